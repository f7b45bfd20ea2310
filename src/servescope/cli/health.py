"""health: is a live OpenAI-compatible server ready?"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from servescope.cli.apps import ApiKeyOption, app
from servescope.cli.common import BarProgress, emit, user_errors, with_progress

if TYPE_CHECKING:
    from servescope.core.health import HealthResult


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
    api_key: ApiKeyOption = None,
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
    from servescope.cli.common import err
    from servescope.gpu.inventory import memory_used_probe
    from servescope.report.health import render_health
    from servescope.server.client import resolve_api_key
    from servescope.server.health import HealthRequest, check_health

    with user_errors():
        request = HealthRequest(url=url, wait=wait, timeout_s=timeout, poll_s=poll, api_key=resolve_api_key(api_key),
                                pid=pid, unit=unit, log_path=log, gpu_memory=memory_used_probe() if wait else None)
        load_log = None if as_json or not wait else LoadLog(err)

        def check(bar: BarProgress | None) -> HealthResult:
            def show(elapsed_s: float, phase: str, line: str | None) -> None:
                if bar is not None:
                    bar.advance(f"{elapsed_s:.0f} s  {phase}  {line or ''}")
                if load_log is not None:
                    load_log(elapsed_s, phase, line)
            return check_health(request, progress=show)

        result = with_progress(as_json, check) if wait else check_health(request)
        emit(result, render_health, as_json=as_json, output=output)
    if not result.ready:
        raise typer.Exit(1)
