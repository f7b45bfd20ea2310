"""Terminal and JSON views of GPU snapshots, topology, memory holders and GEMM benchmark results."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from servescope.core.document import encode
from servescope.core.gemm import GemmBenchDoc

__all__ = ["encode_dataclass", "render_gemm", "render_holders", "render_snapshot", "render_topology"]


def encode_dataclass(record: Any) -> bytes:
    """A GPU record (snapshot, topology, holders) as indented JSON (None → null), ending in a newline."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return (json.dumps(dataclasses.asdict(record), indent=2) + "\n").encode()
    return encode(record)


def _na(value: object) -> str:
    return "N/A" if value is None else str(value)


def render_snapshot(snapshot: Any, console: Console) -> None:
    """One row per GPU, then the processes holding GPU memory (``snapshot``: a ``core.gpu.GpuSnapshot``;
    typed loosely because report/ sits below the feature packages)."""
    title = f"GPUs ({snapshot.source}, {snapshot.taken_at})"
    table = Table(title=title, title_justify="left", box=None)
    heads = ("gpu", "name", "bus id", "used MiB", "total MiB", "PCIe", "power W", "temp °C", "util %")
    for col in heads:
        table.add_column(col, justify="left" if col in ("name", "bus id") else "right", no_wrap=True)
    rows = []
    for g in snapshot.gpus:
        pcie = "N/A" if g.pcie_gen_current is None else f"gen{g.pcie_gen_current} x{_na(g.pcie_width_current)}"
        rows.append((str(g.index), _na(g.name), _na(g.pci_bus_id), _na(g.memory_used_mib), _na(g.memory_total_mib),
                     pcie, _na(g.power_draw_w), _na(g.temperature_c), _na(g.utilization_gpu_pct)))
        table.add_row(*rows[-1])
    if Measurement.get(console, console.options.update_width(1_000_000), table).maximum <= console.width:
        console.print(table)
    else:  # narrow: one GPU a paragraph, wrapped at spaces, so no id or number is cut
        console.print(title, markup=False)
        for row in rows:
            console.print(Text("  " + "   ".join(f"{head} {cell}" for head, cell in zip(heads, row, strict=True))))
    if snapshot.processes:
        procs = Table(title="processes holding GPU memory", title_justify="left", box=None)
        for col in ("gpu", "pid", "process", "used MiB"):
            procs.add_column(col, justify="left" if col == "process" else "right")
        for p in snapshot.processes:
            procs.add_row(_na(p.gpu_index), str(p.pid), _na(p.process_name), _na(p.used_memory_mib))
        console.print(procs)


def _pcie(gen: int | None, width: int | None) -> str:
    return "N/A" if gen is None and width is None else f"gen{_na(gen)} x{_na(width)}"


def render_topology(report: Any, console: Console) -> None:
    """The verdict, each GPU's PCIe link and affinity, then one row per GPU pair (``report``: a
    ``gpu.topology.TopologyReport``, typed loosely as report/ sits below the feature packages)."""
    console.print(f"GPU topology ({report.source}, {report.taken_at})")
    console.print(f"verdict: {report.verdict}")
    gpus = Table(box=None)
    for col in ("gpu", "name", "bus id", "PCIe now", "PCIe max", "CPU affinity", "NUMA"):
        gpus.add_column(col, justify="right" if col == "gpu" else "left")
    for g in report.gpus:
        gpus.add_row(str(g.index), _na(g.name), _na(g.pci_bus_id), _pcie(g.pcie_gen_current, g.pcie_width_current),
                     _pcie(g.pcie_gen_max, g.pcie_width_max), _na(g.cpu_affinity), _na(g.numa_affinity))
    console.print(gpus)
    if report.pairs:
        pairs = Table(box=None)
        for col in ("pair", "link", "NVLinks", "PCIe path", "P2P read"):
            pairs.add_column(col, justify="right" if col == "NVLinks" else "left")
        for p in report.pairs:
            pairs.add_row(f"{p.a}-{p.b}", p.link, str(p.nvlinks), _na(p.pcie_path), _na(p.p2p_read))
        console.print(pairs)
    if report.nics:
        console.print("NICs: " + ", ".join(f"{label}={name}" for label, name in report.nics))


def render_holders(report: Any, console: Console) -> None:
    """Per GPU: used and held MiB, then its holders with user and command line (``report``: a
    ``gpu.holders.HoldersReport``)."""
    console.print(f"GPU memory holders ({report.source}, {report.taken_at})")
    groups = [(f"GPU{g.gpu_index} {_na(g.name)}", g) for g in report.gpus]
    for title, g in groups:
        used = f"{_na(g.used_mib)} of {_na(g.total_mib)} MiB used"
        count = len(g.holders)
        held = "no process holds memory" if not count else (
            f"{_na(g.held_mib)} MiB held by {count} process{'es' if count > 1 else ''}")
        console.print(f"{title}: {used}, {held}")
        _holder_table(g.holders, console)
    if report.unplaced:
        console.print("processes on a GPU the source did not name:")
        _holder_table(report.unplaced, console)


def _holder_table(holders: Any, console: Console) -> None:
    if not holders:
        return
    table = Table(box=None, padding=(0, 1, 0, 2))
    for col in ("pid", "user", "used MiB", "process", "command"):
        table.add_column(col, justify="right" if col in ("pid", "used MiB") else "left",  # wraps at spaces
                         overflow="fold" if col == "command" else "ellipsis", no_wrap=col != "command")
    for h in holders:
        table.add_row(str(h.pid), _na(h.user), _na(h.used_mib), _na(h.name), _na(h.cmdline))
    console.print(table)


def render_gemm(doc: GemmBenchDoc, console: Console) -> None:
    """Each distinct GEMM: time, TFLOP/s, GB/s, and fractions of the measured ceilings."""
    console.print(f"{doc.device_name} · torch {doc.torch_version} · {doc.date}")
    console.print(f"ceilings measured here: copy {doc.copy_ceiling.gbps:.3g} GB/s, "
                  f"matmul {doc.matmul_ceiling.tflops:.3g} TFLOP/s")
    table = Table(box=None)
    for col in ("M", "N", "K", "µs", "TFLOP/s", "GB/s", "of matmul", "of copy", "GEMMs"):
        table.add_column(col, justify="left" if col == "GEMMs" else "right")
    for t in doc.timings:
        names = ", ".join(t.names[:2]) + (f" +{len(t.names) - 2}" if len(t.names) > 2 else "")
        table.add_row(str(t.m), str(t.n), str(t.k), f"{t.median_s * 1e6:.1f}", f"{t.tflops:.3g}", f"{t.gbps:.3g}",
                      _pct(t.frac_ceiling_tflops), _pct(t.frac_ceiling_gbps), names)
    console.print(table)
    for note in doc.notes:
        console.print(f"note: {note}", markup=False)


def _pct(fraction: float | None) -> str:
    return "—" if fraction is None else f"{100 * fraction:.0f}%"
