"""What every command shares: the root app, its command groups, one-line errors, progress, declared flags.

Importing this module costs nothing: typer, pydantic (which typer uses to convert every parameter) and rich
take ~130 ms to import, so the apps and the ``err`` console are made on first use, and a command declared
with :class:`Flag` can run without them (see :func:`run_without_typer`).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from inspect import Parameter, Signature
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

from servescope.core.errors import InputError

if TYPE_CHECKING:
    import typer
    from rich.console import Console

    app: typer.Typer
    capture_app: typer.Typer
    gpu_app: typer.Typer
    bench_app: typer.Typer
    service_app: typer.Typer
    err: Console

__all__ = [
    "BarProgress", "Flag", "app", "bench_app", "capture_app", "err", "fail", "gpu_app", "register",
    "run_without_typer", "service_app", "user_errors", "with_progress",
]

T = TypeVar("T")
_APPS = ("app", "capture_app", "gpu_app", "bench_app", "service_app")


def _make_apps() -> None:
    import typer

    from servescope import __version__

    root = typer.Typer(
        name="servescope",
        help="Where a decode step's time goes on multi-GPU LLM servers, and what to change.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,  # tracebacks with locals could print secrets
        add_completion=False,
    )

    def _version(value: bool) -> None:
        if value:
            typer.echo(f"servescope {__version__}")
            raise typer.Exit()

    def _root(version: bool = False) -> None:
        """servescope: trace analysis for vLLM / SGLang multi-GPU serving."""

    option = typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    _root.__signature__ = Signature([  # type: ignore[attr-defined]  # typer reads it
        Parameter("version", Parameter.POSITIONAL_OR_KEYWORD, default=False, annotation=Annotated[bool, option]),
    ])
    root.callback()(_root)

    groups = {
        "capture_app": ("capture", "Make traces: GPU decode captures of a random-weight model."),
        "gpu_app": ("gpu", "GPUs: inventory, topology (NVLink / PCIe / P2P), memory holders, waiting for free memory."),
        "bench_app": ("bench", "Measurements: a live server's throughput, GEMMs and collectives on this box."),
        "service_app": ("service", "The systemd service: render, lint, import, install, restart safely."),
    }
    made: dict[str, typer.Typer] = {"app": root}
    for attr, (name, text) in groups.items():
        made[attr] = typer.Typer(help=text, no_args_is_help=True)
        root.add_typer(made[attr], name=name)
    globals().update(made)


def __getattr__(name: str) -> Any:
    """The apps and ``err``, made the first time any module asks for them."""
    if name in _APPS:
        _make_apps()
        return globals()[name]
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

    It raises SystemExit, which typer passes through like its own ``Exit``, so the outcome is the same
    with or without typer.
    """
    _stderr().print(f"servescope: error: {message}", markup=False)
    raise SystemExit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn our input errors into one line and exit 2."""
    try:
        yield
    except InputError as exc:
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


# --- flags declared once: typer builds the command from them, main() may parse them itself -------------

_REQUIRED: Any = Parameter.empty


@dataclass(frozen=True, slots=True)
class Flag:
    """One parameter of a command: the function's argument ``name`` and how the command line gives it.

    ``decls`` are the option's names (``("--output", "-o")``); none makes it a positional argument.
    ``type`` is the annotation typer converts to: ``bool`` (a flag), ``int``, ``float``, ``str``, ``Path``,
    each optionally ``| None``, or ``list[Path] | None`` for any number of positional paths.
    """

    name: str
    decls: tuple[str, ...]
    type: Any
    help: str
    default: Any = _REQUIRED
    min: float | None = None
    show_default: bool = True
    metavar: str | None = None


def register(target: typer.Typer, func: Callable[..., None], flags: Sequence[Flag], name: str | None = None) -> None:
    """Add ``func`` to ``target`` as a typer command whose parameters are ``flags``."""
    import typer

    params = []
    for flag in flags:
        extra: dict[str, Any] = {"help": flag.help}
        if not flag.show_default:
            extra["show_default"] = False
        if flag.metavar is not None:
            extra["metavar"] = flag.metavar
        if flag.min is not None:
            extra["min"] = flag.min
        info = typer.Option(*flag.decls, **extra) if flag.decls else typer.Argument(**extra)
        params.append(Parameter(flag.name, Parameter.POSITIONAL_OR_KEYWORD, default=flag.default,
                                annotation=Annotated[flag.type, info]))

    def command(**values: Any) -> None:
        func(**values)

    command.__name__, command.__qualname__, command.__doc__ = func.__name__, func.__qualname__, func.__doc__
    command.__module__ = func.__module__
    command.__signature__ = Signature(params)  # type: ignore[attr-defined]  # typer reads it
    target.command(name)(command)


_UINT = re.compile(r"(?:0|[1-9][0-9]{0,17})\Z")
_UFLOAT = re.compile(r"(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?\Z")


def _plain_value(flag: Flag, text: str) -> object | None:
    """``text`` converted as typer converts it, for the plainest spellings only; None for anything else."""
    base = flag.type
    if base in (int, int | None) and _UINT.match(text):
        value: object = int(text)
    elif base in (float, float | None) and _UFLOAT.match(text):
        value = float(text)
    elif base in (Path, Path | None, str, str | None) and text and not text.startswith("-"):
        value = Path(text) if base in (Path, Path | None) else text
    else:
        return None
    if flag.min is not None and isinstance(value, int | float) and value < flag.min:
        return None
    return value


def parse_plain(argv: Sequence[str], flags: Sequence[Flag]) -> dict[str, Any] | None:
    """The values typer would pass for ``argv``, when ``argv`` is plain enough to be sure; else None.

    Plain means: positional paths that do not start with ``-``; each option at most once, spelt as
    declared (``--output FILE``, ``--output=FILE``, ``-o FILE``); integers and decimals in their simplest
    form within their bounds. Anything else (``--help``, ``--``, unknown options, odd values, mistakes) is
    left to typer, which then decides, prints and exits exactly as it always does.
    """
    by_decl = {decl: flag for flag in flags for decl in flag.decls}
    positional = [flag for flag in flags if not flag.decls]
    if len(positional) > 1 or any(p.type != list[Path] | None for p in positional):
        return None
    values: dict[str, Any] = {f.name: f.default for f in flags}
    seen: set[str] = set()
    paths: list[Path] = []
    tokens = list(argv)
    while tokens:
        token = tokens.pop(0)
        if not token:
            return None
        if not token.startswith("-"):
            if not positional:
                return None
            paths.append(Path(token))
            continue
        decl, has_value, text = token.partition("=")
        flag = by_decl.get(decl)
        if flag is None or flag.name in seen or (has_value and not decl.startswith("--")):
            return None
        seen.add(flag.name)
        if flag.type is bool:
            if has_value:
                return None
            values[flag.name] = True
            continue
        if not has_value:
            if not tokens:
                return None
            text = tokens.pop(0)
        value = _plain_value(flag, text)
        if value is None:
            return None
        values[flag.name] = value
    if positional:
        values[positional[0].name] = paths or None
    return values


def run_without_typer(func: Callable[..., None], flags: Sequence[Flag], argv: Sequence[str]) -> bool:
    """Run ``func`` for ``argv`` as typer would, without importing typer; False when typer must decide.

    The end matches typer's: return → exit 0; SystemExit as raised; Ctrl-C → exit 130; a closed stdout
    pipe → exit 1 with nothing more printed.
    """
    if any(key.endswith("_COMPLETE") for key in os.environ):  # shell completion is typer's
        return False
    values = parse_plain(argv, flags)
    if values is None:
        return False
    try:
        func(**values)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        sys.exit(1)
    return True
