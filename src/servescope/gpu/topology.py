"""How the GPUs of this host talk to each other: per pair NVLink or the PCIe path, P2P, and a verdict for NCCL.

Built from one GpuSnapshot (NVML's topology queries or ``nvidia-smi topo -m`` / ``topo -p2p r``) plus each
GPU's CPU and NUMA affinity (the ``topo -m`` columns, or sysfs beside NVML).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servescope.core.errors import InputError
from servescope.core.files import read_text
from servescope.core.gpu import GpuSnapshot
from servescope.gpu.errors import GpuQueryError, GpuUnavailable
from servescope.gpu.inventory import take_snapshot
from servescope.gpu.smi import parse_topo_matrix

__all__ = [
    "PCIE_PATHS",
    "GpuLinks",
    "GpuPair",
    "TopologyReport",
    "link_kind",
    "nccl_verdict",
    "pci_affinity",
    "read_topology",
    "topology_report",
]

#: PCIe path kinds of ``nvidia-smi topo -m``, nearest first.
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_PATH_WORDS = {
    "PIX": "through one PCIe switch",
    "PXB": "through PCIe switches",
    "PHB": "through host bridge",
    "NODE": "across host bridges of one NUMA node",
    "SYS": "across the CPU interconnect between NUMA nodes",
}
_NVLINK = re.compile(r"^NV(\d+)$")
SYSFS_PCI = Path("/sys/bus/pci/devices")


@dataclass(frozen=True, slots=True)
class GpuLinks:
    """One GPU's own link to the host: PCIe generation and width (``pcie.link.*``), and its CPU/NUMA affinity
    (the ``CPU Affinity`` / ``NUMA Affinity`` columns of ``nvidia-smi topo -m``). None: not available."""

    index: int
    name: str | None
    pci_bus_id: str | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    cpu_affinity: str | None
    numa_affinity: str | None


@dataclass(frozen=True, slots=True)
class GpuPair:
    """How GPU ``a`` reaches GPU ``b`` (a < b).

    Attributes:
        link: the ``nvidia-smi topo -m`` cell: "NV18", "PIX", "PXB", "PHB", "NODE" or "SYS".
        nvlinks: bonded NVLinks between the two (the # of "NV#"); 0 when they talk over PCIe only.
        pcie_path: the PCIe path kind; for an NVLink pair only NVML tells it, else None.
        p2p_read: the ``nvidia-smi topo -p2p r`` code ("OK", "CNS", "GNS", "TNS", "NS", "DR", "U"); None
            when unknown.
        p2p_ok: p2p_read == "OK"; None when unknown.
    """

    a: int
    b: int
    link: str
    nvlinks: int
    pcie_path: str | None
    p2p_read: str | None
    p2p_ok: bool | None


@dataclass(frozen=True, slots=True)
class TopologyReport:
    """Every GPU's host link, every GPU pair's link, and one line for the NCCL user.

    Attributes:
        source: "nvml" or "nvidia-smi".
        taken_at: when the snapshot was taken, ISO 8601 UTC.
        pairs: every pair a < b, in order; empty with one GPU or when the topology could not be read.
        topology_known: False when the source gave no topology although there are several GPUs.
        nics: (label, device) pairs from the ``topo -m`` NIC legend.
    """

    source: str
    taken_at: str
    gpus: tuple[GpuLinks, ...]
    pairs: tuple[GpuPair, ...]
    topology_known: bool
    verdict: str
    nics: tuple[tuple[str, str], ...] = ()


def pci_affinity(bus_id: str, *, root: Path = SYSFS_PCI) -> tuple[str | None, str | None]:
    """(CPU list, NUMA node) of a PCI device from sysfs, as ``nvidia-smi topo -m`` shows them ("0-15", "0").

    Shell twin: ``cat /sys/bus/pci/devices/0000:00:06.0/{local_cpulist,numa_node}``. NVML writes the
    bus id with an 8-digit domain ("00000000:00:06.0"), sysfs with 4. A missing file or a NUMA node of
    -1 (no NUMA information) is None.
    """
    domain, _, rest = bus_id.strip().lower().partition(":")
    name = f"{domain[-4:]:0>4}:{rest}" if rest else bus_id.lower()

    def read(file: str) -> str | None:
        try:
            value = (root / name / file).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return value or None

    numa = read("numa_node")
    return read("local_cpulist"), None if numa is None or numa.startswith("-") else numa


def _nvlinks(link: str) -> int:
    match = _NVLINK.match(link)
    return int(match.group(1)) if match else 0


def nccl_verdict(pairs: tuple[GpuPair, ...], gpu_count: int) -> str:
    """One line on what the GPU pairs mean for NCCL collectives, e.g. "all pairs NVLink (NV18)".

    The worst pair decides: a ring over every GPU is as slow as its slowest hop.
    """
    if gpu_count < 2:
        return "one GPU: no GPU pairs, nothing for NCCL to cross"
    if not pairs:
        return "topology not available: NVLink / PCIe / P2P per pair unknown"
    nvlink = [p for p in pairs if p.nvlinks]
    pcie = [p for p in pairs if not p.nvlinks]
    no_p2p = [p for p in pcie if p.p2p_ok is False]
    codes = "/".join(sorted({p.p2p_read or "?" for p in no_p2p}))
    if not pcie:
        kinds = "/".join(sorted({p.link for p in pairs}, key=_nvlinks))
        line = f"all pairs NVLink ({kinds}): NCCL uses NVLink P2P"
        bad = [p for p in pairs if p.p2p_ok is False]
        if bad:
            line += f"; but P2P read is not OK on {len(bad)} of {len(pairs)} pairs"
        return line
    worst = max((p.link for p in pcie), key=lambda k: PCIE_PATHS.index(k) if k in PCIE_PATHS else len(PCIE_PATHS))
    on_worst = sum(1 for p in pcie if p.link == worst)
    path = f"{_PATH_WORDS.get(worst, worst)} (worst path {worst} on {on_worst} of {len(pairs)} pairs)"
    if nvlink:
        line = (
            f"mixed: {len(nvlink)} of {len(pairs)} pairs NVLink, {len(pcie)} PCIe (worst path {worst}, "
            f"{_PATH_WORDS.get(worst, worst)}, on {on_worst} of {len(pairs)} pairs); a ring over all GPUs crosses PCIe"
        )
        if no_p2p:
            line += f"; P2P unavailable ({codes}) on {len(no_p2p)} PCIe pairs: those go through shared memory"
        return line
    if no_p2p and len(no_p2p) == len(pcie):
        return f"PCIe, P2P unavailable ({codes}): NCCL will go through shared memory"
    if no_p2p:
        return (
            f"PCIe, P2P unavailable ({codes}) on {len(no_p2p)} of {len(pairs)} pairs: NCCL goes through "
            f"shared memory there; elsewhere P2P {path}"
        )
    line = f"PCIe only, P2P {path}"
    if any(p.p2p_ok is None for p in pcie):
        line += "; P2P status unknown"
    return line


def topology_report(
    snapshot: GpuSnapshot, *, affinity: Callable[[str], tuple[str | None, str | None]] | None = None
) -> TopologyReport:
    """Per GPU its host link and affinity, per GPU pair its link and P2P status, and the NCCL verdict.

    Args:
        affinity: bus id -> (CPU list, NUMA node), asked for a GPU whose affinity the snapshot lacks
            (NVML gives none); None leaves it unknown.
    """
    topo = snapshot.topology
    labels = [d for d in topo.devices if d.startswith("GPU")] if topo is not None else []
    gpus = []
    for gpu in sorted(snapshot.gpus, key=lambda g: g.index):
        cpu = numa = None
        label = f"GPU{gpu.index}"
        if topo is not None and label in labels:
            pos = labels.index(label)
            cpu = topo.cpu_affinity[pos] if pos < len(topo.cpu_affinity) else None
            numa = topo.numa_affinity[pos] if pos < len(topo.numa_affinity) else None
        if cpu is None and numa is None and affinity is not None and gpu.pci_bus_id:
            cpu, numa = affinity(gpu.pci_bus_id)
        gpus.append(
            GpuLinks(
                gpu.index, gpu.name, gpu.pci_bus_id, gpu.pcie_gen_current, gpu.pcie_gen_max,
                gpu.pcie_width_current, gpu.pcie_width_max, cpu, numa,
            )
        )
    pairs = []
    if topo is not None:
        indices = [int(label[3:]) for label in labels]
        for i, a in enumerate(indices):
            for j in range(i + 1, len(indices)):
                b = indices[j]
                link = topo.p2p_level(a, b)
                path = topo.pcie_paths[i][j] if topo.pcie_paths is not None else None
                if path is None and not _nvlinks(link):
                    path = link
                read = topo.p2p_read[i][j] if topo.p2p_read is not None else None
                pairs.append(GpuPair(a, b, link, _nvlinks(link), path, read, None if read is None else read == "OK"))
    count = max(len(gpus), len(labels))
    return TopologyReport(
        source=snapshot.source,
        taken_at=snapshot.taken_at,
        gpus=tuple(gpus),
        pairs=tuple(pairs),
        topology_known=topo is not None or count < 2,
        verdict=nccl_verdict(tuple(pairs), count),
        nics=topo.nic_names if topo is not None else (),
    )


def read_topology(*, prefer: str = "nvml", sysfs: Path = SYSFS_PCI) -> TopologyReport:
    """The topology of this host's GPUs, NVML first (``nvidia-smi topo -m`` and ``topo -p2p r`` as fallback).

    Raises:
        ValueError: `prefer` is not "nvml" or "nvidia-smi".
        GpuUnavailable: no GPU query works here.
        GpuQueryError: a query failed.

    Example:
        >>> report = read_topology()        # doctest: +SKIP
        >>> report.verdict
        'all pairs NVLink (NV18): NCCL uses NVLink P2P'
    """
    snapshot = take_snapshot(prefer=prefer)
    if not snapshot.gpus:
        raise GpuUnavailable(f"no GPU found ({snapshot.source})")
    return topology_report(snapshot, affinity=lambda bus: pci_affinity(bus, root=sysfs))


def link_kind(source: str | None) -> str | None:
    """``"nvlink"`` or ``"pcie"``: how the GPUs a unit runs on are linked, for the NCCL rules of ``service lint``.

    ``source`` is one of those two words, an ``nvidia-smi topo -m`` output file (NVLink between any pair:
    ``nvlink``), or None for this machine's GPUs, which gives None where no GPU query works or it reports no
    topology (the NCCL rules are then skipped).

    Raises:
        InputError: the file cannot be read, or is not ``nvidia-smi topo -m`` output.
    """
    if source in ("nvlink", "pcie"):
        return source
    if source is not None:
        try:
            topo = parse_topo_matrix(read_text(Path(source)))
        except (ValueError, GpuQueryError) as exc:  # the matrix parser names what the text lacks
            raise InputError(source, f"not `nvidia-smi topo -m` output ({exc})") from None
        return "nvlink" if topo.has_nvlink else "pcie"
    try:
        snap = take_snapshot()
    except (GpuUnavailable, GpuQueryError):
        return None
    if snap.topology is None:
        return None
    return "nvlink" if snap.topology.has_nvlink else "pcie"
