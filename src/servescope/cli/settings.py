"""settings: the complete effective configuration of a deployed server (:mod:`servescope.server.settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servescope.cli.apps import app, checked_url
from servescope.cli.common import emit, user_errors


@app.command("settings")
def settings(
    unit: Annotated[str | None, typer.Option("--unit", help="The systemd unit (systemctl cat; else looked up in "
                                             "$SYSTEMD_UNIT_PATH or systemd's unit folders).")] = None,
    unit_file: Annotated[Path | None, typer.Option("--unit-file", help="A unit file; its NAME.service.d/*.conf "
                                                   "drop-ins beside it are applied.")] = None,
    pid: Annotated[int | None, typer.Option("--pid", min=1, help="The server process (default: the unit's "
                                            "MainPID, else the one vLLM/SGLang server process running).")] = None,
    url: Annotated[str | None, typer.Option("--url", help="The server (default: --host/--port of its command "
                                            "line).", callback=checked_url)] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", show_default=False, help="Bearer key for /v1/models; "
                                                "else $SERVESCOPE_API_KEY, else the process's own. Never "
                                                "printed.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds per server request.")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the settings document as JSON.")] = False,
    all_env: Annotated[bool, typer.Option("--all-env", help="Show every environment variable of the process, "
                                          "each value whole (default: those that matter to serving — vLLM, "
                                          "NCCL, CUDA, torch, HF, OMP… — and those the unit sets).")] = False,
) -> None:
    """The effective configuration of a deployed vLLM/SGLang server, grouped; --json has all of it.

    Reads the unit (and drop-ins), the running process (/proc/PID cmdline, environ, start time), the server
    (/version, /v1/models, /metrics info gauges, /server_info) and the GPUs; names each drift between them.
    Secrets (--api-key, *_TOKEN, *_KEY, *_SECRET, passwords) are shown as ***. Flags are never cut; of the
    environment the terminal shows what matters to serving (the rest counted, --all-env shows it).
    """
    from servescope.report.settings import render_settings
    from servescope.server.client import resolve_api_key
    from servescope.server.settings import SettingsRequest, read_settings

    with user_errors():
        doc = read_settings(SettingsRequest(unit=unit, unit_file=unit_file, pid=pid, url=url,
                                            api_key=resolve_api_key(api_key), timeout_s=timeout, all_env=all_env))
        emit(doc, render_settings, as_json=as_json)
