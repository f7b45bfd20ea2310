"""Find the steps of a trace and attribute each piece of work to the step that launched it.

Step sources, tried in order (the engine's own markers first, gaps last):

1. vLLM's per-step annotation ``execute_context_X(Y)_generation_Z(W)``: X prefill requests with Y tokens,
   Z decode requests with W tokens (newer vLLM writes ``execute_N_context_X(sqY…)_generation_Z(sqW…)``).
   It gives each step its phase: prefill, decode, mixed, or empty (a padding step with no requests).
   SGLang's ``step[DECODE bs=32]`` / ``step[PREFILL …]`` / ``step[EXTEND …]`` annotations likewise.
2. vLLM V1 builds that write no step annotation: the model runner's (else the worker's) ``execute_model``
   frames (python functions or CPU operators), one per engine step.
3. ``ProfilerStep#N`` ranges from ``torch.profiler.schedule``.
4. Gaps: device activity split where the device sat idle longer than a threshold.

A step without a phase marker gets one from what it shows: the shape of the token ids its embedding lookup
read (``[batch, sequence]``: a sequence of one token is a decode step), else graph replays (engines replay
their captured graphs for decode batches; a step that runs outside them, where others replay, is a prefill
too large for the captured sizes; where some steps replay the whole forward as one graph, as vLLM does for
uniform decode batches, a step that replays it in pieces has prompt work: prefill, or prefill and decode
mixed, which only the engine's annotation tells apart); else ``unknown``.

Device work is attributed through correlation ids: a kernel carries the id of the runtime call that
launched it (``cudaLaunchKernel``; one ``cudaGraphLaunch`` for every kernel of a graph replay), and that
call lies inside the CPU-side step annotation. Work on CPU threads (traces without device events) is
attributed by time: the step whose range contains the op's start.
"""

from __future__ import annotations

import re
import statistics

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.trace.decode import read_op_inputs
from servescope.trace.facts import graph_replayed
from servescope.trace.table import KIND_USER_ANNOTATION, STEP_MARKER_PREFIX, TraceData
from servescope.trace.work import Work

__all__ = ["PHASES", "Step", "Steps", "find_steps", "parse_vllm_step"]

PHASES = ("decode", "mixed", "prefill", "empty", "unknown")
_VLLM_STEP = re.compile(
    r"^execute(?:_\d+)?_context_(?P<x>\d+)\((?P<y>[^)]*)\)_generation_(?P<z>\d+)\((?P<w>[^)]*)\)"
)
_LEADING_COUNT = re.compile(r"^(?:sq)?(\d+)")
_SGLANG_STEP = re.compile(r"^step\[(?P<mode>[A-Z_]+)(?: bs=(?P<bs>\d+))?")
_SGLANG_PHASES = {"DECODE": "decode", "PREFILL": "prefill", "EXTEND": "prefill", "MIXED": "mixed", "IDLE": "empty"}
_EXECUTE_MODEL = re.compile(r"(?:^|[:\s.])execute_model$")
_MODEL_RUNNER = re.compile(r"model_runner", re.IGNORECASE)
_GRAPH_DECODE_SHARE = 0.5
_DEFAULT_GAP_FLOOR_US = 100.0
_GAP_MEDIAN_FACTOR = 20.0


class Step(msgspec.Struct, frozen=True):
    """One step: where it came from, its phase and request mix, and its CPU-side window when known."""

    index: int
    name: str
    phase: str
    start_us: float
    end_us: float
    prefill_requests: int | None = None
    prefill_tokens: int | None = None
    decode_requests: int | None = None
    decode_tokens: int | None = None
    # The step's time is its CPU window (stretched over any of its device work outside it), not only the
    # device span: the engine's whole step, host preparation and sampling included (execute_model frames).
    whole_window: bool = False


class Steps(msgspec.Struct, frozen=True):
    """The steps of one trace and, for each work row (in ``Work.rows`` order), its step or -1."""

    source: str  # "annotation" | "execute_model" | "profiler_step" | "gaps" | "whole"
    steps: list[Step]
    step_of: npt.NDArray[np.int64]
    gap_us: float | None = None


def _count(text: str) -> int | None:
    match = _LEADING_COUNT.match(text)
    return int(match.group(1)) if match else None


def parse_vllm_step(name: str) -> tuple[str, int, int | None, int, int | None] | None:
    """Phase and (prefill requests, prefill tokens, decode requests, decode tokens) of a vLLM step name.

    Example:
        >>> parse_vllm_step("execute_context_0(0)_generation_4(4)")
        ('decode', 0, 0, 4, 4)
    """
    match = _VLLM_STEP.match(name)
    if match is None:
        return None
    prefills, decodes = int(match["x"]), int(match["z"])
    if prefills and decodes:
        phase = "mixed"
    elif prefills:
        phase = "prefill"
    elif decodes:
        phase = "decode"
    else:
        phase = "empty"
    return phase, prefills, _count(match["y"]), decodes, _count(match["w"])


def _cpu_annotations(data: TraceData) -> list[tuple[float, float, str]]:
    """The CPU-side annotations as (start, end, name), in start order (ties: trace order)."""
    table = data.annotations
    rows = np.flatnonzero(table.kind == KIND_USER_ANNOTATION)
    rows = rows[np.argsort(table.ts_us[rows], kind="stable")]
    names = data.names
    return [(ts, ts + dur, names[n]) for ts, dur, n in zip(table.ts_us[rows].tolist(), table.dur_us[rows].tolist(),
                                                          table.name[rows].tolist(), strict=True)]


def _annotation_steps(annotations: list[tuple[float, float, str]]) -> tuple[str, list[Step]]:
    steps: list[Step] = []
    for start, end, name in annotations:
        parsed = parse_vllm_step(name)
        if parsed is not None:
            phase, x, y, z, w = parsed
            steps.append(Step(len(steps), name, phase, start, end, x, y, z, w))
    if steps:
        return "annotation", steps
    for start, end, name in annotations:
        sglang = _SGLANG_STEP.match(name)
        if sglang is not None:
            phase = _SGLANG_PHASES.get(sglang["mode"], "unknown")
            batch = int(sglang["bs"]) if sglang["bs"] else None
            steps.append(Step(len(steps), name, phase, start, end,
                              decode_requests=batch if phase == "decode" else None,
                              prefill_requests=batch if phase == "prefill" else None))
    return ("annotation", _outermost(steps)) if steps else ("", [])


def _profiler_steps(data: TraceData, annotations: list[tuple[float, float, str]]) -> list[Step]:
    """``ProfilerStep#N`` ranges, written as user annotations or as CPU operators (older torch.profiler)."""
    marked = [a for a in annotations if a[2].startswith(STEP_MARKER_PREFIX)]
    ops = data.cpu_ops
    marked += [(float(ops.ts_us[r]), float(ops.ts_us[r] + ops.dur_us[r]), data.names[int(ops.name[r])])
               for r in np.flatnonzero(data.step_markers).tolist()]
    return [Step(i, name, "unknown", start, end) for i, (start, end, name) in enumerate(sorted(set(marked)))]


def _outermost(steps: list[Step]) -> list[Step]:
    """The steps not inside another (a worker's execute_model wraps the model runner's), renumbered."""
    out: list[Step] = []
    for step in sorted(steps, key=lambda s: (s.start_us, -s.end_us)):
        if out and step.start_us >= out[-1].start_us and step.end_us <= out[-1].end_us:
            continue
        out.append(step)
    return [Step(i, s.name, s.phase, s.start_us, s.end_us, s.prefill_requests, s.prefill_tokens,
                 s.decode_requests, s.decode_tokens, s.whole_window) for i, s in enumerate(out)]


def _execute_model_steps(data: TraceData) -> list[Step]:
    """vLLM V1 engine steps from ``execute_model`` frames: the model runner's, else the worker's."""
    ids = np.array([i for i, name in enumerate(data.names) if _EXECUTE_MODEL.search(name)], dtype=np.int32)
    if len(ids) == 0:
        return []
    found: list[tuple[float, float, str]] = []
    for table in (data.frames, data.cpu_ops):
        if len(table) == 0:
            continue
        rows = np.flatnonzero(np.isin(table.name, ids))
        found.extend((float(table.ts_us[r]), float(table.ts_us[r] + table.dur_us[r]), data.names[table.name[r]])
                     for r in rows.tolist())
    runner = [f for f in found if _MODEL_RUNNER.search(f[2])]
    chosen = runner or found
    steps = [Step(0, name, "unknown", start, end, whole_window=True) for start, end, name in chosen]
    return _outermost(steps)


def _containing(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64],
                when: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Index of the window (sorted, non-overlapping) containing each time, or -1."""
    idx = np.searchsorted(starts, when, side="right") - 1
    ok = (idx >= 0) & (when <= ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1).astype(np.int64)


def _attribute(data: TraceData, work: Work, steps: list[Step]) -> npt.NDArray[np.int64]:
    starts = np.array([s.start_us for s in steps])
    ends = np.array([s.end_us for s in steps])
    table = work.table
    if work.kind == "cpu_op":
        return _containing(starts, ends, table.ts_us[work.rows])
    launches = data.launches
    order = np.argsort(launches.correlation, kind="stable")
    sorted_corr = launches.correlation[order]
    corr = table.correlation[work.rows]
    pos = np.clip(np.searchsorted(sorted_corr, corr), 0, max(len(sorted_corr) - 1, 0))
    if len(sorted_corr) == 0:
        return np.full(len(work.rows), -1, dtype=np.int64)
    found = (sorted_corr[pos] == corr) & (corr >= 0)
    launch_ts = launches.ts_us[order[pos]]
    step_of = _containing(starts, ends, launch_ts)
    return np.where(found, step_of, -1).astype(np.int64)


def _gap_steps(work: Work, gap_us: float | None) -> tuple[str, list[Step], npt.NDArray[np.int64], float | None]:
    table = work.table
    start = table.ts_us[work.rows]
    end = start + table.dur_us[work.rows]
    if len(start) == 0:
        return "whole", [], np.zeros(0, dtype=np.int64), gap_us
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
    steps = [
        Step(i, f"gap-step {i}", "unknown", float(start[lo]), float(reach[hi - 1]))
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    ]
    return ("gaps" if len(steps) > 1 else "whole"), steps, step_of, gap_us


def find_steps(data: TraceData, work: Work, *, gap_us: float | None = None) -> Steps:
    """Steps of one trace and the step of every work row.

    Args:
        gap_us: idle time that separates steps in the gap fallback; ``None`` picks
            max(100 µs, 20 × the median idle gap) and records the value used.
    """
    annotations = _cpu_annotations(data)
    source, steps = _annotation_steps(annotations)
    if not steps:
        source, steps = "execute_model", _execute_model_steps(data)
    if not steps:
        source, steps = "profiler_step", _profiler_steps(data, annotations)
    if steps:
        step_of = _attribute(data, work, steps)
        return Steps(source, _with_phases(data, work, steps, step_of), step_of)
    source, steps, step_of, used_gap = _gap_steps(work, gap_us)
    return Steps(source, steps, step_of, used_gap)


# The embedding lookup's token ids are [batch, sequence] in HF-style models: a sequence of one token is a decode
# step. Read (a second pass over the file) only for steps no marker gave a phase, in traces small enough.
_SHAPED_OPS = frozenset({"aten::embedding"})
_SHAPES_MAX_BYTES = 256 << 20


def _embedding_batches(data: TraceData, steps: list[Step]) -> dict[int, tuple[int, int]]:
    """Step index -> (sequences, tokens per sequence) of the first 2-D token-id input its embedding read."""
    out: dict[int, tuple[int, int]] = {}
    if data.size_bytes > _SHAPES_MAX_BYTES or not any(n in _SHAPED_OPS for n in data.names):
        return out
    starts = np.array([s.start_us for s in steps])
    ends = np.array([s.end_us for s in steps])
    for _name, ts, _pid, _tid, dims in sorted(read_op_inputs(data.path, _SHAPED_OPS), key=lambda e: e[1]):
        ids = dims[1] if len(dims) > 1 else None
        if not (isinstance(ids, list) and len(ids) == 2 and all(isinstance(v, int) for v in ids)):
            continue
        at = _containing(starts, ends, np.array([ts]))[0]
        if at >= 0 and int(at) not in out:
            out[int(at)] = (ids[0], ids[1])
    return out


def _with_phases(data: TraceData, work: Work, steps: list[Step], step_of: npt.NDArray[np.int64]) -> list[Step]:
    """Phases for the steps no marker gave one, from the token ids' shape, else from graph replays."""
    if all(s.phase != "unknown" for s in steps):
        return steps
    batches = _embedding_batches(data, steps)
    replay_share, launches = _graph_replays(data, work, step_of, len(steps))
    has_work = np.bincount(step_of[step_of >= 0], minlength=len(steps)) > 0 if len(step_of) else (
        np.zeros(len(steps), dtype=bool))
    any_graph = bool((replay_share >= _GRAPH_DECODE_SHARE).any())
    # vLLM's FULL_AND_PIECEWISE graphs: a uniform decode batch replays the whole forward as one graph; a step
    # with prompt work replays the per-layer pieces (many launches) with eager attention between them
    whole = (replay_share >= _GRAPH_DECODE_SHARE) & (launches == 1)
    pieces = launches > 1 if whole.any() else np.zeros(len(steps), dtype=bool)
    out: list[Step] = []
    for step in steps:
        phase, prefills, prefill_tokens, decodes, decode_tokens = (
            step.phase, step.prefill_requests, step.prefill_tokens, step.decode_requests, step.decode_tokens)
        if phase == "unknown":
            if step.index in batches:
                sequences, length = batches[step.index]
                if length == 1:
                    phase, decodes, decode_tokens = "decode", sequences, sequences
                else:
                    phase, prefills, prefill_tokens = "prefill", sequences, sequences * length
            elif pieces[step.index]:
                phase = "prefill"
            elif replay_share[step.index] >= _GRAPH_DECODE_SHARE:
                phase = "decode"
            elif any_graph and has_work[step.index] and replay_share[step.index] == 0:
                phase = "prefill"
        out.append(Step(step.index, step.name, phase, step.start_us, step.end_us, prefills, prefill_tokens,
                        decodes, decode_tokens, step.whole_window))
    return out


def _graph_replays(data: TraceData, work: Work, step_of: npt.NDArray[np.int64],
                   count: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per step, the share of its device work time replayed from CUDA/HIP graphs, and how many graph replays
    (distinct ``cudaGraphLaunch`` calls) launched it."""
    share, launches = np.zeros(count), np.zeros(count, dtype=np.int64)
    if work.kind != "device" or len(work.rows) == 0:
        return share, launches
    replayed = graph_replayed(data)[work.rows]
    if not replayed.any():
        return share, launches
    ok = step_of >= 0
    total = np.bincount(step_of[ok], weights=work.dur_us[ok], minlength=count)
    graph = np.bincount(step_of[ok & replayed], weights=work.dur_us[ok & replayed], minlength=count)
    share = np.divide(graph, total, out=share, where=total > 0)
    pairs = np.unique(np.stack([step_of[ok & replayed], data.device.correlation[work.rows][ok & replayed]]), axis=1)
    return share, np.bincount(pairs[0], minlength=count)
