"""Bands from each figure's origin, and deciding only what the figures decide (issue 38).

Every expected band is computed here from ``data/bands.toml`` read with ``tomllib`` and from the sizes by plain
arithmetic (log2 of a size over the nearest measured one), not from plan's functions; the measured curve is a real
gloo run on this repository's CI machine, committed with its provenance
(``tests/data/plan/gloo_ws4_all_reduce.json``, README there), read here with ``json``.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.plan import CollectivePath, PlanDoc
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.plan import plan_to_json, render_plan_html

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "src" / "servescope" / "data"
BANDS = tomllib.loads((DATA / "bands.toml").read_text(encoding="utf-8"))
POINTS = tomllib.loads((DATA / "comm" / "points.toml").read_text(encoding="utf-8"))
GLOO = ROOT / "tests" / "data" / "plan" / "gloo_ws4_all_reduce.json"
SEED = dict(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=8, batches=(1, 2, 4, 8, 16, 64))
WAIT = tomllib.loads((DATA / "plan.toml").read_text(encoding="utf-8"))["comm"]["wait"]["us"]


@pytest.fixture(scope="module")
def seed() -> PlanDoc:
    return run_plan(PlanRequest(**SEED))  # type: ignore[arg-type]


def _path(doc: PlanDoc, layout: str, batch: int, op: str, group: int) -> CollectivePath:
    x = next(x for x in doc.layouts if x.name == layout)
    p = next(p for p in x.points if p.batch == batch)
    return next(c for c in p.collectives_per_step[op].paths or [] if c.group == group)


def test_a_band_widens_when_the_figure_is_carried_past_its_points(seed: PlanDoc) -> None:
    """TP=8's all-reduce over 8 RTX PRO 6000 rests on the 8x RTX 6000D points (4 KB, 64 KB): a sibling's figure;
    past 64 KB each doubling widens both sides of the band by a factor 1 + [extended] per_doubling."""
    [sibling] = [p for p in POINTS["point"] if p["profiles"] == ["rtx-pro-6000"] and p["group"] == 8]
    top = max(sibling["bytes"])
    cls = BANDS["class"]["published_sibling"]
    per = BANDS["extended"]["per_doubling"]
    seen = []
    for batch in (4, 8, 16, 64):
        path = _path(seed, "TP=8", batch, "all_reduce", 8)
        doublings = max(0.0, math.log2(path.bytes_each / top))
        assert path.high_us_each is not None and path.low_us_each is not None and path.band
        widen = (1 + per) ** doublings  # a factor on each side for each doubling past 64 KB
        assert path.high_us_each / path.us_each == pytest.approx((1 + cls["hi"]) * widen)
        assert path.low_us_each / path.us_each == pytest.approx((1 - cls["lo"]) / widen)
        assert path.band.startswith("published_sibling") and ("extended" in path.band) == (doublings > 0)
        seen.append(path.high_us_each / path.us_each)
    assert seen[0] < seen[1] < seen[2] < seen[3]  # 56 KiB within, then 112, 224, 896 KiB: ever wider


def test_each_step_carries_its_band_and_throughput_band(seed: PlanDoc) -> None:
    """The step's band is every figure at its near and far side: the sum of the figures' shares, by hand."""
    for x in seed.layouts:
        for p in x.points:
            figs = p.figures or []
            assert sum(f.ms for f in figs) == pytest.approx(p.step_ms, rel=1e-9)
            assert p.step_ms_low == pytest.approx(p.step_ms - sum(f.lo_ms for f in figs))
            assert p.step_ms_high == pytest.approx(p.step_ms + sum(f.hi_ms for f in figs))
            assert p.tokens_per_s_low == pytest.approx(p.batch / p.step_ms_high * 1e3)
            assert p.tokens_per_s_high == pytest.approx(p.batch / p.step_ms_low * 1e3)
    text = plan_to_json(seed)
    assert '"step_ms_low"' in text and '"tokens_per_s_high"' in text
    html = render_plan_html(seed)
    assert "band ms" in html and "tok/s band" in html and "What decides it" in html


def test_the_seeds_batch_8_call_is_undecided_and_names_its_measurement(seed: PlanDoc) -> None:
    """At batch 8 TP=4 PP=2 leads TP=2 PP=4; the margin, set against what the two steps' figures can take from it
    (a figure both use moves both alike), is too small: no recommendation, the deciding figure and its command."""
    rec = seed.recommendation
    assert rec.layout is None and rec.decided is False and rec.leading == "TP=4 PP=2"
    call = next(c for c in rec.calls or [] if c.batch == 8)
    a = next(x for x in seed.layouts if x.name == call.fastest).points[3]
    b = next(x for x in seed.layouts if x.name == call.next).points[3]
    assert call.margin_ms == pytest.approx(b.step_ms - a.step_ms)
    fa = {f.figure: f for f in a.figures or []}
    fb = {f.figure: f for f in b.figures or []}
    take = 0.0
    for name in set(fa) | set(fb):
        x, y = fa.get(name), fb.get(name)
        take += max(0.0, (x.hi_ms if x else 0) - (y.hi_ms if y else 0), (y.lo_ms if y else 0) - (x.lo_ms if x else 0))
    assert call.band_ms == pytest.approx(take) and not call.decided and take > call.margin_ms
    m = rec.measure
    assert m is not None and m.figure.startswith("all_reduce over 4 GPUs") and m.band == "published_same_device"
    assert m.command == "servescope bench comm --gpus 4 --ops all_reduce --sizes 56K,112K -o comm.json"
    assert 10 < m.seconds < 60 and "--comm" in m.then


def test_the_close_call_turns_decided_with_a_bench_comm_result() -> None:
    """The measurement the plan asked for, run here under gloo (4 ranks, the sizes it named): with it the all-reduce
    over 4 GPUs is the measured curve, in situ (its band ±15%), and the batch-8 call is decided."""
    curve = json.loads(GLOO.read_text(encoding="utf-8"))
    assert curve["source"] == "measured" and curve["world_size"] == 4 and curve["backend"] == "gloo"
    measured = {p["bytes"]: p["time_us"] for c in curve["curves"] if c["op"] == "all_reduce" for p in c["points"]}
    doc = run_plan(PlanRequest(**SEED, comm=str(GLOO), force=True))  # type: ignore[arg-type]
    path = _path(doc, "TP=4 PP=2", 8, "all_reduce", 4)
    assert path.bytes_each == 4 * 7168 * 2 and path.origin == "measured curve" and path.band == "in_situ"
    assert path.us_each == pytest.approx(measured[57344] + WAIT)
    cls = BANDS["class"]["in_situ"]
    assert path.high_us_each == pytest.approx(path.us_each * (1 + cls["hi"]))
    call = next(c for c in doc.recommendation.calls or [] if c.batch == 8)
    assert call.decided and call.margin_ms is not None and call.band_ms is not None
    assert call.margin_ms > call.band_ms
    assert doc.forced  # a CPU curve for GPUs: used with --force, and said so


@pytest.mark.parametrize(("args", "option"), [
    (["--context", "100000000"], "--context"),
    (["--context", "0"], "--context"),
    (["--batch", "1,,2"], "--batch"),
    (["--batch", "0"], "--batch"),
    (["--gpus", "0"], "--gpus"),
    (["--hardware", "no-such-card"], "--hardware"),
    (["--model", "no-such-model"], "--model"),
])
def test_each_bad_value_is_one_line_naming_its_option(args: list[str], option: str) -> None:
    base = {"--model": "kimi-k2.5", "--hardware": "rtx-pro-6000", "--gpus": "8"}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    argv = ["plan", *[x for kv in base.items() for x in kv], *([a for a in args if a == "--batch"] and [])]
    if "--batch" in args:
        argv += ["--batch", args[args.index("--batch") + 1]]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in result.output


def test_model_names_are_case_insensitive() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "Kimi-K2.5", "--hardware", "rtx-pro-6000", "--gpus", "8",
                                      "--batch", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["model"]["name"] == "kimi-k2.5"


def test_ep_with_all_to_all_against_tp_per_batch(seed: PlanDoc) -> None:
    """The seed's trade-off: EP (all-to-all in place of the 60 MoE all-reduces) ahead at one stream, TP ahead at high
    concurrency; each batch's swap by hand from the two layouts' own collectives."""
    w = seed.ep_all_to_all
    assert w is not None and w.versus == "TP=8"
    ep = next(x for x in seed.layouts if x.name == "TP=8 EP=8")
    for row, p in zip(w.rows, ep.points, strict=True):
        moe = next(c for c in p.collectives_per_step["all_reduce"].paths or [] if c.what.startswith("MoE output"))
        assert row.all_reduce_calls == moe.count == 60 and row.all_to_all_calls == 120
        per_rank = -(-row.batch // 8)
        assert row.all_to_all_bytes == per_rank * 8 * 7168 * 2
        assert row.ep_ms == pytest.approx(p.step_ms - 60 * moe.us_each / 1e3 + 120 * row.all_to_all_us_each / 1e3)
        assert row.ep_low_ms <= row.ep_ms <= row.ep_high_ms and row.tp_low_ms <= row.tp_ms <= row.tp_high_ms
    assert w.rows[0].ep_ms < w.rows[0].tp_ms  # one stream: EP ahead
    c = w.crossover_batch
    assert c is not None and c > 64
    assert "do not place the crossover" in w.sentence or all(w.crossover_band)


TOPO = ROOT / "tests" / "data" / "plan" / "topo"
PLAN = tomllib.loads((DATA / "plan.toml").read_text(encoding="utf-8"))
PRO = tomllib.loads((DATA / "hardware" / "rtx-pro-6000.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("topology", "bound"), [("8x-rtx-pro-6000-switches.txt", "uplink"),
                                                  ("8x-rtx-pro-6000-dual-cpu.txt", "bridge"), (None, "bridge")])
def test_the_all_to_all_follows_the_boxs_pcie_topology(topology: str | None, bound: str) -> None:
    """DP=8 EP=8 with DeepEP at batch 64 on 8 RTX PRO 6000: behind two switches of 4 GPUs (published topo -m), what
    leaves a switch takes its x16 uplink; direct attach (PHB/SYS) crosses the host bridge, as without a topology."""
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=8, batches=(64,),
                               env={"VLLM_ALL2ALL_BACKEND": "deepep_low_latency"},
                               topology=None if topology is None else str(TOPO / topology)))
    path = _path(doc, "DP=8 EP=8", 64, "all_to_all", 8)
    send = 8 * 8 * 7168 * 2  # 8 requests a rank, 8 routed copies of a bf16 hidden vector each
    link_rate = PRO["p2p_gbps"] * PLAN["efficiency"]["link"] * 1e3  # bytes/µs
    link = 7 / 8 * send / link_rate
    alpha = PLAN["comm"]["pcie"]["base_us"] + PLAN["comm"]["pcie"]["hop_us"]
    if bound == "uplink":  # 4 senders a switch, each sending 4/8 of its buffer to the other switch's GPUs
        far = 4 * 4 / 8 * send / link_rate
    else:
        far = 8 * 7 / 8 * send / (PLAN["all_to_all_pcie"]["bridge_gbps"]["8"] * 1e3)
    assert far > link
    assert path.us_each == pytest.approx(alpha + far + WAIT)
    assert path.path is not None and path.path.endswith(
        "the switch uplink binds" if bound == "uplink" else "the host bridge binds")
    if topology:
        assert any(n.startswith("topology ") and topology in n for n in doc.notes)
        assert doc.inputs.topology is not None


def _gap_favouring_ep(doc: PlanDoc, batch: int) -> float:
    """EP's step less TP's with every figure at the side that favours EP, a figure both use counted once, by hand:
    the fastest EP layout against TP=8 at ``batch``."""
    k = doc.batches.index(batch)
    ep = min((x for x in doc.layouts if x.feasible and x.ep > 1), key=lambda x: x.points[k].step_ms).points[k]
    tp = next(x for x in doc.layouts if x.name == "TP=8").points[k]
    fe, ft = {f.figure: f for f in ep.figures or []}, {f.figure: f for f in tp.figures or []}
    take = 0.0
    for name in set(fe) | set(ft):
        e, t = fe.get(name), ft.get(name)
        take += max(0.0, (t.hi_ms if t else 0) - (e.hi_ms if e else 0), (e.lo_ms if e else 0) - (t.lo_ms if t else 0))
    return ep.step_ms - tp.step_ms - take


def test_the_ep_tp_crossover_moves_within_its_band() -> None:
    """DeepSeek-V3 on 8 H200 with DeepEP: the crossover as predicted lies between the crossovers with every figure at
    the side that favours EP, then TP; at the EP-favoured one the sign of the gap, computed here, changes."""
    env = {"VLLM_ALL2ALL_BACKEND": "deepep_low_latency"}
    v = run_plan(PlanRequest(model="deepseek-v3", hardware="h200", gpus=8, batches=(1, 64), env=env)).ep_vs_tp
    assert v is not None and v.crossover_batch is not None and v.crossover_band is not None
    lo, hi = v.crossover_band
    assert lo is not None and hi is not None and lo <= v.crossover_batch <= hi
    doc = run_plan(PlanRequest(model="deepseek-v3", hardware="h200", gpus=8, batches=(lo - 1, lo), env=env))
    assert _gap_favouring_ep(doc, lo - 1) >= 0 > _gap_favouring_ep(doc, lo)


def test_p2p_off_in_the_topology_turns_custom_all_reduce_off(tmp_path: Path) -> None:
    """2 RTX 5090 whose `topo -p2p rw` says GNS (a public rig report, tests/data/gpu/topo): given as the box's
    topology, the plan takes P2P as off: the 2-GPU all-reduce leaves vLLM's custom kernel (it needs P2P) for NCCL."""
    rig = ROOT / "tests" / "data" / "gpu" / "topo" / "2x5090-phb-p2p-gns"
    topo = tmp_path / "topo.txt"
    topo.write_text((rig / "topo-m.txt").read_text() + "\n" + (rig / "topo-p2p-rw.txt").read_text(), encoding="utf-8")
    kw = dict(model="llama-3-70b", hardware="rtx-pro-6000", gpus=2, batches=(1,), context=1000)
    on = run_plan(PlanRequest(**kw))  # type: ignore[arg-type]
    off = run_plan(PlanRequest(**kw, topology=str(topo)))  # type: ignore[arg-type]
    assert _path(on, "TP=2", 1, "all_reduce", 2).impl == "custom_1stage"
    path = _path(off, "TP=2", 1, "all_reduce", 2)
    assert path.impl == "nccl" and "no GPU P2P" in (path.path or "")
    assert off.hardware.p2p is False and any("P2P off between them (topo -p2p: GNS)" in n for n in off.notes)


@pytest.mark.parametrize("nbytes", [1 << 20, 16 << 20, 128 << 20])
def test_an_all_to_all_without_p2p_pays_the_host_memory_staging(nbytes: int) -> None:
    """8 RTX 4090 (stock driver, P2P off): the all-to-all's bounds times what P2P off cost the same box's nccl-tests
    all-reduce at that size, read here from the bundled curve's two variants."""
    from servescope.plan.collectives import CommCosts
    from servescope.plan.factors import default_factors
    from servescope.plan.hardware import load_hardware

    curves = json.loads((DATA / "comm" / "rtx4090_x8_pcie.json").read_text(encoding="utf-8"))["curves"]
    t = {c["variant"]: {p["bytes"]: p["time_us"] for p in c["points"]} for c in curves if c["op"] == "all_reduce"}
    ratio = t["default"][nbytes] / t["tinygrad-p2p-driver"][nbytes]
    hw = load_hardware("rtx4090")
    m = CommCosts(hw, default_factors(), []).price("all_to_all", 8, nbytes).alltoall
    assert m is not None and m.p2p_off_factor == pytest.approx(max(1.0, ratio), rel=0.01)
    bound = max(m.link_bytes / (m.link_gbps.value * m.link_efficiency.value * 1e3),
                m.bridge_bytes / (m.bridge_gbps.value * 1e3))
    assert m.us == pytest.approx(m.latency_us.value + bound * m.p2p_off_factor)
