"""Facts about how a rank's trace ran, which findings check before they advise anything.

The analysis document holds shares per category; some questions need the raw intervals instead:

* **graph replays**: a device operation launched by a runtime ``cudaGraphLaunch`` / ``hipGraphLaunch`` was
  replayed from a CUDA/HIP graph (:attr:`~servescope.trace.work.Work.replayed`). Its share of the device time,
  for the whole rank and per phase, says whether the engine already uses graphs there. Which steps replayed
  graphs, and how much, is decided once, by the steps (``Steps.graph_us``: the work each step launched); the facts
  keep it (``replayed_steps``, ``StepGap.graph_us``) and the rules and the deployment read it from here.
* **graph capture**: a kernel launched between a runtime ``cudaStreamBeginCapture`` / ``hipStreamBeginCapture``
  and its ``EndCapture`` on the same thread is recorded into a graph, not run: a trace of an engine's start-up
  (or a tool's capture pass) holds such launches and few kernels. Their count against the kernels that ran says
  whether the trace shows served steps at all.
* **idle gaps**: a step's idle time is its span less the union of its work. Whether that idle is a steady
  state (many short host-side gaps in every step: launch bound) or one long gap (a host pause before one
  big prefill) needs the largest single gap of each step, which only the intervals give.

Everything here is vectorised over the rank's work (:class:`~servescope.trace.work.Work`, selected once); one
Python iteration per step.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import StepRow
from servescope.trace.steps import Steps, find_steps
from servescope.trace.table import KIND_KERNEL, TraceData, distinct_ids
from servescope.trace.work import Work, select_work

__all__ = ["RankFacts", "StepGap", "rank_facts"]


class StepGap(msgspec.Struct, frozen=True):
    """The idle time of one step and its largest single gap (µs, the gap's start from the step's start)."""

    step: int  # StepRow.index
    phase: str
    span_us: float
    idle_us: float
    largest_gap_us: float
    largest_gap_at_us: float
    graph_us: float = 0.0  # device time this step replayed from graphs (0: the step ran without any)


class RankFacts(msgspec.Struct, frozen=True):
    rank: int
    graph_replay_share: float  # share of the rank's device time launched by graph replays
    phase_graph_share: dict[str, float] = msgspec.field(default_factory=dict)  # the same, within each phase's steps
    gaps: dict[str, list[StepGap]] = msgspec.field(default_factory=dict)  # per phase, one per step
    graph_captures: int = 0  # stream captures the trace records (BeginCapture … EndCapture)
    captured_launches: int = 0  # kernel launches inside them: recorded into a graph, not run
    kernels_run: int = 0  # kernels the device ran
    # the steps (StepRow.index) that replayed graphs, as the steps decided it (Steps.graph_us: by launch)
    replayed_steps: frozenset[int] = frozenset()


_BEGIN = re.compile(r"^(cuda|hip)StreamBeginCapture")
_END = re.compile(r"^(cuda|hip)StreamEndCapture")
_LAUNCH = re.compile(r"^(cuda|cu|hip|hipExt|hipModule)(Module)?LaunchKernel|^(cuda|cu|hip)LaunchCooperativeKernel")


def _captures(data: TraceData) -> tuple[int, int]:
    """(stream captures, kernel launches inside them) of the trace's runtime calls, window by window per thread."""
    calls = data.launches
    if not len(calls):
        return 0, 0
    kinds = {i: ("begin" if _BEGIN.match(n) else "end" if _END.match(n) else "launch" if _LAUNCH.match(n) else None)
             for i, n in ((int(i), data.names[int(i)]) for i in distinct_ids(calls.name))}
    if "begin" not in kinds.values():
        return 0, 0
    open_at: dict[int, bool] = {}
    captures = launches = 0
    for row in np.argsort(calls.ts_us, kind="stable"):
        kind, thread = kinds[int(calls.name[row])], int(calls.thread[row])
        if kind == "begin":
            open_at[thread] = True
            captures += 1
        elif kind == "end":
            open_at[thread] = False
        elif kind == "launch" and open_at.get(thread):
            launches += 1
    return captures, launches


def _step_gap(start: npt.NDArray[np.float64], end: npt.NDArray[np.float64], row: StepRow,
              graph_us: float) -> StepGap:
    """Idle and largest gap of the work intervals (sorted by start) within ``row``'s window."""
    lo, hi = row.start_us, row.start_us + row.span_us
    if len(start) == 0:
        return StepGap(row.index, row.phase, row.span_us, row.span_us, row.span_us, 0.0, graph_us)
    reach = np.maximum.accumulate(np.minimum(end, hi))
    # gaps: window start → first op, between op i's reach and op i+1's start, last reach → window end
    before = np.concatenate(([lo], reach))
    after = np.concatenate((np.maximum(start, lo), [hi]))
    gaps = np.maximum(after - before, 0.0)
    k = int(np.argmax(gaps))
    return StepGap(row.index, row.phase, row.span_us, max(row.span_us - row.busy_us, 0.0), float(gaps[k]),
                   float(before[k] - lo), graph_us)


def rank_facts(data: TraceData, rank: int, steps: list[StepRow], work: Work | None = None,
               found: Steps | None = None) -> RankFacts:
    """Graph replays and idle gaps of one rank, over the steps the breakdown found (their windows).

    ``work``: the rank's work as the analysis selected it (selected from ``data`` when not given); ``found``: its
    steps as :func:`~servescope.trace.steps.find_steps` found them (found again when not given), whose
    ``graph_us`` decides which steps replayed graphs and how much (by launch, as the breakdown files the work).
    """
    work = work if work is not None else select_work(data)
    found = found if found is not None else find_steps(data, work)
    start = work.table.ts_us[work.rows]
    end = start + work.table.dur_us[work.rows]  # whole durations: a CPU operator's gaps are around all of it
    replayed = work.replayed
    dur = end - start
    total = float(dur.sum())
    share = float(dur[replayed].sum()) / total if total > 0 else 0.0

    gaps: dict[str, list[StepGap]] = {}
    graph_us: dict[str, float] = {}
    work_us: dict[str, float] = {}
    for row in steps:
        lo = int(np.searchsorted(start, row.start_us, side="left"))
        hi = int(np.searchsorted(start, row.start_us + row.span_us, side="right"))
        s, e = start[lo:hi], end[lo:hi]
        step_graph_us = float(found.graph_us[row.index]) if row.index < len(found.graph_us) else 0.0
        gaps.setdefault(row.phase, []).append(_step_gap(s, e, row, step_graph_us))
        graph_us[row.phase] = graph_us.get(row.phase, 0.0) + step_graph_us
        work_us[row.phase] = work_us.get(row.phase, 0.0) + (
            float(found.work_us[row.index]) if row.index < len(found.work_us) else 0.0)
    phase_share = {p: (graph_us[p] / work_us[p] if work_us[p] > 0 else 0.0) for p in work_us}
    captures, captured = _captures(data)
    return RankFacts(rank=rank, graph_replay_share=share, phase_graph_share=phase_share, gaps=gaps,
                     replayed_steps=frozenset(r.index for r in steps if found.replays_graphs(r.index)),
                     graph_captures=captures, captured_launches=captured,
                     kernels_run=int(np.count_nonzero(data.device.kind == KIND_KERNEL)))
