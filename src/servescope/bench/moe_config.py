"""A tuned fused-MoE kernel config for this GPU: vLLM's own Triton MoE kernel timed over block sizes, per batch.

vLLM reads ``E=..,N=..,device_name=...json`` from ``VLLM_TUNED_CONFIG_FOLDER`` (a map from the batch's token count M to
the kernel's block sizes) and says "Using default MoE config" when it finds none. Its tuner
(``benchmarks/kernels/benchmark_moe.py --tune``) is not in the wheel; this runs the same kind of search in the server's
own Python (its torch, its vLLM, its GPU), within a time budget: for each M, the engine's default config first, then
variations of it, each timed on the kernel alone (a CUDA graph of repeated calls); the fastest measured one is kept, so
the file is never slower than the default at the sizes it times. Run it where the server runs::

    python -m servescope.bench.moe_config --model DIR --out DIR [--tp 1] [--budget 300]

then ``servescope tune --moe-config-dir DIR`` (or ``VLLM_TUNED_CONFIG_FOLDER=DIR`` on the server).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servescope.core.atomic import write_text_atomic

__all__ = ["TIMINGS_SUFFIX", "MoeShape", "candidates", "config_file_name", "kernel_gain", "moe_shape", "read_timings",
           "search", "write_configs"]

# Beside the config, what the search measured (vLLM reads only the exact file name): {M: [fastest us, default us]}.
TIMINGS_SUFFIX = ".timings.json"

# The batch sizes (tokens in one step) vLLM's tuner writes: decode batches and prefill chunks.
BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
# What the search varies around the default, in the order tried (likely winners first).
VARIATIONS: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128),
    "BLOCK_SIZE_N": (64, 128, 32, 256),
    "BLOCK_SIZE_K": (128, 64, 256),
    "GROUP_SIZE_M": (1, 16, 32),
    "num_warps": (4, 8),
    "num_stages": (3, 4, 2, 5),
}

Config = dict[str, int]
Timer = Callable[[int, Config], float | None]  # (M, config) -> microseconds, None where the config fails


@dataclass(frozen=True)
class MoeShape:
    """The expert weights one rank holds: E experts, N the intermediate size per rank, K the hidden size."""

    experts: int
    intermediate: int
    hidden: int
    top_k: int


def moe_shape(config: dict[str, Any], tp: int = 1) -> MoeShape:
    """The expert shape from a Hugging Face ``config.json`` (Qwen-MoE, Mixtral, DeepSeek spellings), split by TP."""
    text = config.get("text_config", config)
    experts = text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts")
    inter = text.get("moe_intermediate_size") or text.get("intermediate_size")
    top_k = text.get("num_experts_per_tok") or text.get("moe_topk")
    if not (experts and inter and top_k and text.get("hidden_size")):
        raise ValueError("config.json names no mixture of experts (num_experts, moe_intermediate_size, "
                         "num_experts_per_tok, hidden_size)")
    if inter % tp:
        raise ValueError(f"moe_intermediate_size {inter} does not split over {tp} ranks")
    return MoeShape(int(experts), int(inter) // tp, int(text["hidden_size"]), int(top_k))


def config_file_name(shape: MoeShape, device_name: str, dtype: str | None = None) -> str:
    """The file name vLLM looks for (its spelling: spaces to underscores, the H200 family as NVIDIA_H200)."""
    device = device_name.replace(" ", "_")
    if "H200" in device.split("_"):
        device = "NVIDIA_H200"
    selector = f",dtype={dtype}" if dtype else ""
    return f"E={shape.experts},N={shape.intermediate},device_name={device}{selector}.json"


def candidates(default: Config, batch: int) -> Iterator[Config]:
    """The default first, then one key changed at a time, then pairs of changes: every config the kernel takes."""
    keys = [k for k in VARIATIONS if k in default]
    seen: set[tuple[tuple[str, int], ...]] = set()

    def once(config: Config) -> Iterator[Config]:
        key = tuple(sorted(config.items()))
        if key not in seen and _fits(config, batch):
            seen.add(key)
            yield config

    yield from once(dict(default))
    for key in keys:
        for value in VARIATIONS[key]:
            yield from once({**default, key: value})
    for first, second in itertools.combinations(keys, 2):
        for a, b in itertools.product(VARIATIONS[first], VARIATIONS[second]):
            yield from once({**default, first: a, second: b})


def _fits(config: Config, batch: int) -> bool:
    """Tiles far larger than the batch only waste the kernel's time (every token goes to top_k experts)."""
    return config.get("BLOCK_SIZE_M", 16) <= max(16, 4 * batch)


def search(batches: tuple[int, ...], default_of: Callable[[int], Config], timer: Timer, *, budget_s: float,
           clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] = lambda _: None,
           ) -> dict[int, tuple[Config, float, float]]:
    """For each batch, the fastest config measured and its time against the default's: {M: (config, us, default_us)}.

    The budget is shared evenly among the batches still to search; a batch whose default fails to run is left out.
    """
    found: dict[int, tuple[Config, float, float]] = {}
    start = clock()
    for index, batch in enumerate(batches):
        left = budget_s - (clock() - start)
        until = clock() + max(left, 0.0) / (len(batches) - index)
        default = default_of(batch)
        best: tuple[Config, float] | None = None
        base: float | None = None
        for config in candidates(default, batch):
            if best is not None and clock() > until:
                break
            took = timer(batch, config)
            if took is None:
                continue
            if base is None and config == default:
                base = took
            if best is None or took < best[1]:
                best = (config, took)
        if best is not None and base is not None:
            found[batch] = (best[0], best[1], base)
            say(f"M={batch}: {best[1]:.1f} us (default {base:.1f} us, {base / best[1]:.2f}x) {best[0]}")
    return found


def write_configs(path: Path, found: dict[int, tuple[Config, float, float]]) -> None:
    """The JSON vLLM reads (str(M) -> config) and, beside it, the timings behind it; each written atomically."""
    _write_json(path, {str(m): config for m, (config, _, _) in sorted(found.items())})
    _write_json(path.with_name(path.name + TIMINGS_SUFFIX),
                {str(m): [took, default] for m, (_, took, default) in sorted(found.items())})


def _write_json(path: Path, body: object) -> None:
    write_text_atomic(path, json.dumps(body, indent=2) + "\n", mkdir=True)


def read_timings(config_path: Path) -> dict[int, tuple[float, float]] | None:
    """The search's timings beside a config file ({M: (fastest us, default us)}); None where there are none."""
    try:
        raw = json.loads(config_path.with_name(config_path.name + TIMINGS_SUFFIX).read_text())
        return {int(m): (float(pair[0]), float(pair[1])) for m, pair in raw.items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return None


def kernel_gain(timings: dict[int, tuple[float, float]], batch: float) -> float:
    """How much faster the searched config runs the kernel than vLLM's default at ``batch`` tokens, as a fraction:
    at the timed batch size nearest it (vLLM picks a config the same way). A step gains at most this much: the
    experts are only part of it."""
    nearest = min(timings, key=lambda m: abs(m - batch))
    took, default = timings[nearest]
    return max(default / took - 1.0, 0.0) if took > 0 else 0.0


def _cuda_timer(shape: MoeShape, dtype: Any, repeat: int = 10) -> Timer:  # pragma: no cover - needs a GPU and vLLM
    """Times vLLM's fused_experts on random weights and routing, one config forced at a time (a CUDA graph)."""
    import torch
    from vllm.model_executor.layers.fused_moe import fused_experts, override_config

    device = torch.device("cuda")
    w1 = torch.randn(shape.experts, 2 * shape.intermediate, shape.hidden, device=device, dtype=dtype) / 16
    w2 = torch.randn(shape.experts, shape.hidden, shape.intermediate, device=device, dtype=dtype) / 16

    def timer(batch: int, config: Config) -> float | None:
        x = torch.randn(batch, shape.hidden, device=device, dtype=dtype)
        logits = torch.randn(batch, shape.experts, device=device, dtype=torch.float32)
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), shape.top_k, dim=-1)
        try:
            with override_config(config):
                for _ in range(2):  # compile and warm
                    fused_experts(x, w1, w2, weights, ids)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(repeat):
                        fused_experts(x, w1, w2, weights, ids)
            graph.replay()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            for _ in range(5):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            return float(begin.elapsed_time(end)) * 1000.0 / (5 * repeat)
        except Exception as exc:  # a config the kernel cannot take (shared memory, registers): skip it
            torch.cuda.synchronize()
            print(f"  M={batch} {config}: {type(exc).__name__}", file=sys.stderr)
            return None

    return timer


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs a GPU and vLLM
    parser = argparse.ArgumentParser(prog="python -m servescope.bench.moe_config", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the model folder (its config.json)")
    parser.add_argument("--out", type=Path, required=True, help="the folder for the JSON (VLLM_TUNED_CONFIG_FOLDER)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size the server runs (splits N)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds of search in all")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="token counts M to tune")
    args = parser.parse_args(argv)
    try:
        shape = moe_shape(json.loads((args.model / "config.json").read_text()), args.tp)
    except (OSError, ValueError) as exc:
        print(f"{args.model / 'config.json'}: {exc}", file=sys.stderr)
        return 2
    try:
        import torch
        from vllm.model_executor.layers.fused_moe.fused_moe import get_default_config
    except ImportError as exc:
        print(f"needs the server's Python (torch and vLLM with its fused-MoE kernel): {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs the GPU the server runs on: torch sees no CUDA device", file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    batches = tuple(int(b) for b in args.batches.split(","))
    name = config_file_name(shape, torch.cuda.get_device_name())
    print(f"{name}: E={shape.experts} N={shape.intermediate} K={shape.hidden} top_k={shape.top_k}, "
          f"{len(batches)} batches, {args.budget:.0f} s")
    wanted = set(inspect.signature(get_default_config).parameters)

    def default_of(batch: int) -> Config:  # the engine's own default, by parameter name (it moved between versions)
        named = {"M": batch, "E": shape.experts, "N": shape.intermediate, "K": shape.hidden, "topk": shape.top_k,
                 "dtype": None, "is_marlin": False, "block_shape": None}
        return dict(get_default_config(**{k: v for k, v in named.items() if k in wanted}))

    found = search(batches, default_of, _cuda_timer(shape, dtype), budget_s=args.budget, say=print)
    if not found:
        print("no batch ran: nothing written", file=sys.stderr)
        return 1
    write_configs(args.out / name, found)
    print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
