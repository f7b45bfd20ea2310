"""analyze, report, diff: traces in, breakdowns out.

``servescope analyze`` is the command people time, so this module imports only typer at import time and each
command imports its feature code inside (``main()`` imports no other command module for it: see
:mod:`servescope.cli`); with plain flags analyze runs without this module and typer (:mod:`servescope.cli.plain`,
which holds the command's body).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from servescope.cli.apps import HtmlReport, JsonDocumentOut, TopKernels, app
from servescope.cli.common import emit, user_errors

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["analyze", "diff", "report"]


@app.command()
def analyze(
    paths: Annotated[list[Path] | None, typer.Argument(help="Trace files, or directories: every file in them that "
                                                       "holds a torch profiler trace (gz or not, any name).",
                                                       show_default=False)] = None,
    example: Annotated[bool, typer.Option("--example", help="Analyze the bundled example: a real vLLM 0.26 "
                                          "server's decode steps on an H200 (Qwen3-30B-A3B shapes, batch 16, CUDA "
                                          "graphs).")] = False,
    example_name: Annotated[str | None, typer.Option("--example-name", help="Analyze this bundled example "
                                                     "instead: h200-vllm-moe-b16 (the default), vllm-cpu-tp2 (vLLM "
                                                     "TP=2 on the CPU: two ranks, real all-reduces) or "
                                                     "h200-moe-b16-graphs (an HF MoE model under CUDA graphs, made "
                                                     "by capture decode).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis document as JSON.")] = False,
    output: JsonDocumentOut = None,
    html: HtmlReport = None,
    taxonomy: Annotated[Path | None, typer.Option("--taxonomy", help="TOML file of kernel rules that override the "
                                                  "bundled taxonomy.")] = None,
    step_gap_us: Annotated[float | None, typer.Option("--step-gap-us", min=0.0, help="Idle gap that separates "
                                                      "steps when a trace has no step annotations.")] = None,
    settings: Annotated[list[Path] | None, typer.Option("--settings", help="The saved settings document (JSON) of "
                                                        "the server that wrote the traces: advice is checked against "
                                                        "its flags, environment and version. One found beside the "
                                                        "traces is read too.",
                                                        show_default=False)] = None,
    top: TopKernels = 15,
) -> None:
    """Where each step's time goes, per rank and phase, and what the bottleneck is.

    Reads torch.profiler traces as vLLM, SGLang and plain PyTorch write them (one file per rank; vLLM's
    front-end trace is recognised), finds the steps, and breaks their device time down by category.
    """
    from servescope.cli.plain import run

    run(paths=paths, example=example, example_name=example_name, as_json=as_json, output=output, html=html,
        taxonomy=taxonomy, step_gap_us=step_gap_us, settings=settings, top=top)


@app.command()
def report(
    document: Annotated[Path, typer.Argument(help="A saved JSON document of any command (-o / --json): analyze, "
                                             "plan, bench serve/comm/gemm, health, settings, gpu, service status, "
                                             "diff.")],
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    top: TopKernels = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print the document as JSON.")] = False,
) -> None:
    """Re-render a saved document (text, JSON, HTML) without recomputing: the text is what its command printed.

    The document's ``schema`` field says which kind it is. With `--html` it writes the page and prints one line
    saying where (`--json` still prints the document).
    """
    from servescope.core.document import read_document
    from servescope.report.rerender import render_document, render_html, render_text

    def text(doc: Any, console: Console) -> None:
        if html is not None:
            typer.echo(f"wrote {html} (HTML of {document})")
        else:
            render_text(doc, console, top=top)

    with user_errors():
        emit(read_document(document), text, as_json=as_json, html=html,
             render_html=lambda doc: render_html(doc, top=top),
             encode=lambda doc: render_document(doc, "json").encode())


@app.command()
def diff(
    before: Annotated[Path, typer.Argument(help="Traces (file or directory) or a saved analysis JSON.")],
    after: Annotated[Path, typer.Argument(help="Traces (file or directory) or a saved analysis JSON.")],
    phase: Annotated[str, typer.Option("--phase", help="decode, prefill, mixed or unknown.")] = "decode",
    as_json: Annotated[bool, typer.Option("--json", help="Print the diff document as JSON.")] = False,
    taxonomy: Annotated[Path | None, typer.Option("--taxonomy", help="Kernel rules file, as for analyze.")] = None,
) -> None:
    """Two analyses side by side: time per step by category, before → after, and findings that changed."""
    from servescope.report.diff import encode_diff, render_diff
    from servescope.trace.diff import diff_paths

    with user_errors():
        emit(diff_paths(before, after, phase=phase, taxonomy=taxonomy), render_diff, as_json=as_json,
             encode=encode_diff)
