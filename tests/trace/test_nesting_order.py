"""The order frames are nested in (by thread, then start, the outer one first where two start together) is the
order ``np.lexsort((-end, start, thread))`` gives, row for row (the independent route: numpy's own lexsort): on
made-up tables full of shared starts, where the tie order is tested (in the test data's traces a parent that
starts with its child already comes first), and on the cpu_ops of those traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.trace.classify.launch import _outer_first
from servescope.trace.read.trace_json import decode_trace

_DATA = Path(__file__).resolve().parents[1] / "data"

_ROW = st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(0, 4))  # thread, start, length: many ties


@settings(max_examples=500, deadline=None)
@given(st.lists(_ROW, max_size=80), st.booleans())
def test_the_order_is_lexsorts_on_made_up_tables(rows: list[tuple[int, int, int]], halves: bool) -> None:
    thread = np.array([r[0] for r in rows], dtype=np.int32)
    start = np.array([r[1] for r in rows], dtype=np.float64) / (2 if halves else 1)
    end = start + np.array([r[2] for r in rows], dtype=np.float64)
    assert _outer_first(thread, start, end).tolist() == np.lexsort((-end, start, thread)).tolist()


def _traces() -> list[Path]:
    found = sorted(p for p in _DATA.rglob("*.json*") if ".pt.trace." in p.name or p.name.endswith(".trace.json.gz"))
    return found[:12]


@pytest.mark.parametrize("path", _traces(), ids=lambda p: p.name)
def test_the_order_is_lexsorts_on_real_cpu_ops(path: Path) -> None:
    ops = decode_trace(path).cpu_ops
    end = ops.ts_us + ops.dur_us
    expected = np.lexsort((-end, ops.ts_us, ops.thread))
    assert _outer_first(ops.thread, ops.ts_us, end).tolist() == expected.tolist()
