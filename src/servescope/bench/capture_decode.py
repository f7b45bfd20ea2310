"""Capture prefill + decode steps of a random-weight model under torch.profiler, annotated as vLLM does.

Needs only torch and transformers. ``--model dense``: a Llama-like ``LlamaConfig``; ``moe``: a Qwen3-MoE-like
``Qwen3MoeConfig`` (transformers' fused experts, ``grouped_mm`` by default); random bf16 weights; a
transformers ``StaticCache``. A round: a prefill of ``--batch`` x ``--input-tokens`` random tokens, then
``--decode-steps`` greedy steps (argmax stays on the device, one sync at the end), each step's host work in
``record_function`` under vLLM's step name. ``--cuda-graphs`` captures the decode forward once in a
``torch.cuda.CUDAGraph`` and replays it; both modes share the static cache and explicit 4-D bool masks, so
they launch the same kernels. Writes ``{model}_b{B}[_graphs]_rank0.pt.trace.json.gz`` and ``{stem}.truth.json``:
the live profiler's own totals (``kineto_results.events()``) of device events by name (CPU ops by self time
on a CPU-only run) and the median decode step time of a separate unprofiled round (CUDA events)::

    servescope capture decode --all --cuda-graphs --out /tmp/captures  # dense, moe x b 1, 16, 64

The script also runs by itself under a Python that has torch and transformers but not servescope (same options,
:func:`parse_args`)::

    python3 src/servescope/bench/capture_decode.py --all --cuda-graphs --out /tmp/captures
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

MODELS = ("dense", "moe")
GRID_BATCHES = (1, 16, 64)
TRACE_SUFFIX, TRUTH_SUFFIX = ".pt.trace.json.gz", ".truth.json"
DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
DEFAULTS: dict[str, dict[str, int]] = {  # moe has 4 layers so an eager trace stays under ~1.5 MB gz
    "dense": {"layers": 8, "hidden": 2048, "intermediate": 5632, "heads": 16, "kv_heads": 8, "vocab": 32000},
    "moe": {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "vocab": 32000, "experts": 64,
            "top_k": 8, "moe_intermediate": 768},
}


def prefill_step_name(batch: int, input_tokens: int) -> str:
    """vLLM's name (``execute_context_X(Y)_generation_Z(W)``) of a prefill of ``batch`` x ``input_tokens``."""
    return f"execute_context_{batch}({batch * input_tokens})_generation_0(0)"


def decode_step_name(batch: int) -> str:
    """vLLM's name of a decode step of ``batch`` requests, one token each."""
    return f"execute_context_0(0)_generation_{batch}({batch})"


def capture_stem(model: str, batch: int, graphs: bool) -> str:
    """File stem of one capture, ``{model}_b{B}[_graphs]_rank0`` (rank0: servescope takes it as rank 0)."""
    return f"{model}_b{batch}{'_graphs' if graphs else ''}_rank0"


def totals_by_name(rows: Iterable[tuple[str, str, float]]) -> dict[str, dict[str, Any]]:
    """``{name: {"kind", "count", "total_us"}}`` of (name, kind, µs) rows, the largest total first."""
    out: dict[str, dict[str, Any]] = {}
    for name, kind, dur_us in rows:
        entry = out.setdefault(name, {"kind": kind, "count": 0, "total_us": 0.0})
        entry["count"] += 1
        entry["total_us"] += dur_us
    for entry in out.values():
        entry["total_us"] = round(entry["total_us"], 3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["total_us"]))


def cpu_self_times(ops: Sequence[tuple[str, int, float, float]]) -> list[tuple[str, float]]:
    """(name, self µs) of (name, thread, start µs, µs) CPU ops: less direct children's (servescope's rule)."""
    self_us = [op[3] for op in ops]
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        by_thread[op[1]].append(i)
    for rows in by_thread.values():
        rows.sort(key=lambda r: (ops[r][2], -ops[r][3]))  # a parent opens before a child starting with it
        stack: list[int] = []
        for row in rows:
            while stack and ops[stack[-1]][2] + ops[stack[-1]][3] <= ops[row][2]:
                stack.pop()
            if stack:
                self_us[stack[-1]] -= ops[row][3]
            stack.append(row)
    return [(op[0], max(s, 0.0)) for op, s in zip(ops, self_us, strict=True)]


def build_truth(*, work: str, kernels: dict[str, dict[str, Any]], batch: int, input_tokens: int,
                decode_steps: int, cuda_graphs: bool, model: dict[str, Any], wall_ms: list[float],
                **extra: Any) -> dict[str, Any]:
    """The truth document of one capture: work totals from the live profiler, steps, setup, timings."""
    return {
        "work": work, "kernels": kernels,
        "device_total_us": round(sum(k["total_us"] for k in kernels.values()), 3),
        "event_count": sum(k["count"] for k in kernels.values()),
        "steps": {"prefill": 1, "decode": decode_steps},
        "step_names": {"prefill": prefill_step_name(batch, input_tokens), "decode": decode_step_name(batch)},
        "batch": batch, "input_tokens": input_tokens, "cuda_graphs": cuda_graphs,
        "wall_ms_per_decode_step": round(statistics.median(wall_ms), 4) if wall_ms else None,
        "wall_ms_decode_steps": [round(x, 4) for x in wall_ms],
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **extra, "model": model,
    }


def write_truth(path: Path, truth: dict[str, Any]) -> None:
    """Write a truth document as indented JSON (values JSON cannot hold, such as dtypes, as strings)."""
    path.write_text(json.dumps(truth, indent=1, default=str) + "\n", encoding="utf-8")


# What the summary's ms/step is, said once per run: it is not what `analyze` of the trace reports.
STEP_TIME_MEANING = ("ms/step: an unprofiled round, timed by CUDA events (GPU) or the wall clock (CPU); "
                     "`servescope analyze` of the trace measures the profiled round, slower by the profiler's "
                     "own cost (large where CPU operators are the work)")


def summary_line(truth: dict[str, Any]) -> str:
    """One line per capture: what, trace size, work events, decode step and prefill time (unprofiled)."""
    mode = "graphs" if truth["cuda_graphs"] else "eager"
    return (f"{truth['model_kind']:5s} b{truth['batch']:<3d} {mode:6s} trace {truth['trace_bytes_gz'] / 1e6:5.2f} MB gz"
            f" ({truth['trace_bytes_json'] / 1e6:5.1f} MB json) {truth['event_count']:6d} {truth['work']} events"
            f"  decode {truth['wall_ms_per_decode_step']:.3f} ms/step unprofiled"
            f"  prefill {truth['wall_ms_prefill']:.2f} ms"
            f"  -> {truth['trace_file']}")


@dataclass(frozen=True)
class Options:
    """One capture's settings."""

    model: str
    batch: int
    input_tokens: int
    decode_steps: int
    device: str
    cuda_graphs: bool
    warmup: int
    out: Path
    sizes: dict[str, int]
    experts_impl: str
    seed: int


def build_model(opts: Options) -> Any:
    """The random-weight model (sdpa attention, bfloat16), initialised on the device itself, in eval mode."""
    import torch
    import transformers
    s = opts.sizes
    common = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                  num_key_value_heads=s["kv_heads"], vocab_size=s["vocab"], tie_word_embeddings=False,
                  max_position_embeddings=max(4096, opts.input_tokens + opts.decode_steps),
                  attn_implementation="sdpa")
    if opts.model == "dense":
        config = transformers.LlamaConfig(intermediate_size=s["intermediate"], **common)
    else:
        config = transformers.Qwen3MoeConfig(
            num_experts=s["experts"], num_experts_per_tok=s["top_k"], moe_intermediate_size=s["moe_intermediate"],
            intermediate_size=4 * s["moe_intermediate"], experts_implementation=opts.experts_impl, **common)
    random.seed(opts.seed)
    torch.manual_seed(opts.seed)  # every device's generator
    with torch.device(opts.device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.to(opts.device).eval()


class Session:
    """One batch on one model: its static KV cache, static decode buffers and, optionally, the decode graph."""

    def __init__(self, model: Any, opts: Options) -> None:
        import torch
        import transformers
        self.torch, self.model, self.opts = torch, model, opts
        b, m, dev = opts.batch, opts.input_tokens, opts.device
        self.max_len = m + opts.decode_steps
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=self.max_len)  # lazily allocated
        gen = torch.Generator().manual_seed(opts.seed)
        self.prompt = torch.randint(0, model.config.vocab_size, (b, m), generator=gen).to(dev)
        causal = torch.arange(self.max_len, device=dev)[None, :] <= torch.arange(m, device=dev)[:, None]
        self.prefill_mask = causal[None, None].expand(b, 1, m, self.max_len).contiguous()
        self.prefill_pos = torch.arange(m, device=dev)[None].expand(b, m).contiguous()
        self.mask = torch.zeros(b, 1, 1, self.max_len, dtype=torch.bool, device=dev)
        self.pos = torch.zeros(b, 1, dtype=torch.long, device=dev)
        self.ids = torch.zeros(b, 1, dtype=torch.long, device=dev)
        self.graph: Any = None
        self.graph_logits: Any = None

    def prefill(self) -> None:
        """Reset the cache in place, run the prompts, sample each first token, open the decode mask."""
        self.cache.reset()
        out = self.model(input_ids=self.prompt, attention_mask=self.prefill_mask, position_ids=self.prefill_pos,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.ids.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
        self.mask.zero_()
        self.mask[..., : self.opts.input_tokens] = True

    def _forward(self) -> Any:
        return self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos,
                          past_key_values=self.cache, use_cache=True).logits

    def decode(self, k: int) -> None:
        """Decode step ``k``: its position into mask and position ids (device fills), forward or replay, argmax."""
        p = self.opts.input_tokens + k
        self.mask[..., p] = True
        self.pos.fill_(p)
        if self.graph is not None:
            self.graph.replay()
            logits = self.graph_logits
        else:
            logits = self._forward()
        self.ids.copy_(logits[:, -1].argmax(-1, keepdim=True))

    def capture_graph(self) -> None:
        """Warm the decode forward up on a side stream, then capture it once (every round resets the cache)."""
        torch = self.torch
        self.prefill()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for k in range(2):
                self.decode(k)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.graph_logits = self._forward()
        self.graph = graph
        torch.cuda.synchronize()

    def run_round(self, annotate: bool = False) -> None:
        """A prefill, then every decode step; each in its vLLM step annotation when ``annotate``."""
        from torch.profiler import record_function
        def scope(name: str) -> Any:
            return record_function(name) if annotate else contextlib.nullcontext()

        with scope(prefill_step_name(self.opts.batch, self.opts.input_tokens)):
            self.prefill()
        for k in range(self.opts.decode_steps):
            with scope(decode_step_name(self.opts.batch)):
                self.decode(k)

    def timed_round(self) -> tuple[list[float], float]:
        """(each decode step's ms, the prefill's ms) of one unprofiled round: CUDA events, or perf_counter."""
        torch, cuda = self.torch, self.opts.device.startswith("cuda")

        def mark() -> Any:
            if not cuda:
                return time.perf_counter()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        marks = [mark()]
        self.prefill()
        marks.append(mark())
        for k in range(self.opts.decode_steps):
            self.decode(k)
            marks.append(mark())
        if cuda:
            torch.cuda.synchronize()
        ms = [a.elapsed_time(b) if cuda else 1e3 * (b - a) for a, b in zip(marks, marks[1:], strict=False)]
        return ms[1:], ms[0]


def live_work(prof: Any) -> tuple[str, dict[str, dict[str, Any]]]:
    """The live profiler's device events by name; its CPU ops by self time when it has no device events."""
    import torch
    device_rows: list[tuple[str, str, float]] = []
    cpu_ops: list[tuple[str, int, float, float]] = []
    for ev in prof.profiler.kineto_results.events():
        activity = ev.activity_type() if hasattr(ev, "activity_type") else None  # a str since torch 2.13
        if ev.device_type() == torch.autograd.DeviceType.CUDA:  # type: ignore[attr-defined]  # device work
            if ev.is_user_annotation() or activity not in (None, *DEVICE_KINDS):
                continue  # gpu_user_annotation ranges, syncs: not work
            kind = activity or {"Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}.get(ev.name()[:6], "kernel")
            device_rows.append((ev.name(), kind, ev.duration_ns() / 1e3))
        elif activity == "cpu_op" or (activity is None and not ev.is_user_annotation()):
            cpu_ops.append((ev.name(), ev.start_thread_id(), ev.start_ns() / 1e3, ev.duration_ns() / 1e3))
    if device_rows:
        return "device", totals_by_name(device_rows)
    return "cpu_op", totals_by_name((name, "cpu_op", us) for name, us in cpu_self_times(cpu_ops))


def capture(model: Any, opts: Options) -> dict[str, Any]:
    """Warm up, profile one annotated round, time one more; write the trace and the truth file."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile
    cuda = opts.device.startswith("cuda")
    session = Session(model, opts)
    if opts.cuda_graphs:
        session.capture_graph()
    for _ in range(opts.warmup):
        session.run_round()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        session.run_round(annotate=True)
        if cuda:
            torch.cuda.synchronize()
    work, kernels = live_work(prof)
    stem = capture_stem(opts.model, opts.batch, opts.cuda_graphs)
    trace_path = opts.out / f"{stem}{TRACE_SUFFIX}"
    with tempfile.TemporaryDirectory(dir=opts.out) as tmp:
        raw = Path(tmp) / f"{stem}.pt.trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as fin, gzip.open(trace_path, "wb", compresslevel=6) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        raw_bytes, gz_bytes = raw.stat().st_size, trace_path.stat().st_size
    wall_ms, prefill_ms = session.timed_round()
    truth = build_truth(
        work=work, kernels=kernels, batch=opts.batch, input_tokens=opts.input_tokens,
        decode_steps=opts.decode_steps, cuda_graphs=opts.cuda_graphs, model=model.config.to_dict(),
        wall_ms=wall_ms, wall_ms_prefill=round(prefill_ms, 4), model_kind=opts.model,
        architecture=type(model).__name__, attn_implementation=getattr(model.config, "_attn_implementation", None),
        experts_implementation=getattr(model.config, "_experts_implementation", None) if opts.model == "moe" else None,
        device=torch.cuda.get_device_name(opts.device) if cuda else (platform.processor() or "cpu"),
        torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
        warmup_rounds=opts.warmup, seed=opts.seed, trace_file=trace_path.name,
        trace_bytes_gz=gz_bytes, trace_bytes_json=raw_bytes,
    )
    write_truth(opts.out / f"{stem}{TRUTH_SUFFIX}", truth)
    return truth


class PlanError(ValueError):
    """A combination of options that cannot be captured, in one line."""


@dataclass(frozen=True)
class Request:
    """What one run asks for: ``servescope capture decode``'s options (and this script's, run directly)."""

    out: Path
    model: str = "dense"
    batch: int = 1
    input_tokens: int = 128
    decode_steps: int = 16
    device: str | None = None
    cuda_graphs: bool = False
    warmup: int = 2
    all: bool = False
    experts_impl: str = "grouped_mm"
    seed: int = 0
    sizes: dict[str, int | None] = field(default_factory=dict)  # --layers, --hidden, ...: None keeps the default


SIZE_KEYS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "experts", "top_k", "moe_intermediate")
EXPERTS_IMPLS = ("grouped_mm", "batched_mm", "eager")
# One line each, shared by the typer command and this script's own parser.
HELP = {
    "out": "Output directory (made if missing).",
    "model": "dense: a Llama-like model; moe: a Qwen3-MoE-like one.",
    "batch": "Requests per step.",
    "input_tokens": "Prompt tokens per request.",
    "decode_steps": "Decode steps profiled.",
    "device": "A torch device (default: cuda if available, else cpu).",
    "cuda_graphs": "Replay the decode forward from a CUDA graph.",
    "warmup": "Unprofiled prefill + decode rounds first.",
    "all": "dense and moe x batch 1, 16, 64; eager, and graphs too with --cuda-graphs.",
    "experts_impl": "The transformers experts implementation of the moe model.",
    "seed": "Seed of the random weights and prompts.",
}


SIZE_NAMES = {"layers": "Decoder layers", "hidden": "Hidden size", "intermediate": "MLP intermediate size",
              "heads": "Attention heads", "kv_heads": "Key/value heads", "vocab": "Vocabulary size",
              "experts": "Experts", "top_k": "Experts per token", "moe_intermediate": "Each expert's intermediate size"}


def size_help(key: str) -> str:
    """Help of a size option: what it sets and each model's default, e.g. ``Decoder layers (default: dense 8, moe
    4).``; a size only one model has says so (``Experts (moe only; default 64).``)."""
    having = [m for m in MODELS if key in DEFAULTS[m]]
    if len(having) == 1:
        return f"{SIZE_NAMES[key]} ({having[0]} only; default {DEFAULTS[having[0]][key]})."
    return f"{SIZE_NAMES[key]} (default: {', '.join(f'{m} {DEFAULTS[m][key]}' for m in having)})."


def parse_args(argv: Sequence[str] | None) -> Request:
    """This script's options when it is run directly (a Python with torch and transformers, no servescope)."""
    import argparse

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help=HELP["out"])
    p.add_argument("--model", choices=MODELS, default="dense", help=HELP["model"])
    p.add_argument("--batch", type=int, default=1, help=HELP["batch"])
    p.add_argument("--input-tokens", type=int, default=128, help=HELP["input_tokens"])
    p.add_argument("--decode-steps", type=int, default=16, help=HELP["decode_steps"])
    p.add_argument("--device", default=None, help=HELP["device"])
    p.add_argument("--cuda-graphs", action="store_true", help=HELP["cuda_graphs"])
    p.add_argument("--warmup", type=int, default=2, help=HELP["warmup"])
    p.add_argument("--all", action="store_true", help=HELP["all"])
    p.add_argument("--experts-impl", default="grouped_mm", choices=EXPERTS_IMPLS, help=HELP["experts_impl"])
    p.add_argument("--seed", type=int, default=0, help=HELP["seed"])
    for key in SIZE_KEYS:
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help=size_help(key))
    args = vars(p.parse_args(argv))
    return Request(sizes={k: args.pop(k) for k in SIZE_KEYS}, **args)


def plan(req: Request, device: str) -> list[Options]:
    """Every capture the request asks for, grouped by model.

    Raises:
        PlanError: one line, for a combination that cannot be captured.
    """
    bad = None
    models = MODELS if req.all else (req.model,)
    if req.model not in MODELS or req.experts_impl not in EXPERTS_IMPLS:
        bad = f"--model is one of {', '.join(MODELS)}; --experts-impl one of {', '.join(EXPERTS_IMPLS)}"
    elif min(req.batch, req.input_tokens, req.decode_steps) < 1 or req.warmup < 0:
        bad = "--batch, --input-tokens and --decode-steps must be at least 1, --warmup at least 0"
    elif req.cuda_graphs and not device.startswith("cuda"):
        bad = f"--cuda-graphs needs a CUDA device (this run's device is {device})"
    elif req.cuda_graphs and req.experts_impl == "eager" and "moe" in models:
        bad = "--experts-impl eager syncs on the host (nonzero, a loop over experts): it cannot be graphed"
    if bad:
        raise PlanError(bad)
    batches = GRID_BATCHES if req.all else (req.batch,)
    modes = ((False, True) if req.cuda_graphs else (False,)) if req.all else (req.cuda_graphs,)
    given = {k: v for k, v in req.sizes.items() if v is not None}
    out: list[Options] = []
    for model in models:
        sizes = {k: given.get(k, v) for k, v in DEFAULTS[model].items()}
        base = Options(model=model, batch=req.batch, input_tokens=req.input_tokens,
                       decode_steps=req.decode_steps, device=device, cuda_graphs=False, warmup=req.warmup,
                       out=req.out, sizes=sizes, experts_impl=req.experts_impl, seed=req.seed)
        out.extend(replace(base, batch=b, cuda_graphs=g) for b in batches for g in modes)
    return out


def run(req: Request) -> int:
    """Run the captures asked for; one summary line per capture on stdout. 0 when all were made, else 1.

    Raises:
        PlanError: before anything runs, for a combination that cannot be captured.
    """
    import torch
    device = req.device or ("cuda" if torch.cuda.is_available() else "cpu")
    captures = plan(req, device)
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
    req.out.mkdir(parents=True, exist_ok=True)
    t0, failed = time.perf_counter(), []
    print(STEP_TIME_MEANING, flush=True)
    built: tuple[str, Any] | None = None
    with torch.inference_mode():
        for opts in captures:
            if built is None or built[0] != opts.model:
                built = None  # free the last model first
                built = (opts.model, build_model(opts))
            try:
                print(summary_line(capture(built[1], opts)), flush=True)
            except Exception as exc:  # in a grid, one failed capture must not lose the others
                if not req.all:
                    raise
                failed.append(capture_stem(opts.model, opts.batch, opts.cuda_graphs))
                print(f"{failed[-1]}: FAILED {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", flush=True)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    print(f"{len(captures) - len(failed)}/{len(captures)} capture(s) in {time.perf_counter() - t0:.1f} s"
          f" -> {req.out}" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """This script run directly: its options, then :func:`run`; a bad combination exits with one line."""
    req = parse_args(argv)
    try:
        return run(req)
    except PlanError as exc:
        raise SystemExit(f"capture_decode: error: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
