"""Tables of collective cost curves and the best variant at decode message sizes."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servescope.core.comm import size_text
from servescope.core.comm_result import CommResultDoc

__all__ = ["render_comm"]


def render_comm(result: CommResultDoc, console: Console) -> None:
    """One table per op (size, variant, µs, algbw, busbw), then the decode-size winners, the unit's env lines and
    what failed."""
    doc = result.curves
    backend = " ".join(filter(None, (doc.backend, doc.versions.get("nccl"))))
    console.print(f"{doc.device} · {backend} · torch {doc.versions['torch']}"
                  f" · {doc.world_size} ranks · {doc.interconnect} · {doc.date}")
    for op in dict.fromkeys(c.op for c in doc.curves):
        table = Table(title=op, box=None)
        for col in ("size", "variant", "µs", "algbw GB/s", "busbw GB/s"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        for curve in (c for c in doc.curves if c.op == op):
            for p in curve.points:
                table.add_row(size_text(p.bytes), curve.label, f"{p.time_us:.1f}", f"{p.algbw_gbps:.2f}",
                              f"{p.busbw_gbps:.2f}")
        console.print(table)
    if result.best_at_decode:
        table = Table(title="best all_reduce at decode sizes (hidden × batch × 2 bytes)", box=None)
        for col in ("batch", "bytes", "best variant", "µs", "default µs"):
            table.add_column(col, justify="left" if col == "best variant" else "right")
        for c in result.best_at_decode:
            label = f"{c.variant}{' [graph]' if c.graph else ''}"
            table.add_row(str(c.batch), str(c.bytes), label, f"{c.time_us:.1f}",
                          "N/A" if c.default_time_us is None else f"{c.default_time_us:.1f}")
        console.print(table)
    for line in result.environment:
        console.print(line, markup=False)
    for f in result.failures:
        console.print(f"failed: {f}", markup=False)
