"""plan.planner: the document's keys, crossovers found by bisection, the recommendation and its reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope import __version__
from servescope.core.errors import InputError
from servescope.core.plan import LayoutMemoryGib, PlanInputs, PlanLayout, PlanPoint
from servescope.plan.planner import PlanRequest, find_crossovers, parse_batches, recommend, run_plan


def test_document_keys_and_inputs() -> None:
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=8, batches=(1, 8, 32, 128), context=2048))
    assert (doc.schema, doc.schema_version) == ("servescope.plan", 1)
    assert doc.servescope_version == __version__
    assert (doc.model.name, doc.hardware.name, doc.gpus) == ("kimi-k2.5", "h200", 8)
    assert doc.inputs == PlanInputs(model="kimi-k2.5", hardware="h200", gpus=8, batches=[1, 8, 32, 128],
                                    context=2048, comm=None, calibrate=None, graph=True, env={})
    layout = doc.layouts[0]
    point = layout.points[0]
    assert set(point.parts_ms) == {"weights", "attention", "collectives", "other"}
    ar = point.collectives_per_step["all_reduce"]
    assert (ar.count, ar.bytes) == (123, 123 * 7168 * 2)  # batch 1: bytes summed over the step's ops
    assert doc.recommendation.reasons
    assert all(set(p.origins) == {"weights", "attention", "collectives", "other"} for p in layout.points)


def test_crossover_found_exactly() -> None:
    # Layout 0 costs 10 + b, layout 1 costs 2b: equal at b = 10, so from 11 on layout 0 is faster.
    def step(i: int, b: int) -> float:
        return 10.0 + b if i == 0 else 2.0 * b
    (c,) = find_crossovers(["flat", "steep"], [1, 8, 32, 128], step)
    assert (c.batch, c.between, c.faster_below, c.faster_above) == (11, [8, 32], "steep", "flat")
    assert find_crossovers(["a", "b"], [1, 2], lambda i, b: float(i)) == []


def _layout(name: str, steps: list[float], *, fits: list[bool] | None = None, feasible: bool = True,
            reason: str = "fits") -> PlanLayout:
    points = [PlanPoint(batch=b, step_ms=s, tokens_per_s=None, parts_ms={"collectives": 0.0},
                        origins={"weights": ["datasheet"], "collectives": []}, collectives_per_step={},
                        weight_bytes_per_gpu=0.0, kv_read_bytes_per_gpu=0.0, compute_bound=False, fits_kv=ok)
              for b, s, ok in zip([1, 8, 32], steps, fits or [True] * len(steps), strict=True)]
    return PlanLayout(name=name, kind="tp", tp=1, ep=1, pp=1, dp=1, gpus=1, feasible=feasible, reason=reason,
                      memory_gib_per_gpu=LayoutMemoryGib(weights=1.0, kv_cache=1.0, usable=2.0),
                      memory_origin=["assumed"], kv_tokens_per_gpu=10, kv_capacity_tokens=10, points=points)


def test_recommendation_counts_wins_and_says_why() -> None:
    layouts = [_layout("A", [1.0, 5.0, 9.0]), _layout("B", [2.0, 4.0, 8.0])]
    rec = recommend(layouts, [])
    assert rec.layout == "B"
    assert rec.reasons[0] == "fastest at batch 8, 32 of 1, 8, 32"
    assert "at batch 1 A is faster: 1.00 ms vs 2.00 ms per step" in rec.reasons
    nothing = recommend([_layout("A", [1.0, 1.0, 1.0], feasible=False, reason="too big")], [])
    assert nothing.layout is None and "too big" in nothing.reasons[0]


def test_kimi_on_two_h200_is_refused_in_one_line() -> None:
    # Nothing to plan (issue 24 item 5): no layout's weights fit, so no table of infeasible rows, one error.
    with pytest.raises(InputError, match=r"no layout of kimi-k2.5 fits on 2 × .*TP=2: weights .* exceed"):
        run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=2, batches=(1,)))


def test_gpus_that_split_nothing_are_refused() -> None:
    with pytest.raises(InputError, match="no layout splits llama-3-70b over 1000 GPUs"):
        run_plan(PlanRequest(model="llama-3-70b", hardware="h200", gpus=1000, batches=(1,)))


def test_pcie_box_without_curves_says_assumed() -> None:
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=8, batches=(1, 64)))
    tp8 = next(x for x in doc.layouts if x.name == "TP=8")
    # the all-reduce from a published per-call point (data/comm/points.toml), the logits' all-gather assumed
    assert tp8.points[0].origins["collectives"] == ["published point", "assumed"]
    assert any("no collective curve for 8 GPUs" in n for n in doc.notes)


@pytest.mark.parametrize("text", ["", "0,1", "a", "1,-2", "9999999"])
def test_bad_batches(text: str) -> None:
    with pytest.raises(InputError, match="--batch"):
        parse_batches(text)


def test_batches_sorted_and_unique() -> None:
    assert parse_batches("32, 1,8,8") == (1, 8, 32)


def test_user_comm_file_changes_collectives(tmp_path: Path) -> None:
    from test_plan_hardware import _curve_file

    curves = _curve_file(tmp_path / "c.json", world=8, points=[(1024, 100.0), (1 << 24, 1000.0)])
    # vLLM runs a 16 KiB all-reduce on 8 NVLink GPUs as its custom all-reduce, which a NCCL curve does not time;
    # at batch 1024 (16 MiB a call) without torch symmetric memory it is NCCL's (data/comm/vllm-0.26.toml)
    env = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    base = run_plan(PlanRequest(model="llama-3-70b", hardware="h200", gpus=8, batches=(1024,), env=env))
    slow = run_plan(PlanRequest(model="llama-3-70b", hardware="h200", gpus=8, batches=(1024,), comm=str(curves),
                                env=env))
    p = slow.layouts[0].points[0]
    ar = p.collectives_per_step["all_reduce"]
    assert ar.paths and {q.impl for q in ar.paths} == {"nccl"} and ar.paths[0].origin == "measured curve"
    assert ar.ms == pytest.approx(161 * (1000.0 + ar.paths[0].wait_us_each) / 1e3)
    assert slow.inputs.comm is not None and slow.inputs.comm.size_bytes == curves.stat().st_size
    assert base.layouts[0].points[0].step_ms != p.step_ms
    custom = run_plan(PlanRequest(model="llama-3-70b", hardware="h200", gpus=8, batches=(1,), comm=str(curves)))
    paths = custom.layouts[0].points[0].collectives_per_step["all_reduce"].paths
    assert paths and paths[0].impl == "custom_1stage"  # the curve is NCCL's: not used for the custom all-reduce


def test_batches_no_layout_can_hold_are_named() -> None:
    rec = recommend([_layout("A", [1.0, 2.0, 3.0], fits=[True, True, False])], [])
    assert rec.layout == "A"
    assert "at batch 32 no layout's KV cache holds batch × context (the most any holds: 10 tokens)" in rec.reasons
