"""plan.hardware and plan.collectives: tolerant profile loading, curve selection, the α-β fallback.

The curve tests use the real H200 world-size-1 file from ``bench comm`` and curve files written here in the
``servescope.comm-curves/1`` format with known points, so interpolated times can be worked out by hand.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import InputError
from servescope.plan.collectives import CommCosts, bundled_curves, estimate_us, user_curves
from servescope.plan.factors import default_factors
from servescope.plan.hardware import list_hardware_profiles, load_hardware

DATA = Path(__file__).resolve().parents[1] / "data"
H200_VLLM = DATA / "h200-vllm"
H100_VLLM = DATA / "h100-vllm"
FACTORS = default_factors()


def _trace_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        events: list[dict[str, Any]] = json.load(fh)["traceEvents"]
    return events


def test_every_bundled_profile_loads() -> None:
    names = list_hardware_profiles()
    assert "h200" in names
    for name in names:
        hw = load_hardware(name)
        assert hw.memory_gb > 0 and hw.hbm_gbps > 0 and hw.p2p_gbps > 0
        assert hw.interconnect in ("nvlink", "pcie")


def test_h200_profile_numbers_and_defaults() -> None:
    hw = load_hardware("h200")
    assert (hw.memory_gb, hw.hbm_gbps, hw.nvlink_gbps) == (141.0, 4800.0, 900.0)
    assert hw.interconnect == "nvlink" and hw.p2p_gbps == 450.0
    assert hw.tflops_for("bfloat16") == 989 and hw.tflops_for("int4-g32") == 989


def test_extra_keys_and_both_interconnect_spellings(tmp_path: Path) -> None:
    flat = tmp_path / "flat.toml"
    flat.write_text('memory_gb = 96\nhbm_gbps = 1792\npcie_gbps = 128\ninterconnect = "pcie"\np2p_gbps = 64\n'
                    'nvlink_multicast = false\nsomething_new = [1, 2]\n[dense_tflops]\nbfloat16 = 500\n',
                    encoding="utf-8")
    hw = load_hardware(flat)
    assert (hw.name, hw.interconnect, hw.p2p_gbps, hw.p2p_origin) == ("flat", "pcie", 64.0, "datasheet")
    table = tmp_path / "table.toml"
    table.write_text('memory_gb = 80\nhbm_gbps = 3350\nnvlink_gbps = 900\n[interconnect]\nkind = "nvlink"\n'
                     "p2p_gbps = 400\nhop_us = 1.0\nextra = 3\n", encoding="utf-8")
    hw = load_hardware(table)
    assert (hw.interconnect, hw.p2p_gbps, hw.hop_us, hw.base_us) == ("nvlink", 400.0, 1.0, None)
    bare = tmp_path / "bare.toml"
    bare.write_text("memory_gb = 80\nhbm_gbps = 3350\nnvlink_gbps = 900\n", encoding="utf-8")
    hw = load_hardware(bare)  # no interconnect keys: NVLink (nvlink_gbps > 0), half the bidirectional rate
    assert (hw.interconnect, hw.p2p_gbps, hw.p2p_origin) == ("nvlink", 450.0, "assumed")
    bare.write_text("memory_gb = 48\nhbm_gbps = 864\n", encoding="utf-8")
    hw = load_hardware(bare)  # no NVLink, no PCIe figure: PCIe Gen4 x16, 64 GB/s bidirectional
    assert (hw.interconnect, hw.p2p_gbps) == ("pcie", 32.0)
    assert hw.kernel_floor_us == {} and hw.other_floor_us(16) is None  # no floors: not known, not 0


def test_an_engines_attention_kernel_has_its_own_floor() -> None:
    """FlashAttention 3's decode kernel on the H200: the profile's floor is the fewest µs a call of that kernel in
    the batch-1 vLLM captures of 2026-12-03 (plain gzip + json over their traces); any other attention kernel gets
    the plain PyTorch floor."""
    hw = load_hardware("h200")
    fewest = min(float(e["dur"]) for name in ("dense-graphs-b1", "dense-eager-b1", "moe-graphs-b1", "moe-eager-b1")
                 for e in _trace_events(H200_VLLM / name / "rank0.pt.trace.json.gz")
                 if e.get("cat") == "kernel" and "FlashAttnFwdSm90" in e.get("name", ""))
    fa3 = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>(...)"
    assert hw.attention_floor_us(fa3) == pytest.approx(fewest, abs=0.005)
    assert hw.attention_floor_us("flash_fwd_splitkv_kernel") == hw.kernel_floor_us["attention"] < fewest
    assert "2026-12-03" in hw.attention_kernel_floor_source
    h100 = load_hardware("h100-sxm")  # measured the same way on a lent H100 (2026-12-05, bf16 and fp8 servers)
    fewest = min(float(e["dur"]) for trace in sorted((H100_VLLM / "steady" / "w4").glob("*-b1/rank0.pt.trace.json.gz"))
                 for e in _trace_events(trace)
                 if e.get("cat") == "kernel" and "FlashAttnFwdSm90" in e.get("name", ""))
    assert h100.attention_floor_us(fa3) == pytest.approx(fewest, abs=0.005) != hw.attention_floor_us(fa3)
    l40s = load_hardware("l40s")  # never measured: the plain PyTorch floor, or none
    assert l40s.attention_floor_us(fa3) == l40s.kernel_floor_us.get("attention")
    # FA3's KV read rate: measured on the H100's long-context window only (its KV bytes over its time less the
    # floors, by plain json), none elsewhere
    window = H100_VLLM / "long" / "dense-long-b16"
    prov = json.loads((window / "provenance.json").read_text(encoding="utf-8"))
    shape, events = prov["model_shape"], _trace_events(window / "rank0.pt.trace.json.gz")
    steps = [e for e in events if e.get("cat") == "gpu_user_annotation"
             and e.get("name") == "execute_context_0(0)_generation_16(16)"]
    calls = [float(e["dur"]) for e in events if e.get("cat") == "kernel" and "FlashAttnFwdSm90" in e.get("name", "")
             and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)]
    kv_bytes = (shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * shape["hidden_size"]
                // shape["num_attention_heads"] * 2 * 3069 * 16)  # K and V, bf16, 3,069 tokens, 16 requests
    streamed_us = (sum(calls) - len(calls) * h100.attention_floor_us(fa3)) / len(steps)
    rate = kv_bytes / (h100.hbm_gbps * 1e3 * streamed_us)
    assert h100.attention_rate(fa3) == pytest.approx(rate, abs=0.005) and "dense-long-b16" in \
        h100.attention_kernel_rate_source
    assert hw.attention_rate(fa3) is None and h100.attention_rate("flash_fwd_splitkv_kernel") is None


@pytest.mark.parametrize(("text", "words"), [
    ("hbm_gbps = 1\n", "missing field 'memory_gb'"),
    ("memory_gb = 'lots'\nhbm_gbps = 1\n", "memory_gb: expected a number"),
    ('memory_gb = 1\nhbm_gbps = 1\ninterconnect = "infiniband"\n', "interconnect.kind"),
    ("memory_gb = [\n", "not TOML"),
    ("memory_gb = 1\nhbm_gbps = 1\n[kernel_floor_us]\nlaunch = 2.0\n", "kernel_floor_us: unknown kind 'launch'"),
    ("memory_gb = 1\nhbm_gbps = 1\n[kernel_floor_us]\nother = -1\n", "other: expected a number"),
    ('memory_gb = 1\nhbm_gbps = 1\n[kernel_floor_us]\norigin = "guessed"\n', "neither 'measured' nor 'assumed'"),
    ('memory_gb = 1\nhbm_gbps = 1\n[kernel_floor_us]\nfrom = "h300"\n', "from: 'h300' is not a bundled profile"),
    ('memory_gb = 1\nhbm_gbps = 1\n[kernel_floor_us]\nfrom = "l40s"\n', "l40s has no measured kernel floors"),
    ('memory_gb = 1\nhbm_gbps = 1\n[other_floor_by_batch_us]\n"0" = 1.0\n', "'0' is not a batch size"),
    ('memory_gb = 1\nhbm_gbps = 1\n[other_floor_by_batch_us]\nb16 = 1.0\n', "'b16' is not a batch size"),
    ('memory_gb = 1\nhbm_gbps = 1\n[other_floor_by_batch_us]\n"16" = "fast"\n', "16: expected a number"),
    ("memory_gb = 1\nhbm_gbps = 1\nattention_kernel_floor_us = 8\n", "attention_kernel_floor_us: expected a table"),
    ('memory_gb = 1\nhbm_gbps = 1\n[attention_kernel_floor_us]\nFlash = "slow"\n', "Flash: expected a number"),
    ("memory_gb = 1\nhbm_gbps = 1\n[attention_kernel_rate]\nFlash = 1.5\n", "not a fraction of hbm_gbps"),
    ("memory_gb = 1\nhbm_gbps = 1\nattention_kernel_rate = 0.9\n", "attention_kernel_rate: expected a table"),
])
def test_bad_profiles_name_the_file(written: Callable[..., Path], text: str, words: str) -> None:
    path = written(text)
    with pytest.raises(InputError, match=words) as info:
        load_hardware(path)
    assert str(path) in str(info.value)


def _curve_file(path: Path, *, world: int, points: list[tuple[int, float]], op: str = "all_reduce",
                source: str = "measured", graph: bool = False) -> Path:
    doc: dict[str, Any] = {
        "schema": "servescope.comm-curves/1", "source": source, "provenance": "written by a test",
        "device": "NVIDIA H200", "interconnect": "nvlink", "backend": "nccl",
        "versions": {"torch": "test", "nccl": None}, "date": "2026-12-03", "host": None, "world_size": world,
        "dtype": "bfloat16",
        "curves": [{"op": op, "variant": "default", "env": {}, "graph": graph, "points": [
            {"bytes": b, "time_us": t, "algbw_gbps": 0.0, "busbw_gbps": 0.0, "iters": 10} for b, t in points]}],
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_user_curve_is_used_for_its_world_size_only(tmp_path: Path) -> None:
    hw = load_hardware("h200")
    path = _curve_file(tmp_path / "c.json", world=8, points=[(1024, 10.0), (4096, 40.0)])
    comm = CommCosts(hw, FACTORS, [user_curves(path)], engine=None)
    assert comm.time_us("all_reduce", 8, 1024) == (10.0, "measured curve")
    t, origin = comm.time_us("all_reduce", 8, 2048)  # halfway in log bytes: geometric mean of the times
    assert origin == "measured curve" and t == pytest.approx(math.sqrt(10.0 * 40.0))
    assert comm.time_us("all_reduce", 8, 8192)[0] == pytest.approx(80.0)  # beyond: the last bandwidth
    t4, origin4 = comm.time_us("all_reduce", 4, 2048)  # another group size: the estimate
    assert origin4 == "assumed" and t4 == pytest.approx(estimate_us("all_reduce", 4, 2048, hw, FACTORS))
    assert comm.time_us("all_to_all", 8, 2048)[1] == "assumed"  # an op the file lacks


def test_graph_curve_preferred_and_scale_applied(tmp_path: Path) -> None:
    hw = load_hardware("h200")
    eager = user_curves(_curve_file(tmp_path / "e.json", world=2, points=[(1024, 20.0)]))
    graph = user_curves(_curve_file(tmp_path / "g.json", world=2, points=[(1024, 5.0)], graph=True,
                                    source="published"))
    comm = CommCosts(hw, FACTORS, [eager, graph], engine=None)
    assert comm.time_us("all_reduce", 2, 512) == (20.0, "measured curve")  # first file wins, its eager curve
    comm = CommCosts(hw, FACTORS.replaced("calibrated", collective_scale=2.0), [graph, eager], engine=None)
    assert comm.time_us("all_reduce", 2, 512) == (10.0, "published curve")


def test_real_world_size_one_file_loads_and_single_gpu_costs_nothing() -> None:
    hw = load_hardware("h200")
    comm = CommCosts(hw, FACTORS, [user_curves(DATA / "comm" / "h200_ws1_nccl.json")], engine=None)
    assert comm.time_us("all_reduce", 1, 1 << 20) == (0.0, "assumed")
    assert comm.curve_for("all_reduce", 8) is None


def test_estimate_grows_with_hops_and_bytes() -> None:
    hw = load_hardware("h200")
    small8, small2 = (estimate_us("all_reduce", n, 1024, hw, FACTORS) for n in (8, 2))
    assert small8 - small2 == pytest.approx((14 - 2) * 1.9, rel=0.01)  # ring steps 2(n-1), 1.9 µs each
    a2a = estimate_us("all_to_all", 8, 1 << 24, hw, FACTORS)
    assert a2a == pytest.approx(8.0 + 1.9 + 7 / 8 * (1 << 24) / (450e3 * 0.8))


def test_bundled_curves_match_their_hardware() -> None:
    for name in list_hardware_profiles():
        hw = load_hardware(name)
        for source in bundled_curves(hw):
            assert any(m.lower() in source.doc.device.lower() for m in hw.match) or name in source.path
            assert source.origin in ("measured curve", "published curve")


@pytest.mark.parametrize("card", ["l40s", "rtx-pro-6000", "rtx4090"])
def test_cards_never_measured_take_the_h100s_floors_as_assumed(card: str) -> None:
    """``[kernel_floor_us] from = "h100-sxm"``: the H100's benchmark (tests/data/h100/kernel_floor.json, read with
    plain json), marked assumed and naming where it came from."""
    bench = json.loads((DATA / "h100" / "kernel_floor.json").read_text(encoding="utf-8"))
    hw = load_hardware(card)
    assert hw.kernel_floor_origin == "assumed" and hw.kernel_floor_source.startswith("h100-sxm's measured floors")
    assert hw.kernel_floor_us == {k: pytest.approx(v, abs=0.005) for k, v in bench["kernel_floor_us"].items()}
    assert hw.other_floor_by_batch_us == {int(b): pytest.approx(v, abs=0.005)
                                          for b, v in bench["other_by_batch"].items()}
