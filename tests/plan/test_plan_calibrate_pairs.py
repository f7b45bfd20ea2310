"""plan --calibrate on the real vLLM 0.26 H200 captures made with distinct prompts per request (issue 24): calibrated
at one batch and predicting the other (16 → 1, 1 → 16), dense and MoE, async scheduling on and off, fp8.

Two capture sets. ``steady/w1`` and ``steady/w2`` (2026-12-05): engine steps 64..75 of 90-token requests, every
request long past its admission, the same servers captured twice minutes apart (w2: dense and MoE, async on and
off). The set of 2026-12-04 (``ab/``, ``*-fp8-*``): steps 20..27, admission still settling in some windows; its
pairs are held at the bound measured then (plus one point), so a regression shows.

Each capture is analyzed and written as `servescope profile --json` writes it (its ``profile`` section from the
folder's provenance.json, ``"prompts": "distinct"``); the planner gets the model's shape from provenance.json, with
``quantization_config: {quant_method: fp8}`` where the server ran ``--quantization fp8`` (weights one byte), and the
context in the middle of the profiled window. The truth is taken by another route, plain gzip + json: the decode
step annotations (``execute_context_0(0)_generation_B(B)``, ``gpu_user_annotation``) for the step, the kernels
inside them for the device's work, the rest for the host's time inside the step (the device idle).

What is met (docs/measurements.md, "On real vLLM"; ``benchmarks/plan_calibrate_pairs.py`` prints the tables): the
device's work of the predicted step within 10% on every steady pair (−9.5 to +5.2%); the step within 10%, or within
10% plus what the host's time moved between the two windows. The host's time is what no
calibration can foresee: two windows of one server at one batch ran the same device work (to 1%) with host times
×1.88 apart (``test_repeated_windows_differ_in_the_hosts_time_not_the_devices``); one server alone, captured three
times at one batch, ×1.61 (``test_one_server_alone_repeats_its_device_work_not_its_host_time``).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from servescope.core.analysis import StepReference
from servescope.core.errors import InputError
from servescope.plan.model import arch_from_hf_config
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.profile import encode_profile
from servescope.trace.analyze import AnalyzeRequest, analyze
from tracefiles import benchmark

# The pairs are planned and their truth read (plain gzip + json) by the benchmark that prints the tables of
# docs/measurements.md, so the test holds the numbers the docs quote.
bench = benchmark("plan_calibrate_pairs")

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-vllm"
PAIRS = {("dense", "async"): "ab/dense-async", ("dense", "noasync"): "ab/dense-noasync",
         ("moe", "async"): "ab/moe-async", ("moe", "noasync"): "ab/moe-noasync",
         ("dense", "fp8"): "dense-fp8", ("moe", "fp8"): "moe-fp8"}
STEADY = {(w, kind, flavour): f"steady/{w}/{kind}-{flavour}" for w in ("w1", "w2") for kind in ("dense", "moe")
          for flavour in (("async", "noasync", "fp8") if w == "w1" else ("async", "noasync"))}
DIRECTIONS = ((16, 1), (1, 16))
WITHIN = 0.10
# The 2026-12-04 set beyond 10% (docs/measurements.md): |error| measured on 2026-12-05, held to one point above it.
BEYOND = {("dense", "noasync", 16, 1): 0.205, ("dense", "noasync", 1, 16): 0.170, ("dense", "fp8", 16, 1): 0.144,
          ("dense", "fp8", 1, 16): 0.151, ("moe", "async", 16, 1): 0.172, ("moe", "fp8", 16, 1): 0.201,
          ("moe", "fp8", 1, 16): 0.136}
MARGIN = 0.01


_prov = bench.provenance


def _events(folder: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / folder / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        events: list[dict[str, Any]] = json.load(fh)["traceEvents"]
    return events


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """The 2026-12-04 set, per (kind, flavour, fit, check)."""
    out_dir = tmp_path_factory.mktemp("pairs")
    return {(kind, flavour, fit, check): case for (kind, flavour), stem in PAIRS.items()
            for (fit, check), case in bench.pair(stem, out_dir).items()}


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str, int, int], dict[str, Any]]:
    """The steady windows, per (window, kind, flavour, fit, check)."""
    out_dir = tmp_path_factory.mktemp("steady")
    return {(*key, fit, check): case for key, stem in STEADY.items()
            for (fit, check), case in bench.pair(stem, out_dir).items()}


@pytest.mark.parametrize(("kind", "flavour", "fit", "check"),
                         [(*k, *d) for k in PAIRS for d in DIRECTIONS])
def test_calibrated_at_one_batch_predicts_the_other(plans: dict[tuple[str, str, int, int], dict[str, Any]],
                                                    kind: str, flavour: str, fit: int, check: int) -> None:
    case = plans[(kind, flavour, fit, check)]
    bound = BEYOND.get((kind, flavour, fit, check))
    print(f"{kind} {flavour}: calibrated at {fit}, batch {check} predicted {case['predicted_ms']:.3f} ms against "
          f"{case['check']['step']:.3f} ms: {case['error']:+.1%}")
    assert abs(case["error"]) <= (WITHIN if bound is None else bound + MARGIN)


@pytest.mark.parametrize(("window", "kind", "flavour", "fit", "check"),
                         [(*k, *d) for k in STEADY for d in DIRECTIONS])
def test_steady_windows_the_device_work_is_predicted(steady: dict[tuple[str, str, str, int, int], dict[str, Any]],
                                                     window: str, kind: str, flavour: str, fit: int,
                                                     check: int) -> None:
    """The device's work of the predicted step within 10%; the step within 10% plus what the host's time moved
    between the fitted window and the checked one (the planner carries the fitted window's host time)."""
    case = steady[(window, kind, flavour, fit, check)]
    print(f"{window} {kind} {flavour}: {fit} → {check}: step {case['error']:+.1%}, device {case['device_error']:+.1%}, "
          f"host {case['fit']['host']:.2f} → {case['check']['host']:.2f} ms")
    assert abs(case["device_error"]) <= WITHIN
    assert abs(case["error"]) <= WITHIN + abs(case["host_moved_ms"]) / case["check"]["step"]


def test_steady_windows_where_the_host_kept_its_speed_the_step_is_within_10_percent(
        steady: dict[tuple[str, str, str, int, int], dict[str, Any]]) -> None:
    """Pairs whose two windows' host time moved by under 5% of the step: the step itself within 10%."""
    kept = {k: c for k, c in steady.items() if abs(c["host_moved_ms"]) < 0.05 * c["check"]["step"]}
    assert len(kept) >= 6
    assert all(abs(c["error"]) <= WITHIN for c in kept.values()), {k: c["error"] for k, c in kept.items()}


def test_repeated_windows_differ_in_the_hosts_time_not_the_devices() -> None:
    """Two windows of one server at one batch (w1, w2: same flags, minutes apart): the device's work repeats to
    2%, the host's time inside the step does not; on MoE without async scheduling at 16 requests it was ×1.88 and
    the step 35% longer, so no prediction of the step can be within 10% of both windows."""
    ratios = {}
    for (w, kind, flavour), stem in STEADY.items():
        if w != "w1" or (flavour == "fp8"):
            continue
        for batch in (1, 16):
            one = bench.window(f"{stem}-b{batch}", batch)
            two = bench.window(f"steady/w2/{kind}-{flavour}-b{batch}", batch)
            assert abs(two["device"] / one["device"] - 1) < 0.02
            ratios[(kind, flavour, batch)] = (two["host"] / one["host"], two["step"] / one["step"])
    print({k: (round(h, 2), round(s, 2)) for k, (h, s) in ratios.items()})
    host, step = ratios[("moe", "noasync", 16)]
    assert host > 1.5 and step > 1.25


@pytest.fixture(scope="module")
def repeated() -> dict[str, Any]:
    """One MoE server alone (no async scheduling, python stacks on), its steady window captured three times at 16
    and at 1 request within two minutes (``steady/repeat``, plan word ``repeat-moe``), each window predicted from
    each other's."""
    study: dict[str, Any] = bench.repeats(*bench.REPEATS["steady/repeat"])
    return study


def test_one_server_alone_repeats_its_device_work_not_its_host_time(repeated: dict[str, Any]) -> None:
    """No second server on the machine: the device's work of the three windows at one batch within 2%, the step
    at batch 1 not (2.56 / 2.72 / 3.54 ms); max/min above 1.1/0.9, so no prediction of that step, by any planner,
    is within 10% of all three windows. The same host call, the forward's cudaGraphLaunch, took 1.6x as long in
    the long window as in the others: the host ran slower, it did not do more."""
    truth = repeated["truth"]
    for batch in (1, 16):
        device = [w["device"] for w in truth[batch]]
        assert max(device) / min(device) < 1.02, device
    steps = [w["step"] for w in truth[1]]
    print(f"batch 1 steps {[round(x, 2) for x in steps]} ms")
    assert max(steps) / min(steps) > 1.1 / 0.9
    stem, count = bench.REPEATS["steady/repeat"]
    launches = [_graph_launch_us(f"{stem}-r{r}-b1") for r in range(1, count + 1)]
    slow = steps.index(max(steps))
    assert launches[slow] > 1.3 * max(x for i, x in enumerate(launches) if i != slow), launches


def test_one_server_alone_every_window_predicts_the_others_device_work(repeated: dict[str, Any]) -> None:
    """Each of the three windows at one batch predicts each of the three at the other (18 predictions): the
    device's work within 10%; the step within 10% wherever the two windows' host time is within 5% of the step."""
    truth = repeated["truth"]
    kept = 0
    for (fit, check), rows in repeated["errors"].items():
        for i, row in enumerate(rows):
            for j, error in enumerate(row):
                device_error = repeated["device_errors"][(fit, check)][i][j]
                moved = abs(truth[check][j]["host"] - truth[fit][i]["host"]) / truth[check][j]["step"]
                print(f"{fit} → {check}, r{i + 1} → r{j + 1}: step {error:+.1%}, device {device_error:+.1%}, "
                      f"host moved {moved:.1%} of the step")
                assert abs(device_error) <= WITHIN
                if moved < 0.05:
                    kept += 1
                    assert abs(error) <= WITHIN
    assert kept >= 6


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
    a, n = bench.window("ab/dense-async-b1", 1), bench.window("ab/dense-noasync-b1", 1)
    (busy_a, idle_a), (busy_n, idle_n) = (a["device"], a["host"]), (n["device"], n["host"])
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
    ratios = {}
    for (kind, flavour), stem in PAIRS.items():
        idle = bench.window(f"{stem}-b16", 16)["host"] / bench.window(f"{stem}-b1", 1)["host"]
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


def test_the_plan_names_the_host_time_it_carries(steady: dict[tuple[str, str, str, int, int], dict[str, Any]]) -> None:
    """Every steady calibration says how much of the capture's step is the host's time, carried as a fixed time:
    the figure in its note is the fitted window's host time by plain json (within 2%: the analysis counts a step's
    copies as device work too, and prints 0.01 ms)."""
    for key, case in steady.items():
        [note] = [n for n in case["doc"].notes if n.startswith("host time: ")]
        host, step = (float(x) for x in re.findall(r"([0-9.]+) ms", note)[:2])
        assert host == pytest.approx(case["fit"]["host"], rel=0.02), key
        assert step == pytest.approx(case["fit"]["step"], rel=0.02), key
        assert "carried to every batch and layout" in note


def test_the_plan_names_the_attention_floor_it_used(
        steady: dict[tuple[str, str, str, int, int], dict[str, Any]]) -> None:
    """Every steady capture runs FlashAttention 3 (its kernel names, plain json); each calibration names that
    kernel's own floor from the H200 profile, not the plain PyTorch attention's."""
    for key, case in steady.items():
        window, kind, flavour, fit, _ = key
        names = {e["name"] for e in _events(f"steady/{window}/{kind}-{flavour}-b{fit}") if e.get("cat") == "kernel"}
        assert any("FlashAttnFwdSm90" in n for n in names), key
        [note] = [n for n in case["doc"].notes if n.startswith("attention: its kernels' floor")]
        assert "8.16 µs a call" in note and "attention_kernel_floor_us" in note and "4.97 µs" in note, note


def test_the_host_time_note_names_the_unprofiled_step(tmp_path: Path) -> None:
    """A capture saved by `servescope profile` carries its server's step without the profiler (the engine's own
    inter-token latency, /metrics, over the same batch run): the note quotes it beside the host time it carries,
    as a gauge (taken here from provenance.json)."""
    folder = "steady/w1/moe-noasync-b16"
    prov = _prov(folder)
    itl_ms = float(prov["unprofiled_server"]["itl_ms"])
    trace = DATA / folder / "rank0.pt.trace.json.gz"
    doc = analyze(AnalyzeRequest(paths=[trace], reference=StepReference(
        step_us=itl_ms * 1e3, source="the server's inter-token latency without the profiler")))
    capture = tmp_path / "b16.profile.json"
    capture.write_bytes(encode_profile(doc, [trace], capture={
        "model": prov["model"], "batch": 16, "input_tokens": 32, "output_tokens": 90, "prompts": "distinct"}))
    config = tmp_path / "moe" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
    plan = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(1,), context=101,
                                calibrate=str(capture)))
    [note] = [n for n in plan.notes if n.startswith("host time: ")]
    assert f"without the profiler this server's step was {itl_ms:.2f} ms" in note
    # not a correction: the latency of a whole run (its admission too) can exceed the window's steps, as here
    assert abs(itl_ms / bench.window(folder, 16)["step"] - 1) < 0.1
