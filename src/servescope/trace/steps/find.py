"""Find the steps of a trace and attribute each piece of work to the step that launched it.

Step formats are data (``servescope/data/steps.toml``, read by :mod:`servescope.trace.steps.formats`), tried in its
order, the engines' own markers first:

1. vLLM's per-step annotation ``execute_context_X(Y)_generation_Z(W)``: X prefill requests with Y tokens,
   Z decode requests with W tokens (newer vLLM writes ``execute_N_context_X(sqY…)_generation_Z(sqW…)``).
   It gives each step its phase: prefill, decode, mixed, or empty (a padding step with no requests).
   SGLang's ``step[DECODE bs=32]`` / ``step[PREFILL …]`` / ``step[EXTEND …]`` annotations likewise.
2. vLLM V1 builds that write no step annotation: the model runner's (else the worker's) ``execute_model``
   frames (python functions or CPU operators), one per engine step.
3. ``ProfilerStep#N`` ranges from ``torch.profiler.schedule``.
4. Without any: gaps, device activity split where the device sat idle longer than a threshold.

A step without a phase marker gets one from what it shows: the shape of the token ids its embedding lookup
read (``[batch, sequence]``: a sequence of one token is a decode step), else graph replays (engines replay
their captured graphs for decode batches; a step that runs outside them, where others replay, is a prefill
too large for the captured sizes; where some steps replay the whole forward as one graph, as vLLM does for
uniform decode batches, a step that replays it in pieces has prompt work: prefill, or prefill and decode
mixed, which only the engine's annotation tells apart); else ``unknown``.

Device work is attributed through its launch (:attr:`~servescope.trace.classify.work.Work.launch`): a kernel carries the
correlation id of the runtime call that launched it (``cudaLaunchKernel``; one ``cudaGraphLaunch`` for every
kernel of a graph replay), and that call lies inside the CPU-side step mark. Work on CPU threads (traces without
device events) is attributed by time: the step whose range contains the op's start.

A step is a :class:`~servescope.core.analysis.StepRow` from here to the document: recognised with its name,
phase and request mix (``start_us``/``span_us``: its mark's range), then measured by the breakdown.
"""

from __future__ import annotations

import statistics

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import StepRow
from servescope.trace.classify.work import Work
from servescope.trace.read.table import KIND_USER_ANNOTATION, TraceData
from servescope.trace.read.trace_json import read_op_inputs
from servescope.trace.steps.formats import StepFormat, step_formats

__all__ = ["PHASES", "Steps", "find_steps", "parse_vllm_step", "steps_by"]

PHASES = ("decode", "mixed", "prefill", "empty", "unknown")
_GRAPH_DECODE_SHARE = 0.5
_DEFAULT_GAP_FLOOR_US = 100.0
_GAP_MEDIAN_FACTOR = 20.0

_Mark = tuple[float, float, str]  # a marked range: start, end, name


class Steps(msgspec.Struct, frozen=True, kw_only=True):
    """The steps of one trace as recognised, their marks' exact ranges, and for each work row (in ``Work.rows``
    order) its step or -1.

    ``whole_window``: the steps' time is their marks' whole range, stretched over any of their device work
    outside it (the format's ``whole_window``: execute_model frames hold the engine's whole step).
    """

    source: str  # "annotation" | "execute_model" | "profiler_step" | "gaps" | "whole"
    steps: list[StepRow]
    start_us: npt.NDArray[np.float64]  # per step: its mark's range
    end_us: npt.NDArray[np.float64]
    step_of: npt.NDArray[np.int64]
    whole_window: bool = False
    gap_us: float | None = None
    graphs_by_default: bool = False  # the format's engine captures CUDA graphs by default (engines.toml)
    serves: str | None = None  # the serving engine whose step marks these are (steps.toml), if one
    # per step (StepRow.index): the device time of its work rows (step_of) replayed from CUDA/HIP graphs. The one
    # place a step's graph replay is decided: a step replays graphs where it is > 0 (facts, deployment and the
    # rules read it; the phases of unmarked steps follow its share of the step's work)
    graph_us: npt.NDArray[np.float64] = msgspec.field(default_factory=lambda: np.zeros(0))
    work_us: npt.NDArray[np.float64] = msgspec.field(default_factory=lambda: np.zeros(0))  # per step, all its work

    def replays_graphs(self, index: int) -> bool:
        """Whether step ``index`` replayed any of its work from a graph."""
        return index < len(self.graph_us) and bool(self.graph_us[index] > 0)


def parse_vllm_step(name: str) -> tuple[str, int, int | None, int, int | None] | None:
    """Phase and (prefill requests, prefill tokens, decode requests, decode tokens) of a vLLM step name.

    Example:
        >>> parse_vllm_step("execute_context_0(0)_generation_4(4)")
        ('decode', 0, 0, 4, 4)
    """
    parsed = step_formats().step("vllm").parse(name)
    if parsed is None:
        return None
    phase, counts = parsed
    return (phase, counts["prefill_requests"] or 0, counts["prefill_tokens"], counts["decode_requests"] or 0,
            counts["decode_tokens"])


def _cpu_annotations(data: TraceData) -> list[_Mark]:
    """The CPU-side annotations as (start, end, name), in start order (ties: trace order)."""
    table = data.annotations
    rows = np.flatnonzero(table.kind == KIND_USER_ANNOTATION)
    rows = rows[np.argsort(table.ts_us[rows], kind="stable")]
    names = data.names
    return [(ts, ts + dur, names[n]) for ts, dur, n in zip(table.ts_us[rows].tolist(), table.dur_us[rows].tolist(),
                                                          table.name[rows].tolist(), strict=True)]


def _frames(data: TraceData, fmt: StepFormat) -> list[_Mark]:
    """The python functions and CPU operators the format marks (only those ``prefer`` matches, where any)."""
    ids = np.array([i for i, name in enumerate(data.names) if fmt.pattern.search(name)], dtype=np.int32)
    if len(ids) == 0:
        return []
    found: list[_Mark] = []
    for table in (data.frames, data.cpu_ops):
        if len(table) == 0:
            continue
        rows = np.flatnonzero(np.isin(table.name, ids))
        found.extend((float(table.ts_us[r]), float(table.ts_us[r] + table.dur_us[r]), data.names[table.name[r]])
                     for r in rows.tolist())
    preferred = [f for f in found if fmt.prefer is not None and fmt.prefer.search(f[2])]
    return preferred or found


def _profiler_steps(data: TraceData, fmt: StepFormat, annotations: list[_Mark]) -> list[_Mark]:
    """``ProfilerStep#N`` ranges, written as user annotations or as CPU operators (older torch.profiler)."""
    marked = [a for a in annotations if fmt.pattern.search(a[2])]
    ops = data.cpu_ops
    marked += [(float(ops.ts_us[r]), float(ops.ts_us[r] + ops.dur_us[r]), data.names[int(ops.name[r])])
               for r in np.flatnonzero(data.step_markers).tolist()]
    return sorted(set(marked))


def _outermost(marks: list[_Mark]) -> list[_Mark]:
    """The marks not inside another (a worker's execute_model wraps the model runner's)."""
    out: list[_Mark] = []
    for mark in sorted(marks, key=lambda m: (m[0], -m[1])):
        if out and mark[0] >= out[-1][0] and mark[1] <= out[-1][1]:
            continue
        out.append(mark)
    return out


def _marks(data: TraceData, fmt: StepFormat, annotations: list[_Mark]) -> list[_Mark]:
    """Every range ``fmt`` marks in the trace, in step order."""
    if fmt.marker == "annotation":
        marks = [a for a in annotations if fmt.pattern.search(a[2])]
    elif fmt.marker == "frame":
        marks = _frames(data, fmt)
    else:
        marks = _profiler_steps(data, fmt, annotations)
    return _outermost(marks) if fmt.outermost else marks


def _recognised(fmt: StepFormat, marks: list[_Mark]) -> list[StepRow]:
    """One step per mark, with the phase and request counts its name tells (``start_us``/``span_us``: the
    mark's range, until the breakdown measures the step)."""
    steps = []
    for index, (start, end, name) in enumerate(marks):
        phase, counts = fmt.parse(name) or ("unknown", {})
        steps.append(StepRow(index=index, name=name, phase=phase, start_us=start, span_us=end - start, busy_us=0.0,
                             prefill_requests=counts.get("prefill_requests"),
                             prefill_tokens=counts.get("prefill_tokens"),
                             decode_requests=counts.get("decode_requests"), decode_tokens=counts.get("decode_tokens")))
    return steps


def _containing(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64],
                when: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Index of the window (sorted, non-overlapping) containing each time, or -1."""
    idx = np.searchsorted(starts, when, side="right") - 1
    ok = (idx >= 0) & (when <= ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1).astype(np.int64)


def _attribute(data: TraceData, work: Work, starts: npt.NDArray[np.float64],
               ends: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The step of each work row: the one whose range holds its launch (CPU operators: its start), or -1."""
    if work.kind == "cpu_op":
        return _containing(starts, ends, work.table.ts_us[work.rows])
    step_of = np.full(len(work.rows), -1, dtype=np.int64)
    launched = work.launch >= 0
    step_of[launched] = _containing(starts, ends, data.launches.ts_us[work.launch[launched]])
    return step_of


def _gap_steps(work: Work, gap_us: float | None) -> Steps:
    """Steps cut where the device sat idle longer than ``gap_us`` (``None``: picked from the trace)."""
    table = work.table
    start = table.ts_us[work.rows]
    end = start + table.dur_us[work.rows]
    if len(start) == 0:
        return Steps(source=step_formats().whole_source, steps=[], start_us=np.zeros(0), end_us=np.zeros(0),
                     step_of=np.zeros(0, dtype=np.int64), gap_us=gap_us)
    reach = np.maximum.accumulate(end)
    gaps = start[1:] - reach[:-1]
    if gap_us is None:
        positive = gaps[gaps > 0]
        median = float(statistics.median(positive.tolist())) if len(positive) else 0.0
        gap_us = max(_DEFAULT_GAP_FLOOR_US, _GAP_MEDIAN_FACTOR * median)
    cuts = np.flatnonzero(gaps > gap_us) + 1
    step_of = np.zeros(len(start), dtype=np.int64)
    step_of[cuts] = 1
    step_of = np.cumsum(step_of)
    bounds = np.concatenate(([0], cuts, [len(start)]))
    marks = [(float(start[lo]), float(reach[hi - 1]), f"gap-step {i}")
             for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]
    formats = step_formats()  # [fallback] in steps.toml
    graph, total, _ = _graph_replays(work, step_of, len(marks))
    return Steps(graph_us=graph, work_us=total,
                 source=formats.gaps_source if len(marks) > 1 else formats.whole_source,
                 steps=[StepRow(index=i, name=name, phase="unknown", start_us=s, span_us=e - s, busy_us=0.0)
                        for i, (s, e, name) in enumerate(marks)],
                 start_us=np.array([m[0] for m in marks]), end_us=np.array([m[1] for m in marks]),
                 step_of=step_of, gap_us=gap_us)


def steps_by(data: TraceData, work: Work, fmt: StepFormat, annotations: list[_Mark] | None = None) -> Steps | None:
    """The steps one format marks in the trace and the step of every work row, or None where it marks none
    (``annotations``: the trace's CPU annotations, when already listed)."""
    marks = _marks(data, fmt, annotations if annotations is not None else _cpu_annotations(data))
    if not marks:
        return None
    starts, ends = np.array([m[0] for m in marks]), np.array([m[1] for m in marks])
    step_of = _attribute(data, work, starts, ends)
    replays = _graph_replays(work, step_of, len(marks), data)
    steps = _with_phases(data, work, _recognised(fmt, marks), starts, ends, step_of, replays)
    return Steps(graph_us=replays[0], work_us=replays[1], source=fmt.step_source, steps=steps, start_us=starts,
                 end_us=ends, step_of=step_of,
                 whole_window=fmt.whole_window, graphs_by_default=fmt.graphs_by_default,
                 serves=None if fmt.shared_form is not None and all(fmt.shared_form.search(m[2]) for m in marks)
                 else fmt.serves)


def find_steps(data: TraceData, work: Work, *, gap_us: float | None = None) -> Steps:
    """Steps of one trace and the step of every work row: by the first format of ``steps.toml`` that marks any,
    else by idle gaps.

    Args:
        gap_us: idle time that separates steps in the gap fallback; ``None`` picks
            max(100 µs, 20 × the median idle gap) and records the value used.
    """
    annotations = _cpu_annotations(data)
    for fmt in step_formats().steps:
        found = steps_by(data, work, fmt, annotations)
        if found is not None:
            return found
    return _gap_steps(work, gap_us)


# The embedding lookup's token ids are [batch, sequence] in HF-style models: a sequence of one token is a decode
# step. Read (a second pass over the file) only for steps no marker gave a phase, in traces small enough.
_SHAPED_OPS = frozenset({"aten::embedding"})
_SHAPES_MAX_BYTES = 256 << 20


def _embedding_batches(data: TraceData, starts: npt.NDArray[np.float64],
                       ends: npt.NDArray[np.float64]) -> dict[int, tuple[int, int]]:
    """Step index -> (sequences, tokens per sequence) of the first 2-D token-id input its embedding read."""
    out: dict[int, tuple[int, int]] = {}
    if data.size_bytes > _SHAPES_MAX_BYTES or not any(n in _SHAPED_OPS for n in data.names):
        return out
    for _name, ts, _pid, _tid, dims in sorted(read_op_inputs(data.path, _SHAPED_OPS), key=lambda e: e[1]):
        ids = dims[1] if len(dims) > 1 else None
        if not (isinstance(ids, list) and len(ids) == 2 and all(isinstance(v, int) for v in ids)):
            continue
        at = _containing(starts, ends, np.array([ts]))[0]
        if at >= 0 and int(at) not in out:
            out[int(at)] = (ids[0], ids[1])
    return out


def _with_phases(data: TraceData, work: Work, steps: list[StepRow], starts: npt.NDArray[np.float64],
                 ends: npt.NDArray[np.float64], step_of: npt.NDArray[np.int64],
                 replays: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]],
                 ) -> list[StepRow]:
    """Phases for the steps no marker gave one, from the token ids' shape, else from graph replays."""
    if all(s.phase != "unknown" for s in steps):
        return steps
    batches = _embedding_batches(data, starts, ends)
    graph, total, launches = replays
    replay_share = np.divide(graph, total, out=np.zeros(len(steps)), where=total > 0)
    has_work = np.bincount(step_of[step_of >= 0], minlength=len(steps)) > 0 if len(step_of) else (
        np.zeros(len(steps), dtype=bool))
    any_graph = bool((replay_share >= _GRAPH_DECODE_SHARE).any())
    # vLLM's FULL_AND_PIECEWISE graphs: a uniform decode batch replays the whole forward as one graph; a step
    # with prompt work replays the per-layer pieces (many launches) with eager attention between them
    whole = (replay_share >= _GRAPH_DECODE_SHARE) & (launches == 1)
    pieces = launches > 1 if whole.any() else np.zeros(len(steps), dtype=bool)
    out: list[StepRow] = []
    for step in steps:
        if step.phase != "unknown":
            out.append(step)
        elif step.index in batches:
            sequences, length = batches[step.index]
            out.append(msgspec.structs.replace(step, phase="decode", decode_requests=sequences,
                                               decode_tokens=sequences) if length == 1 else
                       msgspec.structs.replace(step, phase="prefill", prefill_requests=sequences,
                                               prefill_tokens=sequences * length))
        elif pieces[step.index]:
            out.append(msgspec.structs.replace(step, phase="prefill"))
        elif replay_share[step.index] >= _GRAPH_DECODE_SHARE:
            out.append(msgspec.structs.replace(step, phase="decode"))
        elif any_graph and has_work[step.index] and replay_share[step.index] == 0:
            out.append(msgspec.structs.replace(step, phase="prefill"))
        else:
            out.append(step)
    return out


def _graph_replays(work: Work, step_of: npt.NDArray[np.int64], count: int, data: TraceData | None = None,
                   ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per step, the device time of its work replayed from CUDA/HIP graphs, its device work time, and (with
    ``data``) how many graph replays (distinct ``cudaGraphLaunch`` calls) launched it."""
    graph, total, launches = np.zeros(count), np.zeros(count), np.zeros(count, dtype=np.int64)
    if work.kind != "device" or len(work.rows) == 0:
        return graph, total, launches
    replayed = work.replayed
    if not replayed.any():
        return graph, total, launches
    ok = step_of >= 0
    total = np.bincount(step_of[ok], weights=work.dur_us[ok], minlength=count).astype(np.float64, copy=False)
    graph = np.bincount(step_of[ok & replayed], weights=work.dur_us[ok & replayed],
                        minlength=count).astype(np.float64, copy=False)
    if data is not None:
        pairs = np.unique(np.stack([step_of[ok & replayed], data.device.correlation[work.rows][ok & replayed]]),
                          axis=1)
        launches = np.bincount(pairs[0], minlength=count)
    return graph, total, launches
