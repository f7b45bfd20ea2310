"""plan --calibrate on the real vLLM 0.26 H200 captures made with distinct prompts per request (issue 24): calibrated
at one batch and predicting the other (16 → 1, 1 → 16), dense and MoE, async scheduling on and off, fp8.

Each capture is analyzed and written as `servescope profile --json` writes it (its ``profile`` section from the
folder's provenance.json, ``"prompts": "distinct"``); the planner gets the model's shape from provenance.json, with
``quantization_config: {quant_method: fp8}`` where the server ran ``--quantization fp8`` (weights one byte). The
truth is taken by another route: the mean device duration of the capture's decode step annotations
(``execute_context_0(0)_generation_B(B)``, ``gpu_user_annotation``), plain gzip + json.

What is met (docs/measurements.md, "On real vLLM"; ``benchmarks/plan_calibrate_pairs.py`` prints the table): within
10% for the pairs in ``WITHIN``; the others are held at the bound measured on 2026-12-04 (plus one point), so a
regression shows. They miss by the host's input preparation inside the step, which moved between the profiling
windows independently of the batch (``test_the_misses_are_the_hosts_preparation``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import InputError
from servescope.plan.model import arch_from_hf_config
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.profile import encode_profile
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-vllm"
PAIRS = {("dense", "async"): "ab/dense-async", ("dense", "noasync"): "ab/dense-noasync",
         ("moe", "async"): "ab/moe-async", ("moe", "noasync"): "ab/moe-noasync",
         ("dense", "fp8"): "dense-fp8", ("moe", "fp8"): "moe-fp8"}
DIRECTIONS = ((16, 1), (1, 16))
WITHIN = 0.10
# Beyond 10% on 2026-12-04 (docs/measurements.md): |error| measured, held to one point above it.
BEYOND = {("dense", "noasync", 16, 1): 0.191, ("dense", "noasync", 1, 16): 0.170, ("dense", "fp8", 16, 1): 0.127,
          ("dense", "fp8", 1, 16): 0.152, ("moe", "async", 16, 1): 0.122, ("moe", "fp8", 16, 1): 0.114}
MARGIN = 0.01


def _prov(folder: str) -> dict[str, Any]:
    prov: dict[str, Any] = json.loads((DATA / folder / "provenance.json").read_text(encoding="utf-8"))
    return prov


def _events(folder: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / folder / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        events: list[dict[str, Any]] = json.load(fh)["traceEvents"]
    return events


def _steps(folder: str, batch: int) -> list[dict[str, Any]]:
    name = f"execute_context_0(0)_generation_{batch}({batch})"
    return [e for e in _events(folder) if e.get("cat") == "gpu_user_annotation" and e.get("name") == name]


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Per (kind, flavour, fit, check): the error of the prediction and the plan document."""
    out_dir = tmp_path_factory.mktemp("pairs")
    out: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    for (kind, flavour), stem in PAIRS.items():
        prov = _prov(f"{stem}-b1")
        shape = dict(prov["model_shape"])
        flags = prov["server_flags"]
        if "--quantization" in flags:
            assert flags[flags.index("--quantization") + 1] == "fp8"
            shape["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        config = out_dir / f"{kind}-{flavour}" / "config.json"
        config.parent.mkdir()
        config.write_text(json.dumps(shape), encoding="utf-8")
        docs = {}
        for batch in (1, 16):
            folder = f"{stem}-b{batch}"
            p = _prov(folder)
            assert p["batch"] == batch
            trace = DATA / folder / "rank0.pt.trace.json.gz"
            docs[batch] = out_dir / f"{kind}-{flavour}-b{batch}.profile.json"
            docs[batch].write_bytes(encode_profile(analyze(AnalyzeRequest(paths=[trace])), [trace], capture={
                "model": p["model"], "batch": batch, "input_tokens": p["input_tokens"],
                "output_tokens": p["output_tokens"], "prompts": "distinct"}))
        for fit, check in DIRECTIONS:
            p = _prov(f"{stem}-b{check}")
            steps = _steps(f"{stem}-b{check}", check)
            truth_ms = sum(float(e["dur"]) for e in steps) / len(steps) / 1e3
            doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(check,),
                                       context=p["input_tokens"] + p["output_tokens"] // 2,
                                       calibrate=str(docs[fit])))
            predicted = doc.layouts[0].points[0].step_ms
            out[(kind, flavour, fit, check)] = {"error": predicted / truth_ms - 1, "doc": doc, "truth_ms": truth_ms,
                                                "predicted_ms": predicted}
    return out


@pytest.mark.parametrize(("kind", "flavour", "fit", "check"),
                         [(*k, *d) for k in PAIRS for d in DIRECTIONS])
def test_calibrated_at_one_batch_predicts_the_other(plans: dict[tuple[str, str, int, int], dict[str, Any]],
                                                    kind: str, flavour: str, fit: int, check: int) -> None:
    case = plans[(kind, flavour, fit, check)]
    bound = BEYOND.get((kind, flavour, fit, check))
    print(f"{kind} {flavour}: calibrated at {fit}, batch {check} predicted {case['predicted_ms']:.3f} ms against "
          f"{case['truth_ms']:.3f} ms: {case['error']:+.1%}")
    assert abs(case["error"]) <= (WITHIN if bound is None else bound + MARGIN)


def test_the_fp8_weights_are_one_byte(plans: dict[tuple[str, str, int, int], dict[str, Any]]) -> None:
    """--quantization fp8 of a bf16 checkpoint: every linear weight one byte (per-tensor scales)."""
    for kind in ("dense", "moe"):
        bf16 = plans[(kind, "async", 16, 1)]["doc"]
        fp8 = plans[(kind, "fp8", 16, 1)]["doc"]
        assert fp8.model.weight_bytes == 1.0 and bf16.model.weight_bytes == 2.0
        if kind == "moe":
            assert fp8.model.expert_weight_bytes == 1.0 and fp8.model.experts == 128


def test_the_moe_shape_has_its_experts() -> None:
    """provenance.json of these captures leaves num_experts out; Qwen3MoeConfig's default is 128, as the server's
    make_models.py built them (num_experts=128, top 8)."""
    for stem in ("ab/moe-async", "ab/moe-noasync", "moe-fp8"):
        shape = _prov(f"{stem}-b1")["model_shape"]
        assert "num_experts" not in shape and shape["model_type"] == "qwen3_moe"
        arch = arch_from_hf_config(shape, name=stem, source="provenance.json")
        assert (arch.experts, arch.top_k, arch.moe_layers) == (128, 8, shape["num_hidden_layers"])


def test_the_misses_are_the_hosts_preparation() -> None:
    """The device's time a decode step hardly changes between these windows at one batch, the idle host
    preparation inside the step does: dense at batch 1, async on vs off, 0.88 ms apart at the same device work."""
    def parts(folder: str, batch: int) -> tuple[float, float]:
        events = _events(folder)
        steps = _steps(folder, batch)
        kernels = [e for e in events if e.get("cat") == "kernel"]
        busy = 0.0
        for s in steps:
            a, b = float(s["ts"]), float(s["ts"]) + float(s["dur"])
            busy += sum(float(k["dur"]) for k in kernels if a <= float(k["ts"]) < b)
        span = sum(float(s["dur"]) for s in steps)
        return busy / len(steps) / 1e3, (span - busy) / len(steps) / 1e3
    busy_a, idle_a = parts("ab/dense-async-b1", 1)
    busy_n, idle_n = parts("ab/dense-noasync-b1", 1)
    print(f"dense b1: device {busy_a:.2f} / {busy_n:.2f} ms, the rest {idle_a:.2f} / {idle_n:.2f} ms (async / not)")
    assert abs(busy_a / busy_n - 1) < 0.02 and idle_a - idle_n > 0.5


def _graph_launch_us(folder: str) -> float:
    """The median host time of the forward's one cudaGraphLaunch a step (the full-graph replay, > 150 µs; the
    piecewise graphs of mixed steps launch in tens of µs): the same call at every batch, so a host-speed gauge."""
    times = sorted(float(e["dur"]) for e in _events(folder)
                   if e.get("name") == "cudaGraphLaunch" and float(e.get("dur", 0)) > 150)
    return times[len(times) // 2]


def test_the_misses_follow_the_hosts_speed_in_each_window() -> None:
    """Why no calibration on these windows can meet 10% everywhere: the idle host time inside a decode step moved
    between the batch-1 and batch-16 windows with the host's speed, not with the batch. The same call, the
    forward's cudaGraphLaunch, took 1.8× as long in the dense no-async batch-16 window as at batch 1, and the
    step's idle grew 1.58×; where the launch kept its time (dense async, MoE no async) so did the idle. Within one
    window (the admission windows, ``*-admit-*``: batch 1 and 13-16 decode steps side by side) the idle grows by
    at most ~12 µs a request. Plain json: the annotation spans minus the kernels inside them."""
    def idle_ms(folder: str, batch: int) -> float:
        events = _events(folder)
        kernels = [e for e in events if e.get("cat") == "kernel"]
        total = 0.0
        steps = _steps(folder, batch)
        spans = [(float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in kernels]
        for s in steps:
            a, b = float(s["ts"]), float(s["ts"]) + float(s["dur"])
            total += float(s["dur"]) - sum(min(end, b) - max(start, a) for start, end in spans if start < b and end > a)
        return total / len(steps) / 1e3

    ratios = {}
    for (kind, flavour), stem in PAIRS.items():
        idle = idle_ms(f"{stem}-b16", 16) / idle_ms(f"{stem}-b1", 1)
        launch = _graph_launch_us(f"{stem}-b16") / _graph_launch_us(f"{stem}-b1")
        ratios[(kind, flavour)] = (idle, launch)
        print(f"{kind} {flavour}: idle ×{idle:.2f}, graph launch ×{launch:.2f} (batch 16 / batch 1)")
    # the windows whose host kept its speed kept their idle; the ones whose host slowed down grew it
    steady = [k for k, (_, launch) in ratios.items() if abs(launch - 1) < 0.06]
    slowed = [k for k, (_, launch) in ratios.items() if launch > 1.3]
    assert steady and slowed
    assert all(abs(ratios[k][0] - 1) < 0.05 for k in steady)
    assert all(ratios[k][0] > 1.15 for k in slowed)


def test_an_fp8_capture_for_a_bf16_model_is_refused(tmp_path: Path) -> None:
    """The server read one byte a weight (--quantization fp8 in provenance.json's server_flags): a bf16 plan of
    the same shape would fit twice the efficiency. Refused in one line; with --force, by the physics guard."""
    trace = DATA / "dense-fp8-b16" / "rank0.pt.trace.json.gz"
    prov = _prov("dense-fp8-b16")
    capture = tmp_path / "fp8.profile.json"
    capture.write_bytes(encode_profile(analyze(AnalyzeRequest(paths=[trace])), [trace], capture={
        "model": prov["model"], "batch": 16, "input_tokens": 32, "output_tokens": 42, "prompts": "distinct"}))
    config = tmp_path / "llama8b-16l" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
    request = {"model": str(config), "hardware": "h200", "gpus": 1, "batches": (1,), "context": 53,
               "calibrate": str(capture)}
    with pytest.raises(InputError, match=r"quantization: the captured server ran --quantization fp8 .*provenance"
                                         r"\.json\), the plan's .*config\.json has bfloat16 weights"):
        run_plan(PlanRequest(**request))  # type: ignore[arg-type]
    # forced, the physics guard refuses the fit: bf16 bytes read in the fp8 weights' time beat the datasheet
    with pytest.raises(InputError, match=r"hbm_efficiency 1\.\d+ fitted: the capture's weights .* ran faster than the "
                                         r"datasheet's 4800 GB/s allows"):
        run_plan(PlanRequest(**request, force=True))  # type: ignore[arg-type]
