"""Time the decode GEMMs of the capture skeletons, Llama-3-70B and Qwen3-235B-A22B on one GPU; write the JSON.

Needs only Python >= 3.11 and torch: it puts this checkout's ``src/`` on ``sys.path`` and uses
``servescope.plan.model`` and ``servescope.bench.gemm``, which import nothing beyond the standard library
(torch inside functions), so a GPU machine without servescope's dependencies can run it. The skeleton models
are ``servescope/bench/capture_decode.py``'s ``DEFAULTS`` (read from that file, so the two never drift) at TP=1, as
captured; the presets at ``--tp`` (default 8: the shapes one rank of eight runs). The document is
``servescope.core.gemm.GemmBenchDoc`` as JSON; ``servescope.core.gemm.load_gemm_doc`` reads it back::

    python3 tools/bench_gemm_device.py --out /tmp/gemm_h200.json            # the grid, ~1 min on an H200
    python3 tools/bench_gemm_device.py --out /tmp/g.json --device cpu --models dense --batches 1 --iters 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from servescope.bench.capture_decode import DEFAULTS  # noqa: E402  (stdlib at import; torch inside functions)
from servescope.bench.gemm import run_gemm_bench  # noqa: E402
from servescope.core.atomic import write_text_atomic  # noqa: E402
from servescope.core.gemm import GemmBenchDoc, GemmShape, gemm_doc_to_json  # noqa: E402
from servescope.plan.model import ModelArch, gemm_shapes, load_model_arch  # noqa: E402

SKELETONS = ("dense", "moe")
PRESETS = ("llama-3-70b", "qwen3-235b-a22b")
BATCHES = (1, 16, 64)


def skeleton_arch(kind: str) -> ModelArch:
    """``capture_decode``'s random-weight model ``kind`` as a :class:`ModelArch` (head_dim = hidden/heads,
    as transformers' LlamaConfig and Qwen3MoeConfig default it; every Qwen3-MoE layer sparse, no shared expert)."""
    s = DEFAULTS[kind]
    source = f"servescope.bench.capture_decode DEFAULTS[{kind!r}]"
    if kind == "dense":
        return ModelArch(name="skeleton-dense", source=source + " (LlamaConfig)", hidden=s["hidden"],
                         layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"],
                         head_dim=s["hidden"] // s["heads"], intermediate=s["intermediate"], vocab=s["vocab"])
    return ModelArch(name="skeleton-moe", source=source + " (Qwen3MoeConfig)", hidden=s["hidden"],
                     layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"], head_dim=s["hidden"] // s["heads"],
                     intermediate=4 * s["moe_intermediate"], vocab=s["vocab"], experts=s["experts"],
                     top_k=s["top_k"], moe_intermediate=s["moe_intermediate"])


def grid_shapes(models: list[str], batches: list[int], tp: int) -> list[GemmShape]:
    """Every requested model's decode GEMMs at every batch: skeletons at TP=1, presets at ``tp``."""
    shapes: list[GemmShape] = []
    for model in models:
        arch = skeleton_arch(model) if model in SKELETONS else load_model_arch(model)
        for batch in batches:
            shapes += gemm_shapes(arch, tp=1 if model in SKELETONS else tp, batch=batch)
    return shapes


def summary(doc: GemmBenchDoc) -> str:
    """A few lines: the device, the ceilings, then each timing's shape, µs, TFLOP/s and GB/s."""
    cc, mc = doc.copy_ceiling, doc.matmul_ceiling
    lines = [f"{doc.device_name}  torch {doc.torch_version}  copy {cc.gbps:.0f} GB/s  "
             f"matmul {mc.size}^3 {mc.tflops:.1f} TFLOP/s  datasheet {doc.options.hardware}"]
    for t in doc.timings:
        of_copy = "-" if t.frac_ceiling_gbps is None else format(t.frac_ceiling_gbps, ".0%")
        lines.append(f"  {t.m:5d} x {t.n:6d} x {t.k:6d}  {t.median_s * 1e6:9.2f} us  {t.tflops:7.2f} TFLOP/s "
                     f"{t.gbps:7.0f} GB/s  ({of_copy} of copy)  {t.names[0]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON document")
    parser.add_argument("--models", nargs="+", default=[*SKELETONS, *PRESETS],
                        help=f"skeletons {SKELETONS} and/or preset names (default: all four)")
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel size for the presets")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--hardware", default="auto", help="data/hardware profile, 'auto' or 'none'")
    parser.add_argument("--cold-bytes", type=int, default=None)
    parser.add_argument("--copy-bytes", type=int, default=None)
    parser.add_argument("--matmul-size", type=int, default=None)
    parser.add_argument("--quiet", action="store_true", help="no summary on stdout")
    args = parser.parse_args(argv)

    shapes = grid_shapes(args.models, args.batches, args.tp)

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} shapes", end="" if done < total else "\n", file=sys.stderr, flush=True)

    doc = run_gemm_bench(shapes, device=args.device, dtype=args.dtype, iters=args.iters, warmup=args.warmup,
                         hardware=None if args.hardware == "none" else args.hardware, cold_bytes=args.cold_bytes,
                         copy_bytes=args.copy_bytes, matmul_size=args.matmul_size, progress=progress)
    write_text_atomic(args.out, gemm_doc_to_json(doc))
    if not args.quiet:
        print(summary(doc))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
