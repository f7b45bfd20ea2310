"""The server's own step time around a batch: ``/metrics`` histogram means between two scrapes, and the
production step of several unprofiled runs (their median, each run kept beside it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servescope.core.analysis import BatchStep, StepReference
from servescope.server.metrics import Snapshot, server_side

__all__ = ["ServerTiming", "after_profile_note", "batch_step", "median_run", "server_timing", "step_reference"]


@dataclass(frozen=True, kw_only=True)
class ServerTiming:
    """The server's own per-token latency over one batch: ``/metrics`` histogram means between two scrapes."""

    itl_ms: float | None  # inter-token latency: at a steady decode batch, one engine step
    tpot_ms: float | None  # per request (e2e - ttft) / (tokens - 1)
    itl_metric: str | None
    tpot_metric: str | None
    seconds: float  # the batch's wall time, client side

    def record(self) -> dict[str, Any]:
        return {"itl_ms": None if self.itl_ms is None else round(self.itl_ms, 4),
                "tpot_ms": None if self.tpot_ms is None else round(self.tpot_ms, 4),
                "itl_metric": self.itl_metric, "tpot_metric": self.tpot_metric, "seconds": round(self.seconds, 3)}


def server_timing(before: Snapshot | None, after: Snapshot | None, seconds: float) -> ServerTiming | None:
    """The server's own means between two ``/metrics`` scrapes around one batch; None where it keeps no such
    histogram."""
    side = server_side(before, after, [])
    if side.itl_ms_mean is None and side.tpot_ms_mean is None:
        return None
    return ServerTiming(itl_ms=side.itl_ms_mean, tpot_ms=side.tpot_ms_mean, itl_metric=side.itl_metric,
                        tpot_metric=side.tpot_metric, seconds=seconds)


def median_run(runs: list[ServerTiming]) -> ServerTiming | None:
    """The run whose inter-token latency is the median (the lower middle of an even count); None without one."""
    timed = sorted((r for r in runs if r.itl_ms is not None), key=lambda r: r.itl_ms or 0.0)
    return timed[(len(timed) - 1) // 2] if timed else None


def step_reference(timing: ServerTiming | None, runs: list[ServerTiming],
                   by_batch: dict[int, list[ServerTiming]] | None = None, *,
                   caveat: str | None = None) -> StepReference | None:
    """The production step a profile measured: the median run's inter-token latency, every run's beside it, and
    the same server's median step at each other batch it timed (``by_batch``: batch -> its runs); ``caveat``
    (the server was profiled before) closes its source."""
    if timing is None or timing.itl_ms is None:
        return None
    each = _runs_us(runs)
    others = tuple(step for step in (batch_step(b, r) for b, r in sorted((by_batch or {}).items())) if step)
    tail = f"; {caveat}" if caveat else ""
    if len(each) < 2:
        return StepReference(step_us=timing.itl_ms * 1000.0, other_batches=others,
                             source=f"the server's {timing.itl_metric} mean over the same batch run without the "
                                    f"profiler{tail}")
    return StepReference(step_us=timing.itl_ms * 1000.0, runs_us=each, other_batches=others,
                         source=f"the median of {len(each)} runs of the same batch without the profiler "
                                f"({min(each) / 1e3:.2f}–{max(each) / 1e3:.2f} ms), each the server's "
                                f"{timing.itl_metric} mean{tail}")


def batch_step(batch: int, runs: list[ServerTiming]) -> BatchStep | None:
    """The server's step at ``batch`` without the profiler: the median of ``runs``; None where none was timed."""
    median = median_run(runs)
    if median is None or median.itl_ms is None:
        return None
    each = _runs_us(runs)
    return BatchStep(batch=batch, step_us=median.itl_ms * 1000.0, runs_us=each if len(each) > 1 else ())


def _runs_us(runs: list[ServerTiming]) -> tuple[float, ...]:
    return tuple(round(r.itl_ms * 1000.0, 1) for r in runs if r.itl_ms is not None)


# After-runs slower than this share above the median before (and each slower than every run before) are the
# profile's lasting effect, not the runs' own movement.
LASTING = 0.05


def after_profile_note(before: list[ServerTiming], after: list[ServerTiming]) -> str | None:
    """What the runs after the profiled window say about the server it left behind; None without both."""
    was, now = median_run(before), median_run(after)
    if was is None or now is None or was.itl_ms is None or now.itl_ms is None or was.itl_ms <= 0:
        return None
    before_ms = [r.itl_ms for r in before if r.itl_ms is not None]
    after_ms = [r.itl_ms for r in after if r.itl_ms is not None]
    change = now.itl_ms / was.itl_ms - 1
    head = (f"after the profiled window the server's step was {now.itl_ms:.2f} ms, {change:+.0%} against "
            f"{was.itl_ms:.2f} ms before it")
    if change > LASTING and min(after_ms) > max(before_ms):
        return (f"{head}, every run slower: a vLLM server stays slower after a profile (PyTorch leaves its CUDA "
                f"profiling hooks attached, pytorch/pytorch#144455); restart it to get its speed back, and profile "
                f"a freshly started server to measure its production step")
    return (f"{head}: no lasting slowdown measured (a server profiled before this run would carry one in both: "
            f"profile a freshly started server for its production step)")
