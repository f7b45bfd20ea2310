"""Each fact of a rank is computed once (issue 25): the traces are found once, each rank's launches and graph
replays once, and the step a trace's marker recognises is the one the document holds."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from servescope.cli import app, head_start
from servescope.core.analysis import RankAnalysis, StepRow
from servescope.trace import analyze as analyze_module
from servescope.trace.analyze import AnalyzeRequest, analyze, rank_context
from servescope.trace.classify import work
from servescope.trace.read import files
from servescope.trace.read.files import example_trace_dir
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.steps.ranks import assign_ranks

GRAPHS = example_trace_dir()  # vLLM on an H200, decode steps replayed from CUDA graphs
TP2 = example_trace_dir("vllm-cpu-tp2")  # two CPU ranks and the front end


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str, *also: object) -> list[int]:
    """Count the calls of ``module.name`` (and of the same function where ``also`` imported it)."""
    calls: list[int] = []
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    for where in (module, *also):
        monkeypatch.setattr(where, name, counted)
    return calls


@pytest.mark.parametrize("head", [True, False], ids=["head-start", "none"])
def test_the_traces_are_found_once_from_the_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         head: bool) -> None:
    """The head start finds the traces it guessed and the command takes them (else finds them itself); the
    analysis reads what it is given."""
    found = _counting(monkeypatch, files, "find_traces", analyze_module)
    args = [str(TP2), "-o", str(tmp_path / "a.json")]
    if head:
        head_start.start(args)
    try:
        result = CliRunner().invoke(app, ["analyze", *args])
    finally:
        head_start.release()
    assert result.exit_code == 0, result.output
    assert len(found) == 1


@pytest.mark.parametrize("folder", [GRAPHS, TP2], ids=lambda p: p.name)
def test_launches_and_graph_replays_are_found_once_a_rank(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    replays = _counting(monkeypatch, work, "graph_replayed")
    launches = _counting(monkeypatch, work, "launch_rows")
    doc = analyze(AnalyzeRequest(paths=[folder]))
    device_ranks = sum(r.work_kind == "device" for r in doc.ranks)
    assert len(replays) == len(launches) == device_ranks


def test_the_recognised_step_is_the_documents_step() -> None:
    """One step type: the marker's name, phase and request mix reach the document unchanged; the breakdown adds
    the measured span, busy time and categories."""
    (trace,) = assign_ranks([decode_trace(GRAPHS / "rank0.pt.trace.json.gz")])
    context = rank_context(trace)
    (rank,) = analyze(AnalyzeRequest(paths=[GRAPHS])).ranks
    assert isinstance(context.steps.steps[0], StepRow)
    kept = ("index", "name", "phase", "prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens")
    assert [[getattr(s, f) for f in kept] for s in context.steps.steps] == \
        [[getattr(s, f) for f in kept] for s in rank.steps]
    assert all(s.busy_us == 0.0 and not s.categories for s in context.steps.steps)
    assert all(s.busy_us > 0.0 and s.categories for s in rank.steps)


def test_a_rank_analysis_is_built_whole() -> None:
    (rank,) = analyze(AnalyzeRequest(paths=[GRAPHS])).ranks
    assert rank.graph_replay_share > 0.5
    with pytest.raises(AttributeError):
        rank.graph_replay_share = 0.0  # type: ignore[misc]
    assert msgspec.structs.replace(rank, graph_replay_share=0.0).graph_replay_share == 0.0
    assert isinstance(rank, RankAnalysis)


def test_graph_replay_per_step_is_decided_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which steps replay CUDA graphs, and how much, is decided once, by the steps (``Steps.graph_us``, of the work
    each step launched) and kept: the facts' per-step graph time and ``replayed_steps``, the deployment's graph
    evidence and the advice's eager steps all read it, never a second count (issue 39)."""
    from servescope.trace.rules.facts import rank_facts
    from servescope.trace.steps import find as steps_module

    (trace,) = assign_ranks([decode_trace(GRAPHS / "rank0.pt.trace.json.gz")])
    context = rank_context(trace)
    decided = {i for i in range(len(context.steps.steps)) if context.steps.replays_graphs(i)}
    assert decided  # the example's decode steps replay graphs
    facts = rank_facts(context.data, context.rank, context.steps.steps, context.work, context.steps)
    assert facts.measures.replayed_steps == decided
    assert all(m.graph_us == float(context.steps.graph_us[m.step]) for m in facts.measures.steps)
    counted = _counting(monkeypatch, steps_module, "_graph_replays")
    analyze(AnalyzeRequest(paths=[GRAPHS]))
    assert len(counted) == 1  # one rank: counted once, with its steps


def _plain_steps(path: Path) -> list[dict[str, Any]]:
    """Per vLLM step annotation of a trace, by plain json: its phase, the device operations whose runtime call lies
    inside it (rows), their busy time (union), span and the time of those a graph launch started."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    out = []
    for mark in sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")),
                       key=lambda e: e["ts"]):
        lo, hi = mark["ts"], mark["ts"] + mark["dur"]
        mine = sorted((e for e in device if (c := calls.get(e["args"].get("correlation"))) and lo <= c["ts"] <= hi),
                      key=lambda e: e["ts"])
        busy, reach = 0.0, -1.0
        for e in mine:
            start, end = max(e["ts"], reach), e["ts"] + e["dur"]
            busy += max(0.0, end - start)
            reach = max(reach, end)
        graph = sum(e["dur"] for e in mine if "GraphLaunch" in calls[e["args"]["correlation"]]["name"])
        out.append({"phase": "prefill" if "generation_0(0)" in mark["name"] else "decode", "rows": len(mine),
                    "busy": busy, "graph": graph,
                    "span": max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)})
    return out


def test_each_steps_measures_are_made_once_and_kept_in_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """One record a step (rows, busy, idle, graph time, phase), made once per rank with its context, which the facts
    and the rules read (issue 39 item 3); its figures are those plain json over the trace gives."""
    from servescope.trace.steps import measures as measures_module

    made = _counting(monkeypatch, measures_module, "measure_steps", analyze_module)
    kept: list[Any] = []
    real = analyze_module.rank_facts

    def facts_of(*args: Any) -> Any:
        kept.append(args[-1])  # the measures handed to the facts: the context's own
        return real(*args)

    monkeypatch.setattr(analyze_module, "rank_facts", facts_of)
    (rank,) = analyze(AnalyzeRequest(paths=[GRAPHS])).ranks
    assert len(made) == 1 and len(kept) == 1
    measures = kept[0]
    plain = _plain_steps(GRAPHS / "rank0.pt.trace.json.gz")
    assert [m.phase for m in measures.steps] == [p["phase"] for p in plain] == [s.phase for s in rank.steps]
    assert [m.rows for m in measures.steps] == [p["rows"] for p in plain]
    for m, p in zip(measures.steps, plain, strict=True):
        assert m.busy_us == pytest.approx(p["busy"], abs=1e-3)
        assert m.graph_us == pytest.approx(p["graph"], abs=1e-3)
        assert m.span_us == pytest.approx(p["span"], abs=1e-3)
        assert m.idle_us == pytest.approx(p["span"] - p["busy"], abs=1e-3)
    assert {m.step for m in measures.steps if m.graph_us > 0} == measures.replayed_steps
    assert measures.replayed_steps == {i for i, p in enumerate(plain) if p["graph"] > 0}
    assert rank.between_steps_us == pytest.approx(sum(m.gap_before_us or 0.0 for m in measures.steps))
