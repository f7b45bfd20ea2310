"""bench gemm: measurements that feed plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servescope.cli.common import bench_app, user_errors
from servescope.core.errors import InputError


@bench_app.command("gemm")
def bench_gemm(
    model: Annotated[str, typer.Option("--model", help="A preset (kimi-k2.5, deepseek-v3, qwen3-235b-a22b, "
                                       "llama-3-70b) or a HF config.json.")],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel ranks (per-rank shapes).")] = 1,
    batch: Annotated[str, typer.Option("--batch", help="Decode batch sizes, comma-separated.")] = "1,16,64",
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu.")] = "auto",
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed samples per shape.")] = 50,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON result here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Time the model's per-rank decode GEMMs; TFLOP/s and GB/s against ceilings measured in the same run."""
    from servescope.bench.gemm import run_gemm_bench
    from servescope.core.atomic import write_text_atomic
    from servescope.core.gemm import gemm_doc_to_json
    from servescope.plan.model import gemm_shapes, load_model_arch
    from servescope.report.gpu import render_gemm

    with user_errors():
        try:
            batches = [int(b) for b in batch.split(",") if b.strip()]
        except ValueError:
            raise InputError("--batch", f"not a comma-separated list of integers: {batch!r}") from None
        arch = load_model_arch(model)
        shapes = [s for b in batches for s in gemm_shapes(arch, tp=tp, batch=b)]
        doc = run_gemm_bench(shapes, device=device, iters=iters)
        if output is not None:
            write_text_atomic(output, gemm_doc_to_json(doc))
    if as_json:
        sys.stdout.write(gemm_doc_to_json(doc) + "\n")
    else:
        render_gemm(doc, Console(highlight=False))
