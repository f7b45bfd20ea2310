"""Frozen GPU records: what one look at the GPUs saw (the ``gpu --json`` document). Rendering reads these,
never NVML.

Not available is ``None`` (``null`` in JSON, ``N/A`` in tables), never 0.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from servescope.core.document import Document

__all__ = ["GPU_SCHEMA", "GPU_SCHEMA_VERSION", "LINK_KINDS", "GpuInfo", "GpuProcess", "GpuSnapshot", "Source",
           "Topology"]

GPU_SCHEMA = "servescope.gpu"
GPU_SCHEMA_VERSION = 1

Source = Literal["nvml", "nvidia-smi"]

#: The link kinds of ``nvidia-smi topo -m``, nearest first ("NV#" is "NV" and a link count, e.g. "NV18").
LINK_KINDS = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")


class GpuInfo(msgspec.Struct, frozen=True):
    """One GPU. Each field names its ``nvidia-smi --query-gpu`` twin.

    Attributes:
        index: ``index``, NVML's enumeration order (not CUDA_VISIBLE_DEVICES order).
        name: ``name``.
        uuid: ``uuid``.
        pci_bus_id: ``pci.bus_id``, e.g. "00000000:00:06.0".
        memory_total_mib: ``memory.total`` [MiB].
        memory_used_mib: ``memory.used`` [MiB] (NVML v2 "used": reserved memory not included).
        pcie_gen_current: ``pcie.link.gen.current``.
        pcie_gen_max: ``pcie.link.gen.max`` (what this GPU and system allow together).
        pcie_width_current: ``pcie.link.width.current`` (lanes).
        pcie_width_max: ``pcie.link.width.max`` (lanes).
        power_draw_w: ``power.draw`` [W].
        power_limit_w: ``enforced.power.limit`` [W].
        temperature_c: ``temperature.gpu`` [C].
        utilization_gpu_pct: ``utilization.gpu`` [%].
        driver_version: ``driver_version``.
        cuda_version: the driver's CUDA version, as in the ``nvidia-smi`` banner ("CUDA Version: 13.0").
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None
    utilization_gpu_pct: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None


class GpuProcess(msgspec.Struct, frozen=True):
    """A process holding GPU memory: ``nvidia-smi --query-compute-apps=pid,process_name,used_memory``.

    Attributes:
        gpu_index: the GPU it holds memory on; None when the source did not say (a compute-apps CSV
            without ``gpu_bus_id`` on a host with several GPUs).
        used_memory_mib: None where the driver does not report it (e.g. inside some containers).
    """

    gpu_index: int | None
    pid: int
    process_name: str | None
    used_memory_mib: int | None


class Topology(msgspec.Struct, frozen=True):
    """How devices connect: the matrix of ``nvidia-smi topo -m``.

    Attributes:
        devices: the matrix's labels in order: "GPU0".., then "NIC0".. when present.
        links: square matrix over ``devices`` of link kinds (see LINK_KINDS): "X", "NV18", "PIX", ...
        cpu_affinity: per GPU (GPU order), the "CPU Affinity" column, e.g. "0-15"; None when absent.
        numa_affinity: per GPU, the "NUMA Affinity" column; None when absent.
        gpu_numa_id: per GPU, the "GPU NUMA ID" column; None when absent or N/A.
        nic_names: (label, device name) pairs from the "NIC Legend", e.g. ("NIC0", "mlx5_0").
        p2p_read: per GPU pair, the P2P read status as ``nvidia-smi topo -p2p r`` prints it ("X", "OK",
            "CNS", "GNS", "TNS", "NS", "DR", "U"); None when not known (``topo -p2p`` failed or not asked).
        pcie_paths: per GPU pair, the PCIe path kind ("PIX" .. "SYS", "X" on the diagonal) even where
            ``links`` says NVLink (NVML ``nvmlDeviceGetTopologyCommonAncestor``); None when not known
            (nvidia-smi shows only the nearest link).
    """

    devices: tuple[str, ...]
    links: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str | None, ...] = ()
    numa_affinity: tuple[str | None, ...] = ()
    gpu_numa_id: tuple[str | None, ...] = ()
    nic_names: tuple[tuple[str, str], ...] = ()
    p2p_read: tuple[tuple[str, ...], ...] | None = None
    pcie_paths: tuple[tuple[str, ...], ...] | None = None

    @property
    def gpu_count(self) -> int:
        """How many GPUs the matrix covers."""
        return sum(1 for d in self.devices if d.startswith("GPU"))

    def p2p_level(self, a: int, b: int) -> str:
        """The link kind between GPU ``a`` and GPU ``b`` ("X" when a == b), as in ``nvidia-smi topo -m``.

        Raises:
            ValueError: a GPU index the matrix does not have.
        """
        return self.links[self._position(a)][self._position(b)]

    @property
    def has_nvlink(self) -> bool:
        """True when some pair of GPUs is joined by NVLink (an "NV#" cell)."""
        gpus = [i for i, d in enumerate(self.devices) if d.startswith("GPU")]
        return any(self.links[i][j].startswith("NV") for i in gpus for j in gpus if i != j)

    def _position(self, gpu: int) -> int:
        label = f"GPU{gpu}"
        if label not in self.devices:
            have = ", ".join(d for d in self.devices if d.startswith("GPU"))
            raise ValueError(f"no {label} in the topology; it has {have}")
        return self.devices.index(label)


class _SnapshotFields(Document, frozen=True):
    """Everything one look at the GPUs saw (positional, as these records are built).

    Attributes:
        topology: None where there is a single GPU and NVML was the source, or the query failed.
        source: "nvml" or "nvidia-smi".
        taken_at: wall-clock time of the look, ISO 8601 UTC (a label, not for durations).
    """

    gpus: tuple[GpuInfo, ...]
    processes: tuple[GpuProcess, ...]
    topology: Topology | None
    source: Source
    taken_at: str


class GpuSnapshot(_SnapshotFields, kw_only=True, frozen=True):
    """The ``gpu --json`` document: :class:`_SnapshotFields` with its schema (keyword-only, after the fields)."""

    schema: str = GPU_SCHEMA
    schema_version: int = GPU_SCHEMA_VERSION
