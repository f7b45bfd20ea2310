"""``bench serve``: a load sweep against a live OpenAI-compatible server, measured by the client and the server.

Each point is a closed loop of ``concurrency`` streams, or Poisson arrivals at ``rate`` requests/s. Every
request is a streamed ``/v1/completions`` with ``max_tokens = min_tokens = N`` and ``ignore_eos``, a prompt
of exactly ``input_tokens`` tokens by the server's own tokenizer (vLLM ``/tokenize`` + ``/detokenize``;
without them, one common English word per token, documented as ``prompt_source``), and
``stream_options.include_usage`` + ``continuous_usage_stats`` so token counts come from the server.
``/metrics`` is scraped before, during (every 0.5 s) and after each point; see
:mod:`servescope.server.metrics`. The prompts come from :mod:`servescope.server.prompts`.

A 1 ms timer runs beside the streams and records how late it fires (event-loop lag): when that grows
the client, not the server, is the bottleneck, and the result says so (``client_bound``). By default a
point's streams are shared out over worker processes, one per 16 streams, at most one per CPU but one
(:mod:`.pool`; ``workers`` overrides), so that the client stays on time; the requests themselves live in
:mod:`.streams`. A client on time that still measures more than the engine's own histograms names the
server's API front end (``front_end_bound``; :mod:`.bottleneck`).
If the server dies mid-run the point stops launching, in-flight requests count as errors, and the sweep
ends with ``aborted`` set.
"""

from __future__ import annotations

from collections.abc import Callable

from servescope.bench.serve.point import (
    LoadSpec,
    PointProgress,
    plan_requests,
    point_streams,
    summarize,
    workers_for,
)
from servescope.bench.serve.session import ServeSession
from servescope.core.aio import run_loop
from servescope.core.errors import InputError
from servescope.core.serve import ServeResult, SloTarget

__all__ = ["LoadSpec", "PointProgress", "point_streams", "run_bench_serve", "run_bench_serve_async",
           "summarize", "workers_for"]


async def run_bench_serve_async(spec: LoadSpec, *, progress: PointProgress | None = None,
                                checkpoint: Callable[[ServeResult], None] | None = None,
                                slo: tuple[SloTarget, ...] = (), slo_default: bool = False) -> ServeResult:
    """The sweep of ``spec``; ``checkpoint`` gets the result after every point (to write it as it grows).
    With ``slo`` every point is also judged against those targets (goodput, attainment).

    Raises:
        InputError: bad options, or a server that cannot be benchmarked (unreachable at the start, not
            OpenAI-compatible, wrong key, prompt + output longer than its ``max_model_len``).
    """
    if bool(spec.concurrency) == bool(spec.rate):
        raise InputError("--concurrency/--rate", "give exactly one of them")
    levels = max([*spec.concurrency, spec.max_concurrency or 0, 64 if spec.rate else 0])
    plans: list[tuple[int | None, float | None]] = [(c, None) for c in spec.concurrency] + \
                                                   [(None, r) for r in spec.rate]
    async with ServeSession(spec, max_streams=levels, slo=slo, slo_default=slo_default,
                            pool_hint=min(plan_requests(spec, concurrency=c, rate=r) for c, r in plans)) as session:
        for concurrency, rate in plans:
            measured = await session.measure(concurrency, rate, progress=progress)
            if checkpoint is not None and session.result is not None:
                checkpoint(session.result)
            if measured.point.stopped is not None:
                break
        assert session.result is not None
        return session.result


def run_bench_serve(spec: LoadSpec, *, progress: PointProgress | None = None,
                    checkpoint: Callable[[ServeResult], None] | None = None, slo: tuple[SloTarget, ...] = (),
                    slo_default: bool = False) -> ServeResult:
    """The sweep of ``spec`` (see :func:`run_bench_serve_async`), run on a fresh event loop.

    Example:
        >>> result = run_bench_serve(LoadSpec("http://127.0.0.1:8000", concurrency=(1, 4)))  # doctest: +SKIP
    """
    return run_loop(run_bench_serve_async(spec, progress=progress, checkpoint=checkpoint, slo=slo,
                                             slo_default=slo_default))
