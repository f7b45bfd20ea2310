"""Busy time is a union, idle is what is left, shares add up, against brute-force routes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.steps.cadence import union_us
from tracefiles import TRACES


def _brute_union(intervals: list[tuple[float, float]]) -> float:
    covered = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                covered += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        covered += cur_end - cur_start
    return covered


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), max_size=40))
def test_union_matches_brute_force(raw: list[tuple[int, int]]) -> None:
    intervals = sorted((float(s), float(s + d)) for s, d in raw)
    start = np.array([i[0] for i in intervals])
    end = np.array([i[1] for i in intervals])
    assert union_us(start, end) == pytest.approx(_brute_union(intervals))


@pytest.mark.needs_shared
@pytest.mark.parametrize("name", ["hta/a100_8rank_rank3_nccl.json.gz", "vllm-cpu/tp2_b4_16tok_rank0.pt.trace.json.gz",
                                  "tracelens/h100_qwen1.5-0.5b_inference.json.gz"])
def test_phase_invariants(name: str) -> None:
    doc = analyze(AnalyzeRequest(paths=[TRACES / name]))
    for rank in doc.ranks:
        for phase, stats in rank.phases.items():
            assert sum(c.share for c in stats.categories.values()) == pytest.approx(1.0), phase
            assert stats.busy_us_per_step <= stats.step_us.mean + 1e-6
            assert stats.idle_us_per_step == pytest.approx(stats.step_us.mean - stats.busy_us_per_step)
            steps = [s for s in rank.steps if s.phase == phase]
            assert len(steps) == stats.steps
            assert stats.device_us_per_step == pytest.approx(
                sum(sum(s.categories.values()) for s in steps) / len(steps))
            for cat in stats.categories.values():
                assert cat.mean_call_us * cat.calls_per_step == pytest.approx(cat.per_step_us)
