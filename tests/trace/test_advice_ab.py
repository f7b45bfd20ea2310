"""Advice on real vLLM 0.26 A/B pairs from the H200 (tests/data/h200-vllm/ab, issue 22) and an H100
(tests/data/h100-vllm/steady/w4, async scheduling in bf16 and fp8): both sides of each rule.

Each pair is two servers of one model that differ in one setting. The expected side of every check comes from
outside the analysis: which flag the server ran with (its settings document, read with plain json), what its
log said, and the step time the server's own /metrics gave without the profiler (provenance.json's
``unprofiled_server``, written on the device from ``servescope profile``'s unprofiled run).

- the setting absent on A: the advice fires on A and names the setting; on B, which has it, it does not;
- each finding says what it checked and where that came from;
- the gain predicted on A (a range, computed with A's unprofiled step) holds the change measured between A's and
  B's unprofiled steps, and ``diff A B`` reports that change and the setting that moved.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from servescope.core.analysis import AnalysisDoc, Finding, StepReference
from servescope.core.document import read_document
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.diff import diff_analyses
from servescope.trace.rules.deployment import from_settings_doc

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-vllm"
AB = DATA / "ab"

# (A: the setting absent, B: the setting in place, the setting, the words of A's advice)
PAIRS = [
    ("ab/dense-noasync-b16", "ab/dense-async-b16", "async_scheduling", "async scheduling"),
    ("ab/dense-noasync-b1", "ab/dense-async-b1", "async_scheduling", "async scheduling"),
    ("ab/moe-noasync-b16", "ab/moe-async-b16", "async_scheduling", "async scheduling"),
    ("ab/moe-noasync-b1", "ab/moe-async-b1", "async_scheduling", "async scheduling"),
    ("ab/dense-eager-b16", "ab/dense-bf16-b16", "cuda_graphs", "CUDA graphs"),
    ("ab/dense-eager-b64", "ab/dense-bf16-b64", "cuda_graphs", "CUDA graphs"),
    ("ab/dense-cap32-b64", "ab/dense-bf16-b64", "max_cudagraph_capture_size", "--max-cudagraph-capture-size"),
    # the same payload on a lent H100 (2026-12-05, stacks off): bf16 and fp8, 1 and 16 requests
    *[(f"../h100-vllm/steady/w4/{m}-noasync-b{b}", f"../h100-vllm/steady/w4/{m}-async-b{b}", "async_scheduling",
       "async scheduling") for m in ("dense", "dense-fp8", "moe", "moe-fp8") for b in (16, 1)],
]


def _pair_id(part: object) -> str:
    return str(part).replace("../h100-vllm/steady/w4/", "h100/").replace("ab/", "")


def _flags(folder: str) -> list[str]:
    """The server's command line, by plain json from its settings document."""
    doc = json.loads((DATA / folder / "settings.json").read_text())
    (line,) = [s["value"] for g in doc["groups"] for s in g["settings"] if s["key"] == "command line"]
    return str(line).split()


def _unprofiled_us(folder: str) -> float:
    return float(json.loads((DATA / folder / "provenance.json").read_text())["unprofiled_server"]["itl_ms"]) * 1000


@cache
def _doc(folder: str, *, settings: bool = True, reference: bool = True) -> AnalysisDoc:
    path = DATA / folder
    inputs = [from_settings_doc(read_document(path / "settings.json"), str(path / "settings.json"))] if settings else []
    ref = StepReference(step_us=_unprofiled_us(folder), source="the server's ITL without the profiler") \
        if reference else None
    return analyze(AnalyzeRequest(paths=[path / "rank0.pt.trace.json.gz"], settings=inputs, reference=ref))


def _advice(doc: AnalysisDoc, words: str, phase: str = "decode") -> list[tuple[Finding, str]]:
    return [(f, a.text) for f in doc.findings if f.phase == phase for a in f.advice if words in a.text]


def test_the_pairs_differ_in_their_one_setting() -> None:
    assert "--no-async-scheduling" in _flags("ab/dense-noasync-b16")
    assert "--no-async-scheduling" not in _flags("ab/dense-async-b16")
    assert "--enforce-eager" in _flags("ab/dense-eager-b16")
    assert "32" in _flags("ab/dense-cap32-b64")[_flags("ab/dense-cap32-b64").index("--max-cudagraph-capture-size") + 1:]
    assert "disabled" in (DATA / "ab/dense-noasync-b16" / "server-log-lines.txt").read_text()
    assert "Asynchronous scheduling is enabled" in (DATA / "ab/dense-async-b16" / "server-log-lines.txt").read_text()


@pytest.mark.parametrize(("a", "b", "setting", "words"), PAIRS, ids=_pair_id)
def test_advice_fires_where_the_setting_is_absent_and_not_where_it_is_there(a: str, b: str, setting: str,
                                                                            words: str) -> None:
    doc_a, doc_b = _doc(a, reference=False), _doc(b, reference=False)
    # the host bound shows in both traces (the profiler stretches the host), so the rule fires on both:
    # what differs is the advice
    assert _advice(doc_a, words), [f.message for f in doc_a.findings]
    assert not _advice(doc_b, words), [f.message for f in doc_b.findings]
    assert setting in doc_a.deployment and setting in doc_b.deployment
    assert doc_a.deployment[setting].value != doc_b.deployment[setting].value


@pytest.mark.parametrize("folder", ["ab/dense-async-b16", "ab/moe-async-b1", "ab/dense-noasync-b1"])
def test_the_trace_alone_tells_async_scheduling_by_its_frames(folder: str) -> None:
    """python stacks on (vLLM 0.26's default): the scheduler's frames say it, with no settings document."""
    doc = _doc(folder, settings=False, reference=False)
    on = "--no-async-scheduling" not in _flags(folder)
    ev = doc.deployment["async_scheduling"]
    assert ev.source == "trace" and ev.value == ("on" if on else "off")
    assert bool(_advice(doc, "async scheduling")) is not on
    (f,) = [f for f in doc.findings if f.id == "launch_bound" and f.phase == "decode"]
    assert f"async scheduling: {ev.value}, from the trace's python frames" in f.message


def test_without_any_source_the_advice_says_so() -> None:
    """Stacks off and no settings document: nothing tells async scheduling; the advice stays and says that."""
    doc = _doc("ab/dense-bf16-b16", settings=False, reference=False)
    assert "async_scheduling" not in doc.deployment
    (f,) = [f for f in doc.findings if f.id == "launch_bound" and f.phase == "decode"]
    assert "async scheduling: no source told" in f.message and _advice(doc, "async scheduling")
    with_settings = _doc("ab/dense-bf16-b16", reference=False)
    assert with_settings.deployment["async_scheduling"].source == "default"
    assert not _advice(with_settings, "async scheduling")


@pytest.mark.parametrize(("a", "b", "setting", "words"), PAIRS, ids=_pair_id)
def test_the_predicted_gain_holds_the_measured_change(a: str, b: str, setting: str, words: str) -> None:
    doc_a, doc_b = _doc(a), _doc(b)
    measured = _unprofiled_us(a) - _unprofiled_us(b)  # the server's own step, without the profiler, A - B
    ((_, text),) = _advice(doc_a, words)
    (advice,) = [x for f in doc_a.findings if f.phase == "decode" for x in f.advice if x.text == text]
    assert advice.gain is not None
    assert advice.gain.low_us <= measured <= advice.gain.high_us, (advice.gain, measured)
    report = diff_analyses(doc_a, doc_b)
    assert report.cycle_us is not None and report.cycle_us.delta_us == pytest.approx(-measured, abs=0.5)
    assert setting in {c.setting for c in report.settings_changed}
    (applied,) = [p for p in report.predictions if p.applied and p.setting == setting]
    assert applied.outcome == "held"


def test_quantization_advice_fires_on_fp8_and_not_on_bf16() -> None:
    fp8, bf16 = _doc("dense-fp8-b16"), _doc("ab/dense-bf16-b16")
    assert "--quantization" in _flags("dense-fp8-b16") and "--quantization" not in _flags("ab/dense-bf16-b16")
    assert [f for f in fp8.findings if f.id == "quantization_overhead" and f.phase == "decode"]
    assert not [f for f in bf16.findings if f.id == "quantization_overhead"]
    assert fp8.deployment["quantization"].value == "fp8" and "quantization" not in bf16.deployment
