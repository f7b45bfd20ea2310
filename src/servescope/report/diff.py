"""Terminal view of a diff document."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servescope.core.diff import CategoryDelta, DiffDoc
from servescope.core.document import encode as encode_document
from servescope.report.tables import format_us

__all__ = ["encode_diff", "render_diff"]


def encode_diff(doc: DiffDoc) -> bytes:
    """The diff document as indented JSON ending in a newline."""
    return encode_document(doc)


def _pct(delta: CategoryDelta) -> str:
    return "N/A" if delta.delta_pct is None else f"{delta.delta_pct:+.1f}%"


def _row(table: Table, name: str, d: CategoryDelta) -> None:
    style = "green" if d.delta_us < 0 else ("red" if d.delta_us > 0 else "")
    table.add_row(Text(name), format_us(d.before_us), format_us(d.after_us),
                  Text(f"{d.delta_us:+.1f}", style=style), Text(_pct(d), style=style))


def render_diff(doc: DiffDoc, console: Console) -> None:
    """Per rank: step, busy, idle and each category per step, before → after; then findings that changed."""
    console.print(Text(f"before: {doc.before}\nafter:  {doc.after}\nphase:  {doc.phase} (µs per step)"))
    for rank in doc.ranks:
        table = Table(title=f"rank {rank.rank}: {rank.steps_before} → {rank.steps_after} steps",
                      title_justify="left", box=None, header_style="bold")
        for col in ("per step", "before µs", "after µs", "Δ µs", "Δ %"):
            table.add_column(col, justify="left" if col == "per step" else "right")
        _row(table, "step (span)", rank.step_us)
        _row(table, "busy", rank.busy_us)
        _row(table, "idle", rank.idle_us)
        for name, delta in rank.categories.items():
            _row(table, name, delta)
        console.print(table)
    for label, ranks in (("only before", doc.ranks_only_before), ("only after", doc.ranks_only_after)):
        if ranks:
            console.print(Text(f"ranks {label}: {', '.join(map(str, ranks))}"))
    if doc.cycle_us is not None:
        c = doc.cycle_us
        console.print(Text(f"step cycle: {c.before_us:.0f} → {c.after_us:.0f} µs ({c.delta_us:+.0f} µs, {_pct(c)}), "
                           f"{doc.cycle_source}"))
    if doc.settings_changed:
        console.print(Text("settings changed: " + "; ".join(f"{s.setting} {s.before or '?'} → {s.after or '?'}"
                                                         for s in doc.settings_changed)))
    for p in doc.predictions:
        mark = {"held": "green", "short": "yellow", "exceeded": "yellow"}[p.outcome]
        line = Text(f"  {'applied ' if p.applied else ''}{p.finding}: predicted {p.low_us:.0f}–{p.high_us:.0f} µs, "
                    f"measured {p.measured_saving_us:.0f} µs saved: ")
        line.append(p.outcome, style=mark)
        line.append(f" ({p.advice[:90]})")
        console.print(line)
    for label, findings in (("findings that appeared", doc.findings_appeared),
                            ("findings that went away", doc.findings_gone)):
        console.print(Text(f"{label}: {len(findings) or 'none'}", style="bold"))
        for f in findings:
            console.print(Text(f"  [{f.severity}] {f.id}: {f.message}"))
