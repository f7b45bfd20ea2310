"""The ``servescope`` command line: parse flags, call one feature function, render. No analysis here."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer
from rich.console import Console

from servescope import __version__
from servescope.core.errors import InputError

__all__ = ["app", "main"]

app = typer.Typer(
    name="servescope",
    help="Where a decode step's time goes on multi-GPU LLM servers, and what to change.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # tracebacks with locals could print secrets
    add_completion=False,
)
_err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
T = TypeVar("T")


def _fail(message: str, code: int = 2) -> NoReturn:
    _err.print(f"servescope: error: {message}", markup=False)
    raise typer.Exit(code)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn our input errors into one line and exit 2."""
    try:
        yield
    except InputError as exc:
        _fail(str(exc))


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


class _BarProgress:
    def __init__(self, console: Console) -> None:
        self._status = console.status("")
        self._status.start()

    def advance(self, description: str) -> None:
        self._status.update(description)

    def stop(self) -> None:
        self._status.stop()


def _with_progress(quiet: bool, job: Callable[[_BarProgress | None], T]) -> T:
    progress = None if quiet or not _err.is_terminal else _BarProgress(_err)
    try:
        return job(progress)
    finally:
        if progress is not None:
            progress.stop()


def _write_outputs(doc: object, *, json_out: Path | None, html_out: Path | None) -> None:
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

    with _user_errors():
        chosen = list(paths or [])
        if example:
            chosen.append(example_trace_dir())
        if not chosen:
            _fail("give trace files or directories, or --example")
        request = AnalyzeRequest(paths=chosen, taxonomy=taxonomy, step_gap_us=step_gap_us)
        doc = _with_progress(as_json, lambda progress: run_analysis(request, progress=progress))
        _write_outputs(doc, json_out=output, html_out=html)
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

    with _user_errors():
        try:
            data = analysis.read_bytes()
        except OSError as exc:
            raise InputError(str(analysis), exc.strerror or "cannot read") from None
        doc = decode_analysis(data, str(analysis))
        _write_outputs(doc, json_out=None, html_out=html)
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

    with _user_errors():
        doc = diff_paths(before, after, phase=phase, taxonomy=taxonomy)
    if as_json:
        sys.stdout.buffer.write(encode_diff(doc))
        return
    render_diff(doc, Console(highlight=False))


capture_app = typer.Typer(help="Make traces: GPU decode captures of a random-weight model.", no_args_is_help=True)
app.add_typer(capture_app, name="capture")


@capture_app.command("decode", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                                 "help_option_names": []})
def capture_decode(ctx: typer.Context) -> None:
    """Prefill + decode steps of a random-weight dense or MoE model under torch.profiler, annotated as vLLM
    does, with the profiler's own per-kernel totals (needs torch and transformers). `--help` lists the options.
    """
    import importlib.util

    from servescope.bench import capture_decode as tool

    if "--help" not in ctx.args and "-h" not in ctx.args:
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            _fail(f"capture decode needs {' and '.join(missing)}: pip install torch transformers")
    raise typer.Exit(tool.main(list(ctx.args)))


@app.command()
def health(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).")],
    wait: Annotated[bool, typer.Option("--wait", help="Poll until ready; stop at once if the process or unit "
                                       "exits.")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.0, show_default=False,
                                                  help="Seconds to wait in all with --wait (default 1800), "
                                                  "else per request (default 10).")] = None,
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="Seconds between polls with --wait.")] = 2.0,
    pid: Annotated[int | None, typer.Option("--pid", min=1, help="The server's process id: tells loading "
                                            "from crashed.")] = None,
    unit: Annotated[str | None, typer.Option("--unit", help="The server's systemd unit (instead of --pid).")] = None,
    log: Annotated[Path | None, typer.Option("--log", help="The server's log; its last lines show when it is "
                                             "not ready.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", show_default=False,
                                                help="Bearer key; else $SERVESCOPE_API_KEY, else "
                                                "$OPENAI_API_KEY. Never printed.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the health result as JSON.")] = False,
) -> None:
    """Is the server ready? /health 200, /v1/models lists a model, and a 1-token completion works.

    Exit 0 when ready, 1 when not (crashed, engine dead, still loading at the timeout), 2 for bad input or
    a server that cannot be checked (unreachable without --wait, wrong API key, not OpenAI-compatible).
    """
    from servescope.report.health import encode_health, render_health
    from servescope.server.client import resolve_api_key
    from servescope.server.health import CHECK_TIMEOUT_S, WAIT_TIMEOUT_S, check_health, wait_until_ready

    with _user_errors():
        key = resolve_api_key(api_key)
        if wait:
            def waiting(bar: _BarProgress | None) -> object:
                def show(elapsed_s: float, phase: str, line: str | None) -> None:
                    if bar is not None:
                        bar.advance(f"{elapsed_s:.0f} s  {phase}  {line or ''}")
                return wait_until_ready(url, timeout_s=WAIT_TIMEOUT_S if timeout is None else timeout, poll_s=poll,
                                        api_key=key, pid=pid, unit=unit, log_path=log, progress=show)

            result = _with_progress(as_json, waiting)
        else:
            result = check_health(url, api_key=key, timeout_s=CHECK_TIMEOUT_S if timeout is None else timeout,
                                  pid=pid, unit=unit, log_path=log)
    if as_json:
        sys.stdout.buffer.write(encode_health(result))  # type: ignore[arg-type]
    else:
        render_health(result, Console(highlight=False))  # type: ignore[arg-type]
    if not result.ready:  # type: ignore[attr-defined]
        raise typer.Exit(1)


gpu_app = typer.Typer(help="GPUs: inventory, memory holders, waiting for memory to be free.", no_args_is_help=True)
app.add_typer(gpu_app, name="gpu")


@gpu_app.command("list")
def gpu_list(
    prefer: Annotated[str, typer.Option("--prefer", help="nvml or nvidia-smi (the other is the fallback).")] = "nvml",
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
) -> None:
    """GPUs, their memory, PCIe link and the processes holding memory (NVML, else nvidia-smi)."""
    from servescope.gpu.errors import GpuUnavailable
    from servescope.gpu.inventory import take_snapshot
    from servescope.report.gpu import encode_dataclass, render_snapshot

    try:
        snapshot = take_snapshot(prefer=prefer)
    except (GpuUnavailable, ValueError) as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.buffer.write(encode_dataclass(snapshot))
    else:
        render_snapshot(snapshot, Console(highlight=False))


@gpu_app.command("wait-free")
def gpu_wait_free(
    max_used_mib: Annotated[int, typer.Option("--max-used-mib", min=0, help="Free means every GPU uses less.")],
    timeout: Annotated[float, typer.Option("--timeout", min=0.0, help="Seconds before giving up (exit 1).")],
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="Seconds between checks.")] = 2.0,
) -> None:
    """Wait until GPU memory is free (for ExecStartPre); exit 1 naming who still holds it at the timeout."""
    from servescope.gpu.errors import GpuUnavailable
    from servescope.gpu.inventory import wait_until_gpu_memory_free

    try:
        result = wait_until_gpu_memory_free(max_used_mib, timeout, poll)
    except GpuUnavailable as exc:
        _fail(str(exc))
    typer.echo(result.describe())
    if not result.ready:
        raise typer.Exit(1)


bench_app = typer.Typer(help="Measurements that feed plan: GEMMs at a model's decode shapes.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("gemm")
def bench_gemm(
    model: Annotated[str, typer.Option("--model", help="A preset (kimi-k2.5, deepseek-v3, qwen3-235b-a22b, "
                                       "llama-3-70b) or a HF config.json.")],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel ranks (per-rank shapes).")] = 1,
    batch: Annotated[str, typer.Option("--batch", help="Decode batch sizes, comma-separated.")] = "1,16,64",
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu.")] = "auto",
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed samples per shape.")] = 50,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON result here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Time the model's per-rank decode GEMMs; TFLOP/s and GB/s against ceilings measured in the same run."""
    from servescope.bench.gemm import run_gemm_bench
    from servescope.core.atomic import write_text_atomic
    from servescope.core.gemm import gemm_doc_to_json
    from servescope.plan.model import gemm_shapes, load_model_arch
    from servescope.report.gpu import render_gemm

    with _user_errors():
        try:
            batches = [int(b) for b in batch.split(",") if b.strip()]
        except ValueError:
            raise InputError("--batch", f"not a comma-separated list of integers: {batch!r}") from None
        arch = load_model_arch(model)
        shapes = [s for b in batches for s in gemm_shapes(arch, tp=tp, batch=b)]
        doc = run_gemm_bench(shapes, device=device, iters=iters)
        if output is not None:
            write_text_atomic(output, gemm_doc_to_json(doc))
    if as_json:
        sys.stdout.write(gemm_doc_to_json(doc) + "\n")
    else:
        render_gemm(doc, Console(highlight=False))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        _err.print("servescope: interrupted", markup=False)
        sys.exit(130)
