"""A self-contained HTML page of an analysis document: charts (plotly, embedded once) and plain tables.

The page needs no network to view: plotly.js is inlined in the first chart and every later chart reuses it.
Chart divs have stable ids, ``chart-steps-rank{R}`` (time per step by category on rank R) and
``chart-shares`` (category shares of one phase on every rank). Every name from a trace is escaped. A category
shows with the label and colour the document's category table gives it (:mod:`servescope.core.categories`).
"""

from __future__ import annotations

import html
import zlib
from collections.abc import Sequence
from typing import Any

from servescope.core.analysis import AnalysisDoc, CrossRankStats, PhaseStats, RankAnalysis
from servescope.core.categories import COMMUNICATION, Category, CategoryTable, categories_of
from servescope.report.kernel_names import demangle_all, shorten_kernel_name
from servescope.report.page import CSS as _CSS
from servescope.report.tables import (
    decided_by,
    format_count,
    format_evidence,
    format_ms,
    format_share,
    format_us,
    ordered_phases,
    phase_summary,
    plural,
    quant_summary,
    rank_keys,
    skew_text,
    sort_findings,
    top_kernels,
)

__all__ = ["category_color", "render_analysis_html", "shares_phase"]

# A category without a colour of its own takes one of its group's, stable by name: communication in reds.
_COMM_FALLBACK = ("#ef3b2c", "#fc9272", "#e6550d", "#fdd0a2", "#99000d", "#f768a1")
_OTHER_FALLBACK = ("#3182bd", "#31a354", "#756bb1", "#636363", "#8c6d31", "#843c39", "#7b4173", "#5254a3")


Cell = str | tuple[str, str]  # text, or (text, title shown on hover)


def category_color(category: Category) -> str:
    """The colour of a category: its taxonomy's, else stable by name within its group's hues."""
    if category.colour is not None:
        return category.colour
    hues = _COMM_FALLBACK if category.group == COMMUNICATION else _OTHER_FALLBACK
    return hues[zlib.crc32(category.name.encode()) % len(hues)]


def shares_phase(doc: AnalysisDoc) -> str | None:
    """The phase the shares chart shows: decode when any rank has it, else the one with most steps."""
    steps: dict[str, int] = {}
    for rank in doc.ranks:
        for phase, stats in rank.phases.items():
            steps[phase] = steps.get(phase, 0) + stats.steps
    if "decode" in steps:
        return "decode"
    order = ordered_phases(steps)
    return max(order, key=lambda p: steps[p]) if order else None


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], *, numeric: Sequence[int] = (),
           row_classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body: list[str] = []
    for i, row in enumerate(rows):
        cells: list[str] = []
        for j, cell in enumerate(row):
            text, title = (cell, None) if isinstance(cell, str) else cell
            attrs = ' class="num"' if j in numeric else ""
            attrs += "" if title is None else f' title="{_e(title)}"'
            cells.append(f"<td{attrs}>{_e(text)}</td>")
        cls = row_classes[i] if row_classes else ""
        body.append((f'<tr class="{_e(cls)}">' if cls else "<tr>") + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _rank_categories(rank: RankAnalysis) -> list[str]:
    totals: dict[str, float] = {}
    for step in rank.steps:
        for name, us in step.categories.items():
            totals[name] = totals.get(name, 0.0) + us
    return sorted(totals, key=lambda c: (-totals[c], c))


def _steps_figure(categories: CategoryTable, rank: RankAnalysis) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for name in _rank_categories(rank):
        present = [s for s in rank.steps if s.categories.get(name)]  # no empty bars for absent ones
        fig.add_trace(go.Bar(
            x=[s.index for s in present], y=[s.categories[name] for s in present], name=categories[name].label,
            customdata=[[s.phase, s.name] for s in present],
            marker_color=category_color(categories[name]),
            hovertemplate="step %{x} (%{customdata[0]})<br>%{fullData.name}: %{y:.1f} µs<extra></extra>",
        ))
    fig.update_layout(barmode="stack", template="plotly_white", height=420, margin={"t": 50},
                      title=f"rank {rank.rank}: device time per step by category",
                      xaxis_title="step index", yaxis_title="µs", legend_title="category")
    return fig


def _shares_figure(doc: AnalysisDoc, categories: CategoryTable, phase: str) -> Any:
    import plotly.graph_objects as go

    ranks = [r for r in sorted(doc.ranks, key=lambda r: r.rank) if phase in r.phases]
    shares: dict[str, dict[int, float]] = {}
    for r in ranks:
        for name, cat in r.phases[phase].categories.items():
            shares.setdefault(name, {})[r.rank] = cat.share
    fig = go.Figure()
    for name in sorted(shares, key=lambda c: (-sum(shares[c].values()), c)):
        on = [r.rank for r in ranks if r.rank in shares[name]]
        fig.add_trace(go.Bar(x=[f"rank {r}" for r in on], y=[shares[name][r] * 100 for r in on],
                             name=categories[name].label, marker_color=category_color(categories[name]),
                             hovertemplate="%{x}<br>%{fullData.name}: %{y:.1f}%<extra></extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", height=420, margin={"t": 50},
                      title=f"{phase}: share of device time by category", yaxis_title="% of device time",
                      legend_title="category")
    return fig


def _phase_section(doc: AnalysisDoc, categories: CategoryTable, rank: int, phase: str, stats: PhaseStats) -> str:
    steps, per_step = phase_summary(stats)
    items = sorted(stats.categories.items(), key=lambda item: (-item[1].total_us, item[0]))
    rows: list[list[Cell]] = [
        [categories[name].label, doc.categories.get(name, "N/A"), format_share(c.share), format_us(c.per_step_us),
         format_count(c.calls_per_step), format_us(c.mean_call_us)] for name, c in items
    ]
    classes = ["comm" if doc.categories.get(name) == COMMUNICATION else "" for name, _ in items]
    table = _table(["category", "group", "share", "µs/step", "calls/step", "µs/call"], rows,
                   numeric=(2, 3, 4, 5), row_classes=classes)
    quant = quant_summary(stats)
    quant_line = f"<br>{_e(quant)}" if quant is not None else ""
    return f"<h4>rank {rank} · {_e(phase)}</h4><p>{_e(steps)}<br>{_e(per_step)}{quant_line}</p>{table}"


def _across_section(doc: AnalysisDoc, categories: CategoryTable, cross: CrossRankStats) -> str:
    items = sorted(cross.categories.items(), key=lambda item: (-item[1].median_us, item[0]))
    spread = [("step (span)", cross.step_us), *((categories[name].label, c) for name, c in items)]
    rows: list[list[Cell]] = [
        [name, format_us(c.min_us), str(c.min_rank), format_us(c.median_us), format_us(c.max_us),
         str(c.max_rank)] for name, c in spread
    ]
    classes = [""] + ["comm" if doc.categories.get(n) == COMMUNICATION else "" for n, _ in items]
    coll_us, wait, share = (cross.collective_us_per_step, cross.collective_wait_us_per_step,
                            cross.collective_wait_share)
    keys = rank_keys(coll_us, wait, share)
    coll: list[list[Cell]] = [
        [k, format_us(coll_us.get(k)), format_us(wait.get(k)), format_share(share.get(k))]
        for k in keys
    ]
    ranks = ", ".join(str(r) for r in cross.ranks)
    return (f"<h3>across ranks · {_e(cross.phase)}</h3>"
            f"<p>ranks {_e(ranks)}; {plural(cross.steps_compared, 'step')} compared</p>"
            + _table(["per step", "min µs", "rank", "median µs", "max µs", "rank"], rows,
                     numeric=(1, 2, 3, 4, 5), row_classes=classes)
            + _table(["rank", "collective µs/step", "wait µs/step", "wait share"], coll, numeric=(0, 1, 2, 3))
            + f"<p>collective start skew: {_e(skew_text(cross.collective_start_skew_us))}</p>")


def _verdicts_section(doc: AnalysisDoc) -> list[str]:
    """The stored verdict per phase (the headline the text shows first), and the deployment checked against."""
    if not doc.verdicts:
        return []
    out = ["<h2>Bottleneck</h2>", '<ul class="verdicts">']
    out += [f"<li><b>{_e(v.phase)}</b>: {_e(v.sentence)}</li>" for v in doc.verdicts]
    out.append("</ul>")
    if doc.deployment:
        out.append(_table(["setting", "value", "from"], [[k, v.value, f"{v.source}: {v.detail}"]
                                                         for k, v in doc.deployment.items()]))
    return out


def render_analysis_html(doc: AnalysisDoc, *, top: int = 15) -> str:
    """A self-contained HTML page (charts and tables) of an analysis; plotly.js is embedded once.

    Args:
        doc: the analysis document.
        top: how many kernels the kernel table lists, by total time.

    Raises:
        ValueError: ``top`` is negative.

    Example:
        >>> Path("analysis.html").write_text(render_analysis_html(doc), encoding="utf-8")  # doctest: +SKIP
    """
    if top < 0:
        raise ValueError(f"top must be 0 or more, not {top}")
    import plotly.io as pio

    charts: list[str] = []

    def add_chart(fig: Any, div_id: str) -> None:
        charts.append(str(pio.to_html(
            fig, full_html=False, include_plotlyjs=not charts, div_id=div_id, default_height="440px",
            config={"displaylogo": False, "responsive": True},
        )))

    categories = categories_of(doc)
    ranks = sorted(doc.ranks, key=lambda r: r.rank)
    for rank in ranks:
        if rank.steps:
            add_chart(_steps_figure(categories, rank), f"chart-steps-rank{rank.rank}")
    phase = shares_phase(doc)
    if phase is not None:
        add_chart(_shares_figure(doc, categories, phase), "chart-shares")

    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>servescope analysis {_e(doc.created_at)}</title><style>{_CSS}</style></head><body>",
        "<h1>servescope analysis</h1>",
        f'<p class="meta">servescope {_e(doc.servescope_version)} · created {_e(doc.created_at)} · schema '
        f"{_e(doc.schema)} v{doc.schema_version}</p>",
        *_verdicts_section(doc),
        "<h2>Inputs</h2>",
        _table(["path", "bytes"], [[f.path, f"{f.size_bytes:,}"] for f in doc.inputs], numeric=(1,)),
        _table(["trace", "rank", "role", "events", "rank source"],
               [[t.path, "N/A" if t.rank is None else str(t.rank), t.role, f"{t.events:,}", t.rank_source]
                for t in doc.traces], numeric=(1, 3)),
        _table(["option", "value"], [[k, "N/A" if v is None else str(v)] for k, v in doc.options.items()]),
        _table(["platform", "value"], [[k, v] for k, v in doc.platform.items()]),
        "<h2>Charts</h2>", *charts,
        "<h2>Phases and categories</h2>",
    ]
    for rank in ranks:
        parts.append(f"<h3>rank {rank.rank}: {_e(rank.path)}</h3><p>work: {_e(rank.work_kind)}, steps from "
                     f"{_e(rank.step_source)}, unattributed {format_ms(rank.unattributed_us)} ms; "
                     f"{_e(decided_by(rank))}</p>")
        parts.extend(_phase_section(doc, categories, rank.rank, p, rank.phases[p]) for p in ordered_phases(rank.phases))
    if doc.across_ranks:
        parts.append("<h2>Across ranks</h2>")
        for p in ordered_phases(c.phase for c in doc.across_ranks):
            parts.extend(_across_section(doc, categories, c) for c in doc.across_ranks if c.phase == p)
    picked = top_kernels(doc.kernels, top)
    demangle_all(k.name for k in picked)  # one c++filt call for the names LLVM's demangler cannot read
    parts.append(f"<h2>Top {len(picked)} of {len(doc.kernels)} kernels</h2>")
    parts.append(_table(
        ["rank", "category", "count", "total ms", "mean µs", "name"],
        [[str(k.rank), categories[k.category].label, f"{k.count:,}", format_ms(k.total_us),
          format_us(k.total_us / k.count if k.count else None),
          (shorten_kernel_name(k.name, max_chars=90), k.name)]  # the full name shows on hover
         for k in picked], numeric=(0, 2, 3, 4)))
    parts.append("<h2>Findings</h2>")
    findings = sort_findings(doc.findings)
    parts.append(_table(
        ["severity", "id", "rank", "phase", "message", "evidence"],
        [[f.severity, f.id, "all" if f.rank is None else str(f.rank), f.phase or "all", f.message,
          format_evidence(f.evidence)] for f in findings],
        row_classes=[f"sev-{f.severity}" if f.severity in ("high", "medium") else "" for f in findings],
    ) if findings else "<p>none</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
