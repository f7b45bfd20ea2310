"""Steps whose device work overlaps: measured at their cadence, never summed as if serial.

A step's span is the first to the last device operation it launched. Where the device runs behind the host's
marks (the host filled a queue ahead; a copy stream keeps time while the compute stream lags), a step's work is
still running when the next step's begins, and the spans overlap: added up they exceed the time that passed, and
the idle taken from them is the overlap's, not the device's. HTA's A100 training trace is such a case: its
ProfilerSteps are ~216 ms apart, each launches work spanning ~368 ms.

Then each step's window runs from its first device operation to the next step's first (the cadence); the last
step's window, with no next step to end it, is the longer of its mark and the median of the other windows (never
beyond its own work's span; the work it launched may run on past it), and its
busy time is the union of all device work inside the window, whichever step launched it. Per-category time
stays with the step that launched the work. The tolerance (``[overlap]`` in ``steps.toml``) keeps a copy that
finishes a little late from counting.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import StepOverlap, StepRow

__all__ = ["clipped_union_us", "follow_cadence", "union_us"]


def union_us(start: npt.NDArray[np.float64], end: npt.NDArray[np.float64]) -> float:
    """Total length of the union of intervals sorted by start, in µs."""
    if len(start) == 0:
        return 0.0
    reach = np.maximum.accumulate(end)
    new_segment = np.ones(len(start), dtype=bool)
    new_segment[1:] = start[1:] > reach[:-1]
    seg_first = np.flatnonzero(new_segment)
    seg_last = np.append(seg_first[1:] - 1, len(start) - 1)
    return float(np.sum(reach[seg_last] - start[seg_first]))


def clipped_union_us(start: npt.NDArray[np.float64], end: npt.NDArray[np.float64], lo: float, hi: float) -> float:
    """Length of the union of the intervals (sorted by start) inside [lo, hi], in µs."""
    if hi <= lo or len(start) == 0:
        return 0.0
    first = int(np.searchsorted(start, hi, side="left"))
    s, e = np.maximum(start[:first], lo), np.minimum(end[:first], hi)
    keep = e > s
    return union_us(s[keep], e[keep])


def follow_cadence(rows: list[StepRow], mark_us: list[float], start: npt.NDArray[np.float64],
                   end: npt.NDArray[np.float64], tolerance: float) -> tuple[list[StepRow], StepOverlap | None]:
    """The steps measured at their cadence where their work spans overlap (see the module), with what overlapped;
    ``rows`` unchanged and None where they do not.

    Args:
        rows: the steps as their own work measured them (``start_us``/``span_us``: first to last operation).
        mark_us: per row, the length of its step mark (the last step's window is at least this long).
        start, end: every device operation of the rank (any step's or none), sorted by start.
        tolerance: an overlap below this share of the step's span is none.
    """
    if len(rows) < 2:
        return rows, None
    order = sorted(range(len(rows)), key=lambda i: rows[i].start_us)
    overlaps = [rows[a].start_us + rows[a].span_us - rows[b].start_us for a, b in zip(order, order[1:], strict=False)]
    counted = [o for a, o in zip(order, overlaps, strict=False) if o > tolerance * rows[a].span_us]
    if not counted:
        return rows, None
    out = list(rows)
    windows = [rows[b].start_us - rows[a].start_us for a, b in zip(order, order[1:], strict=False)]
    for k, i in enumerate(order):
        row = rows[i]
        lo = row.start_us
        last = lo + min(max(mark_us[i], float(np.median(windows))), row.span_us)
        hi = rows[order[k + 1]].start_us if k + 1 < len(order) else last
        out[i] = msgspec.structs.replace(row, span_us=hi - lo, busy_us=clipped_union_us(start, end, lo, hi),
                                         gap_before_us=0.0 if k else row.gap_before_us)
    note = StepOverlap(pairs=len(counted), max_overlap_us=max(counted),
                       work_span_us=sum(r.span_us for r in rows) / len(rows),
                       cadence_us=sum(r.span_us for r in out) / len(out))
    return out, note
