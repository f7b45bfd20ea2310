"""Terminal and JSON views of the settings document (``servescope settings``); both read only the document.

Flags and unit values are never cut: in a terminal a long value (the full ExecStart) folds onto more lines,
and when stdout is a file or a pipe every row stays on one line (:func:`settings_console`), so ``grep`` finds
it. The environment is shown as far as it matters to serving: the variables ``serving`` accepts and every
one the unit sets; the rest of the process's environment is counted (``--all-env`` shows it), and an
environment value longer than :data:`ENV_VALUE_MAX` characters is shortened (the JSON document keeps all).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servescope.core.document import encode as encode_document
from servescope.core.settings import SettingsDoc

__all__ = ["ENV_VALUE_MAX", "encode_settings", "render_settings", "settings_console"]

_NA = "N/A"
_PIPE_WIDTH = 100_000  # wide enough that no row of a real unit wraps when piped
ENV_VALUE_MAX = 120
"""An environment value longer than this is shown as its first characters and how many more there are."""
_ENV_GROUPS = ("nccl_cuda_env", "vllm_env", "other")


def encode_settings(doc: SettingsDoc) -> bytes:
    """The document as indented UTF-8 JSON ending in a newline; ``None`` is ``null``."""
    return encode_document(doc)


def settings_console() -> Console:
    """A stdout console: the terminal's width on a terminal, else one so wide that no row wraps."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else _PIPE_WIDTH)


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


def render_settings(doc: SettingsDoc, console: Console, *, all_env: bool = True,
                    serving: Callable[[str], bool] | None = None) -> None:
    """A headline, the sources, one table per group (setting, value, source, where), then the drift.

    Args:
        all_env: show every environment variable, each value whole; else only those ``serving`` accepts
            and those the unit sets (the others counted), long values shortened.
        serving: which variable names matter to serving (default: all).
    """
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
            table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 2))
            table.add_column("setting", overflow="fold", style="cyan")
            table.add_column("value", overflow="fold")
            table.add_column("source", overflow="fold", style="dim")
            table.add_column("where", overflow="fold", style="dim")
            for setting in shown:
                value = _env_value(setting.value) if env else _value(setting.value)
                table.add_row(escape(setting.key), escape(value), escape(setting.source),
                              escape(setting.origin or ""))
            console.print(table)
        if hidden:
            console.print(f"  +{hidden} other variable{'s' if hidden != 1 else ''} of the process, not about "
                          "serving: --all-env to show")
    console.print()
    if not doc.drift:
        console.print(_no_drift(doc), markup=True)
        return
    console.print(f"[bold yellow]Drift ({len(doc.drift)})[/]")
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 2))
    table.add_column("kind", overflow="fold", style="yellow")
    table.add_column("key", overflow="fold", style="cyan")
    table.add_column("detail", overflow="fold")
    for item in doc.drift:
        table.add_row(escape(item.kind), escape(item.key), escape(item.detail))
    console.print(table)


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
