"""Commands that talk to a live OpenAI-compatible server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servescope.cli.common import BarProgress, app, user_errors, with_progress


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

    with user_errors():
        key = resolve_api_key(api_key)
        if wait:
            def waiting(bar: BarProgress | None) -> object:
                def show(elapsed_s: float, phase: str, line: str | None) -> None:
                    if bar is not None:
                        bar.advance(f"{elapsed_s:.0f} s  {phase}  {line or ''}")
                return wait_until_ready(url, timeout_s=WAIT_TIMEOUT_S if timeout is None else timeout, poll_s=poll,
                                        api_key=key, pid=pid, unit=unit, log_path=log, progress=show)

            result = with_progress(as_json, waiting)
        else:
            result = check_health(url, api_key=key, timeout_s=CHECK_TIMEOUT_S if timeout is None else timeout,
                                  pid=pid, unit=unit, log_path=log)
    if as_json:
        sys.stdout.buffer.write(encode_health(result))  # type: ignore[arg-type]
    else:
        render_health(result, Console(highlight=False))  # type: ignore[arg-type]
    if not result.ready:  # type: ignore[attr-defined]
        raise typer.Exit(1)


