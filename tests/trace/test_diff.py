"""diff: two runs side by side, figures checked against the traces' own events."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze, example_trace_dir
from servescope.trace.diff import diff_analyses, diff_paths
from tracefiles import TRACES, load_events

DECODE = re.compile(r"^execute_context_0\(0\)_generation_[1-9]\d*\(")


def _decode_allreduce_per_step(path: Path) -> float:
    """µs of _C::shm_allreduce per decode step, from the raw events (a leaf op: self time = duration)."""
    events = load_events(path)
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events
               if e.get("cat") == "user_annotation" and DECODE.match(e["name"])]
    total = sum(e["dur"] for e in events if e.get("name") == "_C::shm_allreduce"
                and any(lo <= e["ts"] <= hi for lo, hi in windows))
    return total / len(windows)


@pytest.fixture(scope="module")
def tp2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp2")
    for f in (TRACES / "vllm-cpu").glob("tp2_*"):
        shutil.copy(f, out / f.name)
    return out


@pytest.mark.needs_shared
def test_diff_figures_come_from_each_side(tp2_dir: Path) -> None:
    doc = diff_paths(tp2_dir, example_trace_dir("vllm-cpu-tp2"))
    assert [r.rank for r in doc.ranks] == [0, 1]
    for rank in doc.ranks:
        before = _decode_allreduce_per_step(tp2_dir / f"tp2_b4_16tok_rank{rank.rank}.pt.trace.json.gz")
        after = _decode_allreduce_per_step(example_trace_dir("vllm-cpu-tp2") / f"rank{rank.rank}.pt.trace.json.gz")
        delta = rank.categories["comm.all_reduce"]
        assert delta.before_us == pytest.approx(before, rel=1e-6)
        assert delta.after_us == pytest.approx(after, rel=1e-6)
        assert delta.delta_us == pytest.approx(after - before, rel=1e-6)


@pytest.mark.needs_shared
def test_diff_of_a_run_with_itself_changes_nothing(tp2_dir: Path) -> None:
    doc = analyze(AnalyzeRequest(paths=[tp2_dir]))
    same = diff_analyses(doc, doc)
    assert not same.findings_appeared and not same.findings_gone
    assert all(d.delta_us == 0 for r in same.ranks for d in r.categories.values())


@pytest.mark.needs_shared
def test_saved_analysis_and_traces_give_the_same_diff(tp2_dir: Path, tmp_path: Path) -> None:
    saved = tmp_path / "before.json"
    assert CliRunner().invoke(app, ["analyze", str(tp2_dir), "-o", str(saved)]).exit_code == 0
    from_saved = diff_paths(saved, example_trace_dir("vllm-cpu-tp2"))
    from_traces = diff_paths(tp2_dir, example_trace_dir("vllm-cpu-tp2"))
    assert [r.categories for r in from_saved.ranks] == [r.categories for r in from_traces.ranks]


@pytest.mark.needs_shared
def test_findings_that_appear_and_go(tp2_dir: Path) -> None:
    doc = analyze(AnalyzeRequest(paths=[tp2_dir]))
    fewer = analyze(AnalyzeRequest(paths=[tp2_dir]))
    gone = fewer.findings.pop(0)
    result = diff_analyses(doc, fewer)
    assert [(f.id, f.rank, f.phase) for f in result.findings_gone] == [(gone.id, gone.rank, gone.phase)]
    assert result.findings_appeared == []


@pytest.mark.needs_shared
def test_phase_missing_on_both_is_an_input_error(tp2_dir: Path) -> None:
    doc = analyze(AnalyzeRequest(paths=[tp2_dir]))
    have = sorted({p for r in doc.ranks for p in r.phases})
    assert "unknown" not in have
    with pytest.raises(InputError, match=rf"neither side has unknown steps \(both have {have[0]}"):
        diff_analyses(doc, doc, phase="unknown")


@pytest.mark.needs_shared
def test_one_rank_traces_of_different_ranks_name_the_ranks_and_the_phase() -> None:
    """HTA's rank 3 of 8 against its rank 0 of 2: diff says which ranks each side holds and which phase they share
    (their distributedInfo, read with json), not "no rank has … steps in both"."""
    before = TRACES / "hta" / "a100_8rank_rank3_nccl.json.gz"
    after = TRACES / "hta" / "nccl_allreduce_2rank_rank0.json.gz"
    ranks = []
    for path in (before, after):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            ranks.append(json.load(handle)["distributedInfo"]["rank"])
    assert ranks[0] != ranks[1]
    result = CliRunner().invoke(app, ["diff", str(before), str(after)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert f"before holds rank {ranks[0]} (unknown steps), after rank {ranks[1]} (unknown steps)" in line
    assert f"different ranks ({ranks[0]} against {ranks[1]})" in line
    assert "neither side has decode steps (both have unknown: --phase unknown)" in line
    assert "no rank has" not in line


def test_bogus_phase_names_the_phases_before_reading_anything(tmp_path: Path) -> None:
    """One line naming the valid phases, exit 2, even when the inputs do not exist (they are not read)."""
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(app, ["diff", str(missing), str(missing), "--phase", "bogus"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "servescope: error: --phase: no phase 'bogus': use one of decode, mixed, prefill, empty, unknown"]
    # every phase named there is one that step detection can give (steps/find.py's own list, read by another route)
    steps_source = (Path(__file__).parents[2] / "src" / "servescope" / "trace" / "steps" / "find.py").read_text()
    for phase in ("decode", "mixed", "prefill", "empty", "unknown"):
        assert f'"{phase}"' in steps_source


@pytest.mark.needs_shared
def test_cli_diff_json(tp2_dir: Path) -> None:
    result = CliRunner().invoke(app, ["diff", str(tp2_dir), str(example_trace_dir("vllm-cpu-tp2")), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "servescope.diff" and doc["phase"] == "decode"
    assert {"before_us", "after_us", "delta_us", "delta_pct"} <= set(doc["ranks"][0]["categories"]["comm.all_reduce"])
