"""gpu topo: real ``nvidia-smi topo -m`` / ``topo -p2p`` outputs from public threads (tests/data/gpu/topo, each
folder's SOURCE.md says where from), the H200's own, and NVML through the fake pynvml.

Expected pair kinds are counted by hand from each file (the dicts below) and, independently of the parser,
by a regex over the matrix text.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from fake_pynvml import load_recording, make_fake_pynvml, with_two_gpus
from gpu_inputs import RECORDING, TOPO, fake_nvidia_smi, shared_file, snapshot_of, topo_text, two_gpu_xml

from servescope.core.gpu import GpuInfo, GpuSnapshot
from servescope.gpu import inventory, nvml
from servescope.gpu.errors import GpuQueryError
from servescope.gpu.smi import parse_topo_matrix, parse_topo_p2p, smi_snapshot
from servescope.gpu.topology import nccl_verdict, pci_affinity, read_topology, topology_report

# Pair link kinds (a < b), counted by hand from each topo-m.txt.
HAND_COUNTED: dict[str, dict[str, int]] = {
    "8xh100-nv18-spaces": {"NV18": 28},
    "8x4090-all-sys-nics": {"SYS": 28},
    "4x3090-nv4-pairs-phb-node": {"NV4": 2, "PHB": 2, "NODE": 2},
    "4xh100-nv6-nics-pix": {"NV6": 6},
    "5gpu-sys-phb-node": {"SYS": 4, "PHB": 2, "NODE": 4},
    "2x5090-phb-p2p-gns": {"PHB": 1},
    "2x3090-sys-numa-na": {"SYS": 1},
}
_KIND = re.compile(r"(?<!\S)(X|NV\d+|PIX|PXB|PHB|NODE|SYS)(?!\S)")


def regex_pairs(text: str) -> dict[tuple[int, int], str]:
    """(a, b) -> kind from the GPU rows of the matrix, by regex only: the first N link tokens of row GPUa."""
    n = len(re.findall(r"GPU\d+", text.splitlines()[0]))
    found: dict[tuple[int, int], str] = {}
    for a, row in re.findall(r"^GPU(\d+)\s+(.*)$", text, re.MULTILINE):
        kinds = _KIND.findall(row)[:n]
        for b, kind in enumerate(kinds):
            if b > int(a):
                found[(int(a), b)] = kind
    return found


@pytest.mark.parametrize("folder", sorted(HAND_COUNTED))
def test_pair_kinds_match_hand_count_and_regex(folder: str) -> None:
    text = topo_text(folder)
    report = topology_report(snapshot_of(text))
    by_parser = {(p.a, p.b): p.link for p in report.pairs}
    assert by_parser == regex_pairs(text)
    assert Counter(by_parser.values()) == Counter(HAND_COUNTED[folder])
    for p in report.pairs:
        number = re.fullmatch(r"NV(\d+)", p.link)
        assert p.nvlinks == (int(number.group(1)) if number else 0)
        assert p.pcie_path == (None if number else p.link)  # nvidia-smi hides the PCIe path of an NVLink pair
        assert p.p2p_read is None and p.p2p_ok is None


def test_affinity_columns_spaces_and_tabs() -> None:
    h100 = parse_topo_matrix(topo_text("8xh100-nv18-spaces"))
    assert h100.cpu_affinity == ("0-47,96-143",) * 4 + ("48-95,144-191",) * 4
    assert h100.numa_affinity == ("0",) * 4 + ("1",) * 4 and h100.gpu_numa_id == (None,) * 8
    rtx = parse_topo_matrix(topo_text("8x4090-all-sys-nics"))
    assert rtx.devices[-2:] == ("NIC0", "NIC1") and rtx.links[8][6] == "PHB" and rtx.links[9][8] == "PIX"
    assert rtx.numa_affinity == ("0",) * 4 + ("1",) * 4
    nics = parse_topo_matrix(topo_text("4xh100-nv6-nics-pix"))
    assert [nics.links[4 + i][i] for i in range(4)] == ["PIX"] * 4 and nics.links[7][7] == "X"
    assert nics.numa_affinity == ("3", "1", "7", "5")
    # GPU0's NUMA Affinity is N/A, written with an extra empty cell before it.
    na = parse_topo_matrix(topo_text("2x3090-sys-numa-na"))
    assert na.cpu_affinity == ("0-7,16-23", "8-15,24-31") and na.numa_affinity == (None, "1")


def test_p2p_matrix_real_gns() -> None:
    text = topo_text("2x5090-phb-p2p-gns", "topo-p2p-rw.txt")
    labels, matrix = parse_topo_p2p(text)
    assert labels == ("GPU0", "GPU1")
    assert matrix == (("X", "GNS"), ("GNS", "X"))
    assert sum(row.count("GNS") for row in matrix) == len(re.findall(r"\tGNS\t", text))
    # The same matrix pasted with spaces (as club-3090 #1130 shows it) reads the same.
    assert parse_topo_p2p(text.replace("\t", "    "))[1] == matrix


def test_p2p_matrix_errors() -> None:
    text = topo_text("2x5090-phb-p2p-gns", "topo-p2p-rw.txt")
    with pytest.raises(GpuQueryError, match="not in the legend: XYZ"):
        parse_topo_p2p(text.replace("\tGNS\t\n GPU1", "\tXYZ\t\n GPU1"))
    with pytest.raises(GpuQueryError, match="row GPU1 missing"):
        parse_topo_p2p(text.replace(" GPU1\tGNS\tX\t\n", ""))
    with pytest.raises(GpuQueryError, match="no header"):
        parse_topo_p2p("Legend:\n  X = Self\n")


@pytest.mark.parametrize(
    ("folder", "verdict"),
    [
        ("8xh100-nv18-spaces", "all pairs NVLink (NV18): NCCL uses NVLink P2P"),
        ("4xh100-nv6-nics-pix", "all pairs NVLink (NV6): NCCL uses NVLink P2P"),
        (
            "4x3090-nv4-pairs-phb-node",
            "mixed: 2 of 6 pairs NVLink, 4 PCIe (worst path NODE, across host bridges of one NUMA node, on 2 of 6 "
            "pairs); a ring over all GPUs crosses PCIe",
        ),
        (
            "5gpu-sys-phb-node",
            "PCIe only, P2P across the CPU interconnect between NUMA nodes (worst path SYS on 4 of 10 pairs); "
            "P2P status unknown",
        ),
    ],
)
def test_verdict_from_real_matrices(folder: str, verdict: str) -> None:
    assert topology_report(snapshot_of(topo_text(folder))).verdict == verdict


def test_verdict_p2p_unavailable_and_ok() -> None:
    folder = "2x5090-phb-p2p-gns"
    p2p = topo_text(folder, "topo-p2p-rw.txt")
    report = topology_report(snapshot_of(topo_text(folder), p2p))
    (pair,) = report.pairs
    assert (pair.link, pair.p2p_read, pair.p2p_ok) == ("PHB", "GNS", False)
    assert report.verdict == "PCIe, P2P unavailable (GNS): NCCL will go through shared memory"
    ok = topology_report(snapshot_of(topo_text(folder), p2p.replace("GNS\t", "OK\t")))
    assert ok.verdict == "PCIe only, P2P through host bridge (worst path PHB on 1 of 1 pairs)"


@pytest.mark.needs_shared
def test_verdict_single_gpu_and_unknown() -> None:
    text = shared_file("topo_query.txt").split("---", 1)[0]
    report = topology_report(snapshot_of(text))
    assert report.pairs == () and report.verdict.startswith("one GPU")
    (gpu,) = report.gpus
    row = re.search(r"^GPU0\t\s*X\s*\t(\S+)\t(\S+)", text, re.MULTILINE)
    assert row and (gpu.cpu_affinity, gpu.numa_affinity) == (row.group(1), row.group(2))
    two = GpuSnapshot((GpuInfo(index=0), GpuInfo(index=1)), (), None, "nvidia-smi", "t")
    unknown = topology_report(two)
    assert not unknown.topology_known and unknown.verdict.startswith("topology not available")
    assert nccl_verdict((), 1).startswith("one GPU")


@pytest.mark.needs_shared
def test_nvidia_smi_fallback_runs_topo_and_p2p(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = TOPO / "2x5090-phb-p2p-gns"
    fake_nvidia_smi(
        tmp_path,
        {"-q -x": two_gpu_xml(tmp_path), "topo -m": folder / "topo-m.txt", "topo -p2p r": folder / "topo-p2p-rw.txt"},
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    snap = smi_snapshot()
    assert snap.topology is not None and snap.topology.p2p_read == (("X", "GNS"), ("GNS", "X"))
    report = read_topology(prefer="nvidia-smi", sysfs=tmp_path / "no-sysfs")
    assert report.source == "nvidia-smi" and len(report.gpus) == 2
    assert report.verdict == "PCIe, P2P unavailable (GNS): NCCL will go through shared memory"
    assert [(g.cpu_affinity, g.numa_affinity) for g in report.gpus] == [("0-63", "0")] * 2
    xml = shared_file("nvidia-smi-q.xml")
    gen = re.search(r"<current_link_gen>(\d+)</current_link_gen>", xml)
    width = re.search(r"<current_link_width>(\d+)x</current_link_width>", xml)
    assert gen and width and report.gpus[0].pcie_gen_current == int(gen.group(1))
    assert report.gpus[0].pcie_width_current == int(width.group(1))


@pytest.mark.needs_shared
def test_nvidia_smi_without_p2p_leaves_it_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = TOPO / "2x5090-phb-p2p-gns"
    fake_nvidia_smi(tmp_path, {"-q -x": two_gpu_xml(tmp_path), "topo -m": folder / "topo-m.txt"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    topo = smi_snapshot().topology
    assert topo is not None and topo.p2p_read is None  # unknown, never guessed


def use_fake(monkeypatch: pytest.MonkeyPatch, doc: dict[str, object]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(doc))  # type: ignore[arg-type]
    monkeypatch.setattr(nvml, "_nvml", None)


def test_nvml_two_gpus_nvswitch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_fake(monkeypatch, with_two_gpus(load_recording(RECORDING / "idle" / "nvml.json")))
    report = read_topology(sysfs=tmp_path)
    (pair,) = report.pairs
    assert (pair.link, pair.nvlinks, pair.pcie_path, pair.p2p_read, pair.p2p_ok) == ("NV18", 18, "SYS", "OK", True)
    assert report.verdict == "all pairs NVLink (NV18): NCCL uses NVLink P2P"
    assert report.source == "nvml" and [g.index for g in report.gpus] == [0, 1]


@pytest.mark.needs_shared
def test_nvml_single_gpu_affinity_from_sysfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """NVML gives no affinity: it comes from sysfs, here a tree holding what the same H200's topo -m said."""
    text = shared_file("topo_query.txt")
    row = re.search(r"^GPU0\t\s*X\s*\t(\S+)\t(\S+)", text, re.MULTILINE)
    bus = re.search(r"^0, [^,]+, (\S+),", text.split("---", 1)[1], re.MULTILINE)
    assert row and bus
    device = tmp_path / bus.group(1)[4:].lower()  # 00000000:00:06.0 -> 0000:00:06.0
    device.mkdir()
    (device / "local_cpulist").write_text(row.group(1) + "\n")
    (device / "numa_node").write_text(row.group(2) + "\n")
    use_fake(monkeypatch, load_recording(RECORDING / "idle" / "nvml.json"))
    report = read_topology(sysfs=tmp_path)
    (gpu,) = report.gpus
    assert (gpu.pci_bus_id, gpu.cpu_affinity, gpu.numa_affinity) == (bus.group(1), row.group(1), row.group(2))
    assert report.pairs == () and report.verdict.startswith("one GPU")


def test_pci_affinity_on_this_machines_sysfs() -> None:
    """A real PCI device of this host, named the NVML way (8-digit domain)."""
    devices = sorted(Path("/sys/bus/pci/devices").iterdir())
    assert devices, "no PCI devices in sysfs"
    dev = devices[0]
    cpus, numa = pci_affinity("0000" + dev.name.upper())
    assert cpus == (dev / "local_cpulist").read_text().strip()
    raw = (dev / "numa_node").read_text().strip()
    assert numa == (None if raw == "-1" else raw)
    assert pci_affinity("00000000:FF:1F.7", root=Path("/nonexistent")) == (None, None)


def test_read_topology_falls_back_and_rejects_bad_prefer(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = snapshot_of(topo_text("4x3090-nv4-pairs-phb-node"))
    monkeypatch.setattr(inventory, "nvml_snapshot", lambda: snap)
    assert len(read_topology().pairs) == 6
    with pytest.raises(ValueError, match="nvml, nvidia-smi"):
        read_topology(prefer="smi")
