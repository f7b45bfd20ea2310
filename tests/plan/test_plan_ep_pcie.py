"""EP on PCIe (issue 24 item 4): the all-to-all's two bounds, and the batch at which EP and TP cross.

vLLM 0.26 runs an all-to-all only for DP=N EP=N with an all-to-all backend (``--all2all-backend``, asked here by
``VLLM_ALL2ALL_BACKEND``; tests/plan/test_plan_ep_vllm.py): the all-to-all cases below are that layout's.

Every expected time is computed here by plain arithmetic from the data files read with ``tomllib`` (the hardware
profile's ``p2p_gbps``, ``data/plan.toml``'s link efficiency, PCIe α, wait and bridge figure) and the model's shape
(hidden × 2 bytes, top_k), not from plan's functions. The model under test: each GPU's (G − 1)/G of its send
buffer through its own x16 link; every sender's share across the host bridge at the aggregate rate a host was
measured to sustain; the longer of the two plus one step's latency and the wait for the last rank.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.document import decode
from servescope.core.plan import CollectivePath, EpTpCrossing, PlanDoc
from servescope.plan.collectives import CommCosts, estimate_us
from servescope.plan.factors import default_factors
from servescope.plan.hardware import load_hardware
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.plan import plan_to_json, render_plan_html

DATA = Path(__file__).resolve().parents[2] / "src" / "servescope" / "data"
PLAN = tomllib.loads((DATA / "plan.toml").read_text(encoding="utf-8"))
PRO = tomllib.loads((DATA / "hardware" / "rtx-pro-6000.toml").read_text(encoding="utf-8"))
KIMI = tomllib.loads((DATA / "models" / "kimi-k2.5.toml").read_text(encoding="utf-8"))
G = 8
LINK = PRO["p2p_gbps"] * PLAN["efficiency"]["link"] * 1e3  # bytes/µs through one GPU's x16 link, one direction
BRIDGE = PLAN["all_to_all_pcie"]["bridge_gbps"]["8"] * 1e3  # bytes/µs across the host bridge, all senders
ALPHA = PLAN["comm"]["pcie"]["base_us"] + PLAN["comm"]["pcie"]["hop_us"]  # one step of the PCIe estimate
WAIT = PLAN["comm"]["wait"]["us"]
TOKEN = KIMI["top_k"] * KIMI["hidden"] * 2  # one token's top-k routed copies of its bf16 hidden vector
DEEPEP = {"VLLM_ALL2ALL_BACKEND": "deepep_low_latency"}
BUS = tomllib.loads((DATA / "comm" / "points.toml").read_text(encoding="utf-8"))["bandwidth"][0]["bus_gbps"] * 1e3


def _a2a(doc: PlanDoc, layout: str, batch: int) -> CollectivePath:
    x = next(x for x in doc.layouts if x.name == layout)
    p = next(p for p in x.points if p.batch == batch)
    [path] = p.collectives_per_step["all_to_all"].paths or []
    return path


def _expected(batch: int) -> tuple[float, float, float]:
    """(link µs, bridge µs, whole call µs) of Kimi-K2.5's DP=8 EP=8 all-to-all at ``batch``, by hand."""
    per_rank = math.ceil(batch / G)  # a replica's requests
    senders = math.ceil(batch / per_rank)  # ranks holding any
    send = per_rank * TOKEN  # the per-rank send buffer
    link = (G - 1) / G * send / LINK
    bridge = senders * (G - 1) / G * send / BRIDGE
    return link, bridge, ALPHA + max(link, bridge) + WAIT


@pytest.fixture(scope="module")
def kimi_pro() -> PlanDoc:
    return run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=G, batches=(1, 3, 4, 64), env=DEEPEP))


def test_each_gpus_sends_serialised_through_its_own_link(kimi_pro: PlanDoc) -> None:
    """Batch 1: one GPU holds the token and pushes 7/8 of its 8 routed copies through its x16 link: the link binds."""
    link, bridge, whole = _expected(1)
    assert link == pytest.approx(7 / 8 * 8 * 7168 * 2 / (64 * 0.8 * 1e3))  # 1.96 µs
    assert link > bridge
    path = _a2a(kimi_pro, "DP=8 EP=8", 1)
    assert path.us_each == pytest.approx(whole, rel=1e-9)  # 12.1 + 1.96 + 1.0 µs
    assert path.wait_us_each == WAIT and path.origin == "assumed"
    assert path.path and path.path.endswith("the link binds") and "serialised through each GPU's x16 link" in path.path
    assert path.source.startswith("PCIe all-to-all model")


@pytest.mark.parametrize(("batch", "bound"), [(3, "link"), (4, "bridge"), (64, "bridge")])
def test_the_shared_bridge_takes_over_when_enough_gpus_send(kimi_pro: PlanDoc, batch: int, bound: str) -> None:
    """The bridge carries every sender's share: from 4 senders (4 / 173.1 > 1 / 51.2) it is the longer bound."""
    link, bridge, whole = _expected(batch)
    assert (bridge > link) == (bound == "bridge")
    path = _a2a(kimi_pro, "DP=8 EP=8", batch)
    assert path.us_each == pytest.approx(whole, rel=1e-9)
    assert path.path and path.path.endswith("the host bridge binds" if bound == "bridge" else "the link binds")
    if batch == 64:  # 8 ranks of 8 tokens: 7 × 917,504 B across the bridge at 173.1 GB/s = 37.1 µs
        assert bridge == pytest.approx(7 * 8 * TOKEN / 173.1e3) and whole == pytest.approx(12.1 + 37.10 + 1.0, abs=0.01)


def test_the_default_backend_gathers_at_the_boxs_published_bus_bandwidth() -> None:
    """allgather_reducescatter on 8 RTX PRO 6000: the α-β estimate, its bandwidth at most the 22.2 GB/s bus
    bandwidth published for the all-reduce between these GPUs (assumed for the all-gather and reduce-scatter)."""
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=G, batches=(8, 1024)))
    x = next(x for x in doc.layouts if x.name == "DP=8 EP=8")
    for p in x.points:
        gathered = G * math.ceil(p.batch / G)
        for op, nbytes in (("all_gather", gathered * (KIMI["hidden"] * 2 + 8 * 8)),
                           ("reduce_scatter", gathered * KIMI["hidden"] * 2)):
            [path] = p.collectives_per_step[op].paths or []
            pcie = PLAN["comm"]["pcie"]
            estimate = pcie["base_us"] + 7 * pcie["hop_us"] + 7 / 8 * nbytes / LINK  # 7 hops of a ring
            assert path.us_each == pytest.approx(max(estimate, 7 / 8 * nbytes / BUS) + WAIT)
            assert path.origin == "assumed" and "22.2 GB/s bus bandwidth published" in path.why
            assert (7 / 8 * nbytes / BUS > estimate) == (p.batch == 1024)  # the ceiling binds at 14 MiB


def test_nccl_proto_does_not_reach_the_all_to_all() -> None:
    """NCCL picks a send/recv's protocol by NCCL_P2P_LL_THRESHOLD, not NCCL_PROTO (src/enqueue.cc): no LL term."""
    f = default_factors()
    for name in ("rtx-pro-6000", "h200"):
        hw = load_hardware(name)
        plain = CommCosts(hw, f, []).price("all_to_all", G, 1 << 20)
        ll = CommCosts(hw, f, [], env={"NCCL_PROTO": "LL"}).price("all_to_all", G, 1 << 20)
        assert ll.us == plain.us
    pro = load_hardware("rtx-pro-6000")  # the all-reduce keeps its LL term
    assert (CommCosts(pro, f, [], env={"NCCL_PROTO": "LL"}).price("all_reduce", G, 1 << 25).us
            > CommCosts(pro, f, []).price("all_reduce", G, 1 << 25).us)


def test_nvlink_boxes_keep_the_alpha_beta_all_to_all() -> None:
    """On NVLink (multicast, a switch fabric) the all-to-all is the α-β estimate + the wait, as before."""
    hw, f = load_hardware("h200"), default_factors()
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=G, batches=(1, 64), env=DEEPEP))
    for layout, batch, send in [("DP=8 EP=8", 1, TOKEN), ("DP=8 EP=8", 64, 8 * TOKEN)]:
        path = _a2a(doc, layout, batch)
        nvlink = PLAN["comm"]["nvlink"]
        by_hand = nvlink["base_us"] + nvlink["hop_us"] + 7 / 8 * send / (450 * 0.8 * 1e3)
        assert path.us_each == pytest.approx(by_hand + WAIT)
        assert path.us_each == pytest.approx(estimate_us("all_to_all", G, send, hw, f) + WAIT)
        assert path.source == "α-β estimate" and path.path == "NCCL"


def _qwen3_30b(tmp_path: Path) -> str:
    """Qwen/Qwen3-30B-A3B's config.json (the fields plan reads): small enough for DP=8 EP=8 on 96 GB cards."""
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
              "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
              "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
              "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "norm_topk_prob": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def test_the_crossover_is_where_the_two_step_times_cross(tmp_path: Path) -> None:
    """Qwen3-30B-A3B on 8 RTX PRO 6000, vLLM's default backend: TP=8 is faster at batch 1 and DP=8 EP=8 from the
    crossover on; the plan's own step times one batch below and at it (its layout table, asked for those batches)
    agree."""
    model = _qwen3_30b(tmp_path)
    doc = run_plan(PlanRequest(model=model, hardware="rtx-pro-6000", gpus=G, batches=(1, 32)))
    v = doc.ep_vs_tp
    assert v is not None
    c = v.crossover_batch
    assert c is not None and 1 < c <= 32 and v.faster_first == "TP=8"
    below, at = v.at
    assert (below.batch, at.batch) == (c - 1, c)
    assert below.tp.step_ms < below.ep.step_ms and at.ep.step_ms < at.tp.step_ms
    assert v.crossings[0] == EpTpCrossing(batch=c, faster_below="TP=8", faster_from="DP=8 EP=8")
    assert f"cross at batch {c}:" in v.sentence
    table = run_plan(PlanRequest(model=model, hardware="rtx-pro-6000", gpus=G, batches=(c - 1, c)))
    step = {(x.name, p.batch): p.step_ms for x in table.layouts for p in x.points}
    for lo, hi in ((below.tp, at.tp), (below.ep, at.ep)):
        assert lo.step_ms == pytest.approx(step[(lo.layout, c - 1)], rel=1e-12)
        assert hi.step_ms == pytest.approx(step[(hi.layout, c)], rel=1e-12)
    # the reason in numbers: each side's collectives as count × µs a call
    tp_ar = next(x for x in at.tp.collectives if x.op == "all_reduce")
    assert f"all_reduce {tp_ar.count} × {tp_ar.us_each:,.1f} µs (published point)" in v.reasons[1]
    ag = next(x for x in at.ep.collectives if x.op == "all_gather")
    assert f"all_gather {ag.count} × {ag.us_each:,.1f} µs (assumed)" in v.reasons[1]
    assert at.ep.all_to_all is None  # the default backend gathers and scatters


def test_without_a_crossover_the_plan_says_which_side_wins_everywhere() -> None:
    """Kimi-K2.5 on 8 RTX PRO 6000: DP=8 EP=8 does not fit, and TP=8 EP=8 runs TP=8's all-reduces (DP = 1): it
    differs by the busiest rank's experts only, so TP=8 is faster at batch 1 and as fast once every GPU's experts
    are all active."""
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=G, batches=(1, 64)))
    v = doc.ep_vs_tp
    assert v is not None
    assert v.crossover_batch is None and v.crossings == [] and v.searched == [1, 65536]
    assert v.ep_layouts == ["TP=8 EP=8"] and v.faster_first == "TP=8"
    first, last = v.at
    assert (first.batch, last.batch) == (1, 65536)
    assert first.tp.step_ms < first.ep.step_ms
    assert first.tp.parts_ms["collectives"] == first.ep.parts_ms["collectives"]
    assert last.tp.step_ms == pytest.approx(last.ep.step_ms, rel=1e-9)
    assert v.sentence.startswith("EP and TP do not cross from batch 1 to 65,536: TP=8 is faster than TP=8 EP=8 "
                                 "or as fast at every batch")
    assert any(r.startswith("at batch 65,536 they predict the same step") for r in v.reasons)
    assert v.kv_max_batch == {"TP=8 EP=8": 28, "TP=8": 28}  # 114,868 KV tokens a GPU ÷ 4,096


def test_the_text_names_the_assumption_and_the_json_and_html_carry_it(tmp_path: Path) -> None:
    model = _qwen3_30b(tmp_path)
    args = ["plan", "--model", model, "--hardware", "rtx-pro-6000", "--gpus", "8", "--batch", "1,64",
            "--env", "VLLM_ALL2ALL_BACKEND=deepep_low_latency"]
    text = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert text.exit_code == 0, text.output
    flat = " ".join(text.stdout.split())
    assert "EP vs TP: EP and TP do not cross from batch 1 to 65,536: DP=8 EP=8 is faster" in flat
    assert ("PCIe without NVLink, so no multicast: each GPU's sends serialised through its own x16 link, the host "
            "bridge shared by every sender") in flat
    assert "173.1 GB/s (published)" in flat and "64 GB/s (datasheet) × 0.8 (assumed)" in flat
    assert "12.1 µs latency (assumed)" in flat and "vLLM 0.26.0 does not read this variable" in flat
    doc = run_plan(PlanRequest(model=model, hardware="rtx-pro-6000", gpus=8, batches=(1, 64), env=DEEPEP))
    text = plan_to_json(doc)
    assert decode(text.encode(), "plan.json") == doc  # a saved plan reads back as the same typed document
    a2a = json.loads(text)["ep_vs_tp"]["at"][0]["ep"]["all_to_all"]
    assert {k: a2a[k]["origin"] for k in ("link_gbps", "link_efficiency", "bridge_gbps", "latency_us")} == {
        "link_gbps": "datasheet", "link_efficiency": "assumed", "bridge_gbps": "published", "latency_us": "assumed"}
    assert "voipmonitor/rtx6kpro" in a2a["bridge_gbps"]["source"]
    html = render_plan_html(doc)
    assert "<h2>EP vs TP</h2>" in html and "bridge_gbps" in html and "voipmonitor/rtx6kpro" in html


def test_another_profile_takes_the_bridge_figure_as_assumed() -> None:
    """L40S: the bridge figure was measured with RTX PRO 6000s on another host: assumed, and said."""
    m = CommCosts(load_hardware("l40s"), default_factors(), []).price("all_to_all", G, 1 << 20).alltoall
    assert m is not None and m.bridge_gbps.origin == "assumed" and "assumed" in m.bridge_gbps.source
    assert m.link_gbps.value == 32  # its own PCIe Gen4 x16 link


def test_a_dense_model_has_no_ep_side() -> None:
    doc = run_plan(PlanRequest(model="llama-3-70b", hardware="rtx-pro-6000", gpus=G, batches=(1,)))
    assert doc.ep_vs_tp is None


@pytest.mark.parametrize(("hardware", "backend", "warned"), [
    ("rtx-pro-6000", "deepep_high_throughput", True), ("rtx-pro-6000", "flashinfer_nvlink_two_sided", True),
    ("rtx-pro-6000", "deepep_low_latency", False), ("rtx-pro-6000", "allgather_reducescatter", False),
    ("h200", "deepep_high_throughput", False)])
def test_a_backend_that_needs_nvlink_is_named_on_pcie(hardware: str, backend: str, warned: bool) -> None:
    """DeepEP's high-throughput kernels need NVLink within a node (its maintainers, DeepEP issues 216 and 162; the
    data file says so, by its interconnect, read here as plain TOML): on a PCIe box the plan says the layout will
    not run with it; on NVLink, or with a backend that runs on PCIe, nothing."""
    rules = tomllib.loads((DATA / "comm" / "vllm-0.26.toml").read_text(encoding="utf-8"))["ep"]["backends"][backend]
    profile = tomllib.loads((DATA / "hardware" / f"{hardware}.toml").read_text(encoding="utf-8"))
    assert (rules.get("needs") == "nvlink" and profile.get("nvlink_gbps", 0) == 0) is warned
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware=hardware, gpus=G, batches=(1,),
                               env={"VLLM_ALL2ALL_BACKEND": backend}))
    said = [n for n in doc.notes if n.startswith(f"--all2all-backend {backend} needs nvlink")]
    assert bool(said) is warned
    if warned:
        assert "will not run with it" in said[0] and rules["needs_source"] in said[0]
