"""service render / lint / import / install / start / stop / status / restart."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from servescope.cli.apps import JsonFlag, MkdirFlag, checked_url, service_app
from servescope.cli.common import emit, user_errors


def _systemctl_errors() -> type[Exception]:
    from servescope.deploy.systemctl import SystemctlError

    return SystemctlError


@service_app.command("render")
def service_render(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.toml", help="The deployment spec.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the unit here (a folder when the "
                                                "spec is multi-node); default stdout.")] = None,
    mkdir: MkdirFlag = False,
) -> None:
    """Render the systemd unit(s) of a spec (multi-node: Ray head, server and worker units)."""
    from servescope.deploy.render import render_units, write_units
    from servescope.deploy.spec import load_spec

    with user_errors():
        units = render_units(load_spec(spec_path))
        if output is None:
            for unit in units:
                if len(units) > 1:
                    typer.echo(f"# ---- {unit.filename} (runs on: {unit.role})")
                typer.echo(unit.text)
            return
        for path, role in write_units(units, output, mkdir=mkdir):
            typer.echo(f"wrote {path}" if role is None else f"wrote {path} (runs on: {role})")


@service_app.command("lint")
def service_lint(
    unit_path: Annotated[Path, typer.Argument(metavar="UNIT", help="A unit file.")],
    topology: Annotated[str | None, typer.Option("--topology", help="nvlink, pcie, or an `nvidia-smi topo -m` "
                                                 "file; default: this machine's GPUs, else NCCL rules skipped.")]
    = None,
    load_time: Annotated[float | None, typer.Option("--load-time", min=1.0, help="Expected model load, seconds "
                                                    "(default 1800).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
    no_host: Annotated[bool, typer.Option("--no-host", help="Skip the checks against this machine (every "
                                          "Exec* program exists and is executable): a unit for another host.")]
    = False,
) -> None:
    """Explain each problem of a unit, with its line and what to do. Exit 1 when an error-level rule fires."""
    from servescope.deploy.lint import lint_unit_file
    from servescope.report.service import encode_lint, render_lint

    with user_errors():
        result = lint_unit_file(unit_path, topology=topology, load_time_s=load_time, host=not no_host)
    emit(result, render_lint, as_json=as_json, encode=encode_lint)
    if result.errors:
        raise typer.Exit(1)


@service_app.command("import")
def service_import(
    unit_path: Annotated[Path, typer.Argument(metavar="UNIT", help="An existing unit file (its UNIT.d/*.conf "
                                              "drop-ins applied).")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the spec here (secrets beside it "
                                                "as NAME.env, mode 0600); default stdout.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the spec and what moved as JSON.")] = False,
    mkdir: MkdirFlag = False,
) -> None:
    """Turn a vLLM/SGLang unit into a spec that renders it back; secrets move to an EnvironmentFile, never into the
    spec.

    Every directive is carried (a spec key, or verbatim in the spec's `[extra]` table) or replaced by the rendered
    unit's own, which the spec's comments name (`Type=exec` with a readiness wait, the GPU memory guard); what a
    spec cannot hold (a value systemd expands at start, a secret given twice) is refused naming its line."""
    from servescope.deploy.importer import import_unit_file, spec_toml
    from servescope.report.service import encode_import, render_import

    with user_errors():
        result, env_path = import_unit_file(unit_path, output=output, mkdir=mkdir)
    if output is None and result.secrets and not as_json:
        typer.echo(f"# {len(result.secrets)} secret(s) not written: use -o to write them to NAME.env", err=True)

    def text(doc: Any, console: Console) -> None:
        if output is None:
            typer.echo(spec_toml(doc), nl=False)
        else:
            render_import(doc, str(output), None if env_path is None else str(env_path), console)

    emit(result, text, as_json=as_json,
         encode=lambda doc: encode_import(doc, None if output is None else str(output)))


@service_app.command("install")
def service_install(
    unit_path: Annotated[Path, typer.Argument(metavar="UNIT", help="A rendered unit file.")],
    directory: Annotated[Path, typer.Option("--dir", help="Where units live.")] = Path("/etc/systemd/system"),
) -> None:
    """Copy a unit into the systemd folder and reload systemd."""
    from servescope.deploy.lifecycle import install_unit

    with user_errors(_systemctl_errors(), PermissionError):
        target = install_unit(unit_path, directory=directory)
    typer.echo(f"installed {target}; systemd reloaded")


def _simple(action: str, name: str) -> None:
    from servescope.deploy import lifecycle

    with user_errors(_systemctl_errors()):
        getattr(lifecycle, f"{action}_service")(name)
    typer.echo(f"{action}: {lifecycle.unit_name(name)}")


@service_app.command("start")
def service_start(name: Annotated[str, typer.Argument(help="The unit name.")]) -> None:
    """systemctl start NAME (a rendered unit returns once the server is ready)."""
    _simple("start", name)


@service_app.command("stop")
def service_stop(name: Annotated[str, typer.Argument(help="The unit name.")]) -> None:
    """systemctl stop NAME."""
    _simple("stop", name)


@service_app.command("status")
def service_status_cmd(
    name: Annotated[str, typer.Argument(help="The unit name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """The unit's state, main pid, restarts and start time (systemctl show)."""
    from servescope.deploy.lifecycle import service_status
    from servescope.report.service import encode_record, render_status

    with user_errors(_systemctl_errors()):
        status = service_status(name)
    emit(status, render_status, as_json=as_json, encode=encode_record)


@service_app.command("restart")
def service_restart(
    name: Annotated[str, typer.Argument(help="The unit name.")],
    url: Annotated[str, typer.Option("--url", help="The server, for the readiness wait.",
                                     callback=checked_url)] = "http://127.0.0.1:8000",
    max_used_mib: Annotated[int, typer.Option("--max-used-mib", min=0, help="GPU memory counts as free below "
                                              "this.")] = 1000,
    gpu_timeout: Annotated[float, typer.Option("--gpu-timeout", min=0.0, help="Seconds to wait for free GPU "
                                               "memory.")] = 600.0,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", min=0.0, help="Seconds to wait for the "
                                                 "server to be ready.")] = 1800.0,
    as_json: JsonFlag = False,
) -> None:
    """stop → wait for free GPU memory → start → wait until ready; never starts while memory is held (exit 1)."""
    from servescope.gpu.errors import GpuQueryError, GpuUnavailable
    from servescope.report.service import encode_record, render_restart
    from servescope.server.health import restart_until_ready

    with user_errors(_systemctl_errors(), GpuUnavailable, GpuQueryError):
        result = restart_until_ready(name, url=url, max_used_mib=max_used_mib, gpu_timeout_s=gpu_timeout,
                                     ready_timeout_s=ready_timeout)
    emit(result, render_restart, as_json=as_json, encode=encode_record)
    if not result.started or result.ready is False:
        raise typer.Exit(1)
