"""The GPU records, now result-document types in :mod:`servescope.core.gpu`; the names stay importable here."""

from __future__ import annotations

from servescope.core.gpu import LINK_KINDS, GpuInfo, GpuProcess, GpuSnapshot, Source, Topology

__all__ = ["LINK_KINDS", "GpuInfo", "GpuProcess", "GpuSnapshot", "Source", "Topology"]
