"""What every command shares without typer: one-line errors, outputs, progress (the apps, which need typer, are
:mod:`servescope.cli.apps`; analyze's plain route, :mod:`servescope.cli.plain`, runs on this module alone).

The ``err`` console is made on first use: rich is imported only by a command that prints through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

from servescope.core.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    err: Console

__all__ = [
    "HELP_MARKUP", "OUTPUT_OPTIONS", "BarProgress", "check_outputs", "emit", "err", "fail", "interrupted_by_sigterm",
    "parse_assignments", "parse_duration", "save",
    "user_errors", "with_progress",
]

T = TypeVar("T")

# Help texts are Markdown, as docs/commands.md shows them: paragraphs reflow to the terminal, `code` loses its
# backticks. The plain "rich" mode keeps every line break of a docstring after its first paragraph.
HELP_MARKUP: Final = "markdown"

# The options that name a file (or folder) a command writes. Their folder must exist before the command runs: a
# missing one is one line naming the option and the path, exit 2, before any work (an hour-long sweep included);
# a command that declares ``--mkdir`` creates it when asked. `capture decode --out` makes its folder itself
# (as its help says), inside a parent that must exist.
OUTPUT_OPTIONS: Final = frozenset({"--output", "--html", "--png", "--json-out", "--env-out", "--out"})


def check_outputs(params: list[Any], values: dict[str, Any]) -> None:
    """Refuse an output option (:data:`OUTPUT_OPTIONS`) of a parsed command whose folder does not exist.

    ``params``: the command's declared parameters; ``values``: their parsed values by name. A command with a
    ``mkdir`` parameter set to true is let through (it creates the folder).

    Raises:
        InputError: ``--html PATH: folder DIR does not exist ...``.
    """
    from servescope.core.atomic import missing_folder

    names = {p.name for p in params}
    if values.get("mkdir"):
        return
    for param in params:
        value = values.get(param.name)
        if value is None or param.param_type_name != "option" or not OUTPUT_OPTIONS & set(param.opts):
            continue
        folder = missing_folder(value)
        if folder is not None:
            if folder.exists():
                raise InputError(f"{param.opts[0]} {value}", f"{folder} is not a folder")
            how = "create it, or pass --mkdir" if "mkdir" in names else "create it first"
            raise InputError(f"{param.opts[0]} {value}", f"folder {folder} does not exist: {how}")


def __getattr__(name: str) -> Any:
    """``err``, the stderr console, made the first time a module asks for it."""
    if name == "err":
        return _stderr()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _stderr() -> Console:
    console = globals().get("err")
    if console is None:
        from rich.console import Console

        console = globals()["err"] = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    return console


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``servescope: error: MESSAGE`` as one stderr line and exit ``code``.

    It raises SystemExit, which typer passes through like its own ``Exit``.
    """
    _stderr().print(f"servescope: error: {message}", markup=False)
    raise SystemExit(code)


def save(path: Path, data: bytes | str) -> None:
    """Write an output file of a command atomically.

    Raises:
        InputError: it cannot be written (one line naming the file, exit 2 under :func:`user_errors`).
    """
    from servescope.core.atomic import write_bytes_atomic, write_text_atomic

    try:
        if isinstance(data, bytes):
            write_bytes_atomic(path, data)
        else:
            write_text_atomic(path, data)
    except OSError as exc:
        raise InputError(str(path), f"cannot write: {exc.strerror or exc}") from None


def emit(doc: T, render: Callable[[T, Console], None], *, as_json: bool, output: Path | None = None,
         html: Path | None = None, render_html: Callable[[T], str] | None = None,
         encode: Callable[[T], bytes] | None = None, blank_line: bool = False) -> None:
    """A command's result, the one way every command gives it: ``-o`` its JSON, ``--html`` its page
    (``render_html``), each written atomically; on stdout its JSON with ``--json``, else ``render`` on a console
    of the terminal's width. The JSON is ``encode`` (by default the document's), encoded once for both;
    ``blank_line`` ends stdout's JSON with one more newline (analyze, profile and tune always have).

    Raises:
        InputError: an output file cannot be written (one line naming it, exit 2 under :func:`user_errors`).
    """
    encoded = None
    if as_json or output is not None:
        from servescope.core.document import encode as encode_document

        encoded = (encode or encode_document)(doc)
    if output is not None and encoded is not None:
        save(output, encoded)
    if html is not None and render_html is not None:
        save(html, render_html(doc))
    if as_json and encoded is not None:
        sys.stdout.buffer.write(encoded + b"\n" if blank_line else encoded)
        return
    from rich.console import Console

    render(doc, Console(highlight=False))


def parse_assignments(option: str, pairs: list[str], *, strip: bool = False) -> dict[str, str]:
    """Repeated ``NAME=VALUE`` options as a dict (the last of a name wins); ``strip``: without the spaces around
    each name and value.

    Raises:
        InputError: a pair without ``=`` or a name (one line naming ``option``).
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if strip:
            key, value = key.strip(), value.strip()
        if not sep or not key:
            raise InputError(option, f"{pair!r} is not NAME=VALUE")
        out[key] = value
    return out


def parse_duration(option: str, text: str | None) -> float | None:
    """``90``, ``90s``, ``10m``, ``2h`` → seconds; ``None`` → ``None``.

    Raises:
        InputError: not a positive duration (one line naming ``option``).
    """
    if text is None:
        return None
    raw = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(raw[-1:])
    try:
        seconds = float(raw[:-1] if scale else raw) * (scale or 1.0)
    except ValueError:
        raise InputError(option, f"{text!r} is not a duration (e.g. 600, 90s, 10m, 2h)") from None
    if not 0 < seconds < float("inf"):
        raise InputError(option, f"{text!r} must be a positive duration")
    return seconds


@contextmanager
def interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM (``timeout``, ``systemctl stop``) raises KeyboardInterrupt inside, as ctrl-c does: a long
    measurement then ends its workers and keeps what it finished."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def user_errors(*also: type[Exception]) -> Iterator[None]:
    """Turn our input errors, and errors of the types ``also`` (systemctl's, the GPUs'), into one line and exit 2."""
    kinds: tuple[type[Exception], ...] = (InputError, *also)
    try:
        yield
    except kinds as exc:
        fail(str(exc))


class BarProgress:
    def __init__(self, console: Console) -> None:
        self._status = console.status("")
        self._status.start()

    def advance(self, description: str) -> None:
        self._status.update(description)

    def stop(self) -> None:
        self._status.stop()


def with_progress(quiet: bool, job: Callable[[BarProgress | None], T]) -> T:
    progress = None if quiet or not _stderr().is_terminal else BarProgress(_stderr())
    try:
        return job(progress)
    finally:
        if progress is not None:
            progress.stop()
