"""Facts about how a rank's trace ran, which findings check before they advise anything.

The analysis document holds shares per category; some questions need the raw intervals instead:

* **graph replays**: a device operation launched by a runtime ``cudaGraphLaunch`` / ``hipGraphLaunch`` was
  replayed from a CUDA/HIP graph (:attr:`~servescope.trace.classify.work.Work.replayed`). Its share of the device time,
  for the whole rank and per phase, says whether the engine already uses graphs there. Which steps replayed
  graphs, and how much, is decided once, by the steps (``Steps.graph_us``: the work each step launched), and kept
  in each step's measures (:mod:`servescope.trace.steps.measures`), which the rules and the deployment read.
* **graph capture**: a kernel launched between a runtime ``cudaStreamBeginCapture`` / ``hipStreamBeginCapture``
  and its ``EndCapture`` on the same thread is recorded into a graph, not run: a trace of an engine's start-up
  (or a tool's capture pass) holds such launches and few kernels. Their count against the kernels that ran says
  whether the trace shows served steps at all.
* **idle gaps**: a step's idle time is its span less the union of its work. Whether that idle is a steady
  state (many short host-side gaps in every step: launch bound) or one long gap (a host pause before one
  big prefill) needs the largest single gap of each step, which only the intervals give: measured once with the
  step's other measures (:class:`~servescope.trace.steps.measures.StepMeasure`).

Everything here is vectorised over the rank's work (:class:`~servescope.trace.classify.work.Work`, selected once).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from servescope.core.analysis import StepRow
from servescope.trace.classify.work import Work, select_work
from servescope.trace.read.table import KIND_KERNEL, TraceData, distinct_ids
from servescope.trace.steps.find import Steps, find_steps
from servescope.trace.steps.measures import StepMeasures, measure_steps

__all__ = ["RankFacts", "rank_facts"]


class RankFacts(msgspec.Struct, frozen=True):
    rank: int
    graph_replay_share: float  # share of the rank's device time launched by graph replays
    graph_captures: int = 0  # stream captures the trace records (BeginCapture … EndCapture)
    captured_launches: int = 0  # kernel launches inside them: recorded into a graph, not run
    kernels_run: int = 0  # kernels the device ran
    # each step's measures (rows, busy, idle gaps, graph time, phase), made once with the rank's context: the
    # steps that replayed graphs, each phase's graph share and idle gaps are read from here
    measures: StepMeasures = msgspec.field(default_factory=StepMeasures)


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


def rank_facts(data: TraceData, rank: int, steps: list[StepRow], work: Work | None = None,
               found: Steps | None = None, measures: StepMeasures | None = None) -> RankFacts:
    """Graph replays, graph captures and the step measures of one rank, over the steps the breakdown measured.

    ``work``: the rank's work as the analysis selected it (selected from ``data`` when not given); ``found``: its
    steps as :func:`~servescope.trace.steps.find.find_steps` found them (found again when not given); ``measures``:
    the steps' measures kept in the rank's context (measured from those when not given).
    """
    work = work if work is not None else select_work(data)
    if measures is None:
        measures = measure_steps(work, found if found is not None else find_steps(data, work), steps)
    start = work.table.ts_us[work.rows]
    dur = (start + work.table.dur_us[work.rows]) - start  # as the step windows reach: whole durations
    total = float(dur.sum())
    share = float(dur[work.replayed].sum()) / total if total > 0 else 0.0
    captures, captured = _captures(data)
    return RankFacts(rank=rank, graph_replay_share=share, measures=measures, graph_captures=captures,
                     captured_launches=captured, kernels_run=int(np.count_nonzero(data.device.kind == KIND_KERNEL)))
