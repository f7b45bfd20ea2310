"""``analyze`` itself, and its route without typer for plain flags.

:func:`run` is the command: the typer declaration in :mod:`servescope.cli.analyze` parses the flags and calls it.
``analyze`` is the command people time against other tools, and typer costs ~25-30 ms of CPU to import and build
the command (benchmarks/results/analyze-vs-hta-2026-12-06-b.md), a tenth of the command on a 35 MB trace. So when
every argument is plain (:data:`FLAGS`, each value well formed, the folders of ``-o`` and ``--html`` there, every
path named readable or missing), :func:`run_plain` gives :func:`run` exactly the values typer would and typer is
never imported; anything else (``--help``, an unknown or repeated option, ``--opt=`` short forms, a value typer
would reject or convert otherwise) goes to typer, which parses and answers as always. tests/cli/test_plain.py
holds :data:`FLAGS` equal to the typer declaration and the two routes' values equal argument list by argument list.

Standard library only at import (the rest as :func:`run` needs it).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servescope.cli.common import emit, fail, user_errors, with_progress

if TYPE_CHECKING:
    from rich.console import Console

    from servescope.core.analysis import AnalysisDoc

__all__ = ["FLAGS", "parse", "run", "run_plain"]

_NUMBER = re.compile(r"\d+(\.\d+)?")  # what --step-gap-us reads here; typer takes the rest (1e3, -1, nan)
_COUNT = re.compile(r"\d+")
_CONVERT: dict[str, Callable[[str], Any]] = {
    "path": Path, "paths": Path, "text": str,
    "number": lambda v: float(v) if _NUMBER.fullmatch(v) else None,
    "count": lambda v: int(v) if _COUNT.fullmatch(v) else None,
}
FLAGS: dict[str, tuple[str, str]] = {
    "--example": ("example", "flag"), "--json": ("as_json", "flag"), "--example-name": ("example_name", "text"),
    "--output": ("output", "path"), "-o": ("output", "path"), "--html": ("html", "path"),
    "--taxonomy": ("taxonomy", "path"), "--step-gap-us": ("step_gap_us", "number"),
    "--settings": ("settings", "paths"), "--top": ("top", "count"),
}
"""analyze's options: the parameter of :func:`run` each sets, and how (``flag``: true; ``paths``: repeated)."""


def run(*, paths: list[Path] | None = None, example: bool = False, example_name: str | None = None,
        as_json: bool = False, output: Path | None = None, html: Path | None = None, taxonomy: Path | None = None,
        step_gap_us: float | None = None, settings: list[Path] | None = None, top: int = 15) -> None:
    """``servescope analyze``: the analysis of the traces in ``paths`` (and the bundled example asked for) on
    stdout as text or JSON, in ``output`` as JSON and in ``html`` as a page (see the command's help)."""
    from servescope.cli import head_start
    from servescope.trace.run import analyze_traces

    with user_errors():
        if not paths and not example and example_name is None:
            fail("give trace files or directories, or --example")
        done = with_progress(as_json, lambda progress: analyze_traces(
            paths or [], example=example, example_name=example_name, taxonomy=taxonomy, step_gap_us=step_gap_us,
            settings=settings or [], warn=_warn, progress=progress, head_start=head_start))
        emit(done.doc, lambda doc, console: _render_text(doc, console, top=top),
             as_json=as_json, output=output, html=html, render_html=_render_html, blank_line=True)


def parse(args: Sequence[str]) -> dict[str, Any] | None:
    """The values typer would give :func:`run` for ``analyze ARGS`` (only those the arguments set), or None when
    they are not plain enough to be sure: typer must parse them."""
    values: dict[str, Any] = {}
    paths: list[Path] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-"):
            if not arg:
                return None
            paths.append(Path(arg))
            continue
        option, inline, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        param, kind = FLAGS.get(option, ("", ""))
        if not param or (param in values and kind != "paths"):
            return None  # unknown (--help, --, -) or repeated: typer says what it makes of it
        if kind == "flag":
            if inline:
                return None
            values[param] = True
            continue
        if not inline:
            if not rest:
                return None
            value = rest.pop(0)
        converted = _CONVERT[kind](value) if value and not value.startswith("-") else None
        if converted is None:
            return None
        if kind == "paths":
            values.setdefault(param, []).append(converted)
        else:
            values[param] = converted
    if paths:
        values["paths"] = paths
    return values if _usable(values) else None


def _usable(values: dict[str, Any]) -> bool:
    """Whether typer would run the command with ``values`` as they are: something named, every path that exists
    readable (typer's paths are ``readable``), the folders of the outputs there (else the one-line error its
    command group gives)."""
    from servescope.core.atomic import missing_folder

    if not values.get("paths") and not values.get("example") and values.get("example_name") is None:
        return False
    named = [*values.get("paths", ()), *values.get("settings", ()),
             *(values[k] for k in ("output", "html", "taxonomy") if k in values)]
    if any(os.path.exists(p) and not os.access(p, os.R_OK) for p in named):
        return False
    return all(missing_folder(values[k]) is None for k in ("output", "html") if k in values)


def run_plain(args: Sequence[str]) -> bool:
    """Run ``analyze ARGS`` without typer when its arguments are plain (:func:`parse`), ending as typer's route
    ends (an interrupt exits 130, a closed stdout pipe 1); False, having done nothing, when typer must parse them.

    Raises:
        SystemExit: the command failed (exit 2, one line on stderr), or as above.
    """
    if "" in args:  # a path, a name or a number, never empty: an unset variable ("$TRACE"), which typer reads as "."
        fail("an empty argument (an unset variable?): give trace files or directories, or --example")
    values = parse(args)
    if values is None:
        return False
    try:
        run(**values)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except OSError as exc:
        import errno

        if exc.errno != errno.EPIPE:
            raise
        from typer._click.utils import PacifyFlushWrapper  # what typer's route does on a closed pipe

        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
        raise SystemExit(1) from None
    return True


def _warn(line: str) -> None:
    sys.stderr.write(f"analyze: {line}\n")  # plain: rich is not imported on this route


def _render_html(doc: AnalysisDoc) -> str:
    from servescope.report.html import render_analysis_html

    return render_analysis_html(doc)


def _render_text(doc: AnalysisDoc, console: Console, *, top: int) -> None:
    """The analysis (its next steps, where the document holds some, at the end)."""
    from servescope.report.tables import render_analysis

    render_analysis(doc, console, top=top)
