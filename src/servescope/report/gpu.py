"""Terminal and JSON views of GPU snapshots and GEMM benchmark results."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from servescope.core.gemm import GemmBenchDoc

__all__ = ["encode_dataclass", "render_gemm", "render_snapshot"]


def encode_dataclass(record: Any) -> bytes:
    """A frozen record as indented JSON (None → null), ending in a newline."""
    return (json.dumps(dataclasses.asdict(record), indent=2) + "\n").encode()


def _na(value: object) -> str:
    return "N/A" if value is None else str(value)


def render_snapshot(snapshot: Any, console: Console) -> None:
    """One row per GPU, then the processes holding GPU memory (``snapshot``: a ``gpu.records.GpuSnapshot``;
    typed loosely because report/ sits below the feature packages)."""
    table = Table(title=f"GPUs ({snapshot.source}, {snapshot.taken_at})", title_justify="left", box=None)
    for col in ("gpu", "name", "bus id", "used MiB", "total MiB", "PCIe", "power W", "temp °C", "util %"):
        table.add_column(col, justify="left" if col in ("name", "bus id") else "right")
    for g in snapshot.gpus:
        pcie = "N/A" if g.pcie_gen_current is None else f"gen{g.pcie_gen_current} x{_na(g.pcie_width_current)}"
        table.add_row(str(g.index), _na(g.name), _na(g.pci_bus_id), _na(g.memory_used_mib), _na(g.memory_total_mib),
                      pcie, _na(g.power_draw_w), _na(g.temperature_c), _na(g.utilization_gpu_pct))
    console.print(table)
    if snapshot.processes:
        procs = Table(title="processes holding GPU memory", title_justify="left", box=None)
        for col in ("gpu", "pid", "process", "used MiB"):
            procs.add_column(col, justify="left" if col == "process" else "right")
        for p in snapshot.processes:
            procs.add_row(_na(p.gpu_index), str(p.pid), _na(p.process_name), _na(p.used_memory_mib))
        console.print(procs)


def render_gemm(doc: GemmBenchDoc, console: Console) -> None:
    """Each distinct GEMM: time, TFLOP/s, GB/s, and fractions of the measured ceilings."""
    console.print(f"{doc.device_name} · torch {doc.torch_version} · {doc.date}")
    console.print(f"ceilings measured here: copy {doc.copy_ceiling.gbps:.0f} GB/s, "
                  f"matmul {doc.matmul_ceiling.tflops:.1f} TFLOP/s")
    table = Table(box=None)
    for col in ("M", "N", "K", "µs", "TFLOP/s", "GB/s", "of matmul", "of copy", "GEMMs"):
        table.add_column(col, justify="left" if col == "GEMMs" else "right")
    for t in doc.timings:
        names = ", ".join(t.names[:2]) + (f" +{len(t.names) - 2}" if len(t.names) > 2 else "")
        table.add_row(str(t.m), str(t.n), str(t.k), f"{t.median_s * 1e6:.1f}", f"{t.tflops:.1f}", f"{t.gbps:.0f}",
                      f"{100 * t.frac_ceiling_tflops:.0f}%", f"{100 * t.frac_ceiling_gbps:.0f}%", names)
    console.print(table)
