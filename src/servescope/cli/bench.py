"""bench gemm / comm / serve: measurements of this box and of a live server."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from servescope.cli.apps import ApiKeyOption, JsonFlag, ModelPreset, PromptsOption, ServerUrl, bench_app
from servescope.cli.common import (
    BarProgress,
    emit,
    err,
    fail,
    interrupted_by_sigterm,
    parse_duration,
    save,
    user_errors,
    with_progress,
)

if TYPE_CHECKING:
    from servescope.core.serve import ServeResult


@bench_app.command("gemm")
def bench_gemm(
    model: ModelPreset,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel ranks (per-rank shapes).")] = 1,
    batch: Annotated[list[str], typer.Option("--batch", help="Decode batch sizes, comma-separated and repeatable: "
                                             "`--batch 1,16 --batch 64` is 1, 16 and 64.")]
    = ["1,16,64"],  # noqa: B006 (typer's default, never changed)
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu.")] = "auto",
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed samples per shape.")] = 50,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON result here.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Time the model's per-rank decode GEMMs; TFLOP/s and GB/s against ceilings measured in the same run."""
    from servescope.bench.gemm import run_model_gemm_bench
    from servescope.plan.planner import parse_batches
    from servescope.report.gpu import render_gemm

    with user_errors():
        doc = run_model_gemm_bench(model, tp=tp, batches=parse_batches(",".join(batch)), device=device, iters=iters,
                                   progress=None if as_json else _gemm_progress)
        emit(doc, render_gemm, as_json=as_json, output=output)


def _gemm_progress(done: int, total: int) -> None:
    """One stderr line per step of a bench that takes minutes on a CPU."""
    if done == 0:
        err.print(f"bench gemm: measuring the copy and matmul ceilings, then {total} shapes", markup=False)
    else:
        err.print(f"bench gemm: {done}/{total} shapes timed", markup=False)


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
    batch: Annotated[list[str], typer.Option("--batch", help="Decode batch sizes for --model, comma-separated and "
                                             "repeatable.")]
    = ["1,8,32"],  # noqa: B006 (typer's default, never changed)
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
    as_json: JsonFlag = False,
) -> None:
    """Collective latency curves (nccl-tests algbw/busbw), one fresh process group per NCCL env variant."""
    from servescope.bench.comm import CommRequest
    from servescope.bench.comm import bench_comm as measure
    from servescope.plan.planner import parse_batches
    from servescope.report.comm import render_comm

    with user_errors():
        batches = parse_batches(",".join(batch))
        rendezvous = {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint,
                      "rdzv_backend": rdzv_backend, "rdzv_id": rdzv_id, "master_addr": master_addr,
                      "master_port": master_port}
        request = CommRequest(ops=tuple(ops.split(",")), sizes=sizes, variants=tuple(variant or ()), graph=graph,
                              nproc=gpus, backend=backend, dtype=dtype, iters=iters, warmup=warmup, model=model,
                              tp=tp, batches=tuple(batches),
                              rendezvous={k: v for k, v in rendezvous.items() if v is not None}, output=output,
                              timeout_s=timeout, keep_going=keep_going)
        # what it measures, each op and variant as it finishes: a default run takes a minute on a CPU
        progress = None if as_json else (lambda m: err.print(f"bench comm: {m}", markup=False))
        try:
            with interrupted_by_sigterm():   # `timeout`/systemd stop: end the workers too
                doc = measure(request, progress=progress)
        except KeyboardInterrupt:
            fail(f"interrupted; the variants that finished are in {output}" if output else "interrupted", code=130)
        if env_out is not None:
            save(env_out, "\n".join(doc.environment) + "\n")
        emit(doc, render_comm, as_json=as_json, output=json_out)
    if doc.failures:
        fail(f"{len(doc.failures)} failed: {doc.failures[0]}")


@bench_app.command("serve")
def bench_serve(
    url: ServerUrl,
    concurrency: Annotated[str | None, typer.Option("--concurrency", help="Concurrent streams per point, "
                                                    "comma-separated (default 1,4,16,64 without --rate and "
                                                    "--slo), or 'auto': search the knee.")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Poisson request rates (req/s) per point, "
                                             "comma-separated, instead of --concurrency; 'auto': search the "
                                             "knee on the request rate.")] = None,
    slo: Annotated[str | None, typer.Option("--slo", help="Latency targets, METRIC_STAT=MS comma-separated: "
                                            "metrics ttft, itl (gaps between tokens), tpot (per request), e2e; "
                                            "stats p50, p90, p95, p99, mean. Without explicit points it searches "
                                            "the knee. Default ttft_p99=2000,itl_p99=100.")] = None,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.01, max=1.0, help="Knee search: stop bisecting "
                                             "when the bracket is within this share of the load.")] = 0.1,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=10, help="Knee search: measurements of the "
                                         "knee's load in all (its spread).")] = 2,
    budget: Annotated[str | None, typer.Option("--budget", show_default=False, help="Knee search: stop after "
                                               "this long (600, 90s, 10m, 2h) with what was found.")] = None,
    max_requests: Annotated[int | None, typer.Option("--max-requests", min=1, show_default=False,
                                                     help="Knee search: stop after this many requests.")] = None,
    start: Annotated[float, typer.Option("--start", min=0.001, help="Knee search: the first load (streams or "
                                         "req/s).")] = 1.0,
    max_load: Annotated[float | None, typer.Option("--max-load", min=0.001, show_default=False,
                                                   help="Knee search: the most load to try (default 1024 "
                                                   "streams, 4096 req/s).")] = None,
    input_tokens: Annotated[int, typer.Option("--input-tokens", min=1, help="Prompt tokens per request.")] = 128,
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=1, help="Output tokens per request "
                                               "(ignore_eos).")] = 64,
    requests: Annotated[int | None, typer.Option("--requests", min=1, show_default=False,
                                                 help="Requests per point (default 4 x concurrency, >= 8).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", min=0.1, show_default=False,
                                                   help="Seconds per point to keep launching requests.")] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Warm-up requests before the sweep.")] = 2,
    warmup_burst: Annotated[int | None, typer.Option("--warmup-burst", min=0, show_default=False,
                                                     help="Requests sent at once after the warm-up, a few output "
                                                     "tokens each, unmeasured: the batch shapes run once (default: "
                                                     "0; a knee search: its most streams, at most 256).")] = None,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", min=1, show_default=False,
                                                        help="Cap on streams in flight with --rate.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model id (default: the first one served).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prompt words and the arrivals (each run draws "
                                                     "its prompts' first tokens anew).")] = 0,
    prompts: PromptsOption = "ids",
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for each chunk.")] = 120.0,
    workers: Annotated[int, typer.Option("--workers", min=0, help="Client processes per point; 0: one per 16 "
                                         "streams, at most one per CPU but one, at least 1 (printed per "
                                         "point).")] = 0,
    api_key: ApiKeyOption = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON result here (after "
                                                "every point).")] = None,
    png: Annotated[Path | None, typer.Option("--png", help="Write a PNG plot of the sweep.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report of the sweep.")] = None,
    compare: Annotated[Path | None, typer.Option("--compare", help="An older result: show the deltas.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Load-test a live server: TTFT, TPOT, ITL, E2E, goodput against latency targets, beside its own /metrics;
    with --slo and no points, find the knee (the most load within the targets) and what bounds it.

    Exit 0 when every request succeeded, 1 when some failed or the server died mid-run (what was measured
    is kept), 2 for bad input or a server that cannot be benchmarked, 130 when interrupted (the points so far
    are in -o).
    """
    from servescope.bench.serve.api import LoadSpec, ServeRequest, bench_serve, interrupted, parse_loads
    from servescope.core.document import decode_as, encode
    from servescope.core.files import read_bytes
    from servescope.core.serve import ServeResult
    from servescope.report.serve import render_serve_html, render_serve_png
    from servescope.server.client import resolve_api_key

    with user_errors():
        levels, rates, search = parse_loads(concurrency, rate)
        old = decode_as(read_bytes(compare), str(compare), ServeResult) if compare is not None else None
        load = LoadSpec(url=url, input_tokens=input_tokens, output_tokens=output_tokens, concurrency=levels,
                        rate=rates, requests=requests, duration_s=duration, warmup_requests=warmup,
                        warmup_burst=warmup_burst,
                        max_concurrency=max_concurrency, model=model, seed=seed, timeout_s=timeout, workers=workers,
                        prompt_form=prompts, api_key=resolve_api_key(api_key))
        request = ServeRequest(load=load, slo=slo, search=search, tolerance=tolerance, repeats=repeats,
                               budget_s=parse_duration("--budget", budget), max_requests=max_requests, start=start,
                               max_load=max_load)
        last: list[ServeResult] = []

        def checkpoint(partial: ServeResult) -> None:
            last[:] = [partial]
            if output is not None:
                save(output, encode(partial))
            if request.searches and not as_json and partial.points:
                _search_lines(partial)

        def sweep(bar: BarProgress | None) -> ServeResult:
            def show(label: str, done: int, planned: int) -> None:
                if bar is not None:
                    bar.advance(f"{label}: {done}/{planned or '?'} requests")
            return bench_serve(request, progress=show, checkpoint=checkpoint)

        try:
            with interrupted_by_sigterm():
                result = with_progress(as_json, sweep)
        except KeyboardInterrupt:
            if output is not None and last:
                save(output, encode(interrupted(last[0])))
            fail(f"interrupted; the points measured so far are in {output}" if output else
                 "interrupted (give -o FILE to keep the points of a run)", code=130)
        if png is not None:
            save(png, render_serve_png(result))
        emit(result, lambda doc, console: _render_serve(doc, old, console), as_json=as_json, output=output,
             html=html, render_html=render_serve_html)
    if result.aborted or (not request.searches and any(p.errors for p in result.points)):
        raise typer.Exit(1)


def _render_serve(result: ServeResult, old: ServeResult | None, console: Console) -> None:
    """The sweep or search, and with ``--compare`` the deltas against the older result."""
    from servescope.report.serve import compare_points, differing_options, render_compare, render_serve

    render_serve(result, console)
    if old is not None:
        from servescope.report.knee import knee_change

        differ = differing_options(result, old)
        if differ:
            console.print(f"the runs differ in {', '.join(differ)}: their deltas are not the server's alone",
                          style="yellow", markup=False, highlight=False)
        render_compare(compare_points(result, old), console)
        line = knee_change(result, old)
        if line is not None:
            console.print(line, markup=False, highlight=False)


def _search_lines(partial: ServeResult) -> None:
    """The search's progress on stderr after a point: first the targets it holds the server to (once the server
    answered), then the point's step, load, verdict and goodput."""
    from servescope.report.knee import targets_line
    from servescope.report.serve import point_label

    if len(partial.points) == 1:
        err.print(targets_line(partial), markup=False, highlight=False)
    point = partial.points[-1]
    verdict = "met" if point.slo and point.slo.met else f"missed ({', '.join(point.slo.missed_by)})" \
        if point.slo else "not judged"
    good = point.slo.goodput_tokens_per_s if point.slo else None
    checks = "; ".join(f"{c.target} {c.value_ms:.1f} ms" for c in (point.slo.checks if point.slo else [])
                       if c.value_ms is not None)
    err.print(f"knee search, {point.step or 'point'} {point_label(point)}: {verdict}; {checks}; goodput "
              f"{good or 0:.1f} tok/s", markup=False, highlight=False)
