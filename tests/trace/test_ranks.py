"""Files become ranks of one run; the front end is never rank 0; ranks are compared."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.steps.ranks import rank_from_name
from tracefiles import TRACES


@pytest.mark.parametrize(("name", "rank"), [
    ("rank3.1733.pt.trace.json.gz", 3), ("trace_rank-12.json", 12), ("worker_rank7.json.gz", 7),
    ("tp1_pp0_rank5.pt.trace.json.gz", 5), ("1733-TP-2.trace.json.gz", 2),
    ("host_123.async_llm.99.pt.trace.json.gz", None),
    ("plain.json", None),
])
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank



@pytest.mark.needs_shared
def test_tp2_files_group_into_ranks_with_communication(tmp_path: Path) -> None:
    for f in (TRACES / "vllm-cpu").glob("tp2_*"):
        shutil.copy(f, tmp_path / f.name)
    doc = analyze(AnalyzeRequest(paths=[tmp_path]))
    roles = {Path(t.path).name: (t.role, t.rank) for t in doc.traces}
    assert roles["tp2_b4_16tok_frontend.async_llm.pt.trace.json.gz"] == ("frontend", None)
    assert roles["tp2_b4_16tok_rank0.pt.trace.json.gz"] == ("worker", 0)
    assert roles["tp2_b4_16tok_rank1.pt.trace.json.gz"] == ("worker", 1)
    assert [r.rank for r in doc.ranks] == [0, 1]
    for rank in doc.ranks:
        decode = rank.phases["decode"]
        assert decode.categories["comm.all_reduce"].total_us > 0
    across = {c.phase: c for c in doc.across_ranks}["decode"]
    assert across.ranks == [0, 1]
    assert across.steps_compared == 15
    for r in ("0", "1"):
        assert 0 <= across.collective_wait_us_per_step[r] <= across.collective_us_per_step[r]


@pytest.mark.needs_shared
def test_same_rank_twice_is_an_input_error() -> None:
    with pytest.raises(InputError, match="rank 0 again"):
        analyze(AnalyzeRequest(paths=[TRACES / "vllm-cpu" / "tp1_b1_32tok_rank0.pt.trace.json.gz",
                                      TRACES / "vllm-cpu" / "tp2_b4_16tok_rank0.pt.trace.json.gz"]))


@pytest.mark.needs_shared
def test_front_end_alone_is_an_input_error() -> None:
    with pytest.raises(InputError, match="front-end"):
        analyze(AnalyzeRequest(paths=[TRACES / "vllm-cpu" / "tp2_b4_16tok_frontend.async_llm.pt.trace.json.gz"]))
