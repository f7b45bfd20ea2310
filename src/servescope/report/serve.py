"""Views of a ``bench serve`` result: a table per point, deltas against an older run, a PNG, HTML.

All read only the :class:`~servescope.core.serve.ServeResult` document, so a saved run renders as a fresh one.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servescope.core.serve import DEFINITIONS, Dist, ServePoint, ServeResult
from servescope.report.knee import knee_html, render_knee, slo_line, targets_line
from servescope.report.page import escape, page, warning
from servescope.report.wrap import hang

__all__ = [
    "compare_points",
    "point_label",
    "point_warnings",
    "render_compare",
    "render_serve",
    "render_serve_html",
    "render_serve_png",
]

_NA = "N/A"
_FIGURES = (("TTFT", "ttft_ms", "ttft_ms_mean"), ("TPOT", "tpot_ms", "tpot_ms_mean"),
            ("ITL", "itl_ms", "itl_ms_mean"), ("E2E", "e2e_ms", "e2e_ms_mean"))


def point_label(point: ServePoint) -> str:
    """``concurrency 4`` or ``rate 2/s``."""
    return f"concurrency {point.concurrency}" if point.concurrency is not None else f"rate {point.rate:g}/s"


def _ms(value: float | None) -> str:
    return _NA if value is None else f"{value:.2f}"


def _num(value: float | None, digits: int = 1) -> str:
    return _NA if value is None else f"{value:.{digits}f}"


def _point_table(point: ServePoint) -> Table:
    table = Table(title=None, show_edge=False, pad_edge=False, box=None)
    for name in ("ms", "mean", "median", "p90", "p99", "server mean"):
        table.add_column(name, justify="left" if name == "ms" else "right")
    table.add_column("definition")
    for label, key, server_key in _FIGURES:
        dist: Dist = getattr(point, key)
        table.add_row(label, _ms(dist.mean), _ms(dist.median), _ms(dist.p90), _ms(dist.p99),
                      _ms(getattr(point.server, server_key)), DEFINITIONS[key])
    return table


def render_serve(result: ServeResult, console: Console) -> None:
    """A headline, then per point: a table of TTFT/TPOT/ITL/E2E beside the server's means, and throughput."""
    opts = result.options
    hang(console, f"{result.url}  model {opts.model}  {opts.input_tokens} in / {opts.output_tokens} out tokens "
                  f"(ignore_eos)  prompts: {opts.prompt_source}")
    if not result.metrics_available:
        console.print(Text("the server has no /metrics: server columns are N/A", style="yellow"))
    if result.search is not None:   # a knee search: the answer first, then its points one row each
        render_knee(result, console)
        if result.aborted:
            console.print(Text(f"stopped early: {result.aborted}", style="bold red"), overflow="fold")
        _next_steps(result, console)
        return
    if result.slo:
        hang(console, targets_line(result))
    for point in result.points:
        head = Text()
        head.append(point_label(point), style="bold")
        head.append(f"  {point.requests} requests, ")
        head.append(f"{point.errors} errors", style="red" if point.errors else "")
        head.append(f", {point.duration_s:.1f} s, {_processes(point)}")
        console.print(head)
        console.print(_point_table(point))
        tok = point.tokens
        diff = tok.output_total - tok.output_requested_total
        lag = point.client_lag
        console.print(Text(
            f"  output {_num(point.output_tokens_per_s)} tok/s, {_num(point.requests_per_s, 2)} req/s; "
            f"usage tokens {tok.output_total} (requested {tok.output_requested_total}, diff {diff:+d}, "
            f"{tok.output_mismatched_requests} requests off), prompt mean {_num(tok.prompt_mean)} "
            f"(requested {tok.prompt_requested}); client lag p99 {_ms(lag.p99_ms)} ms, max {_ms(lag.max_ms)} ms"
            f" over {_processes(point)}"))
        judged = slo_line(point)
        if judged is not None:
            console.print(Text(judged, style="green" if point.slo and point.slo.met else "yellow"), overflow="fold")
        for line in point_warnings(point):  # a client_bound without its finding: saved by an older version
            console.print(Text(f"  {line}", style="yellow"), overflow="fold")
        if point.server.tpot_metric:
            console.print(Text(f"  server: {point.server.tpot_metric} (TPOT), {point.server.ttft_metric} (TTFT), "
                               f"{_num(point.server.requests, 0)} requests, "
                               f"{_num(point.server.generation_tokens, 0)} generation tokens", style="dim"))
        for example in point.error_examples:
            console.print(Text(f"  error: {example}", style="red"), overflow="fold")
    if result.aborted:
        console.print(Text(f"stopped early: {result.aborted}", style="bold red"), overflow="fold")
    _next_steps(result, console)


def _next_steps(result: ServeResult, console: Console) -> None:
    if result.next_steps:
        from servescope.report.tune import render_next_steps

        render_next_steps(list(result.next_steps), console)


def _processes(point: ServePoint) -> str:
    return f"{point.workers} client process{'es' if point.workers != 1 else ''}"


def _key(point: ServePoint) -> tuple[str, float]:
    return ("c", float(point.concurrency)) if point.concurrency is not None else ("r", float(point.rate or 0.0))


def _change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return (new - old) / old


def compare_points(new: ServeResult, old: ServeResult) -> list[dict[str, Any]]:
    """Per point present in both runs: mean TTFT/TPOT/ITL/E2E and output tok/s, old, new and relative change."""
    olds = {_key(p): p for p in old.points}
    rows: list[dict[str, Any]] = []
    for point in new.points:
        before = olds.get(_key(point))
        if before is None:
            continue
        row: dict[str, Any] = {"point": point_label(point)}
        for _, key, _ in _FIGURES:
            a, b = getattr(before, key).mean, getattr(point, key).mean
            row[key] = {"old": a, "new": b, "change": _change(b, a)}
        row["output_tokens_per_s"] = {"old": before.output_tokens_per_s, "new": point.output_tokens_per_s,
                                      "change": _change(point.output_tokens_per_s, before.output_tokens_per_s)}
        rows.append(row)
    return rows


_COMPARED_OPTIONS = ("model", "input_tokens", "output_tokens", "prompt_form")


def differing_options(new: ServeResult, old: ServeResult) -> list[str]:
    """The options that move the figures and differ between the two runs, as ``name old → new``
    (``prompt_form`` only where both runs recorded it)."""
    lines = []
    for name in _COMPARED_OPTIONS:
        a, b = getattr(old.options, name), getattr(new.options, name)
        if a != b and a is not None and b is not None:
            lines.append(f"{name} {a} → {b}")
    return lines


def render_compare(rows: list[dict[str, Any]], console: Console) -> None:
    """The deltas of :func:`compare_points` as a table (means; change in %)."""
    table = Table(title="against the older run (means)", show_edge=False)
    table.add_column("point")
    for name in ("TTFT ms", "TPOT ms", "ITL ms", "E2E ms", "out tok/s"):
        table.add_column(name, justify="right")
    for row in rows:
        cells = []
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tokens_per_s"):
            cell = row[key]
            change = "" if cell["change"] is None else f" ({cell['change'] * 100:+.1f}%)"
            cells.append(f"{_num(cell['old'], 2)} → {_num(cell['new'], 2)}{change}")
        table.add_row(row["point"], *cells)
    if not rows:
        console.print(Text("no point of this run is in the older one (compare by concurrency or rate)"))
        return
    console.print(table)


def _xs(result: ServeResult) -> tuple[list[float], str]:
    if result.points and result.points[0].concurrency is None:
        return [p.rate or 0.0 for p in result.points], "request rate (req/s)"
    return [float(p.concurrency or 0) for p in result.points], "concurrency"


def render_serve_png(result: ServeResult) -> bytes:
    """A PNG of the sweep: TTFT, TPOT (client mean/p99 and the server's mean) and output tok/s by load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, xlabel = _xs(result)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("TTFT (ms)", "ttft_ms", "ttft_ms_mean"), ("TPOT (ms)", "tpot_ms", "tpot_ms_mean"))
    for ax, (title, key, server_key) in zip(axes, panels, strict=False):
        ax.plot(xs, [getattr(p, key).mean for p in result.points], "o-", label="client mean")
        ax.plot(xs, [getattr(p, key).p99 for p in result.points], "s--", label="client p99")
        server = [getattr(p.server, server_key) for p in result.points]
        if any(v is not None for v in server):
            ax.plot(xs, server, "^:", label="server mean (/metrics)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    axes[2].plot(xs, [p.output_tokens_per_s for p in result.points], "o-")
    axes[2].set_title("output tokens/s")
    for ax in axes:
        ax.set_xlabel(xlabel)
        if xlabel == "concurrency" and len(xs) > 1:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.options.model}: {result.options.input_tokens} in / {result.options.output_tokens} out")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()


def render_serve_html(result: ServeResult) -> str:
    """A self-contained HTML page: the sweep as a plotly chart (``chart-serve``, plotly.js inlined) and a table."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    xs, xlabel = _xs(result)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "output tokens/s"))
    for col, key, server_key in ((1, "ttft_ms", "ttft_ms_mean"), (2, "tpot_ms", "tpot_ms_mean")):
        fig.add_trace(go.Scatter(x=xs, y=[getattr(p, key).mean for p in result.points], name=f"{key} client mean"),
                      row=1, col=col)
        fig.add_trace(go.Scatter(x=xs, y=[getattr(p, key).p99 for p in result.points], name=f"{key} client p99",
                                 line={"dash": "dash"}), row=1, col=col)
        fig.add_trace(go.Scatter(x=xs, y=[getattr(p.server, server_key) for p in result.points],
                                 name=f"{key} server mean", line={"dash": "dot"}), row=1, col=col)
    fig.add_trace(go.Scatter(x=xs, y=[p.output_tokens_per_s for p in result.points], name="output tok/s"),
                  row=1, col=3)
    fig.update_xaxes(title_text=xlabel)
    fig.update_layout(template="plotly_white", height=420)
    chart = pio.to_html(fig, full_html=False, include_plotlyjs=True, div_id="chart-serve",
                        config={"displaylogo": False, "responsive": True})
    head = "".join(f"<th>{escape(h)}</th>" for h in
                   ("point", "client processes", "requests", "errors", "TTFT mean ms", "TPOT mean ms",
                    "server TPOT ms", "ITL mean ms", "E2E mean ms", "output tok/s", "req/s", "client lag p99 ms"))
    rows = "".join(
        "<tr>" + "".join(f'<td class="num">{escape(c)}</td>' if i else f"<td>{escape(c)}</td>" for i, c in enumerate((
            point_label(p), str(p.workers), str(p.requests), str(p.errors), _ms(p.ttft_ms.mean), _ms(p.tpot_ms.mean),
            _ms(p.server.tpot_ms_mean), _ms(p.itl_ms.mean), _ms(p.e2e_ms.mean), _num(p.output_tokens_per_s),
            _num(p.requests_per_s, 2), _ms(p.client_lag.p99_ms)))) + "</tr>" for p in result.points)
    warnings = [f"{point_label(p)}: {line}" for p in result.points for line in point_warnings(p)]
    defs = "".join(f"<li><b>{escape(k)}</b>: {escape(v)}</li>" for k, v in result.definitions.items())
    opts = result.options
    parts = [
        f"<h1>bench serve: {escape(result.url)}</h1>",
        f'<p class="meta">servescope {escape(result.servescope_version)} · {escape(result.created_at)} · model '
        f"{escape(opts.model)}, {opts.input_tokens} in / {opts.output_tokens} out tokens; prompts: "
        f"{escape(opts.prompt_source)}</p>",
        *([warning("the server has no /metrics: server columns are N/A")] if not result.metrics_available else []),
        *(["<h2>Findings</h2>", *(warning(w) for w in warnings)] if warnings else []),
        *([f'<p class="warn"><b>stopped early:</b> {escape(result.aborted)}</p>'] if result.aborted else []),
        chart,
        *knee_html(result),
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>",
        f"<h2>Definitions</h2><ul>{defs}</ul>",
    ]
    return page(f"servescope bench serve {result.created_at}", parts)


def point_warnings(point: ServePoint) -> list[str]:
    """The warnings the terminal prints under a point (findings such as client_bound and front_end_bound)."""
    lines = [(f"{f.severity}: " if f.severity else "") + f"{f.message}; try: {f.advice}" for f in point.findings]
    if point.client_lag.client_bound and not any(f.id == "client_bound" for f in point.findings):
        lines.append(f"client-bound: the client's event loop ran up to {_ms(point.client_lag.p99_ms)} ms late (p99)")
    return lines
