"""The terminal view of the settings document (``servescope settings``); it reads only the document.

Flags and unit values are never cut, and no word of them is broken: at the console's width (the terminal's;
``$COLUMNS`` or 80 when stdout is a file or a pipe) a row stays on one line when it fits, a long value (the full
command line, ExecStart) wraps at spaces beside its setting, and where even that leaves too little room for its
longest word each setting's value goes on the lines below it (:func:`_print_rows`). The environment is shown
as far as it matters to serving: the variables ``serving`` accepts and every one the unit sets; the rest of the
process's environment is counted (``--all-env`` shows it), and an environment value longer than
:data:`ENV_VALUE_MAX` characters is shortened (the JSON document keeps all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from servescope.core.settings import SettingsDoc, is_serving_env

__all__ = ["ENV_VALUE_MAX", "render_settings"]

_NA = "N/A"
ENV_VALUE_MAX = 120
"""An environment value longer than this is shown as its first characters and how many more there are."""
_ENV_GROUPS = ("nccl_cuda_env", "vllm_env", "other")


def _value(value: str | None) -> str:
    if value is None:
        return _NA
    return "(set)" if value == "" else value


def _env_value(value: str | None) -> str:
    text = _value(value)
    if len(text) <= ENV_VALUE_MAX:
        return text
    keep = ENV_VALUE_MAX - 30
    return f"{text[:keep]}… (+{len(text) - keep:,} chars; --all-env or --json for all)"


def render_settings(doc: SettingsDoc, console: Console, *, all_env: bool | None = None,
                    serving: Callable[[str], bool] | None = is_serving_env) -> None:
    """A headline, the sources, one table per group (setting, value, source, where), then the drift.

    Args:
        all_env: show every environment variable, each value whole; else only those ``serving`` accepts
            and those the unit sets (the others counted), long values shortened. Default: the document's
            ``all_env`` (``--all-env``).
        serving: which variable names matter to serving (``None``: all).
    """
    all_env = doc.all_env if all_env is None else all_env
    head = [doc.unit or "no unit", f"pid {doc.pid}" if doc.pid is not None else "no process",
            doc.url or "no server", doc.engine or "engine unknown"]
    console.print(f"[bold]{escape(' · '.join(head))}[/]")
    for note in doc.sources:
        mark = "[green]ok[/]" if note.ok else "[yellow]--[/]"
        console.print(f"  {mark} {escape(note.name)}: {escape(note.detail)}")
    for group in doc.groups:
        env = group.id in _ENV_GROUPS and not all_env
        shown = [s for s in group.settings
                 if not env or serving is None or serving(s.key) or s.source != "process"]
        hidden = len(group.settings) - len(shown)
        console.print()
        count = f"{len(shown)} of {len(group.settings)}" if hidden else f"{len(group.settings)}"
        console.print(f"[bold]{escape(group.title)}[/] ({count})")
        if shown:
            rows = [(s.key, _env_value(s.value) if env else _value(s.value), s.source, s.origin or "")
                    for s in shown]
            _print_rows(console, rows, ("cyan", "", "dim", "dim"), wrap=1)
        if hidden:
            console.print(f"  +{hidden} other variable{'s' if hidden != 1 else ''} of the process, not about "
                          "serving: --all-env to show")
    console.print()
    if not doc.drift:
        console.print(_no_drift(doc), markup=True)
        return
    console.print(f"[bold yellow]Drift ({len(doc.drift)})[/]")
    _print_rows(console, [(d.kind, d.key, d.detail) for d in doc.drift], ("yellow", "cyan", ""), wrap=2)


_GAP = 4  # spaces between two columns of rows that fit on one line each
_TIGHT = 2  # between columns when a value wraps: the room is short
_MIN_WRAPPED = 24  # the narrowest column a wrapped value gets before the rows are stacked instead


def _print_rows(console: Console, rows: Sequence[tuple[str, ...]], styles: Sequence[str], *, wrap: int) -> None:
    """Rows as columns, no cell ever cut inside a word, in the first of three layouts that fits the width.

    1. one line a row, when the widest row fits;
    2. column ``wrap`` (the value) wrapped at spaces in what the other columns leave, when that is at least
       as wide as its longest word (and :data:`_MIN_WRAPPED`);
    3. stacked: the other cells on one line, the value on the lines below it, indented, wrapped at spaces.
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(styles))]
    longest_word = max((len(word) for row in rows for word in row[wrap].split()), default=0)
    room = console.width - (sum(widths) - widths[wrap]) - _TIGHT * (len(styles) - 1)
    one_line = sum(widths) + _GAP * (len(styles) - 1) <= console.width
    if one_line or room >= max(longest_word, _MIN_WRAPPED):
        gap = _GAP if one_line else _TIGHT
        table = Table(box=None, show_header=False, pad_edge=False, padding=(0, gap // 2))
        for i, (width, style) in enumerate(zip(widths, styles, strict=True)):
            if i == wrap:  # folds only a word longer than the whole line
                table.add_column(style=style, overflow="fold", width=width if one_line else room)
            else:
                table.add_column(style=style, no_wrap=True, width=width)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
        return
    for row in rows:
        head = Table.grid(padding=(0, _TIGHT, 0, 0))  # the first cell, then the others wrapped beside it
        head.add_column(no_wrap=True)
        head.add_column(overflow="fold")
        rest = Text()
        for i, (cell, style) in enumerate(zip(row, styles, strict=True)):
            if i not in (0, wrap) and cell:
                rest.append(" " * _TIGHT if rest else "")
                rest.append(cell, style=style)
        head.add_row(Text(row[0], style=styles[0]), rest)
        console.print(head)
        console.print(Padding(Text(row[wrap], style=styles[wrap], overflow="fold"), (0, 0, 0, _GAP), expand=False))


_COMPARED = {"unit": "the unit", "process": "the running process", "server": "the server"}


def _no_drift(doc: SettingsDoc) -> str:
    """What an empty drift list means: agreement only among the sources that were read."""
    read = [n.name for n in doc.sources if n.ok and n.name in _COMPARED]
    unread = [n for n in doc.sources if not n.ok and n.name in _COMPARED]
    missed = "; ".join(f"{_COMPARED[n.name]}: {n.detail}" for n in unread)
    if len(read) < 2:
        only = f"only {_COMPARED[read[0]]} was read" if read else "none of the unit, process and server was read"
        return f"[yellow]Drift not checked[/]: {escape(only)} (could not read {escape(missed)})"
    agree = " and ".join(_COMPARED[n] for n in read)
    if not unread:
        return f"[green]No drift[/]: {agree} agree."
    return f"[green]No drift[/] between {agree}; not checked against {escape(missed)}"
