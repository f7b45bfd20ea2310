"""Latency targets (``--slo``) and the knee's document types.

A target is ``METRIC_STAT=MS``: ``ttft_p99=2000`` means the point's 99th percentile TTFT is at most 2000 ms.
Metrics are named as vLLM's ``vllm bench serve`` names them:

- ``ttft``: request sent → first token;
- ``itl``: inter-token latency, the gaps between successive tokens of a stream (every gap of every request);
- ``tpot``: time per output token, per request ``(E2E − TTFT) / (output tokens − 1)``;
- ``e2e``: request sent → last token.

Stats: ``p50`` (or ``median``), ``p90``, ``p95``, ``p99``, ``mean``. Without ``--slo`` the targets are
:data:`DEFAULT_SLO`, printed with every result. The knee's document is the ``bench serve`` document
(:class:`~servescope.core.serve.ServeResult`) with ``slo``, ``search``, ``knee`` and ``cause`` filled in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from servescope.core.errors import InputError
from servescope.core.serve import Knee, KneeCause, KneeSearch, PointSlo, ServePoint, ServeResult, SloTarget, TargetCheck

__all__ = ["DEFAULT_SLO", "METRICS", "PLATEAU", "PROBE_FACTOR", "STATS", "Knee", "KneeCause", "KneeResult",
           "KneeSearch", "PointSlo", "SloTarget", "TargetCheck", "delivered_by_load", "describe_slo", "loads_met",
           "most_delivered", "next_probe", "option_past_stop", "parse_slo"]

KneeResult = ServeResult
"""The knee's document: a ``bench serve`` result whose ``knee`` and ``cause`` the search filled in."""

METRICS: dict[str, str] = {
    "ttft": "time to first token: request sent -> first token",
    "itl": "inter-token latency: the gaps between successive tokens of a stream (all gaps of all requests)",
    "tpot": "time per output token, per request: (E2E - TTFT) / (output tokens - 1)",
    "e2e": "end to end: request sent -> last token",
}
"""The metrics a target may name, with what each measures (vLLM's names)."""

STATS: dict[str, str] = {"p50": "p50", "median": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "mean": "mean"}
"""Accepted statistic spellings → the stored one."""

PROBE_FACTOR = 2
"""Until a load misses the targets, the knee search measures this many times the last load that met them next."""

PLATEAU = 0.02
"""How much more than the knee's best repeat a lower load must deliver to stand for it (tune's noise floor)."""

DEFAULT_SLO = "ttft_p99=2000,itl_p99=100"
"""Targets used when none is given: an interactive chat server — the first token within 2 s and no stall
between tokens above 100 ms (10 tokens/s, faster than people read) for 99% of them."""


def parse_slo(text: str | None, *, option: str = "--slo") -> tuple[SloTarget, ...]:
    """``"ttft_p99=2000,itl_p99=50"`` → targets; ``None`` or empty → :data:`DEFAULT_SLO`'s.

    Raises:
        InputError: an unknown metric or statistic, a limit that is not a positive number, a metric given twice.
    """
    spec = text.strip() if text else ""
    targets: list[SloTarget] = []
    seen: set[str] = set()
    for raw in (spec or DEFAULT_SLO).split(","):
        item = raw.strip()
        if not item:
            raise InputError(option, f"an empty target in {spec!r}; write e.g. ttft_p99=2000,itl_p99=50")
        name, sep, value = item.partition("=")
        if not sep:
            raise InputError(option, f"{item!r} has no '=': write METRIC_STAT=MS, e.g. ttft_p99=2000")
        metric, _, stat = name.strip().lower().partition("_")
        if metric not in METRICS:
            raise InputError(option, f"unknown metric {metric!r} in {item!r}; known: {', '.join(METRICS)}")
        stat = stat or "p99"
        if stat not in STATS:
            raise InputError(option, f"unknown statistic {stat!r} in {item!r}; known: p50, p90, p95, p99, mean")
        try:
            limit = float(value.strip().removesuffix("ms"))
        except ValueError:
            raise InputError(option, f"{value.strip()!r} in {item!r} is not a number of milliseconds") from None
        if not math.isfinite(limit) or limit <= 0:
            raise InputError(option, f"the limit in {item!r} must be a positive number of milliseconds")
        key = f"{metric}_{STATS[stat]}"
        if key in seen:
            raise InputError(option, f"{key} is given twice")
        seen.add(key)
        targets.append(SloTarget(metric=metric, stat=STATS[stat], limit_ms=limit, definition=METRICS[metric]))
    return tuple(targets)


def option_past_stop(stopped: str | None, *, time_option: str = "--budget", each: str = "the") -> str | None:
    """What lets a knee search measure past where it stopped (``stopped``: the search's own sentence), as a hint:
    the option of its time budget (``time_option``), of its request budget, or ``--max-load`` when every load up
    to the limit met the targets; ``None`` for a stop no option moves (the server stopped answering, the bracket
    closed, the first load missed). ``each``: "the" search (``bench serve``) or "each" search (``tune``)."""
    text = stopped or ""
    if "time budget" in text:
        return f"{time_option} gives {each} search more time"
    if "request budget" in text:
        return f"--max-requests gives {each} search more requests"
    if text.startswith("every load up to"):
        return "--max-load lets the search go further"
    return None


def describe_slo(targets: tuple[SloTarget, ...] | list[SloTarget]) -> str:
    """``TTFT p99 <= 2000 ms, ITL p99 <= 100 ms``."""
    return ", ".join(f"{t.metric.upper()} {t.stat} <= {t.limit_ms:g} ms" for t in targets)


def loads_met(points: Sequence[ServePoint]) -> tuple[dict[float, list[ServePoint]], list[float]]:
    """The points judged against targets, by load, and the loads every one of whose points met them (lowest
    first)."""
    by_load: dict[float, list[ServePoint]] = {}
    for point in points:
        if point.slo is not None:
            by_load.setdefault(point.load, []).append(point)
    return by_load, sorted(load for load, ps in by_load.items() if all(p.slo is not None and p.slo.met for p in ps))


def delivered_by_load(points: Sequence[ServePoint]) -> list[tuple[float, float]]:
    """Each load whose points all met the targets, with the median of the output tokens/s they delivered (lowest
    load first; a load whose points recorded none is left out)."""
    by_load, met = loads_met(points)
    tokens = [(load, [t for p in by_load[load] if (t := p.output_tokens_per_s) is not None]) for load in met]
    return [(load, statistics.median(values)) for load, values in tokens if values]


def most_delivered(load: float, tokens: float, top: float,
                   delivered: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """The load that delivered the most tokens/s within the targets, and those tokens/s: the knee's (``load``,
    ``tokens``; ``top`` its best repeat), unless a lower load delivered more than ``top`` by over :data:`PLATEAU`.
    Past a point more streams can deliver fewer tokens and still meet the targets (the H100 MoE server: 17349 tok/s
    at 128 streams, 13506 at its knee of 256); within the margin throughput has levelled off, and the knee's load,
    more streams for as many tokens, stands."""
    best_load, best, bar = load, tokens, top * (1 + PLATEAU)
    for at, delivered_there in delivered:
        if at < load and delivered_there > bar and delivered_there > best:
            best_load, best = at, delivered_there
    return best_load, best


def next_probe(met: float, max_load: float | None) -> float | None:
    """The load the search measures after ``met`` while no load has missed: :data:`PROBE_FACTOR` times it, at most
    ``max_load``; ``None`` once ``met`` reached ``max_load``."""
    if max_load is not None and met >= max_load:
        return None
    probe = met * PROBE_FACTOR
    return min(probe, max_load) if max_load is not None else probe
