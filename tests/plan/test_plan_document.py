"""The plan document is typed end to end (issue 25): ``run_plan`` builds :class:`~servescope.core.plan.PlanDoc`, a
saved plan decodes into the same types and writes back byte for byte, and a plan written before the later keys
(the hardware profile's floors and switches, the calibration's rule and points, a collective's wait and paths)
reads and writes back as it was."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from servescope.core.document import decode, encode
from servescope.core.plan import PlanDoc
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.plan import plan_to_json, render_plan, render_plan_html

CPU = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-profile"
DEEPEP = {"VLLM_ALL2ALL_BACKEND": "deepep_low_latency"}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> PlanDoc:
    """TP=1 calibrated on a CPU capture: a layout with no collectives (its part is the integer 0) and a
    calibration with its captured points."""
    hw = tmp_path_factory.mktemp("hw") / "cpu.toml"
    hw.write_text('name = "cpu-vm"\nmemory_gb = 24\nhbm_gbps = 50\ninterconnect = "pcie"\np2p_gbps = 5\n',
                  encoding="utf-8")
    return run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware=str(hw), gpus=2, batches=(1, 4),
                                context=48, calibrate=str(CPU / "tp2_b4.analysis.json"), force=True))


@pytest.fixture(scope="module")
def pcie_ep(tmp_path_factory: pytest.TempPathFactory) -> PlanDoc:
    """Qwen3-30B-A3B on 8 RTX PRO 6000 with an all-to-all backend: EP vs TP with the PCIe all-to-all's terms."""
    from test_plan_ep_pcie import _qwen3_30b

    model = _qwen3_30b(tmp_path_factory.mktemp("qwen3"))
    return run_plan(PlanRequest(model=model, hardware="rtx-pro-6000", gpus=8, batches=(1, 64), env=DEEPEP))


@pytest.mark.parametrize("name", ["calibrated", "pcie_ep"])
def test_a_saved_plan_reads_back_as_the_same_typed_document(name: str, request: pytest.FixtureRequest) -> None:
    doc: PlanDoc = request.getfixturevalue(name)
    text = plan_to_json(doc)
    again = decode(text.encode(), "plan.json")
    assert again == doc and encode(again).decode() == text


def test_no_collectives_stay_the_integer_0() -> None:
    """A layout of one GPU runs no collectives: its part is written as ``0`` (a sum of nothing) and reads back so."""
    doc = run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware="h200", gpus=1, batches=(1,)))
    text = plan_to_json(doc)
    again = decode(text.encode(), "plan.json")
    assert isinstance(again, PlanDoc)
    collectives = again.layouts[0].points[0].parts_ms["collectives"]
    assert collectives == 0 and isinstance(collectives, int) and '"collectives": 0,' in text
    assert encode(again).decode() == text


def test_the_typed_parts_are_there(calibrated: PlanDoc, pcie_ep: PlanDoc) -> None:
    assert calibrated.calibration is not None and calibrated.calibration.comm_points
    assert calibrated.calibration.mode and calibrated.calibration.routing == "independent"
    versus = pcie_ep.ep_vs_tp
    assert versus is not None
    terms = versus.at[0].ep.all_to_all
    assert terms is not None and terms.link_gbps.origin == "datasheet" and terms.bound in ("link", "bridge")


# Keys a plan got after its first version, where they sit: absent in an older plan.
_LATER = {"hardware": ("kernel_floor_us", "kernel_floor_source", "other_floor_by_batch_us", "p2p", "nvlink_multicast",
                       "compute_capability", "platform"),
          "inputs": ("env",), "calibration": ("mode", "routing", "points", "comm_points")}


def _older(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as a plan written before the later keys."""
    for where, keys in _LATER.items():
        for key in keys:
            (data[where] or {}).pop(key, None)
    for layout in data["layouts"]:
        for point in layout["points"]:
            for entry in point["collectives_per_step"].values():
                del entry["wait_ms"], entry["paths"]
    return data


def test_an_older_plan_reads_and_writes_back_as_it_was(calibrated: PlanDoc) -> None:
    older = encode(_older(json.loads(plan_to_json(calibrated))))
    doc = decode(older, "old-plan.json")
    assert isinstance(doc, PlanDoc) and doc.hardware.p2p is None and doc.calibration and doc.calibration.mode is None
    assert encode(doc) == older
    out = io.StringIO()
    render_plan(doc, Console(file=out, width=120))
    assert "calibrated from" in out.getvalue() and "collectives: the path" not in out.getvalue()
    assert "<h2>Layouts</h2>" in render_plan_html(doc)


def test_a_path_without_its_words_shows_its_implementation(pcie_ep: PlanDoc) -> None:
    data = json.loads(plan_to_json(pcie_ep))
    for layout in data["layouts"]:
        for point in layout["points"]:
            for entry in point["collectives_per_step"].values():
                for path in entry["paths"]:
                    del path["path"]
    doc = decode(encode(data), "plan.json")
    assert encode(doc) == encode(data)
    out = io.StringIO()
    render_plan(doc, Console(file=out, width=200))
    assert "all_reduce over 8" in out.getvalue() and ": nccl;" in out.getvalue()
