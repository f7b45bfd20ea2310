"""analyze's head start: the traces on the command line start decoding before typer is imported.

typer takes ~50 ms to import and build ``analyze``, and numpy with the analysis ~100 ms more; the traces it
will name can be decoding in child processes meanwhile. :func:`start` guesses them from the raw
arguments: each one that names an existing file or directory and does not follow an option that takes a value
(``VALUE_OPTIONS``), plus the bundled example when asked for. It finds the traces they name (once: the command
asks :func:`found` for them) and starts a :class:`~servescope.trace.read.readahead.ReadAhead` on them. The command,
once typer has parsed its flags, takes the traces found for exactly the paths it names (else finds them itself),
and :func:`claim` s the read-ahead: it gets it only when it reads exactly those files, else the children are
stopped and the command reads as it always does. A wrong guess costs time, never a result.

Standard library only (besides the read-ahead and file discovery, which are too).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servescope.trace.read.files import Discovery
    from servescope.trace.read.readahead import ReadAhead

__all__ = ["VALUE_OPTIONS", "claim", "found", "guess", "release", "start"]

VALUE_OPTIONS = frozenset({"-o", "--output", "--html", "--taxonomy", "--step-gap-us", "--settings", "--top",
                           "--example-name"})
"""analyze's options that take a value: the argument after one is that value, not a trace
(tests/cli/test_head_start.py keeps this equal to the command's declaration and to servescope.cli.plain's)."""

_pending: ReadAhead | None = None
_found: tuple[list[Path], Discovery] | None = None  # the paths the guess named, and the traces found in them


def guess(args: Sequence[str]) -> list[Path] | None:
    """The trace files ``analyze ARGS`` will read, as far as the raw arguments tell; None when unsure."""
    named = _guess(args)
    return named[1].traces if named is not None else None


def _guess(args: Sequence[str]) -> tuple[list[Path], Discovery] | None:
    """The paths ``analyze ARGS`` names (the bundled example's folder last) and the traces found in them."""
    from servescope.trace.read.files import example_trace_dir, find_traces

    if "--help" in args or "-h" in args or "" in args:  # an empty argument fails the command (cli.plain)
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
        chosen = [Path(p) for p in named]
        if example is not None:
            chosen.append(example_trace_dir(example) if example else example_trace_dir())
        return (chosen, find_traces(chosen)) if chosen else None
    except Exception:  # noqa: BLE001 - a guess that fails is no guess; the command reports the error
        return None


def start(args: Sequence[str]) -> None:
    """Find and start decoding what ``analyze ARGS`` will read (no-op when the arguments name nothing readable)."""
    global _pending, _found
    named = _guess(args)
    if named is None or not named[1].traces:
        return
    from servescope.trace.read.readahead import ReadAhead

    _found = named
    _pending = ReadAhead(named[1].traces, min_files=1)


def found(chosen: Sequence[Path]) -> Discovery:
    """The traces in ``chosen`` (the paths the command names): those the head start found when it guessed the
    same paths, else found now.

    Raises:
        InputError: as :func:`~servescope.trace.read.files.find_traces`.
    """
    global _found
    named, _found = _found, None
    if named is not None and named[0] == list(chosen):
        return named[1]
    from servescope.trace.read.files import find_traces

    return find_traces(chosen)


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
    global _pending, _found
    pending, _pending, _found = _pending, None, None
    if pending is not None:
        pending.close()
