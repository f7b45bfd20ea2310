"""Bundled plan data: hardware profiles (``data/hardware/*.toml``) and collective curves (``data/comm/*.json``).

Independent routes:
- every curve point's ``busbw_gbps`` is recomputed here from ``bytes`` and ``time_us`` (algbw = bytes / time,
  times nccl-tests' bus factor written out in this file), not read from the file's own ``algbw_gbps``;
- every published curve file is compared number by number with the verbatim nccl-tests text it was built from
  (``data/comm/sources/<file>.txt``), parsed by a small parser written here, separately from the script that
  built the JSON;
- hardware profiles are read with plain ``tomllib`` and checked against plausible physical ranges and against
  each other's internal consistency (link rates by PCIe generation, dense rates ordered by precision).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from servescope.core.comm import CurveDoc, load_curves

DATA = Path(__file__).resolve().parents[2] / "src" / "servescope" / "data"
HARDWARE = sorted((DATA / "hardware").glob("*.toml"))
CURVES = sorted((DATA / "comm").glob("*.json"))
SOURCES = DATA / "comm" / "sources"

# PCIe x16 bidirectional GB/s by generation (what the datasheets print as "PCIe GenN x16: … GB/s").
PCIE_X16_BIDIR = {3: 32, 4: 64, 5: 128, 6: 256}
REQUIRED = {
    "name": str, "gpu": str, "match": list, "quality": str, "source": str, "memory_gb": (int, float),
    "hbm_gbps": (int, float), "nvlink_gbps": (int, float), "pcie_gbps": (int, float), "tdp_w": (int, float),
    "interconnect": str, "p2p": bool, "p2p_gbps": (int, float), "nvlink_multicast": bool, "pcie_gen": int,
    "dense_tflops": dict,
}


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


# --------------------------------------------------------------------------------------- hardware profiles


def test_the_bundled_profiles_are_the_ones_plan_promises() -> None:
    names = {p.stem for p in HARDWARE}
    assert {"h200", "h100-sxm", "rtx-pro-6000", "l40s", "rtx4090"} <= names


@pytest.mark.parametrize("path", HARDWARE, ids=lambda p: p.stem)
def test_hardware_profile_has_the_keys_with_plausible_values(path: Path) -> None:
    hw = _toml(path)
    for key, kind in REQUIRED.items():
        assert key in hw, f"{path.name}: missing {key}"
        assert isinstance(hw[key], kind), f"{path.name}: {key} = {hw[key]!r}"
        if kind == (int, float):
            assert not isinstance(hw[key], bool)
    assert hw["name"] == path.stem, "load_hardware() finds a profile by its file name"
    assert hw["quality"] == "datasheet" and len(hw["source"]) > 20
    assert hw["match"] and all(isinstance(m, str) and m for m in hw["match"])
    assert 8 <= hw["memory_gb"] <= 300
    assert 200 <= hw["hbm_gbps"] <= 10_000
    assert 50 <= hw["tdp_w"] <= 1_500
    assert hw["pcie_gen"] in PCIE_X16_BIDIR
    assert hw["pcie_gbps"] == PCIE_X16_BIDIR[hw["pcie_gen"]]
    assert hw["interconnect"] in ("nvlink", "pcie")
    if hw["interconnect"] == "nvlink":
        assert hw["nvlink_gbps"] > hw["pcie_gbps"]
        assert hw["p2p"] is True
        assert hw["p2p_gbps"] == pytest.approx(hw["nvlink_gbps"] / 2)  # per direction of a bidirectional total
    else:
        assert hw["nvlink_gbps"] == 0
        assert hw["nvlink_multicast"] is False  # NVLS needs NVSwitch
        assert hw["p2p_gbps"] == pytest.approx(hw["pcie_gbps"] / 2)
    rates = hw["dense_tflops"]
    assert rates, f"{path.name}: no dense rates"
    assert all(isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 20_000 for v in rates.values())
    assert "bfloat16" in rates and "float32" in rates
    assert rates["float32"] < rates["bfloat16"]
    for low, high in (("bfloat16", "float8"), ("float8", "float4"), ("float8", "int4"), ("int8", "int4")):
        if low in rates and high in rates:
            assert rates[high] >= rates[low], f"{path.name}: {high} below {low}"
    if "float16" in rates:
        assert rates["float16"] == rates["bfloat16"]


def test_profiles_carry_the_datasheet_figures_the_brief_names() -> None:
    by = {p.stem: _toml(p) for p in HARDWARE}
    expect = {  # memory GB, memory GB/s, interconnect, P2P on stock drivers, NVLS, PCIe generation
        "h200": (141, 4800, "nvlink", True, True, 5),
        "h100-sxm": (80, 3350, "nvlink", True, True, 5),
        "rtx-pro-6000": (96, 1792, "pcie", True, False, 5),
        "l40s": (48, 864, "pcie", True, False, 4),
        "rtx4090": (24, 1008, "pcie", False, False, 4),
    }
    for name, (mem, bw, link, p2p, nvls, gen) in expect.items():
        hw = by[name]
        got = (hw["memory_gb"], hw["hbm_gbps"], hw["interconnect"], hw["p2p"], hw["nvlink_multicast"], hw["pcie_gen"])
        assert got == (mem, bw, link, p2p, nvls, gen), name
    assert by["h100-sxm"]["nvlink_gbps"] == by["h200"]["nvlink_gbps"] == 900
    # The H200 keeps its original keys and values (other modules rely on them).
    h200 = by["h200"]
    assert h200["dense_tflops"]["bfloat16"] == 989 and h200["dense_tflops"]["float8"] == 1979
    assert h200["match"] == ["H200"]


@pytest.mark.parametrize("path", HARDWARE, ids=lambda p: p.stem)
def test_plan_loader_reads_every_bundled_profile(path: Path) -> None:
    hardware = pytest.importorskip("servescope.plan.hardware")
    prof = hardware.load_hardware(path.stem)
    raw = _toml(path)
    assert prof.memory_gb == raw["memory_gb"] and prof.hbm_gbps == raw["hbm_gbps"]
    assert prof.interconnect == raw["interconnect"]
    assert prof.p2p_gbps == pytest.approx(raw["p2p_gbps"])


# ------------------------------------------------------------------------------------------ curve files


def _bus_factor(op: str, n: int) -> float:
    # nccl-tests PERFORMANCE.md: allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n.
    return {"all_reduce": 2 * (n - 1) / n}.get(op, (n - 1) / n)


def test_there_are_published_curves_for_nvlink_and_pcie_boxes() -> None:
    docs = [load_curves(p) for p in CURVES]
    assert any(d.interconnect == "nvlink" and d.world_size == 8 and d.curve("all_reduce") for d in docs)
    assert any(d.interconnect == "pcie" and d.world_size >= 4 and d.curve("all_reduce") for d in docs)


@pytest.mark.parametrize("path", CURVES, ids=lambda p: p.stem)
def test_curve_file_loads_sorted_with_provenance(path: Path) -> None:
    doc = load_curves(path)
    assert doc.curves
    assert doc.backend == "nccl" and doc.world_size >= 2
    if doc.source == "published":
        assert "http" in doc.provenance and (SOURCES / f"{path.stem}.txt").is_file()
        assert f"sources/{path.stem}.txt" in doc.provenance
    seen = set()
    for c in doc.curves:
        key = (c.op, c.variant, c.graph)
        assert key not in seen, f"duplicate curve {key}"
        seen.add(key)
        sizes = [p.bytes for p in c.points]
        assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
        assert len(sizes) >= 10
        assert all(p.time_us > 0 and p.iters >= 1 for p in c.points)
    assert any(c.variant == "default" for c in doc.curves), "plan uses the 'default' variant"


@pytest.mark.parametrize("path", CURVES, ids=lambda p: p.stem)
def test_busbw_equals_bytes_over_time_times_bus_factor(path: Path) -> None:
    doc = load_curves(path)
    for c in doc.curves:
        factor = _bus_factor(c.op, doc.world_size)
        for p in c.points:
            algbw = p.bytes / (p.time_us * 1e-6) / 1e9  # GB/s, 10^9 bytes
            # Allow exactly the printing rounding: bandwidths carry 2 decimals (half-unit 0.005); times carry
            # 2 decimals below 100 µs and at least 4 significant digits above (half-unit at most 0.05 / 0.5).
            half = 0.005 if p.time_us < 100 else 0.05 if p.time_us < 10_000 else 0.5
            slack = algbw * half / p.time_us
            assert abs(algbw - p.algbw_gbps) <= 0.005 + slack + 1e-9, (c.op, c.label, p)
            assert abs(algbw * factor - p.busbw_gbps) <= 0.005 + factor * slack + 1e-9, (c.op, c.label, p)


# A data row of nccl-tests: size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>[a-z0-9_]+)\s+(?P<redop>[a-z]+)\s+(?P<root>-?\d+)"
    r"\s+(?P<time>\d+(?:\.\d+)?)\s+(?P<algbw>\d+(?:\.\d+)?)\s+(?P<busbw>\d+(?:\.\d+)?)\s+\S+"
    r"\s+\d+(?:\.\d+)?\s+\d+(?:\.\d+)?\s+\d+(?:\.\d+)?\s+\S+\s*$"
)
_SECTION = re.compile(r"^### op=(?P<op>\w+) variant=(?P<variant>\S+) graph=(?P<graph>true|false)\b")
_HEADER = re.compile(r"nGpus (?P<ngpus>\d+) .*?warmup iters: \d+ iters: (?P<iters>\d+) .*?graph: (?P<graph>\d)")


def _parse_source(text: str) -> dict[tuple[str, str, bool], dict[str, Any]]:
    """Sections of a sources/*.txt transcript -> out-of-place rows (size > 0) and header facts."""
    out: dict[tuple[str, str, bool], dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        sec = _SECTION.match(line)
        if sec:
            key = (sec["op"], sec["variant"], sec["graph"] == "true")
            assert key not in out, f"duplicate section {key}"
            current = out[key] = {"rows": [], "iters": None, "ngpus": None, "graph_flag": None, "devices": set()}
            continue
        if current is None:
            continue
        head = _HEADER.search(line)
        if head:
            current.update(iters=int(head["iters"]), ngpus=int(head["ngpus"]), graph_flag=head["graph"] == "1")
            continue
        dev = re.search(r"device\s+\d+ \[[0-9a-fx:]+\] (.+?)\s*$", line)
        if line.startswith("#") and dev:
            current["devices"].add(dev[1])
            continue
        row = _ROW.match(line)
        if row and int(row["size"]) > 0:
            current["rows"].append((int(row["size"]), float(row["time"]), float(row["algbw"]), float(row["busbw"])))
    return out


@pytest.mark.parametrize("path", CURVES, ids=lambda p: p.stem)
def test_published_curve_numbers_equal_the_raw_nccl_tests_text(path: Path) -> None:
    doc: CurveDoc = load_curves(path)
    if doc.source != "published":
        pytest.skip("measured by servescope itself; no published transcript")
    sections = _parse_source((SOURCES / f"{path.stem}.txt").read_text(encoding="utf-8"))
    assert set(sections) == {(c.op, c.variant, c.graph) for c in doc.curves}
    for c in doc.curves:
        sec = sections[(c.op, c.variant, c.graph)]
        assert sec["graph_flag"] is None or sec["graph_flag"] == c.graph
        assert sec["ngpus"] * (doc.world_size // sec["ngpus"]) == doc.world_size
        assert sec["devices"] == {doc.device}, "every rank's device is the file's device"
        got = [(p.bytes, p.time_us, p.algbw_gbps, p.busbw_gbps) for p in c.points]
        assert got == sec["rows"], f"{c.op} {c.label}: numbers differ from the transcript"
        assert {p.iters for p in c.points} == {sec["iters"]}
