"""GPUs on this host: inventory, topology (NVLink / PCIe / P2P), memory holders, wait-until-free.

NVML (nvidia-ml-py) first, nvidia-smi parsing as the fallback; both give the same frozen records.
"""

from __future__ import annotations

from servescope.gpu.errors import GpuQueryError, GpuUnavailable
from servescope.gpu.inventory import (
    GpuMemoryUse,
    WaitResult,
    gpu_memory_holders,
    take_snapshot,
    wait_until_gpu_memory_free,
)
from servescope.gpu.records import GpuInfo, GpuProcess, GpuSnapshot, Topology

__all__ = [
    "GpuInfo",
    "GpuMemoryUse",
    "GpuProcess",
    "GpuQueryError",
    "GpuSnapshot",
    "GpuUnavailable",
    "Topology",
    "WaitResult",
    "gpu_memory_holders",
    "take_snapshot",
    "wait_until_gpu_memory_free",
]
