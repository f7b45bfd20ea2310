"""What every command shares: the root app, its command groups, one-line errors, progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn, TypeVar

import typer
from rich.console import Console

from servescope import __version__
from servescope.core.errors import InputError

app = typer.Typer(
    name="servescope",
    help="Where a decode step's time goes on multi-GPU LLM servers, and what to change.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # tracebacks with locals could print secrets
    add_completion=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
T = TypeVar("T")

capture_app = typer.Typer(help="Make traces: GPU decode captures of a random-weight model.", no_args_is_help=True)
app.add_typer(capture_app, name="capture")
gpu_app = typer.Typer(help="GPUs: inventory, memory holders, waiting for memory to be free.", no_args_is_help=True)
app.add_typer(gpu_app, name="gpu")
bench_app = typer.Typer(help="Measurements: a live server's throughput, GEMMs and collectives on this box.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
service_app = typer.Typer(help="The systemd service: render, lint, import, install, restart safely.",
                          no_args_is_help=True)
app.add_typer(service_app, name="service")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"servescope: error: {message}", markup=False)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn our input errors into one line and exit 2."""
    try:
        yield
    except InputError as exc:
        fail(str(exc))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"servescope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """servescope: trace analysis for vLLM / SGLang multi-GPU serving."""


class BarProgress:
    def __init__(self, console: Console) -> None:
        self._status = console.status("")
        self._status.start()

    def advance(self, description: str) -> None:
        self._status.update(description)

    def stop(self) -> None:
        self._status.stop()


def with_progress(quiet: bool, job: Callable[[BarProgress | None], T]) -> T:
    progress = None if quiet or not err.is_terminal else BarProgress(err)
    try:
        return job(progress)
    finally:
        if progress is not None:
            progress.stop()


