"""Advice knows the engine, shares say their base, a host verdict says what the profiler may have added, and a
graph-capture trace's few copies are no finding (issue 37).

Expected figures come from the traces read with plain ``json`` (tracefiles.load_events) and from
docs/measurements.md's own table; the evidence an engine ran a trace is read there too (its step marks, its
backward ops).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from servescope.core.analysis import AnalysisDoc
from servescope.trace.analyze import AnalyzeRequest, analyze, example_trace_dir
from servescope.trace.read.files import find_traces
from servescope.trace.rules.deployment import evidence_beside
from tracefiles import ROOT, TRACES, load_events

SAMPLED = [TRACES / "hta" / f"sampled_128rank_rank{r}.json.gz" for r in (0, 1)]
SERVING_FLAGS = ("--async-scheduling", "--enforce-eager", "--disable-custom-all-reduce", "custom all-reduce",
                 "--disable-cuda-graph", "--max-cudagraph-capture-size", "vLLM", "SGLang")
_NCCL = re.compile(r"^nccl|ncclDevKernel|ncclKernel")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> AnalysisDoc:
    folder = tmp_path_factory.mktemp("sampled")
    for path in SAMPLED:
        shutil.copy(path, folder / path.name)
    return analyze(AnalyzeRequest(paths=[folder]))


@pytest.mark.needs_shared
def test_a_training_run_gets_no_serving_flag(sampled: AnalysisDoc) -> None:
    """HTA's sampled ranks of a 128-rank training run (backward ops, ProfilerSteps, no engine's marks)."""
    for path in SAMPLED:
        names = {str(e.get("name", "")) for e in load_events(path)}
        assert any(n.startswith("autograd::engine::evaluate_function: ") for n in names)
        assert not any(n.startswith(("execute_context", "execute_", "step[")) for n in names)
    assert sampled.deployment["engine"].value == "training"
    assert sampled.findings
    for f in sampled.findings:
        assert not any(flag in f.message for flag in SERVING_FLAGS), (f.id, f.message)
        assert not any(flag in a.text for a in f.advice for flag in SERVING_FLAGS), f.id


@pytest.mark.needs_shared
def test_collective_shares_say_their_base(sampled: AnalysisDoc) -> None:
    """"Collectives take X% of the step's device time": X is the collectives' share of the device time (summed
    kernel time of the steps), never of the step's wall time."""
    (f,) = [f for f in sampled.findings if f.id == "communication_bound"]
    rank = int(f.evidence["rank"])
    events = load_events(SAMPLED[rank])
    marks = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and any(lo <= launch.get(e["args"].get("correlation"), -1) <= hi for lo, hi in marks)]
    comm = sum(e["dur"] for e in work if _NCCL.search(e["name"])) / sum(e["dur"] for e in work)
    assert f.evidence["comm_share"] == pytest.approx(comm, abs=0.01)
    assert f"{100 * comm:.1f}% of the step's device time" in f.message  # the worst rank's, ending the range
    verdict = next(v for v in sampled.verdicts)
    assert "of step time" not in verdict.sentence


def test_a_vllm_trace_is_served_by_vllm() -> None:
    path = example_trace_dir() / "rank0.pt.trace.json.gz"
    names = {str(e.get("name", "")) for e in load_events(path)}
    assert any(n.startswith("execute_context_") for n in names) and any("vllm/v1/" in n for n in names)
    doc = analyze(AnalyzeRequest(paths=[path]))
    assert doc.deployment["engine"].value == "vllm"
    assert "vllm/" in doc.deployment["engine"].detail  # its own code's frames name it first


@pytest.mark.needs_shared
def test_sglangs_numbered_step_marks_name_no_engine_its_frames_do() -> None:
    """SGLang writes vLLM's numbered step form (execute_32_context_0(…)_generation_32(…)); its python frames
    (…/sglang/srt/…) say who ran it: SGLang, and no vLLM advice."""
    path = TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz"
    names = {str(e.get("name", "")) for e in load_events(path)}
    assert any(re.match(r"execute_\d+_context_", n) for n in names)
    assert any("/sglang/srt/" in n for n in names) and not any("/vllm/" in n for n in names)
    doc = analyze(AnalyzeRequest(paths=[path]))
    assert doc.deployment["engine"].value == "sglang"
    assert not any("vLLM" in f.message for f in doc.findings)


# ---------------------------------------------------------------------------------------------------------
# the profiler's stretch, where nothing measured it


def _measured_stretch_range() -> tuple[int, int]:
    """The stretch column of docs/measurements.md's vLLM 0.26 H200 rows (not the H100 ones): min and max %."""
    lines = (ROOT / "docs" / "measurements.md").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| capture | traced step + gap (µs) |"))
    rows = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|"))
    stretch = [int(r[4].strip().lstrip("+").rstrip("%")) for r in rows if not r[1].strip().startswith("H100")]
    assert len(stretch) >= 10
    return min(stretch), max(stretch)


def test_a_host_verdict_with_stacks_and_no_reference_carries_the_caveat(tmp_path: Path) -> None:
    """The bundled example's trace copied alone (python stacks, no profile document beside it): host-bound,
    with the measured stretch range and the command that measures the reference; beside its profile document
    (the step timed without the profiler) no caveat."""
    source = example_trace_dir() / "rank0.pt.trace.json.gz"
    events = load_events(source)
    assert sum(e.get("cat") == "python_function" for e in events) > 0  # recorded with python stacks
    shutil.copy(source, tmp_path / source.name)
    doc = analyze(AnalyzeRequest(paths=[tmp_path]))
    (decode,) = [v for v in doc.verdicts if v.phase == "decode"]
    assert decode.kind == "host" and decode.caveat is not None
    low, high = _measured_stretch_range()
    assert f"{low}–{high}%" in decode.caveat and f"{low}–{high}%" in decode.sentence
    batch = {re.search(r"generation_(\d+)", str(e["name"])).group(1)  # type: ignore[union-attr]
             for e in events if str(e.get("name", "")).startswith("execute_context_0(0)_generation_")}
    assert f"servescope profile URL --batch {batch.pop()} --output-tokens N" in decode.caveat
    found = find_traces([example_trace_dir()])
    beside = evidence_beside(found)
    assert beside.reference is not None
    told = analyze(AnalyzeRequest(paths=found, settings=beside.settings, reference=beside.reference))
    assert all(v.caveat is None for v in told.verdicts)


# ---------------------------------------------------------------------------------------------------------
# host transfers: a finding only where copies happen every step and take time


@pytest.mark.needs_shared
def test_a_graph_capture_trace_gets_no_host_transfer_finding() -> None:
    path = TRACES / "tracelens" / "vllm_decode_full_graph_capture_rank0.pt.trace.json.gz"
    events = load_events(path)
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    begins = [e for e in events if str(e.get("name", "")).endswith("StreamBeginCapture")]
    assert begins and copies and sum(e["dur"] for e in copies) < 10  # a capture with a few µs of copies
    doc = analyze(AnalyzeRequest(paths=[path]))
    assert not [f for f in doc.findings if f.id == "host_transfer"]


@pytest.mark.needs_shared
def test_copies_every_step_that_take_time_still_fire() -> None:
    path = TRACES / "hta" / "a100_8rank_rank3_nccl.json.gz"
    events = load_events(path)
    steps = sum(1 for e in events if e.get("cat") == "user_annotation"
                and str(e.get("name", "")).startswith("ProfilerStep#"))
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and re.search("HtoD|DtoH", e["name"])]
    assert len(copies) / steps >= 1 and sum(e["dur"] for e in copies) / steps >= 10
    doc = analyze(AnalyzeRequest(paths=[path]))
    assert [f for f in doc.findings if f.id == "host_transfer"]


def test_every_piece_of_advice_naming_an_engine_needs_that_engines_evidence() -> None:
    """The data itself: advice that names vLLM (its flags, its VLLM_* variables) fires only `when` vllm_serves
    holds, SGLang's only when sglang_serves does, and a command-line flag only for the engine that takes it."""
    import tomllib

    rules = tomllib.loads((ROOT / "src" / "servescope" / "data" / "findings.toml").read_text(encoding="utf-8"))
    checked = 0
    for rule_id, rule in rules["rules"].items():
        for advice in rule.get("advice", ()):
            text, when = advice["text"], set(advice.get("when", ()))
            if re.search(r"vLLM|VLLM_", text):
                assert "vllm_serves" in when, (rule_id, text)
                checked += 1
            if "SGLang" in text:
                assert "sglang_serves" in when, (rule_id, text)
                checked += 1
            if re.search(r"(?<![\w-])--[a-z]", text):
                assert when & {"vllm_serves", "sglang_serves"}, (rule_id, text)
    assert checked >= 10
