"""What every command shares: the root app, its command groups, one-line errors, progress.

The apps and the ``err`` console are made on first use: rich is imported only by a command that prints
through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn, TypeVar

import typer

from servescope import __version__
from servescope.core.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    err: Console

__all__ = [
    "ApiKeyOption", "BarProgress", "HtmlReport", "JsonDocumentOut", "JsonFlag", "ModelPreset", "ServerUrl",
    "TopKernels", "app", "bench_app", "capture_app", "err", "fail", "gpu_app", "print_result", "save", "service_app",
    "user_errors", "with_progress",
]

T = TypeVar("T")

# Help texts are Markdown, as docs/commands.md shows them: paragraphs reflow to the terminal, `code` loses its
# backticks. The plain "rich" mode keeps every line break of a docstring after its first paragraph.
HELP_MARKUP: Final = "markdown"

app = typer.Typer(
    name="servescope",
    rich_markup_mode=HELP_MARKUP,
    help="Where a decode step's time goes on multi-GPU LLM servers, and what to change.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # tracebacks with locals could print secrets
    add_completion=False,
)
capture_app = typer.Typer(help="Make traces: GPU decode captures of a random-weight model.", no_args_is_help=True,
                          rich_markup_mode=HELP_MARKUP)
gpu_app = typer.Typer(help="GPUs: inventory, topology (NVLink / PCIe / P2P), memory holders, waiting for free memory.",
                      no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
bench_app = typer.Typer(help="Measurements: a live server's throughput, GEMMs and collectives on this box.",
                        no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
service_app = typer.Typer(help="The systemd service: render, lint, import, install, restart safely.",
                          no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
app.add_typer(capture_app, name="capture")
app.add_typer(gpu_app, name="gpu")
app.add_typer(bench_app, name="bench")
app.add_typer(service_app, name="service")

# Options and arguments that several commands declare alike: the same flag, help and default display.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
JsonDocumentOut = Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON document here.")]
HtmlReport = Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")]
TopKernels = Annotated[int, typer.Option("--top", min=0, help="Kernels to list.")]
ModelPreset = Annotated[str, typer.Option("--model", help="A preset (kimi-k2.5, deepseek-v3, qwen3-235b-a22b, "
                                          "llama-3-70b), a HF config.json (or its folder), or a Hugging Face "
                                          "id (ORG/NAME) whose config the local hub cache holds.")]
ServerUrl = Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8000.")]
ApiKeyOption = Annotated[str | None, typer.Option("--api-key", show_default=False,
                                                  help="Bearer key; else $SERVESCOPE_API_KEY, else $VLLM_API_KEY, "
                                                  "else $OPENAI_API_KEY. Never printed.")]


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


def print_result(result: T, render: Callable[[T, Console], None], *, as_json: bool,
                 encode: Callable[[T], bytes] | None = None) -> None:
    """A command's result on stdout: with ``--json`` its JSON (``encode``, by default the document's), else
    ``render`` on a console of the terminal's width."""
    if as_json:
        from servescope.core.document import encode as encode_document

        sys.stdout.buffer.write((encode or encode_document)(result))
    else:
        from rich.console import Console

        render(result, Console(highlight=False))


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
