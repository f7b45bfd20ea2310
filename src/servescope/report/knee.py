"""Views of the latency targets and the knee in a ``bench serve`` document: the answer first, then the points.

All read only the :class:`~servescope.core.serve.ServeResult` document (``slo``, ``search``, ``knee``,
``cause`` and each point's ``slo``), so a saved search renders as a fresh one.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servescope.core.knee import describe_slo, option_past_stop
from servescope.core.serve import PointSlo, ServePoint, ServeResult
from servescope.report.page import escape
from servescope.report.wrap import hang

__all__ = ["knee_change", "knee_html", "knee_lines", "render_knee", "slo_line", "slo_table", "targets_line"]


def targets_line(result: ServeResult) -> str:
    """``targets: TTFT p99 <= 2000 ms, ITL p99 <= 100 ms`` (and whether they are the defaults)."""
    default = " (the default targets; set yours with --slo)" if result.slo_default else ""
    return f"targets: {describe_slo(result.slo)}{default}"


def _load(point: ServePoint) -> str:
    return str(point.concurrency) if point.concurrency is not None else f"{point.rate:g}/s"


def knee_lines(result: ServeResult) -> list[tuple[str, str]]:
    """The answer of a search as (style, line) pairs: the knee, its spread, what bounds it, the setting."""
    lines: list[tuple[str, str]] = [("", targets_line(result))]
    search, knee, cause = result.search, result.knee, result.cause
    if search is None:
        return lines
    unit = search.unit
    if knee is None:
        lines.append(("bold red", f"knee: none — {search.stopped}"))
    else:
        lo, hi = knee.spread
        hint = option_past_stop(search.stopped)
        nxt = (f"; {knee.next_load:g} missed ({', '.join(knee.missed_by) or 'targets'})"
               if knee.next_load is not None else
               f"; no higher load measured: the knee is at least this{f' ({hint})' if hint else ''}")
        delivered = f"; all requests {knee.tokens_per_s:.1f} tok/s" if knee.tokens_per_s is not None else ""
        lines.append(("bold", f"knee: {knee.load:g} {unit} — goodput {knee.goodput_tokens_per_s:.1f} output tok/s, "
                              f"{knee.goodput_requests_per_s:.2f} req/s (spread {lo:.1f}–{hi:.1f} tok/s over "
                              f"{knee.repeats} run{'s' if knee.repeats != 1 else ''}, {knee.met} met{delivered}){nxt}"))
        if (most := knee.most_tokens_at) is not None and knee.tokens_per_s is not None:
            lines.append(("yellow", f"most tokens within the targets: {most[0]:g} {unit}, {most[1]:.1f} tok/s, more "
                                    f"than the knee's {knee.tokens_per_s:.1f}: past {most[0]:g} {unit} the server "
                                    "delivers fewer tokens while still meeting the targets"))
    if cause is not None:
        lines.append(("bold", f"bounded by {cause.title}: {cause.message}"))
        place = {True: f"in place ({cause.setting_value})" if cause.setting_value else "in place",
                 False: "not set on the server's command line (its default applies)",
                 None: "not known (the server's command line was not readable here)"}[cause.in_place]
        lines.append(("", f"  setting: {cause.setting} — {place}"))
        lines.append(("", f"  try: {cause.advice}"))
    elif knee is not None and knee.next_load is not None:
        lines.append(("yellow", "bounded by: no rule of data/knee.toml holds; the figures of each point follow"))
    lines.append(("dim", f"search: {search.stopped}; {len(result.points)} points, {search.requests} requests, "
                         f"{search.seconds:.0f} s"))
    return lines


def render_knee(result: ServeResult, console: Console) -> None:
    """The search's answer, then one row per point."""
    for style, line in knee_lines(result):
        hang(console, line, style=style)
    console.print(slo_table(result))


def _check(slo: PointSlo | None, name: str) -> str:
    check = next((c for c in slo.checks if c.target == name), None) if slo else None
    if check is None or check.value_ms is None:
        return "N/A"
    return f"{check.value_ms:.1f}{'' if check.met else ' ✗'}"


def slo_table(result: ServeResult) -> Table:
    """One row per point: step, load, met, each target's value, attainment, goodput, the server's queue."""
    table = Table(show_edge=False, pad_edge=False, box=None)
    table.add_column("step")
    table.add_column("load", justify="right")
    table.add_column("met")
    for target in result.slo:
        table.add_column(f"{target.name} ms", justify="right")
    for name in ("attain", "goodput tok/s", "running", "waiting", "KV %", "cached %"):
        table.add_column(name, justify="right")
    for p in result.points:
        s = p.server
        table.add_row(
            p.step or "", _load(p), "yes" if p.slo and p.slo.met else "no",
            *(_check(p.slo, t.name) for t in result.slo),
            "N/A" if not p.slo or p.slo.attainment is None else f"{p.slo.attainment:.0%}",
            "N/A" if not p.slo or p.slo.goodput_tokens_per_s is None else f"{p.slo.goodput_tokens_per_s:.1f}",
            "N/A" if s.max_running is None else f"{s.max_running:.0f}",
            "N/A" if s.max_waiting is None else f"{s.max_waiting:.0f}",
            "N/A" if s.kv_cache_usage_max is None else f"{s.kv_cache_usage_max * 100:.0f}",
            "N/A" if s.prefix_cache_hit_rate is None else f"{s.prefix_cache_hit_rate * 100:.0f}")
    return table


def slo_line(point: ServePoint) -> str | None:
    """Under a point of a fixed sweep: met or missed, attainment, goodput."""
    slo = point.slo
    if slo is None:
        return None
    verdict = "met the targets" if slo.met else f"missed {', '.join(slo.missed_by)}"
    values = "; ".join(f"{c.target} {c.value_ms:.1f} ms" for c in slo.checks if c.value_ms is not None)
    attain = "N/A" if slo.attainment is None else f"{slo.attainment:.0%}"
    good = "N/A" if slo.goodput_tokens_per_s is None else f"{slo.goodput_tokens_per_s:.1f}"
    return f"  {verdict} ({values}); attainment {attain}, goodput {good} tok/s"


def knee_html(result: ServeResult) -> list[str]:
    """HTML parts: the answer, and a chart of goodput and each target's value by load, the knee marked."""
    if not result.slo:
        return []
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    points = sorted(result.points, key=lambda p: float(p.concurrency or p.rate or 0))
    xs = [float(p.concurrency if p.concurrency is not None else p.rate or 0) for p in points]
    fig = make_subplots(rows=1, cols=1 + len(result.slo),
                        subplot_titles=("goodput (output tok/s)", *(f"{t.name} (ms)" for t in result.slo)))
    fig.add_trace(go.Scatter(x=xs, y=[p.slo.goodput_tokens_per_s if p.slo else None for p in points],
                             mode="markers+lines", name="goodput"), row=1, col=1)
    for col, target in enumerate(result.slo, start=2):
        ys = [next((c.value_ms for c in p.slo.checks if c.target == target.name), None) if p.slo else None
              for p in points]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+lines", name=target.name), row=1, col=col)
        fig.add_hline(y=target.limit_ms, line_dash="dash", line_color="red", row=1, col=col)
    if result.knee is not None:
        for col in range(1, 2 + len(result.slo)):
            fig.add_vline(x=result.knee.load, line_dash="dot", line_color="green", row=1, col=col)
    fig.update_xaxes(title_text=result.search.unit if result.search else "load")
    fig.update_layout(template="plotly_white", height=420, showlegend=False)
    chart = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id="chart-knee",
                        config={"displaylogo": False, "responsive": True})
    answer = "".join(f"<p><b>{escape(line)}</b></p>" if style.startswith("bold") else f"<p>{escape(line)}</p>"
                     for style, line in knee_lines(result))
    return ["<h2>Targets and the knee</h2>", answer, chart]


def knee_change(new: ServeResult, old: ServeResult) -> str | None:
    """The knee against an older search's (``--compare``): load and goodput, old → new, and whether the new knee
    lies beyond the older one's spread."""
    if new.knee is None and old.knee is None:
        return None
    if new.knee is None or old.knee is None:
        return f"knee: {'none' if old.knee is None else f'{old.knee.load:g}'} → " \
               f"{'none' if new.knee is None else f'{new.knee.load:g}'} (the older search's)"
    a, b = old.knee, new.knee
    change = (b.goodput_tokens_per_s - a.goodput_tokens_per_s) / a.goodput_tokens_per_s if a.goodput_tokens_per_s else 0
    beyond = b.spread[0] > a.spread[1] or b.spread[1] < a.spread[0]
    same = [t.name for t in new.slo] == [t.name for t in old.slo] and \
        [t.limit_ms for t in new.slo] == [t.limit_ms for t in old.slo]
    return (f"knee against the older search: {a.load:g} → {b.load:g} {b.unit}, goodput {a.goodput_tokens_per_s:.1f} → "
            f"{b.goodput_tokens_per_s:.1f} tok/s ({change:+.1%}; "
            f"{'beyond' if beyond else 'within'} the two spreads)"
            + ("" if same else "; the targets differ"))
