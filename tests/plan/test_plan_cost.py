"""plan.cost / plan.weights / plan.layouts: collectives, weight bytes, KV bytes and feasibility, by hand.

Every expected number is written out from the public configs (hidden, layers, heads, vocab …) in this file,
not taken from the planner's output. Conventions under test (see ``plan/cost.py``): all_reduce bytes are
the buffer (``batch × hidden × 2``), all_to_all bytes the per-rank send buffer, all_gather the gathered
output; the vocab-parallel embedding adds one all_reduce and the logits one all_gather per step under TP.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from servescope.core.errors import InputError
from servescope.plan.collectives import CommCosts
from servescope.plan.cost import GIB, Collective, collectives_per_step, layout_memory, predict_point
from servescope.plan.factors import Factors, default_factors
from servescope.plan.hardware import load_hardware
from servescope.plan.layouts import Layout, candidate_layouts
from servescope.plan.model import load_model_arch
from servescope.plan.weights import kv_bytes_per_token_layer, rank_weights

KIMI = load_model_arch("kimi-k2.5")
LLAMA = load_model_arch("llama-3-70b")
H200 = load_hardware("h200")
FACTORS = default_factors()


def _by_op(colls: list[Collective]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for c in colls:
        out.setdefault(c.op, []).append((c.count, c.bytes_each))
    return out


@pytest.mark.parametrize("batch", [1, 8, 32, 128])
def test_kimi_tp8_all_reduces(batch: int) -> None:
    ops = _by_op(collectives_per_step(KIMI, Layout(kind="tp", tp=8), batch))
    # 2 per layer x 61 layers (attention out, MLP/MoE down) + 1 vocab-parallel embedding, 7168 x 2 bytes per token.
    assert ops["all_reduce"] == [(2 * 61 + 1, batch * 7168 * 2)]
    assert ops["all_gather"] == [(1, batch * 163840 * 2)]  # logits, 163840 is already a multiple of 64
    assert set(ops) == {"all_reduce", "all_gather"}


# TP + EP and DP + EP, as vLLM 0.26 runs them: tests/plan/test_plan_ep_vllm.py


def test_pipeline_sends_per_stage_boundary() -> None:
    ops = _by_op(collectives_per_step(LLAMA, Layout(kind="pp", pp=4), 10))
    assert ops == {"send_recv": [(3, math.ceil(10 / 4) * 8192 * 2)]}
    ops = _by_op(collectives_per_step(LLAMA, Layout(kind="tp_pp", tp=2, pp=2), 10))
    assert ops["all_reduce"] == [(2 * 80 + 1, 5 * 8192 * 2)]  # microbatch of 5 on the path
    assert ops["send_recv"] == [(1, 5 * 8192 * 2)]


def test_single_gpu_has_no_collectives() -> None:
    assert collectives_per_step(LLAMA, Layout(kind="tp"), 32) == []


def test_llama_70b_tp4_weight_bytes_per_gpu() -> None:
    # Per layer: q and o 8192x8192, k and v 8192x1024 (8 KV heads x 128), MLP 3 x 8192 x 28672.
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    params = 80 * layer + 2 * 128256 * 8192  # + embedding and lm_head (128256 = 2004 x 64, no padding)
    assert abs(params - 70.55e9) < 0.01e9  # the model card's 70.55 B
    mem = layout_memory(LLAMA, Layout(kind="tp", tp=4), H200, FACTORS, context=4096)
    assert mem.weights_gib * GIB == pytest.approx(params * 2 / 4, rel=1e-12)


def test_kimi_tp8_weight_bytes_per_gpu() -> None:
    experts = 60 * 384 * 3 * 7168 * 2048 * 0.5625  # INT4 g32: 4 bits + one bf16 scale per 32
    assert experts == pytest.approx(571e9, rel=0.001)
    q_a, kv_a = 7168 * 1536, 7168 * (512 + 64)  # replicated on every rank
    q_b, kv_b, o = 1536 * 64 * 192, 512 * 64 * (128 + 128), 64 * 128 * 7168
    dense_mlp, shared, router = 3 * 7168 * 18432, 3 * 7168 * 2048, 7168 * 384
    vocab = 163840 * 7168
    split_bf16 = 61 * (q_b + kv_b + o) + dense_mlp + 60 * shared + 2 * vocab
    replicated_bf16 = 61 * (q_a + kv_a) + 60 * router
    assert (split_bf16 + replicated_bf16) * 2 == pytest.approx(23.4e9, rel=0.01)  # "≈ 23 GB bf16"
    mem = layout_memory(KIMI, Layout(kind="tp", tp=8), H200, FACTORS, context=4096)
    want = experts / 8 + split_bf16 * 2 / 8 + replicated_bf16 * 2
    assert mem.weights_gib * GIB == pytest.approx(want, rel=1e-9)


def test_kv_bytes_per_token() -> None:
    # MLA: one latent of kv_lora_rank + qk_rope_head_dim per token and layer, on every TP rank.
    assert kv_bytes_per_token_layer(KIMI, 8, 2.0) == (512 + 64) * 2
    assert kv_bytes_per_token_layer(KIMI, 1, 2.0) * 61 == 70272
    # GQA: K and V for the rank's KV heads, at least one.
    assert kv_bytes_per_token_layer(LLAMA, 1, 2.0) == 2 * 8 * 128 * 2
    assert kv_bytes_per_token_layer(LLAMA, 4, 2.0) == 2 * 2 * 128 * 2
    assert kv_bytes_per_token_layer(LLAMA, 16, 2.0) == 2 * 1 * 128 * 2


def test_feasibility_flips_with_gpu_count() -> None:
    for layout in candidate_layouts(KIMI, 2)[0]:
        assert not layout_memory(KIMI, layout, H200, FACTORS, context=4096).feasible, layout.name
    tp8 = layout_memory(KIMI, Layout(kind="tp", tp=8), H200, FACTORS, context=4096)
    assert tp8.feasible
    # Usable = 141 GB x 0.90 - 2 GiB; the KV cache gets the rest at 70272 bytes per token.
    usable = 141e9 * 0.90 - 2 * GIB
    assert tp8.kv_tokens_per_gpu == int((usable - tp8.weights_gib * GIB) // (1152 * 61))


def test_feasibility_flips_with_memory(tmp_path: Path) -> None:
    small, big = tmp_path / "small.toml", tmp_path / "big.toml"
    small.write_text("memory_gb = 141\nhbm_gbps = 4800\n", encoding="utf-8")  # 141 GB of bf16 70B > 0.9 x 141
    big.write_text("memory_gb = 200\nhbm_gbps = 4800\n", encoding="utf-8")
    one = Layout(kind="tp")
    assert not layout_memory(LLAMA, one, load_hardware(small), FACTORS, context=4096).feasible
    assert layout_memory(LLAMA, one, load_hardware(big), FACTORS, context=4096).feasible


def test_point_parts_by_hand() -> None:
    layout, batch, context = Layout(kind="tp", tp=4), 8, 1000
    mem = layout_memory(LLAMA, layout, H200, FACTORS, context=context)
    comm = CommCosts(H200, FACTORS, [], engine=None)
    point = predict_point(LLAMA, layout, H200, comm, batch=batch, context=context,
                          memory=mem)
    read = (80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 128256 * 8192) * 2 / 4  # no embedding
    assert point.weight_bytes == pytest.approx(read)
    assert point.parts_ms["weights"] == pytest.approx(read / (4800e9 * 0.77) * 1e3)
    kv = batch * context * (2 * 2 * 128 * 2) * 80
    assert point.kv_read_bytes == pytest.approx(kv)
    # the kernel's work per request priced as 150 more tokens a request (data/plan.toml), all at 0.77 of the HBM rate
    assert point.parts_ms["attention"] == pytest.approx(kv * (context + 150) / context / (4800e9 * 0.77) * 1e3)
    assert point.parts_ms["other"] == pytest.approx((30 + 15 * 80) / 1e3)
    # α-β all_reduce over 4 NVLink ranks (p2p 450 GB/s: half of H200's 900 bidirectional), 161 per step
    ar = 8.0 + 2 * 3 * 1.9 + 2 * 3 / 4 * batch * 8192 * 2 / (450e3 * 0.8)
    ag = 8.0 + 3 * 1.9 + 3 / 4 * batch * 128256 * 2 / (450e3 * 0.8)
    assert point.parts_ms["collectives"] == pytest.approx((161 * ar + ag) / 1e3)
    assert point.step_ms == pytest.approx(sum(point.parts_ms.values()))
    assert point.origins["collectives"] == ["assumed"]
    assert point.origins["weights"] == ["assumed", "datasheet"]


def test_ep_reads_only_local_experts() -> None:
    tp = rank_weights(KIMI, Layout(kind="tp", tp=8))
    ep = rank_weights(KIMI, Layout(kind="tp_ep", tp=8, ep=8))
    assert ep.experts_held == 384 // 8 and tp.experts_held == 384
    assert ep.expert == pytest.approx(8 * tp.expert)  # whole experts vs 1/8 slices
    assert ep.experts_held * ep.expert == pytest.approx(tp.experts_held * tp.expert)


def test_layouts_offered_and_left_out() -> None:
    names = [x.name for x in candidate_layouts(KIMI, 8)[0]]
    assert names == ["TP=8", "TP=8 EP=8", "DP=8 EP=8", "PP=8", "TP=2 PP=4", "TP=4 PP=2"]
    dense, skipped = candidate_layouts(LLAMA, 8)
    assert "TP=8 EP=8" not in [x.name for x in dense]  # no experts, no EP
    assert [x.name for x in candidate_layouts(LLAMA, 1)[0]] == ["TP=1"]
    odd, skipped = candidate_layouts(LLAMA, 3)
    assert "TP=3" not in [x.name for x in odd] and any(s.startswith("TP=3:") for s in skipped)


def test_unknown_hardware_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no such hardware profile"):
        load_hardware("no-such-gpu")


def test_alike_requests_route_to_top_k_experts_at_any_batch() -> None:
    """routing "alike" (B copies of one sequence, as `servescope profile` sends them): a MoE layer reads the
    top_k experts' weights at every batch, as one token does; "independent": E(1-(1-k/E)^B) experts."""
    arch = load_model_arch("qwen3-235b-a22b")
    hw = load_hardware("h200")
    layout = Layout(kind="tp", tp=8)
    independent = default_factors()
    alike = independent.replaced("calibrated", routing="alike")

    def read(factors: Factors, batch: int) -> float:
        comm = CommCosts(hw, factors, [], engine=None)
        memory = layout_memory(arch, layout, hw, factors, context=1024)
        return predict_point(arch, layout, hw, comm, batch=batch, context=1024, memory=memory).weight_bytes

    assert independent.routing == "independent"
    assert read(alike, 64) == read(alike, 1) == read(independent, 1)
    w = rank_weights(arch, layout)
    experts = arch.experts * (1 - (1 - arch.top_k / arch.experts) ** 64)
    assert read(independent, 64) - read(independent, 1) == pytest.approx(
        arch.moe_layers * (experts - arch.top_k) * w.expert)


def test_routing_must_be_known() -> None:
    with pytest.raises(ValueError, match="independent, alike"):
        default_factors().replaced("calibrated", routing="skewed")
