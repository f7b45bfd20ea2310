"""One judge over the whole corpus: the stored verdict and the findings agree on every trace in the tests, advice
never asks for what the server already runs, and advice names the platform's own knobs.

The server's settings come from outside the analysis: its settings document read with plain json where the
capture has one, else the flags its provenance.json recorded on the device.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from servescope.core.analysis import AnalysisDoc
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.rules.deployment import DeploymentInput, load_deployment_rules
from servescope.trace.rules.findings import load_rules
from tracefiles import ROOT

DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared" / "traces"
H200 = DATA / "h200-vllm"
EXAMPLES = ROOT / "src" / "servescope" / "data" / "examples"


def _corpus() -> list[Path]:
    folders = sorted({p.parent for p in DATA.rglob("*.pt.trace.json.gz")} | {p for p in EXAMPLES.iterdir()
                                                                            if p.is_dir()})
    shared = sorted(p for p in SHARED.rglob("*.json.gz") if "capture" not in p.name) if SHARED.is_dir() else []
    return folders + shared


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT.parent)).replace("main/", "")


@cache
def _doc(path: Path) -> AnalysisDoc:
    try:
        return analyze(AnalyzeRequest(paths=[path]))
    except Exception as exc:  # noqa: BLE001 - folders the analysis refuses (bad-input fixtures) are not the point
        pytest.skip(f"not analysable: {exc}")


@pytest.mark.parametrize("path", _corpus(), ids=_id)
def test_the_verdict_says_what_the_findings_say(path: Path) -> None:
    doc = _doc(path)
    order = load_rules()["verdict"]["order"]
    phases = {p for r in doc.ranks for p, s in r.phases.items() if s.steps and s.categories and p != "empty"}
    assert {v.phase for v in doc.verdicts} == phases
    for v in doc.verdicts:
        fired = [f for f in doc.findings if f.phase == v.phase and f.id in order]
        if fired:
            first = min(fired, key=lambda f: order.index(f.id))
            assert v.finding == first.id, (v, [f.id for f in fired])
            metric = first.evidence.get("idle_share", first.evidence.get("comm_share"))
            assert isinstance(metric, float) and v.share == pytest.approx(metric, abs=1e-3)
            shown = re.search(r"\d+\.\d%", v.sentence)
            assert shown is not None and shown.group(0) in first.message  # the same figure in both
        else:
            # no rule names it: the category with the most device time does, as the tables count it
            assert v.finding is None and v.base == "device time"
            stats = next(r.phases[v.phase] for r in doc.ranks if r.rank == v.rank)
            assert v.share == pytest.approx(max(c.share for c in stats.categories.values()))


@pytest.mark.parametrize("path", _corpus(), ids=_id)
def test_shares_in_the_headline_never_add_up_to_more_than_the_whole(path: Path) -> None:
    doc = _doc(path)
    for r in doc.ranks:
        for stats in r.phases.values():
            assert sum(c.share for c in stats.categories.values()) <= 1.0 + 1e-6
            assert stats.idle_us_per_step <= stats.step_us.mean + 1e-6


def _captures() -> list[Path]:
    return sorted(p.parent for p in H200.rglob("provenance.json")) + [EXAMPLES / "h200-vllm-moe-b16"]


def _recorded_flags(folder: Path) -> tuple[list[str], str]:
    """The server's flags and vLLM version by plain json: its settings document, else its provenance."""
    if (folder / "settings.json").is_file():
        doc = json.loads((folder / "settings.json").read_text())
        rows = {s["key"]: s["value"] for g in doc["groups"] for s in g["settings"]}
        return str(rows["command line"]).split(), str(rows["/version version"])
    prov = json.loads((folder / "provenance.json").read_text())
    return ["python3", "-m", "vllm.entrypoints.openai.api_server", *prov["server_flags"]], str(prov["vllm_version"])


@pytest.mark.parametrize("folder", _captures(), ids=lambda p: p.name)
def test_no_advice_for_a_setting_the_server_already_had(folder: Path) -> None:
    """vLLM 0.26 runs async scheduling and CUDA graphs unless told not to: where its flags did not say so, no
    advice asks for them; each finding with such advice says what it checked and where from."""
    flags, version = _recorded_flags(folder)
    inp = DeploymentInput(source="settings", where=str(folder), argv=flags, version=version)
    doc = analyze(AnalyzeRequest(paths=[folder / "rank0.pt.trace.json.gz"], settings=[inp]))
    advice = [a for f in doc.findings for a in f.advice]
    assert version.startswith("0.26")
    if "--no-async-scheduling" not in flags:
        assert not [a for a in advice if a.setting == "async_scheduling"]
    if "--enforce-eager" not in flags:
        assert not [a for a in advice if a.setting == "cuda_graphs"]
    else:
        assert [a for a in advice if a.setting == "cuda_graphs"] or not doc.findings
    labels = {s["label"] for s in load_deployment_rules()["settings"].values()}
    for f in doc.findings:
        for checked in f.checked:
            label, _, rest = checked.partition(": ")
            assert label in labels and (", from " in rest or rest.startswith("no source told")), checked


def _rocm_traces() -> list[Path]:
    return [p for p in _corpus() if re.search(r"mi300|rocm|amd", p.name, re.I)]


@pytest.mark.parametrize("path", _rocm_traces(), ids=_id)
def test_amd_traces_get_rocm_knobs_not_nccls(path: Path) -> None:
    doc = _doc(path)
    assert doc.deployment["platform"].value == "rocm"
    texts = [a.text for f in doc.findings for a in f.advice]
    assert not [t for t in texts if "LL128" in t or "vLLM's custom all-reduce" in t]
