"""The service's life: install, start, stop, status, and a restart that never starts while GPU memory is held.

``restart`` = ``systemctl stop`` → wait for free GPU memory (``gpu wait-free``) → ``systemctl start`` →
wait until ready (``health --wait``, passed in: :func:`servescope.server.health.restart_until_ready` is the
whole ``service restart``). When memory stays held, it stops there and names who holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servescope.core.atomic import write_bytes_atomic
from servescope.core.errors import InputError
from servescope.core.files import read_bytes
from servescope.core.service import ServiceStatus
from servescope.deploy.systemctl import run_systemctl, show_unit
from servescope.gpu.inventory import WaitResult, wait_until_gpu_memory_free

__all__ = ["RestartResult", "ServiceStatus", "install_unit", "restart_service", "service_status", "start_service",
           "stop_service", "unit_name"]

SYSTEM_DIR = Path("/etc/systemd/system")


def unit_name(name: str) -> str:
    """``NAME`` as a unit name: ``.service`` added when it has no unit suffix."""
    return name if "." in name else f"{name}.service"


def install_unit(path: Path, *, directory: Path = SYSTEM_DIR) -> Path:
    """Copy the unit file at ``path`` into ``directory`` (atomically), then ``systemctl daemon-reload``.

    A step that fails leaves nothing behind: without systemctl nothing is written, and when the reload fails
    the unit that was there before is put back (or the new file removed).

    Raises:
        InputError: the unit cannot be read.
        SystemctlError: no systemctl, or the reload failed (after the rollback).
        PermissionError: the folder is not writable.
    """
    import shutil

    from servescope.deploy.systemctl import SystemctlError

    data = read_bytes(path)
    if shutil.which("systemctl") is None:
        raise SystemctlError(f"systemctl not found on PATH (is this a systemd machine?); {directory / path.name} "
                             "not written")
    target = directory / path.name
    try:
        before: tuple[bytes, int] | None = (target.read_bytes(), target.stat().st_mode & 0o7777)
    except FileNotFoundError:
        before = None
    target = write_bytes_atomic(target, data, mode=0o644)
    try:
        run_systemctl(["daemon-reload"])
    except BaseException:
        if before is None:
            target.unlink(missing_ok=True)
        else:
            write_bytes_atomic(target, before[0], mode=before[1])
        raise
    return target


def start_service(name: str) -> None:
    """``systemctl start NAME``: with the rendered unit this returns once the server is ready."""
    run_systemctl(["start", unit_name(name)])


def stop_service(name: str) -> None:
    """``systemctl stop NAME``."""
    run_systemctl(["stop", unit_name(name)])


def service_status(name: str) -> ServiceStatus:
    """The unit's state from ``systemctl show NAME -p ...``; an unknown unit is an InputError."""
    props = show_unit(unit_name(name))
    if props.get("LoadState") == "not-found":
        raise InputError(unit_name(name), "no such unit (systemctl show: LoadState=not-found)")

    def text(key: str) -> str | None:
        return props.get(key) or None

    def number(key: str) -> int | None:
        value = props.get(key, "")
        return int(value) if value.isdigit() and value != "0" else None

    return ServiceStatus(unit_name(name), text("LoadState"), text("ActiveState"), text("SubState"), text("Result"),
                         number("MainPID"), int(props["NRestarts"]) if props.get("NRestarts", "").isdigit() else None,
                         text("ExecMainStartTimestamp"), text("FragmentPath"))


@dataclass(frozen=True, slots=True)
class RestartResult:
    """How a restart went: ``steps`` done in order; ``gpu`` the wait; ``started``/``ready`` whether it got there."""

    name: str
    steps: tuple[str, ...]
    gpu: WaitResult
    started: bool
    ready: bool | None
    detail: str


def restart_service(
    name: str,
    *,
    max_used_mib: int,
    gpu_timeout_s: float,
    poll_s: float = 2.0,
    gpu_wait: Callable[..., WaitResult] = wait_until_gpu_memory_free,
    wait_ready: Callable[[], tuple[bool, str]] | None = None,
) -> RestartResult:
    """Stop, wait for GPU memory below ``max_used_mib``, start, and (with ``wait_ready``) wait until ready.

    Never starts while memory is held: when the wait times out, the result says who holds it and
    ``started`` is False.
    """
    steps = ["stop"]
    stop_service(name)
    result = gpu_wait(max_used_mib, gpu_timeout_s, poll_s)
    steps.append("gpu-wait-free")
    if not result.ready:
        return RestartResult(unit_name(name), tuple(steps), result, False, None,
                             "not started: " + result.describe())
    start_service(name)
    steps.append("start")
    if wait_ready is None:
        return RestartResult(unit_name(name), tuple(steps), result, True, None, "started")
    ready, detail = wait_ready()
    steps.append("health-wait")
    return RestartResult(unit_name(name), tuple(steps), result, True, ready, detail)
