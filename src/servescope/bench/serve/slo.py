"""One ``bench serve`` point judged against latency targets: met or not, attainment, goodput.

Two questions, two routes:

- **Did the point meet the targets?** Each target's statistic over all of the point's requests (ITL: over
  all gaps of all requests) is at most its limit, and no request failed.
- **Which requests were served well?** A request is *good* when each of its own figures is within every
  target's limit: its TTFT, TPOT and E2E; for ITL its own gaps at the target's statistic (``itl_p99``: the 99th
  percentile of that request's gaps). Attainment is the share of requests that were good (failed ones count
  as not good); goodput their number per second and their output tokens per second over the point's span.
  This is the per-request definition of vLLM's ``--goodput`` and guidellm's ``slo_attainment``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servescope.bench.serve.streams import Sample
from servescope.core.serve import PointSlo, SloTarget, TargetCheck

__all__ = ["judge_slo", "request_values", "statistic"]

_PERCENTILE = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def statistic(values: Sequence[float], stat: str) -> float | None:
    """``stat`` (p50/p90/p95/p99/mean) of ``values``; ``None`` when there are none."""
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    if stat == "mean":
        return float(arr.mean())
    return float(np.percentile(arr, _PERCENTILE[stat]))


def request_values(sample: Sample, target: SloTarget) -> float | None:
    """One request's own figure for ``target`` (ms): its TTFT, TPOT, E2E, or its gaps at the target's stat."""
    if target.metric == "ttft":
        return None if sample.ttft_s is None else sample.ttft_s * 1e3
    if target.metric == "e2e":
        return None if sample.e2e_s is None else sample.e2e_s * 1e3
    if target.metric == "tpot":
        return sample.tpot_ms()
    return statistic(sample.gaps_ms(), target.stat)


def _point_values(ok: list[Sample], target: SloTarget) -> list[float]:
    if target.metric == "itl":
        return [gap for s in ok for gap in s.gaps_ms()]
    return [v for v in (request_values(s, target) for s in ok) if v is not None]


def _good(sample: Sample, targets: Sequence[SloTarget]) -> bool:
    if sample.error is not None:
        return False
    for target in targets:
        value = request_values(sample, target)
        # a request too short to have the figure (one token: no gap, no TPOT) is not held against it
        if value is not None and value > target.limit_ms:
            return False
    return sample.ttft_s is not None


def judge_slo(samples: Sequence[Sample], targets: Sequence[SloTarget], span_s: float) -> PointSlo:
    """The point of ``samples`` (lasting ``span_s``) against ``targets``."""
    ok = [s for s in samples if s.error is None]
    checks: list[TargetCheck] = []
    for target in targets:
        value = statistic(_point_values(ok, target), target.stat)
        checks.append(TargetCheck(target=target.name, value_ms=value, limit_ms=target.limit_ms,
                                  met=value is not None and value <= target.limit_ms))
    missed = [c.target for c in checks if not c.met]
    if len(ok) < len(samples):
        missed.append("errors")
    good = [s for s in samples if _good(s, targets)]
    attainment = len(good) / len(samples) if samples else None
    tokens = sum(s.output_tokens or 0 for s in good)
    rate = len(good) / span_s if span_s > 0 else None
    return PointSlo(met=not missed and bool(ok), checks=checks, attainment=attainment,
                    goodput_requests_per_s=rate, goodput_tokens_per_s=tokens / span_s if span_s > 0 else None,
                    missed_by=missed)
