"""The knee: the most load a server takes while its points still meet the latency targets, and why it stops.

The search (``bench serve --slo …`` without explicit points) probes exponentially — 1, 2, 4, … streams, or
requests/s with ``--rate auto`` — until a point misses a target, then bisects between the last point that met
them and the first that did not until the bracket is within ``tolerance`` (relative; one stream for
concurrency). The knee's point is then measured again (``repeats`` in all) and so is the first point past it,
so the knee carries a spread. Before the first point a burst of requests sent at once (the search's most streams,
at most 256, a few output tokens each) runs the shapes the search will reach, so that no point pays for a kernel an
engine compiles on first use (vLLM's Triton fused-MoE kernels: a fresh MoE server's first search on an H100 put its
knee at 3 streams, the next one at 128). It stops early when the server stops answering, when the client itself
runs late (its lag: past there it would measure itself), or at the budget (seconds, requests). Every point is
appended to the document as it finishes (``checkpoint``), so an interrupted search keeps what it measured.

Why the knee is there is judged by :func:`servescope.bench.serve.cause.judge_knee` on the first point past it.

Example:
    >>> result = find_knee(KneeSpec(load=LoadSpec("http://127.0.0.1:8000"), slo=parse_slo(None)))  # doctest: +SKIP
    >>> result.knee.load, result.cause.id                                                     # doctest: +SKIP
    (24.0, 'scheduler_cap')
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from servescope.bench.serve.cause import judge_knee
from servescope.bench.serve.point import LoadSpec, PointProgress
from servescope.bench.serve.session import ServeSession
from servescope.core.aio import run_loop
from servescope.core.knee import delivered_by_load, loads_met, most_delivered, next_probe
from servescope.core.serve import Knee, KneeCause, KneeSearch, ServePoint, ServeResult, SloTarget

__all__ = ["KneeSpec", "client_explains", "find_knee", "find_knee_async", "knee_of", "next_load"]

_MAX_STREAMS = 1024
_MAX_RATE = 4096.0
_MAX_BURST = 256  # a knee search's warm-up burst: its most streams, at most this


@dataclass(frozen=True)
class KneeSpec:
    """What the search runs.

    ``mode`` "concurrency" (closed loop) or "rate" (Poisson arrivals). ``start`` the first load; ``max_load``
    the most it tries (default 1024 streams / 4096 requests/s). ``tolerance``: the bracket's relative width that
    ends the bisection. ``repeats``: measurements of the knee's load in all. ``budget_s`` / ``max_requests``:
    stop there with what was found. ``server_argv``: the server's command line, where known (what is in place).
    ``also_at``: loads measured once after the search where it measured none of them and they lie below its knee
    (tune sets a trial's tokens/s at the reference knee's load beside the reference's there).
    """

    load: LoadSpec
    slo: tuple[SloTarget, ...]
    mode: str = "concurrency"
    tolerance: float = 0.1
    budget_s: float | None = None
    max_requests: int | None = None
    repeats: int = 2
    start: float = 1.0
    max_load: float | None = None
    slo_default: bool = False
    server_argv: Sequence[str] | None = field(default=None, repr=False)
    also_at: tuple[float, ...] = ()


def _met(point: ServePoint) -> bool:
    return bool(point.slo and point.slo.met)


def client_explains(point: ServePoint) -> bool:
    """Whether the client's own lateness could account for a point's miss: it ran late (client-bound) and every
    target it missed would be met with the client's lag p99 taken off (a late client adds at most that to a TTFT
    or a gap), unless the engine's own mean of that metric (``/metrics``) is already beyond the limit — a mean
    beyond a limit puts every percentile above it beyond it too, whatever the client's state. A point that met
    the targets with the client's delays inside its figures met them."""
    lag = point.client_lag
    if not lag.client_bound or point.slo is None or point.slo.met or "errors" in point.slo.missed_by:
        return False
    late = lag.p99_ms or 0.0
    for check in point.slo.checks:
        if check.met:
            continue
        engine_mean = getattr(point.server, f"{check.target.split('_')[0]}_ms_mean", None)
        if engine_mean is not None and engine_mean > check.limit_ms:
            return False
        if check.value_ms is None or check.value_ms - late > check.limit_ms:
            return False
    return True


def next_load(met: float | None, missed: float | None, *, mode: str, start: float, max_load: float,
              tolerance: float) -> float | None:
    """The next load to measure, or ``None`` when the bracket is closed (or nothing is left to try).

    Probe: double the last load that met the targets (``start`` first) up to ``max_load``. Bisect: the middle
    of (met, missed), rounded to a stream for concurrency, until ``missed - met <= tolerance × met`` (or one
    stream apart).
    """
    if missed is None:
        if met is None:
            return start
        return next_probe(met, max_load)
    if met is None:
        return None   # the first load already missed: nothing below it to try
    if missed - met <= tolerance * met or (mode == "concurrency" and missed - met <= 1):
        return None
    middle = (met + missed) / 2
    if mode == "concurrency":
        middle = float(math.floor(middle))
        if middle <= met:
            return None
    return middle


def knee_of(points: Sequence[ServePoint], unit: str) -> Knee | None:
    """The knee of a finished search: the highest load every one of whose points met the targets (a load
    measured again and missed once is not the knee), with the median goodput of its repeats and their spread."""
    by_load, good = loads_met(points)
    if not good:
        return None
    best = max(good)
    repeats = by_load[best]
    tokens = [p.slo.goodput_tokens_per_s or 0.0 for p in repeats if p.slo is not None]
    reqs = [p.slo.goodput_requests_per_s or 0.0 for p in repeats if p.slo is not None]
    delivered = [p.output_tokens_per_s for p in repeats if p.output_tokens_per_s is not None]
    above = sorted(load for load in by_load if load > best)
    missed_by = sorted({m for p in by_load[above[0]] if p.slo for m in p.slo.missed_by}) if above else []
    most = None
    if delivered:  # past a point more streams can deliver fewer tokens and still meet the targets
        at = most_delivered(best, statistics.median(delivered), max(delivered), delivered_by_load(points))
        most = at if at[0] != best else None
    return Knee(unit=unit, load=best, goodput_requests_per_s=statistics.median(reqs),
                goodput_tokens_per_s=statistics.median(tokens), spread=(min(tokens), max(tokens)),
                met=sum(1 for p in repeats if _met(p)), repeats=len(repeats),
                next_load=above[0] if above else None, missed_by=missed_by,
                tokens_per_s=statistics.median(delivered) if delivered else None,
                tokens_spread=(min(delivered), max(delivered)) if delivered else None, most_tokens_at=most)


class _Search:
    """The search's state: the bracket, the budget, and why it stopped."""

    def __init__(self, spec: KneeSpec) -> None:
        self.spec = spec
        self.met: float | None = None
        self.missed: float | None = None
        self.stopped = ""
        self.requests = 0
        self.started = time.monotonic()

    def over_budget(self) -> str | None:
        spec = self.spec
        if spec.budget_s is not None and time.monotonic() - self.started >= spec.budget_s:
            return f"the time budget ({spec.budget_s:g} s) ran out"
        if spec.max_requests is not None and self.requests >= spec.max_requests:
            return f"the request budget ({spec.max_requests}) ran out"
        return None

    def record(self, point: ServePoint) -> str | None:
        """Move the bracket by ``point``; a reason to stop, if any."""
        self.requests += point.requests
        load = point.load
        if point.stopped is not None:
            return f"the server stopped answering at {load:g}: {point.stopped}"
        if client_explains(point):
            self.missed = load if self.missed is None else min(self.missed, load)
            return (f"the client ran late at {load:g} (lag p99 {point.client_lag.p99_ms or 0:.1f} ms over "
                    f"{point.workers} process(es)): it cannot load this server further from here; raise --workers "
                    "or run it on another machine")
        if _met(point):
            self.met = load if self.met is None else max(self.met, load)
        else:
            self.missed = load if self.missed is None else min(self.missed, load)
        return None


async def find_knee_async(spec: KneeSpec, *, progress: PointProgress | None = None,
                          checkpoint: Callable[[ServeResult], None] | None = None) -> ServeResult:
    """The search of ``spec`` (see the module); ``checkpoint`` gets the document after every point."""
    rate_mode = spec.mode == "rate"
    unit = "requests/s" if rate_mode else "streams"
    max_load = spec.max_load or (_MAX_RATE if rate_mode else _MAX_STREAMS)
    search = _Search(spec)
    streams = int(max_load) if not rate_mode else min(_MAX_STREAMS, spec.load.max_concurrency or _MAX_STREAMS)
    sent = spec.load
    if sent.warmup_burst is None:  # the shapes the search will reach run once before it measures
        sent = dataclasses.replace(sent, warmup_burst=min(streams, _MAX_BURST))
    async with ServeSession(sent, max_streams=streams, slo=spec.slo, slo_default=spec.slo_default) as session:

        def document(stopped: str) -> ServeResult:
            assert session.result is not None
            points = session.result.points
            knee = knee_of(points, unit)
            return msgspec.structs.replace(
                session.result, knee=knee, cause=_cause(spec, points, knee),
                search=KneeSearch(unit=unit, tolerance=spec.tolerance, repeats=spec.repeats, start=spec.start,
                                  max_load=max_load, budget_s=spec.budget_s, max_requests=spec.max_requests,
                                  stopped=stopped, requests=search.requests,
                                  seconds=time.monotonic() - search.started))

        async def run(load: float, step: str) -> str | None:
            concurrency, rate = (None, load) if rate_mode else (int(load), None)
            measured = await session.measure(concurrency, rate, progress=progress, step=step,
                                             requests=_requests(spec.load, load, rate_mode))
            if step == "reference":  # below the bracket, which stays the search's: only a dead server ends it
                search.requests += measured.point.requests
                reason = None if measured.point.stopped is None else \
                    f"the server stopped answering at {load:g}: {measured.point.stopped}"
            else:
                reason = search.record(measured.point)
            if checkpoint is not None:
                checkpoint(document(reason or "running"))
            return reason

        stop: str | None = None
        while stop is None:
            load = next_load(search.met, search.missed, mode=spec.mode, start=spec.start, max_load=max_load,
                             tolerance=spec.tolerance)
            if load is None:
                break
            stop = search.over_budget() or await run(load, "probe" if search.missed is None else "bisect")
        if stop is None:
            for load in ([search.met] * (spec.repeats - 1) if search.met is not None else []) + \
                        ([search.missed] if search.missed is not None and spec.repeats > 1 else []):
                stop = search.over_budget() or await run(load, "repeat")
                if stop is not None:
                    break
        if stop is None:
            stop = _closed(search, max_load, unit)
            measured = {p.load for p in session.result.points} if session.result else set()
            for load in sorted(set(spec.also_at)):
                if search.met is not None and load < search.met and load not in measured:
                    if search.over_budget() is not None:  # the search itself is done: its reason stands
                        break
                    if (dead := await run(load, "reference")) is not None:
                        stop = dead
                        break
        return document(stop)


def _requests(load: LoadSpec, level: float, rate_mode: bool) -> int | None:
    """Requests of a search's point: the user's (``--requests``, ``--duration``), else at least 16 — a p99 of
    8 requests is their maximum — and 4 per stream (8 s of arrivals at a rate)."""
    if load.requests is not None or load.duration_s is not None:
        return None
    return max(16, math.ceil((8 if rate_mode else 4) * level))


def _closed(search: _Search, max_load: float, unit: str) -> str:
    if search.met is None:
        return f"the first load ({search.spec.start:g} {unit}) already missed the targets"
    if search.missed is None:
        return f"every load up to {max_load:g} {unit} met the targets"
    return f"the bracket closed: {search.met:g} met, {search.missed:g} missed (tolerance {search.spec.tolerance:.0%})"


def _cause(spec: KneeSpec, points: list[ServePoint], knee: Knee | None) -> KneeCause | None:
    """The cause judged on the least load that missed the targets (beside the knee's point and the first)."""
    missed = [p for p in points if p.slo is not None and (not p.slo.met or client_explains(p))
              and (knee is None or p.load > knee.load)]
    if not missed:
        return None
    least = min(p.load for p in missed)
    at = [p for p in missed if p.load == least][0]
    at_knee = next((p for p in points if knee is not None and p.load == knee.load), None)
    return judge_knee(at, knee=at_knee, first=points[0] if points else None,
                      prompt_tokens=spec.load.input_tokens, server_argv=spec.server_argv,
                      client_explains=client_explains(at))


def find_knee(spec: KneeSpec, *, progress: PointProgress | None = None,
              checkpoint: Callable[[ServeResult], None] | None = None) -> ServeResult:
    """:func:`find_knee_async` on a fresh event loop (blocking)."""
    return run_loop(find_knee_async(spec, progress=progress, checkpoint=checkpoint))
