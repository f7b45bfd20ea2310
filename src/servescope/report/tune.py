"""Views of a ``tune`` result: the answer first (baseline against final knee), every trial, what to keep, what
was not tried and why; and the same as HTML. Read only the :class:`~servescope.core.tune.TuneDoc`."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servescope.core.tune import KneeFigure, Trial, TuneDoc, option_past_floor
from servescope.report.page import escape, page, text_block

__all__ = ["render_next_steps", "render_tune", "render_tune_html"]

_STYLE = {"kept": "green", "rolled_back": "yellow", "failed_start": "red", "measure_failed": "red",
          "interrupted": "red"}


def _knee(figure: KneeFigure | None) -> str:
    if figure is None:
        return "N/A"
    if figure.load is None:
        return "no load met the targets (goodput 0)"
    plus = "+" if figure.floor else ""
    room = ", ".join(f"{c.target} {c.value_ms:.0f} of {c.limit_ms:g} ms" for c in figure.checks or []
                     if c.value_ms is not None)
    knee = f"{figure.load:g}{plus} {figure.unit or ''}".rstrip()
    best = figure.best_load
    if best == figure.load:
        return f"{figure.delivered:.1f} tok/s at {knee}" + (f" ({room})" if room else "")
    # a lower load delivered more within the targets than the knee's: that is the figure compared
    return (f"{figure.delivered:.1f} tok/s at {best:g} {figure.unit or ''}".rstrip()
            + f" (the knee {knee}: {figure.tokens_per_s:.1f} tok/s" + (f"; {room}" if room else "") + ")")


def _floors(figures: list[KneeFigure | None], console: Console) -> None:
    """One line for the knees that are lower bounds: no load above them was measured, and why."""
    floors = {(f.load, f.unit, f.floor) for f in figures if f is not None and f.floor and f.load is not None}
    for load, unit, why in sorted(floors, key=lambda x: (x[0] or 0, x[2] or "")):
        console.print(Text(f"  {load:g}+ {unit or ''}: no higher load was measured ({why}); the knee may lie higher "
                           f"({option_past_floor(why)})", style="dim"), overflow="fold")


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{value:+.0%}"


def _headline(doc: TuneDoc, console: Console) -> None:
    base = doc.baseline
    mean = sum(b.delivered for b in base) / len(base) if base else None
    kept = [t for t in doc.trials if t.outcome == "kept"]
    head = Text()
    head.append(f"tune {doc.target.kind} {doc.target.name}", style="bold")
    head.append(f"  {doc.target.url}  targets {', '.join(doc.options.slo) or 'default'}  "
                f"{doc.options.input_tokens} in / {doc.options.output_tokens} out tokens"
                + ("  prompts sent as text" if doc.options.prompt_form == "text" else ""))
    console.print(head, overflow="fold")
    if base:
        console.print(Text(f"baseline: {' | '.join(_knee(b) for b in base)}  (noise ±{doc.noise:.0%})"),
                      overflow="fold")
    gain = (doc.final.delivered / mean - 1) if doc.final and mean else None
    final = Text(f"final:    {_knee(doc.final)}")
    if kept:
        final.append(f"  ({_pct(gain)} against the baseline's mean, {len(kept)} change(s) kept)", style="green")
    else:
        final.append("  (nothing kept: the original configuration stays)", style="yellow")
    console.print(final, overflow="fold")
    _floors([*base, doc.final], console)
    console.print(Text(f"stopped: {doc.stopped}; {len(doc.trials)} trial(s) in {doc.seconds:.0f} s"
                       + ("; the original configuration is in place" if doc.restored else "")), overflow="fold")


def _trials(doc: TuneDoc, console: Console) -> None:
    if not doc.trials:
        return
    table = Table(show_edge=False, pad_edge=False, box=None)
    table.add_column("#", justify="right")
    table.add_column("change", overflow="fold", ratio=3)
    table.add_column("outcome", no_wrap=True)
    table.add_column("predicted", no_wrap=True)
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("tok/s", justify="right", no_wrap=True)
    table.add_column("start s", justify="right", no_wrap=True)
    table.add_column("knee s", justify="right", no_wrap=True)
    for t in doc.trials:
        c = t.change
        table.add_row(str(t.number), c.edit.describe(), Text(t.outcome, style=_STYLE.get(t.outcome, "")),
                      f"{c.gain_low:+.0%}..{c.gain_high:+.0%}", _pct(t.measured_gain),
                      "N/A" if t.knee is None else f"{t.knee.delivered:.1f}",
                      f"{t.restart_s:.0f}", f"{t.measure_s:.0f}")
    console.print(table)
    for t in doc.trials:
        console.print(Text(f"  {t.number}. {t.change.label}: {t.why}", style=_STYLE.get(t.outcome, "")),
                      overflow="fold")
        console.print(Text(f"     because: {'; '.join(t.change.because)}", style="dim"), overflow="fold")
        if t.within_prediction is not None:
            console.print(Text(f"     predicted {t.change.gain_low:+.0%}..{t.change.gain_high:+.0%} "
                               f"({t.change.gain_basis}); measured {_pct(t.measured_gain)}{_same_load(t)}"
                               f"{_outside(t, doc.noise)}", style="dim"),
                          overflow="fold")
        for line in t.log_tail[-1:]:
            console.print(Text(f"     log: {line.strip()}", style="red"), overflow="fold")


def _same_load(trial: Trial) -> str:
    """Where the range priced the same load: the trial's gain there, and where the knee moved."""
    if trial.same_load is None or trial.same_load_gain is None or trial.knee is None:
        return ""
    moved = f"; the knee {trial.same_load:g} -> {trial.knee.load:g}" if trial.knee.load != trial.same_load else ""
    unit = trial.knee.unit or "streams"
    return f" (at {trial.same_load:g} {unit}, the reference's knee load: {_pct(trial.same_load_gain)}{moved})"


def _outside(trial: Trial, noise: float) -> str:
    """What to add after a trial's measured gain: nothing inside its predicted range; outside it, whether by less
    than the noise (one measurement cannot tell such a gain from one inside) or by more."""
    gain, change = trial.judged_gain, trial.change
    if trial.within_prediction or gain is None:
        return ""
    by = change.gain_low - gain if gain < change.gain_low else gain - change.gain_high
    if by <= noise:
        return (f", outside the prediction by {'under 1%' if by < 0.01 else f'{by:.0%}'}, less than the noise "
                f"(±{noise:.0%})")
    return ", outside the prediction"


def render_tune(doc: TuneDoc, console: Console) -> None:
    """The answer first, then every trial, the settings to keep and what was not tried."""
    _headline(doc, console)
    _trials(doc, console)
    if doc.keep.changes:
        console.print(Text("keep:", style="bold"))
        console.print(Text(f"  {doc.keep.command_line}"), overflow="fold")
        if doc.keep.dropin:
            console.print(Text(f"  drop-in {doc.target.dropin}:"))
            for line in doc.keep.dropin.splitlines():
                console.print(Text(f"    {line}"), overflow="fold")
    if doc.not_tried:
        console.print(Text("not tried:", style="bold"))
        for n in doc.not_tried:
            console.print(Text(f"  {n.id} ({n.reason}): {n.detail}"), overflow="fold")
    for note in doc.evidence:
        console.print(Text(f"evidence: {note}", style="dim"), overflow="fold")
    if doc.target.left_running is not None:
        console.print(Text(f"left running: process {doc.target.left_running} on {doc.target.url} (its own session; "
                           f"stop it with kill -TERM -- -{doc.target.left_running})"), overflow="fold")
    if doc.journal:
        console.print(Text(f"journal: {doc.journal} (`servescope tune --restore --journal {doc.journal}` undoes)",
                           style="dim"), overflow="fold")


def render_tune_html(doc: TuneDoc) -> str:
    """The text view as a self-contained page."""
    out = io.StringIO()
    render_tune(doc, Console(file=out, width=140, highlight=False, color_system=None))
    return page("servescope tune", [f"<h1>servescope tune: {escape(doc.target.name)}</h1>",
                                    f'<p class="meta">written by <code>servescope tune</code> '
                                    f"{escape(doc.created_at)}</p>", text_block(out.getvalue())])


def render_next_steps(lines: list[str], console: Console) -> None:
    """The catalogue's candidates for an analysis (analyze, profile, bench serve): what ``tune`` would try."""
    if not lines:
        return
    console.print(Text("next steps (the catalogue of changes; `servescope tune` tries them and keeps what pays):",
                       style="bold"), overflow="fold")
    for line in lines:
        console.print(Text(f"  {line}"), overflow="fold")
