"""Views of a plan document (``servescope.plan``): terminal tables, JSON text, and an HTML page with a chart.

Only renders: every figure comes from the document :func:`servescope.plan.planner.run_plan` returned (or a
saved one). The HTML chart div has the stable id ``chart-plan-steps`` (step time vs batch, one line per
layout; infeasible layouts dotted).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from servescope.core.document import encode
from servescope.core.messages import size_text
from servescope.core.plan import EpVsTp, PlanDoc, PlanLayout, PlanPoint
from servescope.report.page import escape as _e
from servescope.report.page import page

__all__ = ["CollectiveSource", "collective_sources", "plan_to_json", "render_plan", "render_plan_headline",
           "render_plan_html"]

_PARTS = ("weights", "attention", "collectives", "other")
_SHORT = {"measured curve": "measured", "published curve": "published", "datasheet": "datasheet",
          "assumed": "assumed", "calibrated": "calibrated"}
_NBSP = "\u00a0"
_COLLECTIVES_TITLE = "collectives: the path each takes and where its figure comes from"


def _short_source(source: str) -> str:
    """A figure's source in a few words: a file's name, a pull request's repository and number; a point carried
    past its largest size by a published bandwidth names both (``…; past 65,536 B: 22.2 GB/s bus bandwidth …``)."""
    source, _, past = source.partition("; past ")
    head = source.split(" (", 1)[0].split(": ", 1)[0].split(", ", 1)[0]
    head = head.rsplit("/", 1)[-1] if " " not in head and "/" in head else head
    m = re.match(r"([\d,]+) B: (.*?) \((\w+)\) from (.*)", past)
    if m is None:
        return head
    return f"{head}; past {size_text(int(m[1].replace(',', '')))}: {m[2]}, {_short_source(m[4])}"


@dataclass
class CollectiveSource:
    """One collective figure of the plan (op, group size, path, origin, source, wait): why it takes that path, the
    layouts that use it, its message sizes (bytes) and times a call (µs)."""

    op: str
    group: int
    path: str
    impl: str
    origin: str
    source: str
    wait_us: float
    whys: list[str] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    us: list[float] = field(default_factory=list)


def collective_sources(doc: PlanDoc) -> list[CollectiveSource]:
    """One row per collective figure of the plan, from each point's ``collectives_per_step.OP.paths`` (a plan
    written before the paths has none)."""
    rows: dict[tuple[str, int, str, str, str, float], CollectiveSource] = {}
    for layout in doc.layouts:
        for p in layout.points:
            for op, entry in p.collectives_per_step.items():
                for path in entry.paths or []:
                    shown = path.path or path.impl
                    key = (op, path.group, shown, path.origin, path.source, round(path.wait_us_each, 6))
                    row = rows.setdefault(key, CollectiveSource(
                        op=op, group=path.group, path=shown, impl=path.impl, origin=path.origin, source=path.source,
                        wait_us=path.wait_us_each))
                    if path.why not in row.whys:
                        row.whys.append(path.why)
                    if layout.name not in row.layouts:
                        row.layouts.append(layout.name)
                    row.bytes.append(path.bytes_each)
                    row.us.append(path.us_each)
    return list(rows.values())


def _span(values: list[int] | list[float], fmt: Callable[[float], str]) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def _collective_entries(doc: PlanDoc) -> list[str]:
    """One line of text per (path, origin, source, wait): the collectives priced so, each with its group size and
    message sizes, then the path and where the figure comes from."""
    merged: dict[tuple[str, str, str, float], list[str]] = {}
    for row in collective_sources(doc):
        key = (row.path, row.origin, row.source, round(row.wait_us, 6))
        item = f"{row.op} over {row.group}, {_span(row.bytes, size_text)}"
        merged.setdefault(key, []).append(item.replace(" ", _NBSP))  # an item is never broken over lines
    out = [f"{', '.join(items)}: {path}; {_figure_from(origin, source, wait)}"
           for (path, origin, source, wait), items in merged.items()]
    return [re.sub(r" (?=[KM]iB\b| B\b|µs\b)", _NBSP, line) for line in out]  # a size stays with its unit


def _figure_from(origin: str, source: str, wait_us: float) -> str:
    wait = f" + {wait_us:.1f} µs wait (assumed)" if wait_us else ""
    return f"{origin}: {_short_source(source)}{wait}"


def plan_to_json(doc: PlanDoc) -> str:
    """The document as indented JSON text ending in a newline."""
    return encode(doc).decode()


def _tokens_per_s(point: PlanPoint) -> str:
    """tok/s as the table shows it: ``!kv`` when the KV cache cannot hold batch × context."""
    tps = point.tokens_per_s
    return "N/A" if tps is None else f"{tps:,.0f}" + ("" if point.fits_kv else " !kv")


def render_plan_headline(doc: PlanDoc, console: Console) -> None:
    """``FORCED`` lines first: the inputs used with ``--force`` although they do not match the plan."""
    for line in doc.forced:
        console.print(f"[bold red]FORCED[/] {line.removeprefix('forced: ')}", soft_wrap=True)


def _what_if_lines(doc: PlanDoc) -> list[str]:
    """EP with all-to-all against TP per batch (:mod:`servescope.plan.ep_a2a`), one line a batch."""
    w = doc.ep_all_to_all
    if not w:
        return []
    moe = w.rows[0].all_reduce_calls if w.rows else 0
    out = [f"EP with all-to-all in place of the {moe} MoE all-reduces (what-if; vLLM 0.26 runs it only under DP "
           f"attention): {w.sentence}"]
    for r in w.rows:
        out.append(f"batch {r.batch}: {w.versus} {r.tp_ms:.2f} ({r.tp_low_ms:.1f}–{r.tp_high_ms:.1f}) vs EP "
                   f"{r.ep_ms:.2f} ({r.ep_low_ms:.1f}–{r.ep_high_ms:.1f}) ms a step; out {r.all_reduce_calls} × "
                   f"{r.all_reduce_us_each:.1f} µs all-reduce, in {r.all_to_all_calls} × {r.all_to_all_us_each:.1f} "
                   f"µs all-to-all of {size_text(r.all_to_all_bytes)} ({r.all_to_all_origin}"
                   f"{f', the {r.bound} binds' if r.bound else ''}): {'decided' if r.decided else 'too close to call'}")
    if w.measure:
        out.append(f"what decides it at batch {w.rows[0].batch}: {w.measure.figure} ({w.measure.band}); measure it "
                   f"here (about {w.measure.seconds:.0f} s): {w.measure.command}")
    return out


def _what_if_text(doc: PlanDoc, console: Console, width: int) -> None:
    for i, line in enumerate(_what_if_lines(doc)):
        line = re.sub(r" (?=(?:[KMG]iB|µs|ms)\b)", _NBSP, line)
        for out in textwrap.wrap(line, width=width, initial_indent="" if i == 0 else "  - ",
                                 subsequent_indent="    " if i == 0 else "      ", break_long_words=False,
                                 break_on_hyphens=False):
            console.print(out.replace(_NBSP, " "), markup=False)


def _step_band(point: PlanPoint) -> str:
    """The step's band as the table shows it: ``15.1–19.9`` (empty for a plan written before bands)."""
    if point.step_ms_low is None or point.step_ms_high is None:
        return ""
    return f"{point.step_ms_low:.1f}–{point.step_ms_high:.1f}"


def _tps_band(point: PlanPoint) -> str:
    if point.tokens_per_s_low is None or point.tokens_per_s_high is None:
        return ""
    return f"{point.tokens_per_s_low:,.0f}–{point.tokens_per_s_high:,.0f}"


def _origins(point: PlanPoint) -> str:
    marks = sorted({_SHORT.get(o, o) for v in point.origins.values() for o in v})
    return ", ".join(marks)


def _header(doc: PlanDoc) -> str:
    return (f"{doc.model.name} on {doc.gpus} × {doc.hardware.gpu} ({doc.hardware.interconnect}), context "
            f"{doc.context:,} tokens per request")


def _name(layout: PlanLayout) -> str:
    """The layout's name as the tables show it: ``✗`` when it does not fit."""
    return layout.name + ("" if layout.feasible else " ✗")


def render_plan(doc: PlanDoc, console: Console) -> None:
    """One table of every layout × batch (step and its parts in ms), then memory, crossovers, the choice."""
    console.print(_header(doc), markup=False)
    table = Table(box=box.SIMPLE_HEAD, title="predicted decode step (ms)", pad_edge=False, show_edge=False)
    heads = ("batch", "step", "band", "weights", "attn", "comm", "other", "tok/s", "tok/s band")
    for col in ("layout", *heads):
        table.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    marks: set[str] = set()
    rows: list[tuple[str, list[str]]] = []
    for layout in doc.layouts:
        for p in layout.points:
            rows.append((_name(layout), [str(p.batch), f"{p.step_ms:.2f}", _step_band(p),
                                         *(f"{p.parts_ms[k]:.2f}" for k in _PARTS), _tokens_per_s(p), _tps_band(p)]))
            marks.update(o for v in p.origins.values() for o in v)
    for i, (name, cells) in enumerate(rows):
        table.add_row(name if i == 0 or rows[i - 1][0] != name else "", *cells)
    if Measurement.get(console, console.options.update_width(1_000_000), table).maximum <= console.width:
        console.print(table)
    else:  # narrow: one table a layout, named above it, without the layout column; numbers are never cut
        console.print(Text("predicted decode step (ms)", style="italic"))
        cols = list(range(len(heads)))
        widths = [max(len(h), *(len(cells[i]) for _, cells in rows)) for i, h in enumerate(heads)]
        while sum(widths[i] + 1 for i in cols) > console.width and len(cols) > 7:  # bands below, not cut
            cols.remove(max(i for i in cols if heads[i].endswith("band")))
        for name in dict.fromkeys(name for name, _ in rows):
            part = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, show_edge=False)
            for i in cols:  # the same columns in every layout's table
                part.add_column(heads[i], justify="right", no_wrap=True, min_width=widths[i])
            mine = [cells for row_name, cells in rows if row_name == name]
            for cells in mine:
                part.add_row(*(cells[i] for i in cols))
            console.print(Text(name, style="bold"))
            console.print(part)
            for i in (i for i in range(len(heads)) if i not in cols):
                line = f"{heads[i]}  " + "  ".join(f"batch{_NBSP}{cells[0]}{_NBSP}{cells[i]}" for cells in mine
                                                   if cells[i])  # the table's own words: it reads as a row
                for out in textwrap.wrap(line, width=max(40, console.width - 1), initial_indent="  ",
                                         subsequent_indent="    ", break_long_words=False, break_on_hyphens=False):
                    console.print(out.replace(_NBSP, " "), markup=False)
    console.print(f"✗ does not fit; !kv the KV cache cannot hold batch × context; band: the step with every figure "
                  f"at the near and the far side of its band (data/bands.toml). Figures from: "
                  f"{', '.join(sorted(marks))}", markup=False)
    entries = _collective_entries(doc)
    if entries:
        console.print(f"{_COLLECTIVES_TITLE}:", markup=False)
        for entry in entries:
            for line in textwrap.wrap(entry, width=max(40, console.width - 1), initial_indent="  ",
                                      subsequent_indent="      ", break_on_hyphens=False):
                console.print(line.replace(_NBSP, " "), markup=False)
    mem = Table(box=box.SIMPLE_HEAD, title="memory per GPU (GiB)")
    for col in ("layout", "weights", "KV cache", "KV tokens/GPU"):  # the reason wraps at spaces, nothing else
        mem.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    mem.add_column("fits", min_width=20)
    for layout in doc.layouts:
        g = layout.memory_gib_per_gpu
        mem.add_row(layout.name, f"{g.weights:.1f}", f"{g.kv_cache:.1f}", f"{layout.kv_tokens_per_gpu:,}",
                    layout.reason if layout.feasible else f"no: {layout.reason}")
    console.print(mem)
    for line in doc.skipped:
        console.print(f"left out: {line}", markup=False)
    for c in doc.crossovers:
        console.print(f"crossover at batch {c.batch}: {c.faster_below} faster below, {c.faster_above} "
                      f"from there on", markup=False)
    rec = doc.recommendation
    width = max(40, console.width - 1)
    if rec.layout is None and rec.leading and rec.decided is False:
        head = f"recommended: none: too close to call on these figures ({rec.leading} leads)"
    else:
        head = f"recommended: {rec.layout or 'none'}" + (" (its margin exceeds the bands)" if rec.decided else "")
    console.print(head, markup=False)
    for reason in rec.reasons:
        for out in textwrap.wrap(reason, width=width, initial_indent="  - ", subsequent_indent="      ",
                                 break_long_words=False, break_on_hyphens=False):
            console.print(out, markup=False)
    if rec.measure:
        m = rec.measure
        for i, line in enumerate([f"what decides it: {m.figure} ({m.band})",
                                  f"measure it here (about {m.seconds:.0f} s): {m.command}", f"then: {m.then}"]):
            for out in textwrap.wrap(line, width=width, initial_indent="  " if i else "", subsequent_indent="      ",
                                     break_long_words=False, break_on_hyphens=False):
                console.print(out, markup=False)
    versus = doc.ep_vs_tp  # a plan saved before 2026-12 has none
    if versus:
        width = max(40, console.width - 1)
        for i, line in enumerate([f"EP vs TP: {versus.sentence}", *versus.reasons]):
            line = re.sub(r"(?<=\d) × (?=\d)", f"{_NBSP}×{_NBSP}", line)  # "123 × 95.8 µs" stays on one line
            line = re.sub(r" (?=(?:[KMG]iB|µs|ms|GB/s)\b)", _NBSP, line)  # a figure stays with its unit
            for out in textwrap.wrap(line, width=width, initial_indent="" if i == 0 else "  - ",
                                     subsequent_indent="    " if i == 0 else "      ", break_long_words=False,
                                     break_on_hyphens=False):
                console.print(out.replace(_NBSP, " "), markup=False)
    _what_if_text(doc, console, max(40, console.width - 1))
    cal = doc.calibration
    if cal:
        fitted = ", ".join(f"{k} {v:.3g}" for k, v in cal.fitted.items()) or "nothing"
        mode = f", {cal.mode}" if cal.mode else ""  # documents saved before the fitting rules had none
        console.print(f"calibrated from {cal.path} (rank {cal.rank}, TP={cal.tp}, batch {cal.batch}, "
                      f"context {cal.context}{mode}): {fitted}", markup=False)
    for note in doc.notes:
        console.print(f"note: {note}", markup=False)


def _figure(doc: PlanDoc) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for layout in doc.layouts:
        pts = layout.points
        custom = [[p.parts_ms[k] for k in _PARTS] for p in pts]
        fig.add_trace(go.Scatter(
            x=[p.batch for p in pts], y=[p.step_ms for p in pts], mode="lines+markers",
            name=layout.name + ("" if layout.feasible else " (does not fit)"), customdata=custom,
            line={"dash": "solid" if layout.feasible else "dot"},
            hovertemplate=("batch %{x}: %{y:.2f} ms<br>weights %{customdata[0]:.2f} · attention "
                           "%{customdata[1]:.2f} · collectives %{customdata[2]:.2f} · other %{customdata[3]:.2f}"
                           "<extra>%{fullData.name}</extra>")))
    fig.update_layout(template="plotly_white", height=460, margin={"t": 50},
                      title="predicted decode step time vs batch", xaxis_title="batch (running requests)",
                      yaxis_title="ms per step", xaxis_type="log", legend_title="layout")
    return fig


def _cell(text: str) -> str:
    """A cell; the marks the terminal shows (``✗``, ``!kv``) stand out."""
    for mark in (" ✗", " !kv"):
        if text.endswith(mark):
            return f'{_e(text.removesuffix(mark))} <span class="mark">{_e(mark.strip())}</span>'
    return _e(text)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ep_vs_tp_html(versus: EpVsTp | None) -> list[str]:
    """The EP-vs-TP section: the sentence, the reasons, both sides at the batches compared and the all-to-all's
    inputs with their provenance."""
    if not versus:
        return []
    rows = [[f"{at.batch:,}", side.layout, f"{side.step_ms:.3f}", *(f"{side.parts_ms[k]:.3f}" for k in _PARTS),
             "; ".join(f"{c.op} {c.count} × {c.us_each:.1f} µs ({c.origin})" for c in side.collectives)]
            for at in versus.at for side in (at.tp, at.ep)]
    inputs: list[list[str]] = []
    for at in versus.at:
        model = at.ep.all_to_all
        if not model:
            continue
        for key, f in (("link_gbps", model.link_gbps), ("link_efficiency", model.link_efficiency),
                       ("bridge_gbps", model.bridge_gbps), ("latency_us", model.latency_us)):
            inputs.append([f"{at.batch:,}", key, f"{f.value:g}", f.unit, f.origin, f.source])
        inputs.append([f"{at.batch:,}", "bound", f"{model.bound} (link {model.link_us:.1f} µs, bridge "
                       f"{model.bridge_us:.1f} µs, {model.senders} senders)", "", "", model.assumption])
    return [
        "<h2>EP vs TP</h2>",
        f"<p>{_e(versus.sentence)}</p>",
        "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in versus.reasons) + "</ul>",
        _table(["batch", "layout", "step ms", *(f"{k} ms" for k in _PARTS), "collectives per step"], rows),
        *([_table(["batch", "all-to-all input", "value", "unit", "origin", "source"], inputs)] if inputs else []),
    ]


def _measure_html(doc: PlanDoc) -> list[str]:
    """The call at each batch, and the measurement that settles a close one."""
    rec = doc.recommendation
    out = []
    if rec.calls:
        out.append(_table(["batch", "fastest", "next", "margin ms", "band ms", "decided", "figure that can take most"],
                          [[str(c.batch), c.fastest, c.next or "", "" if c.margin_ms is None else f"{c.margin_ms:.2f}",
                            "" if c.band_ms is None else f"{c.band_ms:.2f}", "yes" if c.decided else "no",
                            c.deciding or ""] for c in rec.calls]))
    if rec.measure:
        m = rec.measure
        out.append(f"<p><b>What decides it</b>: {_e(m.figure)} ({_e(m.band)}). Measure it here (about "
                   f"{m.seconds:.0f} s): <code>{_e(m.command)}</code>; then {_e(m.then)}.</p>")
    return out


def render_plan_html(doc: PlanDoc) -> str:
    """A self-contained HTML page: the step-vs-batch chart (plotly.js inlined) and the plan's tables."""
    import plotly.io as pio

    chart = str(pio.to_html(_figure(doc), full_html=False, include_plotlyjs=True, div_id="chart-plan-steps",
                            default_height="480px", config={"displaylogo": False, "responsive": True}))
    rows = [[_name(layout), str(p.batch), f"{p.step_ms:.3f}", _step_band(p),
             *(f"{p.parts_ms[k]:.3f}" for k in _PARTS), _tokens_per_s(p), _tps_band(p),
             ", ".join(f"{op} ×{c.count}" for op, c in p.collectives_per_step.items()) or "none", _origins(p)]
            for layout in doc.layouts for p in layout.points]
    mem = [[x.name, "yes" if x.feasible else "no", f"{x.memory_gib_per_gpu.weights:.1f}",
            f"{x.memory_gib_per_gpu.kv_cache:.1f}", f"{x.kv_tokens_per_gpu:,}", x.reason] for x in doc.layouts]
    factors = [[k, f"{f.value:.4g}" if isinstance(f.value, int | float) else str(f.value), f.origin]
               for k, f in doc.factors.items()]
    colls = [[r.op, str(r.group), ", ".join(r.layouts), _span(r.bytes, size_text), _span(r.us, lambda v: f"{v:.1f}"),
              f"{r.wait_us:.1f}", r.path, r.origin, r.source, " · ".join(r.whys)] for r in collective_sources(doc)]
    rec = doc.recommendation
    parts = [
        "<h1>servescope plan</h1>",
        *(f'<p class="warn"><b>FORCED</b> {_e(line.removeprefix("forced: "))}</p>' for line in doc.forced),
        f'<p class="meta">servescope {_e(doc.servescope_version)} · {_e(doc.created_at)} · {_e(_header(doc))}'
        "</p>",
        f"<h2>Recommended: {_e(rec.layout or 'none')}"
        f"{_e(f' (too close to call on these figures: {rec.leading} leads)') if rec.decided is False else ''}</h2>",
        "<ul>" + "".join(f"<li>{_e(r)}</li>" for r in rec.reasons) + "</ul>",
        *_measure_html(doc),
        *_ep_vs_tp_html(doc.ep_vs_tp),
        *(["<h2>EP with all-to-all (what-if)</h2>",
           "<ul>" + "".join(f"<li>{_e(x)}</li>" for x in _what_if_lines(doc)) + "</ul>"] if doc.ep_all_to_all else []),
        "<h2>Step time vs batch</h2>", chart,
        "<h2>Layouts</h2>",
        _table(["layout", "batch", "step ms", "band ms", *(f"{k} ms" for k in _PARTS), "tok/s", "tok/s band",
                "collectives per step", "from"], rows),
        '<p class="meta">✗ does not fit; !kv the KV cache cannot hold batch × context.</p>',
        f"<h2>{_e(_COLLECTIVES_TITLE.capitalize())}</h2>",
        _table(["collective", "GPUs", "layouts", "message", "µs a call", "wait µs", "path", "origin", "source",
                "why this path"], colls) if colls else "<p>none</p>",
        "<h2>Memory per GPU</h2>",
        _table(["layout", "fits", "weights GiB", "KV cache GiB", "KV tokens per GPU", "why"], mem),
        "<h2>Crossovers</h2>",
        _table(["batch", "layouts", "faster below", "faster from there"],
               [[str(c.batch), " vs ".join(c.layouts), c.faster_below, c.faster_above]
                for c in doc.crossovers]) if doc.crossovers else "<p>none</p>",
        "<h2>Factors</h2>", _table(["factor", "value", "origin"], factors),
        "<h2>Notes</h2>",
        "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in [*doc.notes, *doc.skipped]) + "</ul>",
    ]
    return page(f"servescope plan {doc.model.name}", parts)
