"""GPUs on this host: inventory, topology (NVLink / PCIe / P2P), memory holders, wait-until-free.

NVML (nvidia-ml-py) first, nvidia-smi parsing as the fallback; both give the same frozen records.
"""

from __future__ import annotations

from servescope.core.gpu import GpuInfo, GpuProcess, GpuSnapshot, Topology
from servescope.gpu.errors import GpuQueryError, GpuUnavailable
from servescope.gpu.holders import GpuHolders, Holder, HoldersReport, find_gpu_holders, read_gpu_holders
from servescope.gpu.inventory import (
    GpuMemoryUse,
    WaitResult,
    gpu_memory_holders,
    take_snapshot,
    wait_until_gpu_memory_free,
)
from servescope.gpu.topology import GpuLinks, GpuPair, TopologyReport, read_topology, topology_report

__all__ = [
    "GpuHolders",
    "GpuInfo",
    "GpuLinks",
    "GpuMemoryUse",
    "GpuPair",
    "GpuProcess",
    "GpuQueryError",
    "GpuSnapshot",
    "GpuUnavailable",
    "Holder",
    "HoldersReport",
    "Topology",
    "TopologyReport",
    "WaitResult",
    "find_gpu_holders",
    "gpu_memory_holders",
    "read_gpu_holders",
    "read_topology",
    "take_snapshot",
    "topology_report",
    "wait_until_gpu_memory_free",
]
