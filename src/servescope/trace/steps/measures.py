"""Each step's measures, computed once per rank and kept in its context: what every rule reads of a step.

One record a step, in the breakdown's order: its phase, the work rows it launched, its span, busy and idle time,
its largest idle gap (and where in the step it began), the host's gap before it, and the device time it replayed
from graphs against all its work. Each is decided where it is made and only kept here: the rows and the graph time
by the steps (``Steps.step_of``, ``Steps.graph_us``: by launch), the span, busy time and gap before by the
breakdown (the measured :class:`~servescope.core.analysis.StepRow`), the idle gaps here, over the work that ran in
the step's window. The facts, the rules, the advice and the deployment's graph evidence read these records instead
of measuring a step again.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import StepRow
from servescope.trace.classify.work import Work
from servescope.trace.steps.find import Steps

__all__ = ["StepMeasure", "StepMeasures", "measure_steps"]


class StepMeasure(msgspec.Struct, frozen=True):
    """One step's measures (µs; ``largest_gap_at_us`` from the step's start)."""

    step: int  # StepRow.index
    phase: str
    span_us: float
    idle_us: float  # span less busy time (the whole span where no work ran in its window)
    largest_gap_us: float
    largest_gap_at_us: float
    graph_us: float = 0.0  # device time this step replayed from graphs (0: the step ran without any)
    rows: int = 0  # work rows the step launched (Steps.step_of)
    busy_us: float = 0.0  # union of its work (the breakdown's)
    work_us: float = 0.0  # device time of the work it launched (graphs' and the rest)
    gap_before_us: float | None = None  # host time since the previous step ended (None: the first)


class StepMeasures(msgspec.Struct, frozen=True):
    """A rank's step measures, one per measured step in order, with what the rules ask of them by phase."""

    steps: tuple[StepMeasure, ...] = ()

    def of_phase(self, phase: str) -> list[StepMeasure]:
        """The steps of ``phase``, in order."""
        return [m for m in self.steps if m.phase == phase]

    @property
    def replayed_steps(self) -> frozenset[int]:
        """The steps (``StepRow.index``) that replayed any of their work from graphs."""
        return frozenset(m.step for m in self.steps if m.graph_us > 0)

    def graph_share(self, phase: str) -> float | None:
        """The share of ``phase``'s device work its steps replayed from graphs (None: the rank has no such step)."""
        picked = self.of_phase(phase)
        if not picked:
            return None
        work = sum(m.work_us for m in picked)
        return sum(m.graph_us for m in picked) / work if work > 0 else 0.0


def _largest_gap(start: npt.NDArray[np.float64], end: npt.NDArray[np.float64], lo: float,
                 hi: float) -> tuple[float, float]:
    """(largest idle gap, its start from ``lo``) of work intervals (some; sorted by start) in the window [lo, hi]."""
    reach = np.maximum.accumulate(np.minimum(end, hi))
    # gaps: window start → first op, between op i's reach and op i+1's start, last reach → window end
    before = np.concatenate(([lo], reach))
    after = np.concatenate((np.maximum(start, lo), [hi]))
    gaps = np.maximum(after - before, 0.0)
    k = int(np.argmax(gaps))
    return float(gaps[k]), float(before[k] - lo)


def measure_steps(work: Work, found: Steps, steps: Sequence[StepRow]) -> StepMeasures:
    """The measures of ``steps`` (the breakdown's, measured) of a rank whose work is ``work`` and whose steps, as
    found, are ``found``."""
    start = work.table.ts_us[work.rows]
    end = start + work.table.dur_us[work.rows]  # whole durations: a CPU operator's gaps are around all of it
    launched = np.bincount(found.step_of[found.step_of >= 0], minlength=len(found.steps)) if len(found.step_of) \
        else np.zeros(len(found.steps), dtype=np.int64)
    out = []
    for row in steps:
        lo_row = int(np.searchsorted(start, row.start_us, side="left"))
        hi_row = int(np.searchsorted(start, row.start_us + row.span_us, side="right"))
        ran = hi_row > lo_row  # any work in the step's window (else the whole span is one gap)
        gap, at = _largest_gap(start[lo_row:hi_row], end[lo_row:hi_row], row.start_us,
                               row.start_us + row.span_us) if ran else (row.span_us, 0.0)
        i = row.index
        out.append(StepMeasure(
            step=i, phase=row.phase, span_us=row.span_us,
            idle_us=max(row.span_us - row.busy_us, 0.0) if ran else row.span_us,
            largest_gap_us=gap, largest_gap_at_us=at,
            graph_us=float(found.graph_us[i]) if i < len(found.graph_us) else 0.0,
            rows=int(launched[i]) if i < len(launched) else 0, busy_us=row.busy_us,
            work_us=float(found.work_us[i]) if i < len(found.work_us) else 0.0, gap_before_us=row.gap_before_us))
    return StepMeasures(tuple(out))
