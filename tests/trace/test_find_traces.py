"""analyze DIR reads every trace it recognises by content, whatever its name, and says what it left out and why
(issue 23: a folder of four traces analysed one, the three not named ``*.pt.trace.json.gz``, without a word)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.read.files import find_traces, left_out_lines, why_not_a_trace
from tracefiles import TRACES

CPU = TRACES / "vllm-cpu"   # a real vLLM TP=2 capture on the CPU: two ranks and the API server's trace
RANK0, RANK1 = CPU / "tp2_b4_16tok_rank0.pt.trace.json.gz", CPU / "tp2_b4_16tok_rank1.pt.trace.json.gz"
FRONTEND = CPU / "tp2_b4_16tok_frontend.async_llm.pt.trace.json.gz"
SAVED = Path(__file__).parents[1] / "data" / "vllm-cpu-profile" / "tp2_b4.analysis.json"  # a saved analysis


def _rank_of(path: Path) -> int:
    """distributedInfo.rank, read with json (not servescope's decoder)."""
    return int(json.loads(gzip.decompress(path.read_bytes()))["distributedInfo"]["rank"])


@pytest.fixture
def renamed(tmp_path: Path) -> Path:
    """The capture under names that say nothing (one rank gunzipped), beside files that are not traces."""
    run = tmp_path / "run"
    (run / "deeper").mkdir(parents=True)
    shutil.copy(RANK0, run / "first.gz")
    (run / "deeper" / "second").write_bytes(gzip.decompress(RANK1.read_bytes()))
    shutil.copy(FRONTEND, run / "api-server.bin")
    shutil.copy(SAVED, run / "last-week.json")
    (run / "notes.txt").write_text("rank 1 is the slow one\n")
    (run / "meta.json.gz").write_bytes(gzip.compress(b'{"model": "tiny-llama", "tp": 2}'))
    (run / "empty.json").write_bytes(b"")
    return run


@pytest.mark.needs_shared
def test_every_trace_is_found_by_content_and_the_rest_is_named(renamed: Path) -> None:
    found = find_traces([renamed])
    assert sorted(p.name for p in found.traces) == ["api-server.bin", "first.gz", "second"]
    assert {p.name: why for p, why in found.left_out} == {
        "empty.json": "empty file",
        "last-week.json": "a servescope.analysis document, not a trace (servescope report reads it)",
        "meta.json.gz": "JSON without traceEvents",
        "notes.txt": "not JSON",
    }


@pytest.mark.needs_shared
def test_analyze_reads_the_renamed_traces_as_the_named_ones(renamed: Path) -> None:
    """The same analysis as of the files under their own names: both ranks and the front end."""
    doc = analyze(AnalyzeRequest(paths=[renamed]))
    reference = analyze(AnalyzeRequest(paths=[RANK0, RANK1, FRONTEND]))
    assert sorted(r.rank for r in doc.ranks) == sorted([_rank_of(RANK0), _rank_of(RANK1)]) == [0, 1]
    assert len(doc.traces) == 3
    for rank, ref in zip(sorted(doc.ranks, key=lambda r: r.rank), sorted(reference.ranks, key=lambda r: r.rank),
                         strict=True):
        assert rank.phases.keys() == ref.phases.keys()
        assert rank.phases["decode"].steps == ref.phases["decode"].steps


@pytest.mark.needs_shared
def test_cli_says_what_it_left_out_one_line_each(renamed: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "servescope", "analyze", str(renamed), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ranks"]
    lines = proc.stderr.splitlines()
    assert lines[0] == "analyze: left out 4 files that are not torch profiler traces:"
    assert lines[1:] == [f"analyze:   {renamed / name}: {why}" for name, why in (
        ("empty.json", "empty file"),
        ("last-week.json", "a servescope.analysis document, not a trace (servescope report reads it)"),
        ("meta.json.gz", "JSON without traceEvents"),
        ("notes.txt", "not JSON"))]


def test_many_left_out_files_are_a_count_and_the_first_few(tmp_path: Path) -> None:
    skipped = [(tmp_path / f"n{i}.txt", "not JSON") for i in range(8)]
    lines = left_out_lines(skipped, most=5)
    assert lines[0] == "left out 8 files that are not torch profiler traces:"
    assert lines[1:6] == [f"  {tmp_path}/n{i}.txt: not JSON" for i in range(5)]
    assert lines[6:] == ["  ... and 3 more"]
    assert left_out_lines([]) == []


@pytest.mark.needs_shared
def test_a_bare_event_list_and_a_late_traceevents_key_are_traces(tmp_path: Path) -> None:
    """Chrome's array form, and an object whose traceEvents comes after 64 KiB of other keys."""
    doc = json.loads(gzip.decompress(RANK0.read_bytes()))
    bare = tmp_path / "bare"
    bare.write_text(json.dumps(doc["traceEvents"]))
    late = tmp_path / "late"
    late.write_text(json.dumps({"padding": "x" * (200 << 10), "traceEvents": doc["traceEvents"][:50]}))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([1, 2, 3]))
    assert why_not_a_trace(bare) is None and why_not_a_trace(late) is None
    assert why_not_a_trace(listed) == 'a JSON list without trace events (no "ph" field)'


@pytest.mark.needs_shared
def test_a_gzip_cut_short_is_taken_so_reading_it_names_the_problem(tmp_path: Path) -> None:
    raw = RANK0.read_bytes()
    cut = tmp_path / "r0"
    cut.write_bytes(raw[: len(raw) // 2])
    assert why_not_a_trace(cut) is None
    garbage = tmp_path / "g.gz"
    garbage.write_bytes(b"\x1f\x8b" + bytes(range(200)))
    assert why_not_a_trace(garbage) == "corrupt gzip"
