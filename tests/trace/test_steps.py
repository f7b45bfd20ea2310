"""Steps from the engine's own markers, on real traces: expected counts and times from plain ``json.load``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.classify.work import select_work
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.steps.find import find_steps
from tracefiles import ROOT, TRACES, load_events

VLLM_NO_ANNOTATIONS = TRACES / "public" / "vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz"
HF_EAGER = TRACES / "public" / "hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz"
SGLANG_REPLAY = TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz"
H200_GRAPHS = ROOT / "tests" / "data" / "h200" / "dense_b16_graphs_rank0.pt.trace.json.gz"


def _device_windows(events: list[dict]) -> list[tuple[float, float]]:
    """Per execute_model frame of the model runner: its (start, end), for frames that launched device work."""
    frames = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("ph") == "X" and re.search(r"gpu_model_runner\.py\(\d+\): execute_model$",
                                                          e.get("name", "")))
    launches = [e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {}) and e["name"].startswith(("cudaLaunch", "cuLaunch",
                                                                                   "cudaGraphLaunch"))]
    return [(s, t) for s, t in frames if any(s <= ts <= t for ts in launches)]


@pytest.mark.needs_shared
def test_vllm_v1_without_annotations_steps_are_its_execute_model_frames() -> None:
    events = load_events(VLLM_NO_ANNOTATIONS)
    windows = _device_windows(events)
    all_frames = [e for e in events if e.get("ph") == "X"
                  and re.search(r"gpu_model_runner\.py\(\d+\): execute_model$", e.get("name", ""))]
    assert len(all_frames) == 11 and len(windows) == 10  # the last one launched nothing: no step
    doc = analyze(AnalyzeRequest(paths=[VLLM_NO_ANNOTATIONS]))
    rank = doc.ranks[0]
    assert rank.step_source == "execute_model"
    assert {p: s.steps for p, s in rank.phases.items()} == {"prefill": 1, "decode": 9}
    # the prefill is the one step that runs outside the CUDA graphs (the first, 91 ms); decode steps replay them
    decode_ranges = sorted(windows, key=lambda w: w[0])[1:]
    expected = sum(t - s for s, t in decode_ranges) / len(decode_ranges)
    assert rank.phases["decode"].step_us.mean == pytest.approx(expected, rel=0.03)
    # host time between steps is reported, not dropped
    gaps = [t2 - e1 for (_, e1), (t2, _) in zip(windows, windows[1:], strict=False)]
    assert rank.between_steps_us == pytest.approx(sum(g for g in gaps if g > 0), rel=0.05, abs=50.0)


@pytest.mark.needs_shared
def test_profiler_step_phase_from_the_token_ids_shape() -> None:
    events = load_events(HF_EAGER)
    embedding = next(e for e in events if e.get("name") == "aten::embedding")
    batch, length = embedding["args"]["Input Dims"][1]
    assert length > 1
    doc = analyze(AnalyzeRequest(paths=[HF_EAGER]))
    rank = doc.ranks[0]
    assert rank.step_source == "profiler_step"
    assert len(rank.steps) == 1
    step = rank.steps[0]
    assert (step.phase, step.prefill_requests, step.prefill_tokens) == ("prefill", batch, batch * length)


@pytest.mark.needs_shared
def test_sglang_steps_come_from_its_annotations() -> None:
    events = load_events(SGLANG_REPLAY)
    marked = [e for e in events if e.get("cat") == "user_annotation"
              and (e["name"].startswith("step[") or e["name"].startswith("execute_"))]
    assert marked
    data = decode_trace(SGLANG_REPLAY)
    steps = find_steps(data, select_work(data))
    assert steps.source == "annotation"
    assert [s.phase for s in steps.steps] == ["decode"]


def test_graph_replay_steps_keep_their_annotation_phase_and_cuda_time(tmp_path: Path) -> None:
    """Annotated steps are unchanged: the decode steps of an H200 capture replay graphs and say so."""
    events = load_events(H200_GRAPHS)
    decode = [e for e in events if e.get("cat") == "gpu_user_annotation"
              and e["name"].startswith("execute_context_0(0)_generation_")]
    doc = analyze(AnalyzeRequest(paths=[H200_GRAPHS]))
    stats = doc.ranks[0].phases["decode"]
    assert stats.steps == len(decode)
    assert stats.step_us.mean == pytest.approx(sum(e["dur"] for e in decode) / len(decode), rel=0.005)
    assert doc.ranks[0].graph_replay_share > 0.5
