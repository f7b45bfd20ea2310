"""GPU decode captures made on a lent H200 (`servescope capture decode`), checked against the profiler's totals.

Each ``*.truth.json`` beside a trace holds the per-kernel count and device time that the live
torch.profiler object reported during the capture (not read back from the exported JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"
TRUTHS = sorted(DATA.glob("*.truth.json"))


def _trace_for(truth: Path) -> Path:
    return truth.with_name(truth.name.replace(".truth.json", ".pt.trace.json.gz"))


def test_captures_are_present() -> None:
    assert len(TRUTHS) >= 6, f"expected the H200 captures (dense/moe × batch 1/16/64) in {DATA}"
    for truth in TRUTHS:
        assert _trace_for(truth).is_file(), truth


@pytest.mark.parametrize("truth_path", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_analysis_reproduces_the_profilers_own_totals(truth_path: Path) -> None:
    truth = json.loads(truth_path.read_text())
    doc = analyze(AnalyzeRequest(paths=[_trace_for(truth_path)]))
    got: dict[str, tuple[int, float]] = {}
    for k in doc.kernels:
        count, total = got.get(k.name, (0, 0.0))
        got[k.name] = (count + k.count, total + k.total_us)
    assert set(got) == set(truth["kernels"])
    for name, expected in truth["kernels"].items():
        count, total = got[name]
        assert count == expected["count"], name
        assert total == pytest.approx(expected["total_us"], rel=0.005, abs=0.01), name
    rank = doc.ranks[0]
    assert rank.work_kind == "device" and rank.step_source == "annotation"
    assert rank.phases["prefill"].steps == truth["steps"]["prefill"]
    assert rank.phases["decode"].steps == truth["steps"]["decode"]
    assert rank.phases["decode"].tokens_per_step == truth["batch"]
    device_total = sum(k.total_us for k in doc.kernels)
    other = sum(k.total_us for k in doc.kernels if k.category == "other")
    top_other = sorted((k for k in doc.kernels if k.category == "other"), key=lambda k: -k.total_us)[:5]
    assert other <= 0.05 * device_total, [k.name for k in top_other]
