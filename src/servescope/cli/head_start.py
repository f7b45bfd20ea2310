"""analyze's head start: the traces on the command line start decoding before typer is imported.

typer takes ~50 ms to import and build ``analyze``, and numpy with the analysis ~100 ms more; the traces it
will name can be decoding in child processes meanwhile. :func:`start` guesses them from the raw
arguments: each one that names an existing file or directory and does not follow an option that takes a value
(``VALUE_OPTIONS``), plus the bundled example when asked for. It starts a
:class:`~servescope.trace.readahead.ReadAhead` on what they name. The command, once typer has parsed its flags
and found its files, :func:`claim` s it: it gets it only when it reads exactly those files, else the children
are stopped and the command reads as it always does. A wrong guess costs time, never a result.

Standard library only (besides the read-ahead and file discovery, which are too).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servescope.trace.readahead import ReadAhead

__all__ = ["VALUE_OPTIONS", "claim", "release", "start"]

VALUE_OPTIONS = frozenset({"-o", "--output", "--html", "--taxonomy", "--step-gap-us", "--settings", "--top",
                           "--example-name"})
"""analyze's options that take a value: the argument after one is that value, not a trace
(tests/cli/test_head_start.py keeps this equal to the command's declaration)."""

_pending: ReadAhead | None = None


def guess(args: Sequence[str]) -> list[Path] | None:
    """The trace files ``analyze ARGS`` will read, as far as the raw arguments tell; None when unsure."""
    from servescope.trace.files import discover_traces, example_trace_dir

    if "--help" in args or "-h" in args:
        return None
    named: list[str] = []
    example: str | None = None  # "" for --example: the default example
    waiting: str | None = None  # a value option whose value is the next argument
    options_end = False
    for arg in args:
        if options_end or arg == "-":
            named.append(arg)
        elif arg == "--":
            options_end = True
        elif waiting is not None:
            if waiting == "--example-name":
                example = arg
            waiting = None
        elif arg.startswith("-"):
            option, has_value, value = arg.partition("=")
            if option == "--example":
                example = example or ""
            elif option in VALUE_OPTIONS:
                if not has_value:
                    waiting = option
                elif option == "--example-name":
                    example = value
        else:
            named.append(arg)
    try:
        chosen: list[str | Path] = [*named]
        if example is not None:
            chosen.append(example_trace_dir(example) if example else example_trace_dir())
        return discover_traces(chosen) if chosen else None
    except Exception:  # noqa: BLE001 - a guess that fails is no guess; the command reports the error
        return None


def start(args: Sequence[str]) -> None:
    """Start decoding what ``analyze ARGS`` will read (no-op when the arguments name nothing readable)."""
    global _pending
    found = guess(args)
    if not found:
        return
    from servescope.trace.readahead import ReadAhead

    _pending = ReadAhead(found, min_files=1)


def claim(found: Sequence[Path]) -> ReadAhead | None:
    """The head start when it decodes exactly ``found``, in that order; else None (its children stopped)."""
    global _pending
    pending, _pending = _pending, None
    if pending is None:
        return None
    if list(pending.paths) == list(found):
        return pending
    pending.close()
    return None


def release() -> None:
    """Stop an unclaimed head start (the command failed or ended before reading)."""
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        pending.close()
