"""Commands that talk to a live OpenAI-compatible server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from servescope.cli.common import BarProgress, app, bench_app, save, user_errors, with_progress
from servescope.core.errors import InputError


class LoadLog:
    """``health --wait``'s lasting lines on stderr, for a terminal and a log alike: one when the phase
    changes and one every ``every_s`` between, so that how the load went (GPU memory rising, the server's
    newest log line) is still there after the verdict. Each line is cut to the console's width."""

    def __init__(self, console: Console, every_s: float = 10.0) -> None:
        self._console = console
        self._every_s = every_s
        self._phase: str | None = None
        self._last_s = 0.0

    def __call__(self, elapsed_s: float, phase: str, line: str | None) -> None:
        if phase == self._phase and elapsed_s - self._last_s < self._every_s:
            return
        self._phase, self._last_s = phase, elapsed_s
        self._console.print(f"{elapsed_s:5.0f} s  {phase:<11}  {line or ''}".rstrip(), markup=False,
                            highlight=False, soft_wrap=False, no_wrap=True, overflow="ellipsis", crop=True)


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
                                                "$VLLM_API_KEY, else $OPENAI_API_KEY. Never printed.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the health result as JSON.")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the health result (JSON) here, "
                                                "ready or not.")] = None,
) -> None:
    """Is the server ready? /health 200, /v1/models lists a model, and a 1-token completion works.

    With --wait, a refused port is judged with the process (--pid / --unit) and the GPU memory in use:
    alive or memory rising = loading, gone = crashed at once.

    Exit 0 when ready, 1 when not (unreachable, crashed, engine dead, still loading at the timeout; --json
    prints the result either way), 2 for bad input or a server that cannot be checked (wrong API key, not
    OpenAI-compatible).
    """
    from servescope.gpu.inventory import memory_used_probe
    from servescope.report.health import encode_health, render_health
    from servescope.server.client import resolve_api_key
    from servescope.server.health import CHECK_TIMEOUT_S, WAIT_TIMEOUT_S, check_health, wait_until_ready

    with user_errors():
        key = resolve_api_key(api_key)
        if wait:
            from servescope.cli.common import err

            load_log = None if as_json else LoadLog(err)

            def waiting(bar: BarProgress | None) -> object:
                def show(elapsed_s: float, phase: str, line: str | None) -> None:
                    if bar is not None:
                        bar.advance(f"{elapsed_s:.0f} s  {phase}  {line or ''}")
                    if load_log is not None:
                        load_log(elapsed_s, phase, line)
                return wait_until_ready(url, timeout_s=WAIT_TIMEOUT_S if timeout is None else timeout, poll_s=poll,
                                        api_key=key, pid=pid, unit=unit, log_path=log, progress=show,
                                        gpu_memory=memory_used_probe())

            result = with_progress(as_json, waiting)
        else:
            result = check_health(url, api_key=key, timeout_s=CHECK_TIMEOUT_S if timeout is None else timeout,
                                  pid=pid, unit=unit, log_path=log)
        if output is not None:
            save(output, encode_health(result))  # type: ignore[arg-type]
    if as_json:
        sys.stdout.buffer.write(encode_health(result))  # type: ignore[arg-type]
    else:
        render_health(result, Console(highlight=False))  # type: ignore[arg-type]
    if not result.ready:  # type: ignore[attr-defined]
        raise typer.Exit(1)


def _parse_list(option: str, text: str | None, kind: type[int] | type[float]) -> tuple[Any, ...]:
    if not text:
        return ()
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(option, f"not a comma-separated list of numbers: {text!r}") from None
    if any(v <= 0 for v in values):
        raise InputError(option, f"values must be positive: {text!r}")
    return values


@bench_app.command("serve")
def bench_serve(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8000.")],
    concurrency: Annotated[str | None, typer.Option("--concurrency", help="Concurrent streams per point, "
                                                    "comma-separated (default 1,4,16,64 without --rate).")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Poisson request rates (req/s) per point, "
                                             "comma-separated, instead of --concurrency.")] = None,
    input_tokens: Annotated[int, typer.Option("--input-tokens", min=1, help="Prompt tokens per request.")] = 128,
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=1, help="Output tokens per request "
                                               "(ignore_eos).")] = 64,
    requests: Annotated[int | None, typer.Option("--requests", min=1, show_default=False,
                                                 help="Requests per point (default 4 x concurrency, >= 8).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", min=0.1, show_default=False,
                                                   help="Seconds per point to keep launching requests.")] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Warm-up requests before the sweep.")] = 2,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", min=1, show_default=False,
                                                        help="Cap on streams in flight with --rate.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model id (default: the first one served).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of prompts and arrivals.")] = 0,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for each chunk.")] = 120.0,
    workers: Annotated[int, typer.Option("--workers", min=0, help="Client processes per point; 0: one per 16 "
                                         "streams, at most one per CPU but one, at least 1 (printed per "
                                         "point).")] = 0,
    api_key: Annotated[str | None, typer.Option("--api-key", show_default=False,
                                                help="Bearer key; else $SERVESCOPE_API_KEY, else "
                                                "$VLLM_API_KEY, else $OPENAI_API_KEY. Never printed.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON result here (after "
                                                "every point).")] = None,
    png: Annotated[Path | None, typer.Option("--png", help="Write a PNG plot of the sweep.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report of the sweep.")] = None,
    compare: Annotated[Path | None, typer.Option("--compare", help="An older result: show the deltas.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Load-test a live server: TTFT, TPOT, ITL, E2E and throughput per point, beside its own /metrics.

    Exit 0 when every request succeeded, 1 when some failed or the server died mid-run (what was measured
    is kept), 2 for bad input or a server that cannot be benchmarked.
    """
    from servescope.core.atomic import write_bytes_atomic, write_text_atomic
    from servescope.report.serve import (
        compare_points,
        decode_serve,
        encode_serve,
        render_compare,
        render_serve,
        render_serve_html,
        render_serve_png,
    )
    from servescope.server.client import resolve_api_key
    from servescope.server.loadgen import LoadSpec, run_bench_serve

    with user_errors():
        rates = _parse_list("--rate", rate, float)
        levels = _parse_list("--concurrency", concurrency, int) or ((1, 4, 16, 64) if not rates else ())
        if rates and concurrency:
            raise InputError("--concurrency/--rate", "give one of them, not both")
        old = decode_serve(_read(compare), str(compare)) if compare is not None else None
        spec = LoadSpec(url=url, input_tokens=input_tokens, output_tokens=output_tokens, concurrency=levels,
                        rate=rates, requests=requests, duration_s=duration, warmup_requests=warmup,
                        max_concurrency=max_concurrency, model=model, seed=seed, timeout_s=timeout, workers=workers,
                        api_key=resolve_api_key(api_key))

        def save(partial: object) -> None:
            if output is not None:
                write_bytes_atomic(output, encode_serve(partial))  # type: ignore[arg-type]

        def sweep(bar: BarProgress | None) -> object:
            def show(label: str, done: int, planned: int) -> None:
                if bar is not None:
                    bar.advance(f"{label}: {done}/{planned or '?'} requests")
            return run_bench_serve(spec, progress=show, checkpoint=save)

        result = with_progress(as_json, sweep)
        if png is not None:
            write_bytes_atomic(png, render_serve_png(result))  # type: ignore[arg-type]
        if html is not None:
            write_text_atomic(html, render_serve_html(result))  # type: ignore[arg-type]
    if as_json:
        sys.stdout.buffer.write(encode_serve(result))  # type: ignore[arg-type]
    else:
        console = Console(highlight=False)
        render_serve(result, console)  # type: ignore[arg-type]
        if old is not None:
            render_compare(compare_points(result, old), console)  # type: ignore[arg-type]
    if result.aborted or any(p.errors for p in result.points):  # type: ignore[attr-defined]
        raise typer.Exit(1)


def _read(path: Path | None) -> bytes:
    assert path is not None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), f"cannot read ({exc.strerror or exc})") from None
