"""settings: the complete effective configuration of a deployed server.

Wiring only (see ``deploy.settings``): the unit from deploy/, the process from server/process, the server's
report from server/reported, the GPUs from gpu/; ``deploy.settings.effective_settings`` combines them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from servescope.cli.common import app, user_errors
from servescope.core.errors import InputError


@app.command("settings")
def settings(
    unit: Annotated[str | None, typer.Option("--unit", help="The systemd unit (systemctl cat; else looked up in "
                                             "$SYSTEMD_UNIT_PATH or systemd's unit folders).")] = None,
    unit_file: Annotated[Path | None, typer.Option("--unit-file", help="A unit file; its NAME.service.d/*.conf "
                                                   "drop-ins beside it are applied.")] = None,
    pid: Annotated[int | None, typer.Option("--pid", min=1, help="The server process (default: the unit's "
                                            "MainPID, else the one vLLM/SGLang server process running).")] = None,
    url: Annotated[str | None, typer.Option("--url", help="The server (default: --host/--port of its command "
                                            "line).")] = None,
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
    import msgspec

    from servescope.deploy.settings import (
        choose_pid,
        choose_url,
        effective_settings,
        is_server_argv,
        is_serving_env,
        process_api_key,
        read_unit_settings,
    )
    from servescope.gpu.errors import GpuQueryError, GpuUnavailable
    from servescope.gpu.inventory import take_snapshot
    from servescope.report.settings import encode_settings, render_settings, settings_console
    from servescope.server.client import ApiKey, resolve_api_key
    from servescope.server.process import find_processes, read_process_record
    from servescope.server.reported import read_server_record

    with user_errors():
        if unit is not None and unit_file is not None:
            raise InputError("--unit-file", "give --unit or --unit-file, not both")
        record = read_unit_settings(name=unit, path=unit_file) if unit or unit_file else None
        target, how = choose_pid(pid=pid, unit=record, scan=lambda: find_processes(is_server_argv))
        process = read_process_record(target) if target is not None else None
        address = choose_url(url=url, process=process, unit=record)
        own_key = process_api_key(process)
        key = resolve_api_key(api_key) or (ApiKey(own_key, "the server's command line") if own_key else None)
        server = read_server_record(address, api_key=key, timeout_s=timeout) if address else None
        notes = {"process": how}
        try:
            gpus = take_snapshot().gpus
        except (GpuUnavailable, GpuQueryError) as exc:
            gpus, notes["gpus"] = None, str(exc)
        doc = msgspec.structs.replace(
            effective_settings(unit=record, process=process, server=server, gpus=gpus, notes=notes), all_env=all_env)
    if as_json:
        sys.stdout.buffer.write(encode_settings(doc))
    else:
        render_settings(doc, settings_console(), all_env=doc.all_env, serving=is_serving_env)
