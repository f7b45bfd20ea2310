"""EP as vLLM 0.26 runs it (issue 24): the all2all backend and its collectives, the shared expert split over TP,
and the busiest EP rank's experts.

``data/comm/vllm-0.26.toml`` ``[ep]`` is checked against the vLLM 0.26.0 source where it is unpacked
(``/tmp/vllm026``); every expected byte count is written out here from the public configs (hidden, layers, experts
…), not taken from plan's output.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from servescope.plan.cost import GIB, Collective, collectives_per_step, layout_memory
from servescope.plan.ep_backend import ep_backend
from servescope.plan.factors import default_factors
from servescope.plan.hardware import load_hardware
from servescope.plan.layouts import Layout
from servescope.plan.model import active_experts, busiest_rank_experts, load_model_arch
from servescope.plan.paths import engine_rules
from servescope.plan.planner import PlanRequest, run_plan

VLLM = Path("/tmp/vllm026/vllm")
KIMI = load_model_arch("kimi-k2.5")
DSV3 = load_model_arch("deepseek-v3")
H200 = load_hardware("h200")
H = 7168 * 2  # one token's bf16 hidden vector
DEEPEP = {"VLLM_ALL2ALL_BACKEND": "deepep_low_latency"}


def _by_op(colls: list[Collective]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for c in colls:
        out.setdefault(c.op, []).append((c.count, c.bytes_each))
    return out


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.skipif(not VLLM.is_dir(), reason="the vLLM 0.26.0 source is not unpacked at /tmp/vllm026")
def test_ep_rules_hold_the_sources_words() -> None:
    ep = engine_rules()["ep"]
    parallel = _flat((VLLM / "config" / "parallel.py").read_text(encoding="utf-8"))
    assert f'all2all_backend: All2AllBackend = "{ep["default"]}"' in parallel
    literal = re.search(r"All2AllBackend = Literal\[(.*?)\]", parallel)
    assert literal is not None
    names = set(re.findall(r'"(\w+)"', literal[1]))
    aliases = {a for b in ep["backends"].values() for a in b.get("aliases", [])}
    assert names == set(ep["backends"]) | aliases | set(ep["removed"])
    assert 'if self.all2all_backend in ["pplx", "naive"]:' in parallel and sorted(ep["removed"]) == ["naive", "pplx"]
    assert "Falling back to 'allgather_reducescatter'." in parallel
    assert "and self.tensor_parallel_size > 1 and self.data_parallel_size > 1 )" in parallel  # sequence-parallel MoE
    moe = _flat((VLLM / "model_executor" / "layers" / "fused_moe" / "config.py").read_text(encoding="utf-8"))
    assert ("def use_all2all_kernels(self): return self.use_ep and ( self.dp_size > 1 or self.pcp_size > 1 or "
            "self.is_sequence_parallel )") in moe and ep["all2all_min_dp"] == 2
    envs = (VLLM / "envs.py").read_text(encoding="utf-8")
    assert ep["env"] not in envs and ep["env_read"] is False
    comm = (VLLM / "distributed" / "device_communicators").joinpath
    cuda = comm("cuda_communicator.py").read_text(encoding="utf-8")
    assert all(f'"{name}"' in cuda for name in ep["backends"])
    a2a = comm("all2all.py").read_text(encoding="utf-8")
    agrs = a2a[a2a.index("class AgRsAll2AllManager"):a2a.index("class DeepEPAll2AllManagerBase")]
    assert "dist_group.all_gatherv(" in agrs and "dist_group.reduce_scatterv(" in agrs
    agrs_rule = ep["backends"]["allgather_reducescatter"]
    assert (agrs_rule["dispatch"], agrs_rule["combine"]) == ("all_gather", "reduce_scatter")
    runner = _flat((VLLM / "model_executor" / "layers" / "fused_moe" / "runner" / "moe_runner.py")
                   .read_text(encoding="utf-8"))
    assert ("and (self.moe_config.tp_size > 1 or self.moe_config.ep_size > 1) and not self._fused_output_is_reduced "
            "): states = tensor_model_parallel_all_reduce(states)") in runner


@pytest.mark.skipif(not VLLM.is_dir(), reason="the vLLM 0.26.0 source is not unpacked at /tmp/vllm026")
def test_the_shared_expert_is_a_tp_mlp_in_vllm() -> None:
    """deepseek_v2.py: the shared expert is a DeepseekV2MLP whose linears take ``disable_tp=is_sequence_parallel``,
    and ``is_sequence_parallel`` is ``use_sequence_parallel_moe`` (DP > 1 only): at DP = 1 it is split over TP."""
    src = _flat((VLLM / "model_executor" / "models" / "deepseek_v2.py").read_text(encoding="utf-8"))
    mlp = src[src.index("class DeepseekV2MLP"):src.index("def forward", src.index("class DeepseekV2MLP"))]
    assert mlp.count("disable_tp=is_sequence_parallel") == 2
    assert "MergedColumnParallelLinear(" in mlp and "RowParallelLinear(" in mlp
    assert "self.is_sequence_parallel = parallel_config.use_sequence_parallel_moe" in src
    assert "self.shared_experts = DeepseekV2MLP(" in src
    assert "is_sequence_parallel=self.is_sequence_parallel, reduce_results=False, prefix=f\"{prefix}.shared_experts\"" \
        in src


def test_backend_by_default_and_by_env() -> None:
    default = ep_backend({})
    assert (default.name, default.dispatch, default.combine) == ("allgather_reducescatter", "all_gather",
                                                                  "reduce_scatter")
    assert "--all2all-backend default" in default.why and default.notes == ()
    deepep = ep_backend(DEEPEP)
    assert (deepep.name, deepep.dispatch, deepep.combine) == ("deepep_low_latency", "all_to_all", "all_to_all")
    [note] = deepep.notes
    assert "does not read this variable" in note and "33535" in note and "--all2all-backend" in note
    assert ep_backend({"VLLM_ALL2ALL_BACKEND": "flashinfer_all2allv"}).name == "flashinfer_nvlink_two_sided"
    removed = ep_backend({"VLLM_ALL2ALL_BACKEND": "pplx"})
    assert removed.name == "allgather_reducescatter" and "removed backend" in removed.why
    unknown = ep_backend({"VLLM_ALL2ALL_BACKEND": "carrier_pigeon"})
    assert unknown.name == "allgather_reducescatter" and any("not a backend" in n for n in unknown.notes)


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_tp_ep_runs_the_all_reduces_tp_runs(batch: int) -> None:
    """TP=8 EP=8 (DP = 1): no dispatch or combine; the 60 MoE layers' outputs are all-reduced like a dense MLP's."""
    ep = collectives_per_step(KIMI, Layout(kind="tp_ep", tp=8, ep=8), batch)
    ops = _by_op(ep)
    assert ops["all_reduce"] == [(61 + 1 + 1, batch * H), (60, batch * H)]  # attention, dense MLP, embedding; MoE
    assert ops["all_gather"] == [(1, batch * 163840 * 2)]  # the logits
    assert set(ops) == {"all_reduce", "all_gather"}
    tp = _by_op(collectives_per_step(KIMI, Layout(kind="tp", tp=8), batch))
    assert sum(c for c, _ in ops["all_reduce"]) == sum(c for c, _ in tp["all_reduce"]) == 123
    moe = next(c for c in ep if c.what.startswith("MoE output"))
    assert "runs no all2all backend" in moe.why and "use_all2all_kernels needs DP > 1" in moe.why


def test_dp_ep_default_backend_gathers_then_scatters() -> None:
    ops = _by_op(collectives_per_step(KIMI, Layout(kind="dp_ep", dp=8, ep=8), 61))
    gathered = 8 * 8  # 8 replicas each padded to ceil(61 / 8) = 8 requests
    assert ops == {"all_gather": [(60, gathered * (H + 8 * 8))],  # + top-8 float32 weights and int32 ids
                   "reduce_scatter": [(60, gathered * H)]}


def test_dp_ep_all_to_all_backend_dispatches_and_combines() -> None:
    ops = _by_op(collectives_per_step(KIMI, Layout(kind="dp_ep", dp=8, ep=8), 64, ep_backend(DEEPEP)))
    assert ops == {"all_to_all": [(120, 8 * 8 * H)]}  # 8 requests a replica, top-8 copies each


def test_the_plan_names_the_backend_and_takes_it_from_the_env() -> None:
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=8, batches=(16,), env=DEEPEP))
    assert any(n.startswith("VLLM_ALL2ALL_BACKEND=deepep_low_latency: vLLM 0.26.0 does not read") for n in doc.notes)
    dp = next(x for x in doc.layouts if x.name == "DP=8 EP=8").points[0].collectives_per_step
    [path] = dp["all_to_all"].paths or []
    assert path.why.startswith("all2all backend deepep_low_latency: --all2all-backend deepep_low_latency")
    plain = run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=8, batches=(16,)))
    dp = next(x for x in plain.layouts if x.name == "DP=8 EP=8").points[0].collectives_per_step
    assert set(dp) == {"all_gather", "reduce_scatter"}
    assert "all2all backend allgather_reducescatter: --all2all-backend default" in (dp["all_gather"].paths or [])[0].why
    assert not any("VLLM_ALL2ALL_BACKEND" in n for n in plain.notes)


def _expected_weights(arch_name: str, layout: Layout) -> float:
    """Weight bytes on one GPU, by hand from the model's config (the heaviest stage: all of it without PP)."""
    if arch_name == "kimi-k2.5":
        layers, moe, dense_first, experts, heads, vocab = 61, 60, 1, 384, 64, 163840
        wb, eb = 2.0, 0.5625  # bf16 attention / dense / shared; INT4 g32 experts
    else:  # deepseek-v3
        layers, moe, dense_first, experts, heads, vocab = 61, 58, 3, 256, 128, 129280
        wb = eb = 1 + 4 / (128 * 128)  # FP8 with a float32 scale per 128 × 128 block
    tp = layout.tp
    q_a, kv_a = 7168 * 1536, 7168 * (512 + 64)  # replicated on every rank
    q_b, kv_b, o = 1536 * heads * 192, 512 * heads * (128 + 128), heads * 128 * 7168  # split over TP
    attention = layers * ((q_a + kv_a) + (q_b + kv_b + o) / tp) * wb
    dense = dense_first * 3 * 7168 * 18432 / tp * wb
    shared = moe * 3 * 7168 * 2048 / tp * wb  # one shared expert, a TP-split MLP (whole when TP = 1)
    router = moe * 7168 * experts * 2
    held = experts // layout.ep
    routed = moe * held * 3 * 7168 * 2048 / (1 if layout.ep > 1 else tp) * eb
    vocab_parallel = 2 * vocab * 7168 / tp * 2  # embedding and lm_head, bf16
    return attention + dense + shared + router + routed + vocab_parallel


@pytest.mark.parametrize("model", ["kimi-k2.5", "deepseek-v3"])
@pytest.mark.parametrize("layout", [Layout(kind="tp", tp=8), Layout(kind="tp_ep", tp=8, ep=8),
                                    Layout(kind="dp_ep", dp=8, ep=8)], ids=lambda x: x.name)
def test_weight_bytes_per_gpu_with_the_shared_expert_split_over_tp(model: str, layout: Layout) -> None:
    arch = load_model_arch(model)
    mem = layout_memory(arch, layout, H200, default_factors(), context=4096)
    assert mem.weights_gib * GIB == pytest.approx(_expected_weights(model, layout), rel=1e-9)


def test_tp_ep_holds_no_more_than_tp() -> None:
    """E/8 whole experts weigh what 1/8 of every expert weighs, and the shared expert is split alike."""
    for arch in (KIMI, DSV3):
        tp, ep = (layout_memory(arch, x, H200, default_factors(), context=4096).weights_gib
                  for x in (Layout(kind="tp", tp=8), Layout(kind="tp_ep", tp=8, ep=8)))
        assert ep == pytest.approx(tp, rel=1e-12)
    assert load_model_arch("qwen3-235b-a22b").shared_experts == 0  # Qwen3-MoE has no shared expert


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_busiest_rank_against_routing_drawn_at_random(batch: int) -> None:
    """The expected most active experts on one of 8 ranks of 48, by drawing top-8 of 384 for every token."""
    rng = random.Random(24)
    trials = 3000
    total = 0
    for _ in range(trials):
        active = set()
        for _ in range(batch):
            active.update(rng.sample(range(384), 8))
        per_rank = [0] * 8
        for e in active:
            per_rank[e // 48] += 1
        total += max(per_rank)
    drawn = total / trials
    assert busiest_rank_experts(384, 8, batch, 8) == pytest.approx(drawn, rel=0.03)
    assert busiest_rank_experts(384, 8, batch, 1) == pytest.approx(active_experts(384, 8, batch))
    assert busiest_rank_experts(384, 8, 100_000, 8) == pytest.approx(48)
    assert busiest_rank_experts(384, 8, batch, 8) > active_experts(384, 8, batch) / 8  # above the mean rank
