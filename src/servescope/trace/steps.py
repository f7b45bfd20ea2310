"""Find the steps of a trace and attribute each piece of work to the step that launched it.

Step sources, tried in order:

1. vLLM's per-step annotation ``execute_context_X(Y)_generation_Z(W)``: X prefill requests with Y tokens,
   Z decode requests with W tokens (newer vLLM writes ``execute_N_context_X(sqY…)_generation_Z(sqW…)``).
   It gives each step its phase: prefill, decode, mixed, or empty (a padding step with no requests).
2. ``ProfilerStep#N`` ranges from ``torch.profiler.schedule``; phase ``unknown``.
3. Gaps: device activity split where the device sat idle longer than a threshold; phase ``unknown``.

Device work is attributed through correlation ids: a kernel carries the id of the runtime call that
launched it (``cudaLaunchKernel``; one ``cudaGraphLaunch`` for every kernel of a graph replay), and that
call lies inside the CPU-side step annotation. Work on CPU threads (traces without device events) is
attributed by time: the step whose range contains the op's start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servescope.trace.reader import Annotation, TraceData
from servescope.trace.work import Work

__all__ = ["PHASES", "Step", "Steps", "find_steps", "parse_vllm_step"]

PHASES = ("decode", "mixed", "prefill", "empty", "unknown")
_VLLM_STEP = re.compile(
    r"^execute(?:_\d+)?_context_(?P<x>\d+)\((?P<y>[^)]*)\)_generation_(?P<z>\d+)\((?P<w>[^)]*)\)"
)
_LEADING_COUNT = re.compile(r"^(?:sq)?(\d+)")
_DEFAULT_GAP_FLOOR_US = 100.0
_GAP_MEDIAN_FACTOR = 20.0


@dataclass(frozen=True, slots=True)
class Step:
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


@dataclass(frozen=True, slots=True)
class Steps:
    """The steps of one trace and, for each work row (in ``Work.rows`` order), its step or -1."""

    source: str  # "annotation" | "profiler_step" | "gaps" | "whole"
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


def _annotation_steps(annotations: list[Annotation]) -> tuple[str, list[Step]]:
    cpu = sorted((a for a in annotations if not a.on_gpu), key=lambda a: a.ts_us)
    steps: list[Step] = []
    for ann in cpu:
        parsed = parse_vllm_step(ann.name)
        if parsed is not None:
            phase, x, y, z, w = parsed
            end = ann.ts_us + ann.dur_us
            steps.append(Step(len(steps), ann.name, phase, ann.ts_us, end, x, y, z, w))
    if steps:
        return "annotation", steps
    for ann in cpu:
        if ann.name.startswith("ProfilerStep#"):
            steps.append(Step(len(steps), ann.name, "unknown", ann.ts_us, ann.ts_us + ann.dur_us))
    return ("profiler_step", steps) if steps else ("", [])


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
        median = float(np.median(positive)) if len(positive) else 0.0
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
    source, steps = _annotation_steps(data.annotations)
    if steps:
        return Steps(source, steps, _attribute(data, work, steps))
    source, steps, step_of, used_gap = _gap_steps(work, gap_us)
    return Steps(source, steps, step_of, used_gap)
