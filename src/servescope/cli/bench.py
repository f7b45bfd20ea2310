"""bench gemm: measurements that feed plan."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servescope.cli.common import bench_app, err, fail, save, user_errors
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
    from servescope.core.atomic import write_bytes_atomic
    from servescope.core.document import encode
    from servescope.plan.model import gemm_shapes, load_model_arch
    from servescope.report.gpu import render_gemm

    with user_errors():
        batches = _int_list("--batch", batch)
        arch = load_model_arch(model)
        shapes = [s for b in batches for s in gemm_shapes(arch, tp=tp, batch=b)]
        doc = run_gemm_bench(shapes, device=device, iters=iters, progress=None if as_json else _gemm_progress)
        if output is not None:
            write_bytes_atomic(output, encode(doc))
    if as_json:
        sys.stdout.buffer.write(encode(doc))
    else:
        render_gemm(doc, Console(highlight=False))


def _gemm_progress(done: int, total: int) -> None:
    """One stderr line per step of a bench that takes minutes on a CPU."""
    if done == 0:
        err.print(f"bench gemm: measuring the copy and matmul ceilings, then {total} shapes", markup=False)
    else:
        err.print(f"bench gemm: {done}/{total} shapes timed", markup=False)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@bench_app.command("comm")
def bench_comm(
    ops: Annotated[str, typer.Option("--ops", show_default="all four", help="Collectives, comma-separated: "
                                     "all_reduce, all_gather, reduce_scatter, all_to_all.")] =
        "all_reduce,all_gather,reduce_scatter,all_to_all",
    sizes: Annotated[str, typer.Option("--sizes", help="Bytes (nccl-tests size): LOW:HIGH[:FACTOR] or a list.")] =
        "1K:64M",
    variant: Annotated[list[str] | None, typer.Option("--variant", help="NCCL env variant NAME=V[,NAME=V]; "
                                                      "repeatable; 'default' is always run first.")] = None,
    graph: Annotated[bool, typer.Option("--graph", help="Also time each op replayed from a CUDA graph.")] = False,
    gpus: Annotated[int | None, typer.Option("--gpus", "--nproc-per-node", help="Processes (GPUs) per node; "
                                             "default all GPUs, 2 under gloo.")] = None,
    backend: Annotated[str, typer.Option("--backend", help="auto, nccl or gloo.")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16, float16 or float32.")] = "bfloat16",
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed samples per size.")] = 50,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed ops per size first.")] = 10,
    model: Annotated[str | None, typer.Option("--model", help="Preset or config.json: its hidden size gives "
                                              "the decode all_reduce sizes.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="That model's tensor-parallel ranks; must equal "
                                           "the bench's world size (the decode all_reduce runs over TP).")] = None,
    batch: Annotated[str, typer.Option("--batch", help="Decode batch sizes for --model.")] = "1,8,32",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the curve file here.")] = None,
    env_out: Annotated[Path | None, typer.Option("--env-out", help="Write the unit's Environment= lines here.")]
        = None,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="Write the --json result here (what `servescope "
                                                  "report` reads; -o is the curve file `plan --comm` reads).")]
        = None,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Go on after a failed variant.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per variant launch.")] = 900.0,
    nnodes: Annotated[str | None, typer.Option("--nnodes", help="torchrun: nodes.")] = None,
    node_rank: Annotated[str | None, typer.Option("--node-rank", help="torchrun: this node's rank.")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option("--rdzv-endpoint", help="torchrun: host:port.")] = None,
    rdzv_backend: Annotated[str | None, typer.Option("--rdzv-backend", help="torchrun: c10d or static.")] = None,
    rdzv_id: Annotated[str | None, typer.Option("--rdzv-id", help="torchrun: job id.")] = None,
    master_addr: Annotated[str | None, typer.Option("--master-addr", help="torchrun: rank 0's host.")] = None,
    master_port: Annotated[str | None, typer.Option("--master-port", help="torchrun: rank 0's port.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Collective latency curves (nccl-tests algbw/busbw), one fresh process group per NCCL env variant."""
    from servescope.bench.comm import bench_comm as measure
    from servescope.core.atomic import write_text_atomic
    from servescope.core.document import encode
    from servescope.report.comm import render_comm

    with user_errors():
        batches = _int_list("--batch", batch)
        rendezvous = {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint,
                      "rdzv_backend": rdzv_backend, "rdzv_id": rdzv_id, "master_addr": master_addr,
                      "master_port": master_port}
        # what it measures, each op and variant as it finishes: a default run takes a minute on a CPU
        progress = None if as_json else (lambda m: err.print(f"bench comm: {m}", markup=False))
        previous = signal.signal(signal.SIGTERM, _interrupt)   # `timeout`/systemd stop: end the workers too
        try:
            doc = measure(ops=ops.split(","), sizes=sizes, variants=variant or (), graph=graph, nproc=gpus,
                          backend=backend, dtype=dtype, iters=iters, warmup=warmup, model=model, tp=tp,
                          batches=batches, rendezvous={k: v for k, v in rendezvous.items() if v is not None},
                          output=output, timeout_s=timeout, keep_going=keep_going, progress=progress)
        except KeyboardInterrupt:
            fail(f"interrupted; the variants that finished are in {output}" if output else "interrupted", code=130)
        finally:
            signal.signal(signal.SIGTERM, previous)
        if env_out is not None:
            write_text_atomic(env_out, "\n".join(doc.environment) + "\n")
        if json_out is not None:
            save(json_out, encode(doc))
    if as_json:
        sys.stdout.buffer.write(encode(doc))
    else:
        render_comm(doc, Console(highlight=False))
    if doc.failures:
        fail(f"{len(doc.failures)} failed: {doc.failures[0]}")


def _int_list(option: str, text: str) -> list[int]:
    """``1,8,32`` as integers.

    Raises:
        InputError: naming ``option``, when an item is not an integer.
    """
    try:
        return [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise InputError(option, f"not a comma-separated list of integers: {text!r}") from None
