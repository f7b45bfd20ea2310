"""plan never beats the datasheet, and refuses every calibration from another setup (issue 24 item 5).

Property tests (hypothesis) over random models (dense and MoE, HF configs built here), the bundled hardware
profiles, every layout plan proposes for 1-8 GPUs, batches and contexts:

- uncalibrated: no predicted step is shorter than its weights read once at the datasheet HBM rate (the bytes
  counted here from the GEMM shapes of :func:`servescope.plan.model.gemm_shapes`, an independent count) nor its
  GEMM FLOPs at the datasheet tensor rate;
- calibrated on a real capture (vLLM 0.26 on one H200, Llama-3-8B shapes with 16 layers, batch 16): a plan for
  another model, GPU count or device is refused (``InputError``, one line); the plan it matches is accepted, and
  its predictions keep to the same datasheet floor.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.core.document import encode
from servescope.core.errors import InputError
from servescope.plan.hardware import list_hardware_profiles, load_hardware
from servescope.plan.model import arch_from_hf_config, gemm_shapes, load_model_arch
from servescope.plan.planner import PlanRequest, run_plan
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-vllm"
CAPTURE = DATA / "dense-graphs-b16"
PROFILES = list_hardware_profiles()


@st.composite
def hf_configs(draw: st.DrawFn) -> dict[str, Any]:
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    head_dim = draw(st.sampled_from([64, 128]))
    cfg: dict[str, Any] = {
        "hidden_size": heads * head_dim, "num_hidden_layers": draw(st.integers(2, 96)),
        "num_attention_heads": heads, "num_key_value_heads": draw(st.sampled_from([h for h in (1, 2, 4, 8, heads)
                                                                                  if heads % h == 0])),
        "head_dim": head_dim, "intermediate_size": 256 * draw(st.integers(4, 112)),
        "vocab_size": draw(st.sampled_from([32000, 128256, 151936])),
        "torch_dtype": draw(st.sampled_from(["bfloat16", "float16"])),
    }
    if draw(st.booleans()):
        experts = draw(st.sampled_from([8, 16, 64, 128]))
        cfg |= {"num_experts": experts, "num_experts_per_tok": draw(st.integers(1, min(8, experts))),
                "moe_intermediate_size": 128 * draw(st.integers(2, 16))}
    return cfg


def _weights_floor_us(arch: Any, tp: int, batch: int) -> tuple[float, float]:
    """(bytes one TP rank reads, GEMM FLOPs it runs) in a decode step, from the GEMM shapes (TP layouts)."""
    shapes = gemm_shapes(arch, tp=tp, batch=batch)
    return (sum(s.weight_bytes * s.count for s in shapes),
            sum(2.0 * s.mean_tokens * s.n * s.k * s.count for s in shapes))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=hf_configs(), hardware=st.sampled_from(PROFILES), gpus=st.sampled_from([1, 2, 4, 8]),
       batch=st.integers(1, 512), context=st.integers(1, 8192))
def test_no_prediction_beats_the_datasheet(cfg: dict[str, Any], hardware: str, gpus: int, batch: int,
                                           context: int) -> None:
    arch = arch_from_hf_config(cfg, name="random", source="hypothesis")
    hw = load_hardware(hardware)
    path = Path(f"/tmp/servescope-physics-{hardware}-{gpus}.json")
    path.write_text(json.dumps(cfg), encoding="utf-8")
    try:
        doc = run_plan(PlanRequest(model=str(path), hardware=hardware, gpus=gpus, batches=(batch,),
                                   context=context))
    except InputError as err:  # nothing to plan: one line naming why
        assert "no layout" in err.problem and "\n" not in err.problem
        return
    for layout in doc.layouts:
        point = layout.points[0]
        step_us = point.step_ms * 1e3
        read_us = point.weight_bytes_per_gpu / (hw.hbm_gbps * 1e3)
        assert point.parts_ms["weights"] * 1e3 >= read_us * 0.999, layout.name
        assert step_us >= read_us * 0.999
        assert all(v >= 0 for v in point.parts_ms.values())
        if layout.kind == "tp" and not arch.experts:  # an independent count of bytes and FLOPs
            nbytes, flops = _weights_floor_us(arch, layout.tp, batch)
            assert step_us >= nbytes / (hw.hbm_gbps * 1e3) * 0.99
            rate = hw.tflops_for(arch.weight_dtype)
            if rate:
                assert step_us >= flops / (rate * 1e6) * 0.99


@cache
def _capture() -> tuple[str, str]:
    """(analysis of the real H200 dense b16 capture, its model's config), written once."""
    folder = Path("/tmp/servescope-physics-capture")
    folder.mkdir(exist_ok=True)
    analysis = folder / "dense-graphs-b16.analysis.json"
    analysis.write_bytes(encode(analyze(AnalyzeRequest(paths=[CAPTURE / "rank0.pt.trace.json.gz"]))))
    prov = json.loads((CAPTURE / "provenance.json").read_text(encoding="utf-8"))
    config = folder / "llama8b-16l.json"
    config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
    return str(analysis), str(config)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["capture", "llama-3-70b", "kimi-k2.5", "qwen3-235b-a22b", "deepseek-v3"]),
       hardware=st.sampled_from(PROFILES), gpus=st.sampled_from([1, 2, 4, 8]), batch=st.integers(1, 256))
def test_every_mismatched_calibration_is_refused(model: str, hardware: str, gpus: int, batch: int) -> None:
    analysis, config = _capture()
    planned = config if model == "capture" else model
    matches = model == "capture" and gpus == 1 and "H200" in " ".join(load_hardware(hardware).match)
    request = PlanRequest(model=planned, hardware=hardware, gpus=gpus, batches=(batch,), context=56,
                          calibrate=analysis)
    if not matches:
        with pytest.raises(InputError) as err:
            run_plan(request)
        assert "\n" not in err.value.problem
        if "no layout" not in err.value.problem:
            assert "--calibrate from another setup" in err.value.problem
        return
    doc = run_plan(request)
    assert doc.forced == []
    hw = load_hardware(hardware)
    arch = load_model_arch(config)
    nbytes, _ = _weights_floor_us(arch, 1, batch)
    point = doc.layouts[0].points[0]
    assert point.step_ms * 1e3 >= nbytes / (hw.hbm_gbps * 1e3)
    hbm = doc.factors["hbm_efficiency"].value
    assert isinstance(hbm, float) and hbm <= 1.0
