"""``bench serve``: a load sweep against a live OpenAI-compatible server, measured by the client and the server.

Each point is a closed loop of ``concurrency`` streams, or Poisson arrivals at ``rate`` requests/s. Every
request is a streamed ``/v1/completions`` with ``max_tokens = min_tokens = N`` and ``ignore_eos``, a prompt
of exactly ``input_tokens`` tokens by the server's own tokenizer (vLLM ``/tokenize`` + ``/detokenize``;
without them, one common English word per token, documented as ``prompt_source``), and
``stream_options.include_usage`` + ``continuous_usage_stats`` so token counts come from the server.
``/metrics`` is scraped before, during (every second) and after each point; see
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

import asyncio
import math
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from servescope import __version__
from servescope.bench.serve.bottleneck import is_client_bound, judge_point
from servescope.bench.serve.pool import auto_workers, available_cpus, run_point_in_workers
from servescope.bench.serve.streams import Point, PointJob, Sample, run_point_here
from servescope.core.errors import InputError
from servescope.core.serve import (
    DEFINITIONS,
    ClientLag,
    Dist,
    ServeOptions,
    ServePoint,
    ServeResult,
    TokenCounts,
)
from servescope.server.client import ApiKey, ServerClient
from servescope.server.metrics import Snapshot, scrape_metrics, server_side
from servescope.server.prompts import make_prompts

__all__ = ["LoadSpec", "PointProgress", "point_streams", "run_bench_serve", "run_bench_serve_async",
           "summarize", "workers_for"]

PointProgress = Callable[[str, int, int], None]
"""Called as requests finish: (point label, finished, planned)."""

_SCRAPE_EVERY_S = 1.0
_ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class LoadSpec:
    """What to run. Exactly one of ``concurrency`` / ``rate`` is non-empty.

    ``requests`` per point (default ``max(8, 4 × concurrency)``, or ``8 × rate`` for rate points);
    ``duration_s`` stops launching new requests that many seconds into a point (whichever comes first).
    ``workers`` processes share each point's streams; 0 (the default) sizes them per point from its streams
    and the CPUs (:func:`servescope.bench.serve.pool.auto_workers`).
    """

    url: str
    input_tokens: int = 128
    output_tokens: int = 64
    concurrency: tuple[int, ...] = (1,)
    rate: tuple[float, ...] = ()
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 2
    max_concurrency: int | None = None
    model: str | None = None
    seed: int = 0
    timeout_s: float = 120.0
    workers: int = 0
    api_key: ApiKey | None = field(default=None, repr=False)


def _percentiles(values: list[float]) -> Dist:
    if not values:
        return Dist(mean=None, median=None, p90=None, p99=None, samples=0)
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Dist(mean=float(arr.mean()), median=float(p50), p90=float(p90), p99=float(p99), samples=len(values))


def summarize(samples: list[Sample], *, output_tokens: int, input_tokens: int) -> dict[str, Any]:
    """The client-side figures of one point (ms), as keyword arguments of :class:`ServePoint`."""
    ok = [s for s in samples if s.error is None]
    ttft = [s.ttft_s * 1e3 for s in ok if s.ttft_s is not None]
    e2e = [s.e2e_s * 1e3 for s in ok if s.e2e_s is not None]
    tpot = [(s.e2e_s - s.ttft_s) * 1e3 / (s.output_tokens - 1) for s in ok
            if s.e2e_s is not None and s.ttft_s is not None and s.output_tokens is not None and s.output_tokens > 1]
    itl = [(b - a) * 1e3 for s in ok for a, b in zip(s.chunk_s, s.chunk_s[1:], strict=False)]
    out_total = sum(s.output_tokens or 0 for s in ok)
    prompts = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    span = (max(s.done_at for s in samples) - min(s.sent_at for s in samples)) if samples else 0.0
    errors = [s.error for s in samples if s.error is not None]
    return {
        "requests": len(samples), "errors": len(errors),
        "error_examples": list(dict.fromkeys(errors))[:_ERROR_EXAMPLES], "duration_s": span,
        "ttft_ms": _percentiles(ttft), "tpot_ms": _percentiles(tpot), "itl_ms": _percentiles(itl),
        "e2e_ms": _percentiles(e2e),
        "output_tokens_per_s": out_total / span if span > 0 and ok else None,
        "requests_per_s": len(ok) / span if span > 0 and ok else None,
        "tokens": TokenCounts(
            output_total=out_total, output_requested_total=output_tokens * len(ok),
            output_mismatched_requests=sum(1 for s in ok if s.output_tokens != output_tokens),
            prompt_mean=sum(prompts) / len(prompts) if prompts else None, prompt_requested=input_tokens),
    }


async def _scraper(client: ServerClient, snaps: list[Snapshot], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=_SCRAPE_EVERY_S)
        except TimeoutError:
            snap = await scrape_metrics(client)
            if snap is not None:
                snaps.append(snap)


def _lag(lags: list[float], tpot: Dist) -> ClientLag:
    """Lag percentiles over every tick of every client process, and whether the client's own delays rival
    the per-token latency it measures."""
    if not lags:
        return ClientLag(p50_ms=None, p99_ms=None, max_ms=None)
    p50, p99 = np.percentile(np.asarray(lags), [50, 99])
    return ClientLag(p50_ms=float(p50), p99_ms=float(p99), max_ms=float(max(lags)),
                     client_bound=is_client_bound(float(p99), tpot.median))


# -------------------------------------------------------------------------------------------------- sweep

async def _model_and_len(client: ServerClient, wanted: str | None) -> tuple[str, int | None]:
    listing = await client.get_json("/v1/models")
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not models:
        raise InputError(client.url_of("/v1/models"), "the server lists no model")
    chosen = next((m for m in models if m.get("id") == wanted), None) if wanted else models[0]
    if chosen is None:
        names = ", ".join(str(m.get("id")) for m in models)
        raise InputError("--model", f"the server does not serve {wanted!r} (it serves {names})")
    raw = chosen.get("max_model_len")
    return str(chosen["id"]), raw if isinstance(raw, int) else None


def point_streams(spec: LoadSpec, concurrency: int | None, rate: float | None, warm_e2e_s: float | None) -> int:
    """Streams a point keeps in flight: its concurrency; for a rate, ``rate x`` the warm-up's E2E (Little's
    law, at least 1 s when unknown), capped at ``max_concurrency``."""
    if concurrency is not None:
        return concurrency
    streams = math.ceil((rate or 1.0) * max(warm_e2e_s or 1.0, 1e-3))
    return max(1, min(streams, spec.max_concurrency) if spec.max_concurrency else streams)


def workers_for(spec: LoadSpec, concurrency: int | None, rate: float | None = None,
                warm_e2e_s: float | None = None, cpus: int | None = None) -> int:
    """Worker processes for one point: ``spec.workers`` (at most one per stream), else sized by
    :func:`~servescope.bench.serve.pool.auto_workers` from its streams and the CPUs."""
    if spec.workers > 0:
        return spec.workers if concurrency is None else min(spec.workers, concurrency)
    return auto_workers(point_streams(spec, concurrency, rate, warm_e2e_s),
                        cpus if cpus is not None else available_cpus())


def _plan_requests(spec: LoadSpec, *, concurrency: int | None, rate: float | None) -> int:
    if spec.requests is not None:
        return spec.requests
    if spec.duration_s is not None:
        return sys.maxsize
    return max(8, 4 * concurrency) if concurrency is not None else max(8, int(8 * (rate or 1.0)))


async def run_bench_serve_async(spec: LoadSpec, *, progress: PointProgress | None = None,
                                checkpoint: Callable[[ServeResult], None] | None = None) -> ServeResult:
    """The sweep of ``spec``; ``checkpoint`` gets the result after every point (to write it as it grows).

    Raises:
        InputError: bad options, or a server that cannot be benchmarked (unreachable at the start, not
            OpenAI-compatible, wrong key, prompt + output longer than its ``max_model_len``).
    """
    if bool(spec.concurrency) == bool(spec.rate):
        raise InputError("--concurrency/--rate", "give exactly one of them")
    levels = max([*spec.concurrency, spec.max_concurrency or 0, 64 if spec.rate else 0])
    async with ServerClient(spec.url, api_key=spec.api_key, read_timeout_s=spec.timeout_s,
                            max_connections=levels + 8) as client:
        model, max_len = await _model_and_len(client, spec.model)
        if max_len is not None and spec.input_tokens + spec.output_tokens > max_len:
            raise InputError("--input-tokens/--output-tokens", f"{spec.input_tokens} + {spec.output_tokens} tokens "
                             f"exceed the server's max_model_len {max_len}")
        counts = [_plan_requests(spec, concurrency=c, rate=None) for c in spec.concurrency] + \
                 [_plan_requests(spec, concurrency=None, rate=r) for r in spec.rate]
        pool = min(256, max(min(counts), max(spec.concurrency or [1])) + spec.warmup_requests)
        prompts, source = await make_prompts(client, model, tokens=spec.input_tokens, count=pool, seed=spec.seed)
        body = {"model": model, "max_tokens": spec.output_tokens, "min_tokens": spec.output_tokens,
                "ignore_eos": True, "temperature": 0.0,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        options = ServeOptions(model=model, input_tokens=spec.input_tokens, output_tokens=spec.output_tokens,
                               concurrency=list(spec.concurrency), rate=list(spec.rate), requests=spec.requests,
                               duration_s=spec.duration_s, warmup_requests=spec.warmup_requests,
                               max_concurrency=spec.max_concurrency, seed=spec.seed, prompt_source=source,
                               timeout_s=spec.timeout_s, workers=spec.workers, cpus=available_cpus())
        warm = Point(client, body, prompts[::-1])
        for _ in range(spec.warmup_requests):
            sample = await warm.one()
            if sample.error is not None:
                raise InputError(client.url_of("/v1/completions"), f"the warm-up request failed: {sample.error}")
        warm_e2e = [s.e2e_s for s in warm.samples if s.e2e_s is not None]
        warm_e2e_s = max(warm_e2e) if warm_e2e else None
        result = ServeResult(servescope_version=__version__, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                             url=client.base_url, platform={"python": platform.python_version(),
                                                            "system": platform.platform()},
                             options=options, definitions=dict(DEFINITIONS), points=[],
                             api_key_source=spec.api_key.source if spec.api_key else None)
        metrics_seen = False
        plans: list[tuple[int | None, float | None]] = [(c, None) for c in spec.concurrency] + \
                                                       [(None, r) for r in spec.rate]
        points: list[ServePoint] = []
        aborted: str | None = None
        for index, ((concurrency, rate), planned) in enumerate(zip(plans, counts, strict=True)):
            label = f"concurrency {concurrency}" if concurrency is not None else f"rate {rate:g}/s"
            job = PointJob(url=spec.url, api_key=spec.api_key, timeout_s=spec.timeout_s, body=body, prompts=prompts,
                           first_prompt=0, concurrency=concurrency, rate=rate, requests=planned,
                           duration_s=spec.duration_s, max_concurrency=spec.max_concurrency,
                           seed=spec.seed + index)
            workers = workers_for(spec, concurrency, rate, warm_e2e_s, options.cpus)
            before = await scrape_metrics(client)
            during: list[Snapshot] = []
            stop = asyncio.Event()
            scraper = asyncio.create_task(_scraper(client, during, stop))
            shown = planned if planned != sys.maxsize else 0
            finished = 0

            def tick(label: str = label, shown: int = shown) -> None:
                nonlocal finished
                finished += 1
                if progress is not None:
                    progress(label, finished, shown)

            try:
                if workers > 1:
                    run = await asyncio.to_thread(run_point_in_workers, job, workers, tick=tick)
                else:
                    run = await run_point_here(job, client=client, tick=tick)
            finally:
                stop.set()
                await scraper
            after = await scrape_metrics(client) if run.down is None else None
            metrics_seen = metrics_seen or before is not None
            figures = summarize(run.samples, output_tokens=spec.output_tokens, input_tokens=spec.input_tokens)
            point = ServePoint(
                concurrency=concurrency, rate=rate, workers=workers, client_lag=_lag(run.lags_ms, figures["tpot_ms"]),
                server=server_side(before, after, during), stopped=run.down, **figures)
            points.append(_judged(point))
            aborted = run.down
            result = _with_points(result, points, aborted, metrics_seen)
            if checkpoint is not None:
                checkpoint(result)
            if aborted is not None:
                break
        return result


def _judged(point: ServePoint) -> ServePoint:
    import msgspec

    return msgspec.structs.replace(point, findings=judge_point(point))


def _with_points(result: ServeResult, points: list[ServePoint], aborted: str | None,
                 metrics_seen: bool) -> ServeResult:
    import msgspec

    return msgspec.structs.replace(result, points=list(points), aborted=aborted, metrics_available=metrics_seen)


def run_bench_serve(spec: LoadSpec, *, progress: PointProgress | None = None,
                    checkpoint: Callable[[ServeResult], None] | None = None) -> ServeResult:
    """The sweep of ``spec`` (see :func:`run_bench_serve_async`), run on a fresh event loop.

    Example:
        >>> result = run_bench_serve(LoadSpec("http://127.0.0.1:8000", concurrency=(1, 4)))  # doctest: +SKIP
    """
    return asyncio.run(run_bench_serve_async(spec, progress=progress, checkpoint=checkpoint))
