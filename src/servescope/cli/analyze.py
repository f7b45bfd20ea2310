"""analyze, report, diff: traces in, breakdowns out.

Each command is a plain function and its flags, declared once (:class:`~servescope.cli.common.Flag`);
:func:`register` makes the typer commands from them. ``servescope analyze`` is the command people time,
so ``main()`` runs it without typer when its flags are plain (:func:`run_analyze_fast`): this module
imports nothing heavy at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from servescope.cli.common import Flag, fail, run_without_typer, user_errors, with_progress
from servescope.core.errors import InputError

if TYPE_CHECKING:
    import typer

__all__ = ["ANALYZE_FLAGS", "DIFF_FLAGS", "REPORT_FLAGS", "analyze", "diff", "register", "report",
           "run_analyze_fast"]

_TOP = Flag("top", ("--top",), int, "Kernels to list.", default=15, min=0)
_HTML = Flag("html", ("--html",), Path | None, "Write a self-contained HTML report here.", default=None)

ANALYZE_FLAGS = (
    Flag("paths", (), list[Path] | None, "Trace files or directories (.json, .json.gz).", default=None,
         show_default=False),
    Flag("example", ("--example",), bool, "Analyze the bundled example: a real vLLM 0.26 server's decode steps "
         "on an H200 (Qwen3-30B-A3B shapes, batch 16, CUDA graphs).", default=False),
    Flag("example_name", ("--example-name",), str | None, "Analyze this bundled example instead: "
         "h200-vllm-moe-b16 (the default), vllm-cpu-tp2 (vLLM TP=2 on the CPU: two ranks, real all-reduces) or "
         "h200-moe-b16-graphs (an HF MoE model under CUDA graphs, made by capture decode).", default=None),
    Flag("as_json", ("--json",), bool, "Print the analysis document as JSON.", default=False),
    Flag("output", ("--output", "-o"), Path | None, "Write the JSON document here.", default=None),
    _HTML,
    Flag("taxonomy", ("--taxonomy",), Path | None, "TOML file of kernel rules that override the bundled "
         "taxonomy.", default=None),
    Flag("step_gap_us", ("--step-gap-us",), float | None, "Idle gap that separates steps when a trace has no "
         "step annotations.", default=None, min=0.0),
    _TOP,
)
REPORT_FLAGS = (
    Flag("document", (), Path, "A saved JSON document of any command (-o / --json): analyze, plan, bench "
         "serve/comm/gemm, health, settings, gpu, service status, diff."),
    _HTML,
    _TOP,
    Flag("as_json", ("--json",), bool, "Print the document as JSON.", default=False),
)
DIFF_FLAGS = (
    Flag("before", (), Path, "Traces (file or directory) or a saved analysis JSON."),
    Flag("after", (), Path, "Traces (file or directory) or a saved analysis JSON."),
    Flag("phase", ("--phase",), str, "decode, prefill, mixed or unknown.", default="decode"),
    Flag("as_json", ("--json",), bool, "Print the diff document as JSON.", default=False),
    Flag("taxonomy", ("--taxonomy",), Path | None, "Kernel rules file, as for analyze.", default=None),
)


def write_outputs(doc: object, *, json_out: Path | None, html_out: Path | None, encoded: bytes | None = None) -> None:
    """Write the analysis as JSON (``encoded`` when already made) and as HTML, each atomically."""
    from servescope.core.atomic import write_bytes_atomic, write_text_atomic

    target = json_out
    try:
        if json_out is not None:
            if encoded is None:
                from servescope.report.jsonout import encode_analysis

                encoded = encode_analysis(doc)
            write_bytes_atomic(json_out, encoded)
        target = html_out
        if html_out is not None:
            from servescope.report.html import render_analysis_html

            write_text_atomic(html_out, render_analysis_html(doc))  # type: ignore[arg-type]
    except OSError as exc:
        raise InputError(str(target), f"cannot write: {exc.strerror or exc}") from None


def analyze(paths: list[Path] | None, example: bool, example_name: str | None, as_json: bool, output: Path | None,
            html: Path | None, taxonomy: Path | None, step_gap_us: float | None, top: int) -> None:
    """Where each step's time goes, per rank and phase, and what the bottleneck is.

    Reads torch.profiler traces as vLLM, SGLang and plain PyTorch write them (one file per rank; vLLM's
    front-end trace is recognised), finds the steps, and breaks their device time down by category.
    """
    from servescope.trace.files import discover_traces, example_trace_dir
    from servescope.trace.readahead import ReadAhead

    with user_errors():
        chosen = list(paths or [])
        if example or example_name is not None:
            chosen.append(example_trace_dir(example_name) if example_name is not None else example_trace_dir())
        if not chosen:
            fail("give trace files or directories, or --example")
        # The traces start decoding in child processes now, while this one imports the analysis.
        found = discover_traces(chosen)
        with ReadAhead(found, min_files=1) as read_ahead:
            from servescope.trace.analyze import AnalyzeRequest
            from servescope.trace.analyze import analyze as run_analysis

            request = AnalyzeRequest(paths=found, taxonomy=taxonomy, step_gap_us=step_gap_us)
            doc = with_progress(as_json, lambda progress: run_analysis(request, progress=progress,
                                                                      read_ahead=read_ahead))
        encoded = None
        if as_json or output is not None:
            from servescope.report.jsonout import encode_analysis

            encoded = encode_analysis(doc)
        write_outputs(doc, json_out=output, html_out=html, encoded=encoded)
    if encoded is not None and as_json:
        sys.stdout.buffer.write(encoded + b"\n")
        return
    from rich.console import Console

    from servescope.report.tables import render_analysis

    render_analysis(doc, Console(highlight=False), top=top)


def report(document: Path, html: Path | None, top: int, as_json: bool) -> None:
    """Re-render a saved document (text, JSON, HTML) without recomputing: the text is what its command printed.

    The document's ``schema`` field says which kind it is.
    """
    from servescope.core.atomic import write_text_atomic
    from servescope.core.document import read_document
    from servescope.report.rerender import render_document, render_html, render_text, text_console

    with user_errors():
        doc = read_document(document)
        if html is not None:
            try:
                write_text_atomic(html, render_html(doc, top=top))
            except OSError as exc:
                raise InputError(str(html), f"cannot write: {exc.strerror or exc}") from None
    if as_json:
        sys.stdout.write(render_document(doc, "json"))
        return
    render_text(doc, text_console(doc), top=top)


def diff(before: Path, after: Path, phase: str, as_json: bool, taxonomy: Path | None) -> None:
    """Two analyses side by side: time per step by category, before → after, and findings that changed."""
    from rich.console import Console

    from servescope.report.diff import encode_diff, render_diff
    from servescope.trace.diff import diff_paths

    with user_errors():
        doc = diff_paths(before, after, phase=phase, taxonomy=taxonomy)
    if as_json:
        sys.stdout.buffer.write(encode_diff(doc))
        return
    render_diff(doc, Console(highlight=False))


def register(app: typer.Typer) -> None:
    """Add analyze, report and diff to the root app."""
    from servescope.cli.common import register as add

    add(app, analyze, ANALYZE_FLAGS)
    add(app, report, REPORT_FLAGS)
    add(app, diff, DIFF_FLAGS)


def run_analyze_fast(argv: Sequence[str]) -> bool:
    """``servescope analyze ARGS`` without typer when ARGS are plain; False leaves it to typer."""
    return run_without_typer(analyze, ANALYZE_FLAGS, argv)
