"""Steps whose device work overlaps are measured at their cadence, never summed as if serial (issue 37).

HTA's A100 training trace: its ProfilerSteps are ~216 ms apart, but the work each launches spans ~368 ms (the
compute stream runs ~160 ms behind the host's marks). The expected figures come from the trace read with plain
``json``: the marks, each kernel's launch (correlation id → runtime call inside a mark) and the union of all
device work over each step's window (its first device operation to the next step's).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from servescope.core.analysis import AnalysisDoc
from servescope.report.summary import render_summary
from servescope.trace.analyze import AnalyzeRequest, analyze
from tracefiles import TRACES, load_events

OVERLAPPING = TRACES / "hta" / "a100_16rank_rank0_training_overlapping_steps.json.gz"
SERIAL = TRACES / "hta" / "nccl_allreduce_2rank_rank0.json.gz"
_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
SERVING_FLAGS = ("--async-scheduling", "--enforce-eager", "--disable-custom-all-reduce", "custom all-reduce",
                 "vLLM", "SGLang", "--max-cudagraph-capture-size")


def _union(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= reach:
            continue
        total += e - max(s, reach)
        reach = e
    return total


def _independent(path: Path) -> dict[str, Any]:
    """The marks, each step's device work (by its launch inside the mark) and the device's timeline."""
    events = load_events(path)
    marks = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                   if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"))
    launch_at = {e["args"]["correlation"]: float(e["ts"]) for e in events
                 if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    device = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), e) for e in events
              if e.get("cat") in _DEVICE and e.get("ph") == "X"]
    per_step: list[list[tuple[float, float]]] = [[] for _ in marks]
    for s, end, e in device:
        at = launch_at.get(e.get("args", {}).get("correlation"))
        for i, (lo, hi) in enumerate(marks):
            if at is not None and lo <= at <= hi:
                per_step[i].append((s, end))
    return {"marks": marks, "per_step": per_step, "device": [(s, e) for s, e, _ in device]}


@pytest.fixture(scope="module")
def overlapping() -> tuple[AnalysisDoc, dict[str, Any]]:
    return analyze(AnalyzeRequest(paths=[OVERLAPPING])), _independent(OVERLAPPING)


@pytest.mark.needs_shared
def test_overlapping_steps_follow_the_cadence(overlapping: tuple[AnalysisDoc, dict[str, Any]]) -> None:
    doc, ind = overlapping
    marks, per_step = ind["marks"], ind["per_step"]
    spans = [max(e for _, e in w) - min(s for s, _ in w) for w in per_step]
    firsts = [min(s for s, _ in w) for w in per_step]
    cadence = [b - a for a, b in zip(firsts, firsts[1:], strict=False)]
    # the premise: each step's work spans far more than the time between steps (they overlap)
    assert min(spans) > 1.5 * max(cadence)
    mark_cadence = statistics.mean(b[0] - a[0] for a, b in zip(marks, marks[1:], strict=False))
    (rank,) = doc.ranks
    (phase,) = rank.phases.values()
    # the step time is the cadence (within 3% of the marks' own spacing), not the ~368 ms work span
    assert phase.step_us.mean == pytest.approx(mark_cadence, rel=0.03)
    assert phase.step_us.mean < 0.7 * statistics.mean(spans)
    # never summed as if serial: the steps' time adds up to no more than the time that passed
    steps = sorted(rank.steps, key=lambda r: r.start_us)
    assert sum(r.span_us for r in steps) <= steps[-1].start_us + steps[-1].span_us - steps[0].start_us + 1.0
    # the idle over the windows between consecutive steps' first operations: all device work in each, unioned
    windows = list(zip(firsts, firsts[1:], strict=False))
    busy = [_union([(max(s, lo), min(e, hi)) for s, e in ind["device"] if e > lo and s < hi]) for lo, hi in windows]
    ours = {round(r.start_us): r for r in steps}
    for (lo, hi), b in zip(windows, busy, strict=True):
        row = ours[round(lo)]
        assert row.span_us == pytest.approx(hi - lo, abs=1.0)
        assert row.busy_us == pytest.approx(b, rel=1e-6, abs=1.0)
    note = rank.steps_overlap
    assert note is not None and note.pairs == len(cadence)
    assert note.work_span_us == pytest.approx(statistics.mean(spans), rel=1e-6)
    assert note.max_overlap_us == pytest.approx(max(a + s - b for a, s, b in zip(firsts, spans, firsts[1:],
                                                                                 strict=False)), rel=1e-6)


@pytest.mark.needs_shared
def test_overlapping_steps_are_said_and_get_no_host_bound_or_serving_advice(
        overlapping: tuple[AnalysisDoc, dict[str, Any]]) -> None:
    doc, _ = overlapping
    ids = {f.id for f in doc.findings}
    assert "steps_overlap" in ids
    assert "launch_bound" not in ids  # the host launched the work ~160 ms before it ran: the idle is not its
    assert all(v.kind != "host" for v in doc.verdicts)
    for f in doc.findings:
        assert not any(flag in f.message for flag in SERVING_FLAGS), (f.id, f.message)
    console = Console(width=80, record=True, color_system=None)
    render_summary(doc, console)
    assert "the steps overlap" in console.export_text()


@pytest.mark.needs_shared
def test_steps_that_do_not_overlap_keep_their_work_spans() -> None:
    doc = analyze(AnalyzeRequest(paths=[SERIAL]))
    ind = _independent(SERIAL)
    spans = [max(e for _, e in w) - min(s for s, _ in w) for w in ind["per_step"] if w]
    (rank,) = doc.ranks
    assert rank.steps_overlap is None
    assert sorted(r.span_us for r in rank.steps) == pytest.approx(sorted(spans), abs=1.0)
