"""The root app, its command groups and the options several commands declare alike: everything of the command
line that needs typer (what commands share without it is :mod:`servescope.cli.common`).

``analyze`` with plain flags runs without typer (:mod:`servescope.cli.plain`); every other route imports it here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from typer.core import TyperGroup

from servescope import __version__
from servescope.cli.common import HELP_MARKUP, check_outputs, user_errors

__all__ = [
    "ApiKeyOption", "HtmlReport", "JsonDocumentOut", "JsonFlag", "MkdirFlag", "ModelPreset", "PromptsOption",
    "ServerUrl", "TopKernels", "app", "bench_app", "capture_app", "checked_url", "gpu_app", "service_app",
]


class _Group(TyperGroup):
    """A command group whose commands check their output folders (:func:`check_outputs`) once their options
    are parsed, before they run: one rule for every command, declared here once."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        callback = getattr(command, "callback", None)
        if command is not None and not isinstance(command, TyperGroup) and callback is not None \
                and not getattr(callback, "checks_outputs", False):
            params = command.params

            def checked(**values: Any) -> Any:
                with user_errors():
                    check_outputs(params, values)
                return callback(**values)

            checked.checks_outputs = True  # type: ignore[attr-defined]
            command.callback = checked
        return name, command, rest


app = typer.Typer(
    name="servescope",
    cls=_Group,
    rich_markup_mode=HELP_MARKUP,
    help="Where a decode step's time goes on multi-GPU LLM servers, and what to change.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # tracebacks with locals could print secrets
    add_completion=False,
)
capture_app = typer.Typer(cls=_Group, help="Make traces: GPU decode captures of a random-weight model.",
                          no_args_is_help=True,
                          rich_markup_mode=HELP_MARKUP)
gpu_app = typer.Typer(cls=_Group,
                      help="GPUs: inventory, topology (NVLink / PCIe / P2P), memory holders, waiting for free memory.",
                      no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
bench_app = typer.Typer(cls=_Group, help="Measurements: a live server's throughput, GEMMs and collectives on this box.",
                        no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
service_app = typer.Typer(cls=_Group, help="The systemd service: render, lint, import, install, restart safely.",
                          no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
app.add_typer(capture_app, name="capture")
app.add_typer(gpu_app, name="gpu")
app.add_typer(bench_app, name="bench")
app.add_typer(service_app, name="service")

# Options and arguments that several commands declare alike: the same flag, help and default display.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
JsonDocumentOut = Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON document here.")]
HtmlReport = Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")]
MkdirFlag = Annotated[bool, typer.Option("--mkdir", help="Create the output's folder when it is missing (else "
                                         "a missing folder is an error).")]
TopKernels = Annotated[int, typer.Option("--top", min=0, help="Kernels to list.")]
ModelPreset = Annotated[str, typer.Option("--model", help="A preset (kimi-k2.5, deepseek-v3, qwen3-235b-a22b, "
                                          "llama-3-70b), a HF config.json (or its folder), or a Hugging Face "
                                          "id (ORG/NAME) whose config the local hub cache holds.")]


def checked_url(value: str | None) -> str | None:
    """A server URL option or argument, checked as it is parsed: one line and exit 2 when it is not an
    ``http(s)://HOST[:PORT]`` URL, before a command acts on it (looks for its process, starts a server)."""
    if value is not None:
        from servescope.server.client import normalize_base_url

        with user_errors():
            normalize_base_url(value)
    return value


ServerUrl = Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8000.", callback=checked_url)]
PromptsOption = Annotated[Literal["ids", "text"], typer.Option(
    "--prompts", help="Send prompts as the server's token ids (exact lengths; the API server does not tokenize "
    "them) or as text, which it tokenizes per request as most clients' prompts are.")]
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
