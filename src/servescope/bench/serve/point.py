"""What one ``bench serve`` point is made of: the load spec, the client-side summary of its requests, how many
streams and worker processes it gets, and how many requests it sends.

:mod:`.session` runs points with these; :mod:`.sweep` runs a fixed list of them, :mod:`.knee` searches.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servescope.bench.serve.bottleneck import is_client_bound
from servescope.bench.serve.pool import auto_workers
from servescope.bench.serve.streams import Sample
from servescope.core.cpus import usable_cpus
from servescope.core.errors import InputError
from servescope.core.serve import ClientLag, Dist, TokenCounts
from servescope.server.client import ApiKey, ServerClient
from servescope.server.metrics import Snapshot, scrape_metrics

__all__ = ["LoadSpec", "PointProgress", "client_lag", "model_and_len", "plan_requests", "point_streams",
           "scraper", "summarize", "workers_for"]

PointProgress = Callable[[str, int, int], None]
"""Called as requests finish: (point label, finished, planned)."""

_SCRAPE_EVERY_S = 0.5   # the running/waiting gauges of a point of a few seconds need several samples
_ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class LoadSpec:
    """What to run. Exactly one of ``concurrency`` / ``rate`` is non-empty.

    ``requests`` per point (default ``max(8, 4 × concurrency)``, or ``8 × rate`` for rate points);
    ``duration_s`` stops launching new requests that many seconds into a point (whichever comes first).
    ``warmup_burst``: requests sent at once after the ``warmup_requests`` (a few output tokens each), so that the
    server has run the batch shapes the points will reach before any is measured (an engine compiles some kernels,
    e.g. Triton's fused MoE, for a shape on its first use); ``None``: 0 for a sweep, a knee search's most streams
    (at most 256) for a search.
    ``workers`` processes share each point's streams; 0 (the default) sizes them per point from its streams
    and the CPUs (:func:`servescope.bench.serve.pool.auto_workers`).
    ``prompt_form``: ``ids`` sends each prompt as the server's token ids (exact lengths; the API server does not
    tokenize them), ``text`` as text, which the API server tokenizes per request, as most clients' prompts are.
    """

    url: str
    input_tokens: int = 128
    output_tokens: int = 64
    concurrency: tuple[int, ...] = (1,)
    rate: tuple[float, ...] = ()
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 2
    warmup_burst: int | None = None
    max_concurrency: int | None = None
    model: str | None = None
    seed: int = 0
    timeout_s: float = 120.0
    workers: int = 0
    prompt_form: str = "ids"
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
    tpot = [t for t in (s.tpot_ms() for s in ok) if t is not None]
    itl = [gap for s in ok for gap in s.gaps_ms()]
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


async def scraper(client: ServerClient, snaps: list[Snapshot], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=_SCRAPE_EVERY_S)
        except TimeoutError:
            snap = await scrape_metrics(client)
            if snap is not None:
                snaps.append(snap)


def client_lag(lags: list[float], tpot: Dist) -> ClientLag:
    """Lag percentiles over every tick of every client process, and whether the client's own delays rival
    the per-token latency it measures."""
    if not lags:
        return ClientLag(p50_ms=None, p99_ms=None, max_ms=None)
    p50, p99 = np.percentile(np.asarray(lags), [50, 99])
    return ClientLag(p50_ms=float(p50), p99_ms=float(p99), max_ms=float(max(lags)),
                     client_bound=is_client_bound(float(p99), tpot.median))


# -------------------------------------------------------------------------------------------------- sweep

async def model_and_len(client: ServerClient, wanted: str | None) -> tuple[str, int | None]:
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
                        cpus if cpus is not None else usable_cpus())


def plan_requests(spec: LoadSpec, *, concurrency: int | None, rate: float | None) -> int:
    if spec.requests is not None:
        return spec.requests
    if spec.duration_s is not None:
        return sys.maxsize
    return max(8, 4 * concurrency) if concurrency is not None else max(8, int(8 * (rate or 1.0)))


