"""analyze on every real trace: kernel table, steps and attribution against an independent plain-JSON route."""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from servescope.core.analysis import AnalysisDoc
from servescope.trace.analyze import AnalyzeRequest, analyze
from tracefiles import TRACES, all_shared_traces, load_events

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
VLLM_STEP = re.compile(r"^execute(_\d+)?_context_(\d+)\(.*\)_generation_(\d+)\(")
WORKER_TRACES = [p for p in all_shared_traces() if ".async_llm." not in p.name]


def _cpu_ops_by_self_time(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """cpu_ops with "dur" replaced by self time: duration less the direct children's (plain stack walk)."""
    by_thread: defaultdict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#"):
            by_thread[(e["pid"], e["tid"])].append(dict(e))
    out = []
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        children_time = [0.0] * len(ops)
        open_ops: list[int] = []
        for i, op in enumerate(ops):
            while open_ops and ops[open_ops[-1]]["ts"] + ops[open_ops[-1]]["dur"] <= op["ts"]:
                open_ops.pop()
            if open_ops:
                children_time[open_ops[-1]] += op["dur"]
            open_ops.append(i)
        for op, inner in zip(ops, children_time, strict=True):
            op["dur"] = max(op["dur"] - inner, 0.0)
            out.append(op)
    return out


def _work(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    return device if device else _cpu_ops_by_self_time(events)


@pytest.fixture(scope="module")
def docs() -> dict[Path, AnalysisDoc]:
    return {p: analyze(AnalyzeRequest(paths=[p])) for p in WORKER_TRACES}


@pytest.mark.needs_shared
@pytest.mark.parametrize("path", WORKER_TRACES, ids=lambda p: p.name)
def test_kernel_table_matches_plain_json(path: Path, docs: dict[Path, AnalysisDoc]) -> None:
    expected_count: Counter[str] = Counter()
    expected_total: defaultdict[str, float] = defaultdict(float)
    for e in _work(load_events(path)):
        expected_count[e["name"]] += 1
        expected_total[e["name"]] += float(e["dur"])
    got_count: Counter[str] = Counter()
    got_total: defaultdict[str, float] = defaultdict(float)
    for k in docs[path].kernels:
        got_count[k.name] += k.count
        got_total[k.name] += k.total_us
    assert got_count == expected_count
    for name, total in expected_total.items():
        assert got_total[name] == pytest.approx(total, rel=1e-3, abs=1e-3), name
    totals = docs[path].device_totals[str(docs[path].ranks[0].rank)]
    assert sum(t.count for t in totals.values()) == sum(expected_count.values())


def _step_windows(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    ann = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                  and VLLM_STEP.match(e["name"])), key=lambda e: e["ts"])
    if not ann:
        ann = sorted((e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")
                      and e.get("cat") in ("user_annotation", "cpu_op")), key=lambda e: e["ts"])
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ann]


def _expected_step_time(events: list[dict[str, Any]]) -> dict[int, float]:
    """Work time per step: each kernel → its launch (same correlation id) → the step range holding it."""
    windows = _step_windows(events)
    starts = [w[0] for w in windows]
    work = _work(events)
    is_device = bool(work) and work[0].get("cat") in DEVICE_CATS
    launch_ts = {e["args"]["correlation"]: float(e["ts"]) for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    per_step: defaultdict[int, float] = defaultdict(float)
    for e in work:
        when = launch_ts.get(e.get("args", {}).get("correlation")) if is_device else float(e["ts"])
        if when is None:
            continue
        i = bisect.bisect_right(starts, when) - 1
        if i >= 0 and when <= windows[i][1]:
            per_step[i] += float(e["dur"])
    return dict(per_step)


@pytest.mark.needs_shared
@pytest.mark.parametrize("path", WORKER_TRACES, ids=lambda p: p.name)
def test_work_is_attributed_to_the_step_that_launched_it(path: Path, docs: dict[Path, AnalysisDoc]) -> None:
    events = load_events(path)  # read here, not at collection: 17 traces took 11 s of every run's start
    if not _step_windows(events):
        pytest.skip("no vLLM step annotation or ProfilerStep# range: no step to attribute work to")
    expected = _expected_step_time(events)
    got = {row.index: sum(row.categories.values()) for row in docs[path].ranks[0].steps}
    got = {i: t for i, t in got.items() if t > 0}
    assert set(got) == set(expected)
    for index, total in expected.items():
        assert got[index] == pytest.approx(total, rel=1e-6), index


@pytest.mark.needs_shared
def test_vllm_cpu_tp1_steps_and_phases(docs: dict[Path, AnalysisDoc]) -> None:
    doc = docs[TRACES / "vllm-cpu" / "tp1_b1_32tok_rank0.pt.trace.json.gz"]
    phases = doc.ranks[0].phases
    assert phases["decode"].steps == 31
    assert phases["prefill"].steps == 1
    assert doc.ranks[0].step_source == "annotation"
    assert phases["decode"].tokens_per_step == 1.0


@pytest.mark.needs_shared
def test_graph_replay_kernels_belong_to_the_replayed_step(docs: dict[Path, AnalysisDoc]) -> None:
    path = TRACES / "tracelens" / "vllm_decode_full_graph_replay.json.gz"
    events = load_events(path)
    graph = [e["args"]["correlation"] for e in events if e.get("name") in ("cudaGraphLaunch", "hipGraphLaunch")]
    replayed = [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in graph]
    assert len(replayed) > 100  # one launch, hundreds of kernels
    rank = docs[path].ranks[0]
    assert rank.phases["decode"].steps == 1
    step_total = sum(rank.steps[0].categories.values())
    assert step_total >= sum(float(e["dur"]) for e in replayed)


@pytest.mark.needs_shared
def test_gap_fallback_splits_at_idle_gaps(tmp_path: Path) -> None:
    import json

    events = [e for e in load_events(TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz")
              if e.get("cat") not in ("user_annotation", "gpu_user_annotation")]
    stripped = tmp_path / "no_steps_rank0.json"
    stripped.write_text(json.dumps({"traceEvents": events}))
    kernels = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                     if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS)
    gap_us = 50.0
    reach, expected_steps = kernels[0][1], 1
    for start, end in kernels[1:]:
        if start - reach > gap_us:
            expected_steps += 1
        reach = max(reach, end)
    doc = analyze(AnalyzeRequest(paths=[stripped], step_gap_us=gap_us))
    rank = doc.ranks[0]
    assert rank.step_source in ("gaps", "whole")
    assert len(rank.steps) == expected_steps
    assert doc.options["step_gap_us"] == gap_us
