"""profile: capture a live server's decode steps and analyze them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from servescope.cli.apps import HtmlReport, JsonDocumentOut, ServerUrl, TopKernels, app
from servescope.cli.common import emit, user_errors

if TYPE_CHECKING:
    from servescope.server.profile import ProfileResult


@app.command()
def profile(
    url: ServerUrl,
    batch: Annotated[int, typer.Option("--batch", help="Concurrent requests in the profiled window.")] = 1,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Tokens each request generates "
                                               "(ignore_eos).")] = 32,
    input_tokens: Annotated[int, typer.Option("--input-tokens", help="Prompt length in tokens.")] = 32,
    trace_dir: Annotated[Path | None, typer.Option("--trace-dir", help="The server's torch_profiler_dir "
                                                   "(found from the local process when not given).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name (default: the first listed).")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help="Bearer key (or $SERVESCOPE_API_KEY / "
                                                "$VLLM_API_KEY / $OPENAI_API_KEY).", show_default=False)] = None,
    trace_timeout: Annotated[float, typer.Option("--trace-timeout", help="Seconds to wait for complete "
                                                 "trace files.")] = 120.0,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="Send one unprofiled batch first "
                                         "(2 tokens each) so the profiled one meets a warm server.")] = True,
    unprofiled_runs: Annotated[int, typer.Option("--unprofiled-runs", min=0, help="Run the same batch this many "
                                                 "times without the profiler (the server's own /metrics): the "
                                                 "median is the production step, the spread how much it moves; "
                                                 "0 skips it.")] = 3,
    after_runs: Annotated[int, typer.Option("--after-runs", min=0, help="Run the same batch this many times "
                                            "once the traces are written: whether the profile left the server "
                                            "slower; 0 skips it.")] = 3,
    unprofiled_batches: Annotated[str | None, typer.Option(
        "--unprofiled-batches", help="Other batches to time the same way, comma-separated (e.g. 1,4,16,64): the "
        "server's own step across batches, which `plan --calibrate` uses for the host's cycle under async "
        "scheduling and checks its predictions against.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis document plus trace_files.")] = False,
    output: JsonDocumentOut = None,
    html: HtmlReport = None,
    top: TopKernels = 15,
) -> None:
    """Profile B concurrent requests × N tokens on a live vLLM server and print the decode breakdown.

    POST /start_profile, the requests, POST /stop_profile, waits for the new trace files (one per rank
    plus the front end) to be complete, then analyzes exactly those files.
    """
    from servescope.plan.planner import parse_batches
    from servescope.report.html import render_analysis_html
    from servescope.report.profile import encode_profile
    from servescope.server.client import resolve_api_key
    from servescope.server.profile import ProfileRequest, profile_server

    with user_errors():
        request = ProfileRequest(url=url, batch=batch, output_tokens=output_tokens, input_tokens=input_tokens,
                                 trace_dir=trace_dir, api_key=resolve_api_key(api_key), model=model,
                                 trace_timeout_s=trace_timeout, warmup=warmup,
                                 unprofiled_runs=unprofiled_runs, after_runs=after_runs,
                                 unprofiled_batches=parse_batches(unprofiled_batches, "--unprofiled-batches")
                                 if unprofiled_batches else ())
        result = profile_server(request, say=lambda line: print(line, file=sys.stderr, flush=True))
        emit(result, lambda done, console: _render(done, console, top=top), as_json=as_json, output=output,
             html=html, render_html=lambda done: render_analysis_html(done.analysis), blank_line=True,
             encode=lambda done: encode_profile(done.analysis, done.capture.trace_files,
                                                capture=done.capture.record()))


def _render(result: ProfileResult, console: Console, *, top: int) -> None:
    """What was captured, then the analysis of its traces (with its next steps)."""
    from servescope.report.profile import render_capture
    from servescope.report.tables import render_analysis
    from servescope.server.timing import after_profile_note

    capture, doc = result.capture, result.analysis
    render_capture(console, url=capture.url, model=capture.model, batch=capture.batch,
                   output_tokens=capture.output_tokens, input_tokens=capture.input_tokens,
                   trace_files=capture.trace_files, usage=capture.usage,
                   unprofiled_ms=capture.unprofiled_server.itl_ms if capture.unprofiled_server else None,
                   runs_ms=[r.itl_ms for r in capture.unprofiled_runs if r.itl_ms is not None],
                   profiled_ms=capture.profiled_server.itl_ms if capture.profiled_server else None,
                   after_note=after_profile_note(capture.unprofiled_runs, capture.after_runs),
                   before_note=capture.profiled_before,
                   other_batches_ms={s.batch: s.step_us / 1e3 for s in (doc.unprofiled.other_batches
                                                                         if doc.unprofiled else ())})
    render_analysis(doc, console, top=top)
