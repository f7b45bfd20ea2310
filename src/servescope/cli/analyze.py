"""analyze, report, diff: traces in, breakdowns out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servescope.cli.common import app, fail, user_errors, with_progress
from servescope.core.errors import InputError


def write_outputs(doc: object, *, json_out: Path | None, html_out: Path | None) -> None:
    from servescope.core.atomic import write_bytes_atomic, write_text_atomic
    from servescope.report.html import render_analysis_html
    from servescope.report.jsonout import encode_analysis

    target = json_out
    try:
        if json_out is not None:
            write_bytes_atomic(json_out, encode_analysis(doc))  # type: ignore[arg-type]
        target = html_out
        if html_out is not None:
            write_text_atomic(html_out, render_analysis_html(doc))  # type: ignore[arg-type]
    except OSError as exc:
        raise InputError(str(target), f"cannot write: {exc.strerror or exc}") from None


@app.command()
def analyze(
    paths: Annotated[list[Path] | None, typer.Argument(help="Trace files or directories (.json, .json.gz).",
                                                       show_default=False)] = None,
    example: Annotated[bool, typer.Option("--example", help="Analyze the bundled example capture.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis document as JSON.")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON document here.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    taxonomy: Annotated[Path | None, typer.Option("--taxonomy", help="TOML file of kernel rules that "
                                                  "override the bundled taxonomy.")] = None,
    step_gap_us: Annotated[float | None, typer.Option("--step-gap-us", min=0.0, help="Idle gap that separates "
                                                      "steps when a trace has no step annotations.")] = None,
    top: Annotated[int, typer.Option("--top", min=0, help="Kernels to list.")] = 15,
) -> None:
    """Where each step's time goes, per rank and phase, and what the bottleneck is.

    Reads torch.profiler traces as vLLM, SGLang and plain PyTorch write them (one file per rank; vLLM's
    front-end trace is recognised), finds the steps, and breaks their device time down by category.
    """
    from servescope.report.jsonout import encode_analysis
    from servescope.report.tables import render_analysis
    from servescope.trace.analyze import AnalyzeRequest, example_trace_dir
    from servescope.trace.analyze import analyze as run_analysis

    with user_errors():
        chosen = list(paths or [])
        if example:
            chosen.append(example_trace_dir())
        if not chosen:
            fail("give trace files or directories, or --example")
        request = AnalyzeRequest(paths=chosen, taxonomy=taxonomy, step_gap_us=step_gap_us)
        doc = with_progress(as_json, lambda progress: run_analysis(request, progress=progress))
        write_outputs(doc, json_out=output, html_out=html)
    if as_json:
        sys.stdout.buffer.write(encode_analysis(doc) + b"\n")
        return
    render_analysis(doc, Console(highlight=False), top=top)


@app.command()
def report(
    analysis: Annotated[Path, typer.Argument(help="A saved `analyze -o` / `--json` document.")],
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    top: Annotated[int, typer.Option("--top", min=0, help="Kernels to list.")] = 15,
) -> None:
    """Re-render a saved analysis (tables, HTML) without reading the traces again."""
    from servescope.report.jsonout import decode_analysis
    from servescope.report.tables import render_analysis

    with user_errors():
        try:
            data = analysis.read_bytes()
        except OSError as exc:
            raise InputError(str(analysis), exc.strerror or "cannot read") from None
        doc = decode_analysis(data, str(analysis))
        write_outputs(doc, json_out=None, html_out=html)
    render_analysis(doc, Console(highlight=False), top=top)


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
        doc = diff_paths(before, after, phase=phase, taxonomy=taxonomy)
    if as_json:
        sys.stdout.buffer.write(encode_diff(doc))
        return
    render_diff(doc, Console(highlight=False))


