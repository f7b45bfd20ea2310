"""`capture decode` says what its ms/step is: an unprofiled round, not the profiled one `analyze` measures."""

from __future__ import annotations

import json

import pytest

from servescope.bench.capture_decode import STEP_TIME_MEANING, summary_line
from tracefiles import ROOT

TRUTH = ROOT / "tests" / "data" / "h200" / "dense_b16_rank0.truth.json"


def test_the_summary_line_says_its_step_time_is_unprofiled() -> None:
    truth = json.loads(TRUTH.read_text(encoding="utf-8"))  # a real capture's record, made on the H200
    line = summary_line(truth)
    assert f"decode {truth['wall_ms_per_decode_step']:.3f} ms/step unprofiled" in line
    assert "profiled round" in STEP_TIME_MEANING and "analyze" in STEP_TIME_MEANING


def test_the_profiled_step_analyze_reports_is_not_the_unprofiled_one() -> None:
    """The capture's own trace: analyze's decode step (profiled) against the capture's unprofiled median."""
    from servescope.trace.analyze import AnalyzeRequest, analyze

    truth = json.loads(TRUTH.read_text(encoding="utf-8"))
    doc = analyze(AnalyzeRequest(paths=[TRUTH.with_name(truth["trace_file"])]))
    profiled_ms = doc.ranks[0].phases["decode"].step_us.mean / 1e3
    assert profiled_ms != pytest.approx(truth["wall_ms_per_decode_step"], rel=0.01)  # why the line must say which
