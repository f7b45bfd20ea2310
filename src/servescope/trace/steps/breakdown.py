"""Where a step's time goes, per rank and phase: busy time, idle time and time per category.

Definitions (all per step, then averaged over the steps of a phase):

* **span**: on a GPU trace, from the first to the last device operation attributed to the step; on a
  trace whose work runs on CPU threads, the step annotation's own range.
* **busy**: the union of the step's work intervals (overlapping kernels on several streams count once).
* **idle**: span − busy: the device waited for the host (launch- or CPU-bound time).
* **device time**: the plain sum of the step's work durations (can exceed busy when streams overlap);
  category shares are fractions of it. On CPU traces each operator counts its self time, so device time
  equals busy time there.
* **µs per output token**: total span of the phase's steps / output tokens they produced, counting one
  token per request in the step (vLLM's Z decode requests plus X prefills, which emit their first
  token unless the prefill is chunked) — a throughput view; a request's own TPOT is about one step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import (
    BASES,
    CategoryStats,
    DeviceTotal,
    KernelRow,
    PhaseStats,
    StepOverlap,
    StepRow,
    Summary,
)
from servescope.trace.classify.precision import Precision, phase_quant, precision_of
from servescope.trace.classify.taxonomy import Taxonomy
from servescope.trace.classify.work import Work
from servescope.trace.classify.work_category import CaptureReference, Classified, classify_work, first_most
from servescope.trace.read.table import KIND_NAMES, TraceData, distinct_ids
from servescope.trace.steps.cadence import follow_cadence, union_us
from servescope.trace.steps.collectives import phase_collectives
from servescope.trace.steps.find import PHASES, Steps
from servescope.trace.steps.formats import step_formats

__all__ = ["RankBreakdown", "StepComm", "break_down"]


class StepComm(msgspec.Struct, frozen=True):
    """The collective operations of one step, in start order (for comparing ranks)."""

    start_us: npt.NDArray[np.float64]
    dur_us: npt.NDArray[np.float64]


class RankBreakdown(msgspec.Struct, frozen=True):
    phases: dict[str, PhaseStats]
    steps: list[StepRow]
    step_comm: list[StepComm]  # parallel to ``steps``
    kernels: list[KernelRow]
    device_totals: dict[str, DeviceTotal]
    unattributed_us: float
    basis_share: dict[str, float]  # share of the work time decided by each basis
    overlap: StepOverlap | None = None  # the steps' work overlapped: measured at their cadence (trace.cadence)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if len(values) else 0.0


def _phase_stats(rows: list[StepRow], counts: list[dict[str, int]], device_us: list[float],
                 categories: list[str]) -> PhaseStats:
    n = len(rows)
    spans = [r.span_us for r in rows]
    total_device = sum(device_us)
    cats: dict[str, CategoryStats] = {}
    for name in categories:
        total = sum(r.categories.get(name, 0.0) for r in rows)
        calls = sum(c.get(name, 0) for c in counts)
        if calls == 0:
            continue
        cats[name] = CategoryStats(
            total_us=total,
            share=total / total_device if total_device else 0.0,
            per_step_us=total / n,
            calls_per_step=calls / n,
            mean_call_us=total / calls,
        )
    cats = dict(sorted(cats.items(), key=lambda item: -item[1].total_us))
    known = [r for r in rows if r.decode_requests is not None]
    produced = sum((r.decode_requests or 0) + (r.prefill_requests or 0) for r in known)
    has_tokens = len(known) == n and produced > 0
    prompt = [r.prefill_tokens for r in rows if r.prefill_tokens is not None]
    prompt_per_step = sum(prompt) / n if len(prompt) == n and sum(prompt) > 0 else None
    return PhaseStats(
        steps=n,
        step_us=Summary(mean=sum(spans) / n, median=_median(spans)),
        busy_us_per_step=sum(r.busy_us for r in rows) / n,
        idle_us_per_step=sum(r.span_us - r.busy_us for r in rows) / n,
        device_us_per_step=total_device / n,
        tokens_per_step=produced / n if has_tokens else None,
        us_per_output_token=sum(spans) / produced if has_tokens else None,
        categories=cats,
        prompt_tokens_per_step=prompt_per_step,
    )


def break_down(data: TraceData, work: Work, steps: Steps, taxonomy: Taxonomy, *, rank: int,
               capture: CaptureReference | None = None) -> RankBreakdown:
    """Per-step and per-phase breakdown of one rank's work, plus its kernel table and device totals.

    ``capture``: the graph-capture trace's launches, for the kernels this trace replays from graphs.
    """
    categories = list(taxonomy.categories)
    table, rows = work.table, work.rows
    start = table.ts_us[rows]
    end = start + table.dur_us[rows]
    dur = work.dur_us
    kinds = table.kind[rows]
    names = table.name[rows]
    classified = classify_work(data, work, taxonomy, capture)
    precision = precision_of(data, work, taxonomy, classified, capture)
    cat = classified.category
    is_comm = np.array([taxonomy.is_communication(c) for c in categories], dtype=bool)[cat] if len(cat) else (
        np.zeros(0, dtype=bool))

    step_rows: list[StepRow] = []
    step_comm: list[StepComm] = []
    step_counts: list[dict[str, int]] = []
    step_device: list[float] = []
    by_step = np.argsort(steps.step_of, kind="stable")  # keeps start order within a step
    bounds = np.searchsorted(steps.step_of[by_step], np.arange(len(steps.steps) + 1))
    previous_end: float | None = None
    for step in steps.steps:
        sel = by_step[bounds[step.index] : bounds[step.index + 1]]
        s, e = start[sel], end[sel]
        mark_start, mark_end = float(steps.start_us[step.index]), float(steps.end_us[step.index])
        if work.kind == "device":
            if len(sel) == 0:
                continue  # a CPU-side step that launched no device work
            first, last = float(s.min()), float(e.max())
            if steps.whole_window:
                first, last = min(first, mark_start), max(last, mark_end)
            span_start, span = first, last - first
        else:
            span_start, span = mark_start, mark_end - mark_start
        per_cat = np.bincount(cat[sel], weights=dur[sel], minlength=len(categories))
        per_count = np.bincount(cat[sel], minlength=len(categories))
        comm_sel = sel[is_comm[sel]]
        gap_before = span_start - previous_end if previous_end is not None else None
        previous_end = span_start + span
        # the recognised step, measured: its name, phase and request mix as the marker told them
        step_rows.append(msgspec.structs.replace(
            step, start_us=span_start, span_us=span, busy_us=union_us(s, e),
            categories={categories[i]: float(v) for i, v in enumerate(per_cat) if per_count[i]},
            gap_before_us=max(gap_before, 0.0) if gap_before is not None else None,
        ))
        step_counts.append({categories[i]: int(c) for i, c in enumerate(per_count) if c})
        step_device.append(float(dur[sel].sum()))
        step_comm.append(StepComm(start[comm_sel], dur[comm_sel]))

    overlap = None
    if work.kind == "device":
        order = np.argsort(start, kind="stable")
        marks = [float(steps.end_us[r.index] - steps.start_us[r.index]) for r in step_rows]
        step_rows, overlap = follow_cadence(step_rows, marks, start[order], end[order],
                                            step_formats().overlap_tolerance)
    phases: dict[str, PhaseStats] = {}
    collectives = phase_collectives(data, work, cat, categories, taxonomy.table, steps.step_of, step_rows)
    for phase in PHASES:
        picked = [i for i, r in enumerate(step_rows) if r.phase == phase]
        if picked:
            stats = _phase_stats([step_rows[i] for i in picked], [step_counts[i] for i in picked],
                                 [step_device[i] for i in picked], categories)
            quant = _quant(data, names, dur, cat, categories, precision, steps.step_of,
                           [step_rows[i].index for i in picked], sum(step_device[i] for i in picked))
            phases[phase] = msgspec.structs.replace(stats, **quant, collectives=collectives.get(phase, {}))

    kernels = _kernel_rows(data, names, kinds, classified, dur, categories, rank)
    totals: dict[str, DeviceTotal] = {}
    for kind_id in distinct_ids(kinds).tolist():
        mask = kinds == kind_id
        totals[KIND_NAMES[kind_id]] = DeviceTotal(count=int(mask.sum()), total_us=float(dur[mask].sum()))
    unattributed = float(dur[steps.step_of < 0].sum()) if len(steps.step_of) else 0.0
    by_basis = np.bincount(classified.basis, weights=dur, minlength=len(BASES)) if len(dur) else np.zeros(len(BASES))
    total = float(by_basis.sum())
    basis_share = {b: float(v) / total for b, v in zip(BASES, by_basis.tolist(), strict=True) if total and v}
    return RankBreakdown(phases, step_rows, step_comm, kernels, totals, unattributed, basis_share, overlap)


def _quant(data: TraceData, names: npt.NDArray[np.int32], dur: npt.NDArray[np.float64], cat: npt.NDArray[np.int32],
           categories: list[str], precision: Precision, step_of: npt.NDArray[np.int64], picked: list[int],
           device_us: float) -> dict[str, Any]:
    """The quantization / cast fields of one phase (steps ``picked``): its rows with a precision role, summed."""
    marked = precision.role != 0
    if not marked.any():
        return {}
    in_phase = np.isin(step_of, picked)
    rows = np.flatnonzero(marked & in_phase)
    if len(rows) == 0:
        return {}
    fused = precision.fused[rows]
    d = dur[rows]
    by_role = np.bincount(precision.role[rows], weights=d, minlength=len(precision.roles) + 1)
    per_name = np.bincount(names[rows], weights=d)
    top = int(np.argmax(per_name))
    top_cat = categories[int(cat[rows[names[rows] == top][0]])]
    return phase_quant(device_us, len(picked), float(d[~fused].sum()), float(d[fused].sum()),
                       {r: float(by_role[i + 1]) for i, r in enumerate(precision.roles)},
                       (data.names[top], top_cat, float(per_name[top])))


def _kernel_rows(data: TraceData, names: npt.NDArray[np.int32], kinds: npt.NDArray[np.int8],
                 classified: Classified, dur: npt.NDArray[np.float64], categories: list[str],
                 rank: int) -> list[KernelRow]:
    """One row per (name, kind, category, basis), its launching frame the one that decided most of its calls."""
    if len(names) == 0:
        return []
    cat, basis = classified.category, classified.basis
    key = ((names.astype(np.int64) * 8 + kinds.astype(np.int64)) * 256 + cat.astype(np.int64)) * 8 + basis
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=dur)
    counts = np.bincount(inverse)
    launch_op: dict[int, str] = {}
    framed = np.flatnonzero(classified.frame >= 0)
    if len(framed):  # per row group, the frame that decided most of its rows (ties: the first seen)
        groups, frames = first_most(inverse.ravel()[framed].astype(np.int64),
                                    classified.frame[framed].astype(np.int64), np.ones(len(framed)))
        launch_op = {g: classified.frame_names[f] for g, f in zip(groups.tolist(), frames.tolist(), strict=True)}
    out = [
        KernelRow(rank=rank, name=data.names[int(names[f])], category=categories[int(cat[f])],
                  kind=KIND_NAMES[int(kinds[f])], count=int(counts[i]), total_us=float(totals[i]),
                  basis=BASES[int(basis[f])], launch_op=launch_op.get(i))
        for i, f in enumerate(first.tolist())
    ]
    out.sort(key=lambda k: -k.total_us)
    return out
