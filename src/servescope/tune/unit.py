"""A systemd unit as a tune target: each configuration is one drop-in, installed by ``service restart``'s safe path.

The unit file and its other drop-ins are never written. A configuration other than the original is the drop-in
``<unit>.d/zz-servescope-tune.conf`` (last in name order: its ``ExecStart=`` and ``Environment=`` win); the
original is that file as it was before (absent, or its bytes and mode). Every restart is ``systemctl
daemon-reload``, then stop → wait for free GPU memory → start → ``health --wait`` on the unit, and needs
``confirm`` to say yes first (``--yes``, or the user at the prompt, shown the drop-in).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from servescope.core.atomic import write_bytes_atomic
from servescope.core.errors import InputError
from servescope.core.gpu import GpuSnapshot
from servescope.deploy.lifecycle import restart_service, unit_name
from servescope.deploy.systemctl import SystemctlError, run_systemctl
from servescope.deploy.unitfile import (
    UnitFile,
    default_dropin_dirs,
    load_unit,
    parse_environment,
    split_command_line,
)
from servescope.gpu.errors import GpuUnavailable
from servescope.gpu.inventory import WaitResult, wait_until_gpu_memory_free
from servescope.server.health import HealthRequest, check_health
from servescope.server.process import read_unit_log_tail
from servescope.tune.edit import ServerConfig, render_dropin
from servescope.tune.target import Started

__all__ = ["DROPIN_NAME", "FileState", "NotConfirmed", "UnitTarget", "gpu_wait", "restore_file"]

DROPIN_NAME = "zz-servescope-tune.conf"


class NotConfirmed(Exception):
    """The user said no to a restart: the loop stops, nothing restarted."""


FileState = tuple[bytes, int] | None
"""A file as it was: its bytes and mode, or None when it did not exist."""


def read_state(path: Path) -> FileState:
    try:
        return path.read_bytes(), path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return None


def restore_file(path: Path, state: FileState) -> None:
    """Put ``path`` back as ``state`` says: the same bytes and mode, or no file."""
    if state is None:
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # only when empty: the folder tune made for its drop-in
        except OSError:
            pass
    else:
        write_bytes_atomic(path, state[0], mode=state[1])


def gpu_wait(max_used_mib: int, timeout_s: float, poll_s: float) -> WaitResult:
    """``gpu wait-free``; a machine without a GPU stack (a CPU server) has nothing to wait for."""
    try:
        return wait_until_gpu_memory_free(max_used_mib, timeout_s, poll_s)
    except GpuUnavailable:
        empty = GpuSnapshot((), (), None, "nvidia-smi", datetime.now(UTC).isoformat(timespec="seconds"))
        return WaitResult(True, max_used_mib, 0, 0.0, (), empty)


def _config(unit: UnitFile, source: str) -> tuple[ServerConfig, str]:
    """The command line and environment a unit runs, and its ExecStart= prefixes."""
    exec_start = unit.get("Service", "ExecStart")
    if not exec_start:
        raise InputError(source, "no ExecStart= (nothing to tune)")
    command = split_command_line(exec_start, f"{source}: ExecStart")
    return ServerConfig(tuple(command.argv), parse_environment(unit.get_all("Service", "Environment"))), \
        command.prefixes


class UnitTarget:
    """The unit ``unit`` (its file at ``unit_path``), serving on ``url``."""

    kind = "unit"

    def __init__(self, unit: str, *, unit_path: Path, url: str, confirm: Callable[[str], bool],
                 ready_timeout_s: float, max_used_mib: int = 1000, gpu_timeout_s: float = 600.0,
                 api_key: str | None = None, dropin_dir: Path | None = None) -> None:
        self.unit = unit_name(unit)
        self.unit_path = unit_path
        dirs = default_dropin_dirs(unit_path)
        self.dropin_path = (dropin_dir or dirs[0]) / DROPIN_NAME
        loaded = load_unit(unit_path, dropin_dirs=list(dict.fromkeys([*dirs, self.dropin_path.parent])))
        # what runs now (every drop-in, tune's own of an earlier run too), and what tune's drop-in is laid over
        self.original, self.prefixes = _config(loaded, str(unit_path))
        self.base, _ = _config(UnitFile(loaded.path, tuple(e for e in loaded.entries
                                                           if e.source != str(self.dropin_path))), str(unit_path))
        self.before: FileState = read_state(self.dropin_path)
        self.url = url
        self.confirm = confirm
        self.ready_timeout_s = ready_timeout_s
        self.max_used_mib = max_used_mib
        self.gpu_timeout_s = gpu_timeout_s
        self.api_key = api_key
        self.restarted = False

    @property
    def name(self) -> str:
        return self.unit

    def dropin_text(self, config: ServerConfig) -> str:
        """The drop-in that makes the unit run ``config``."""
        return render_dropin(self.base, config, prefixes=self.prefixes,
                             header=f"servescope tune: a trial configuration of {self.unit}; "
                                    f"`servescope tune --restore` removes it")

    def install(self, config: ServerConfig) -> None:
        """Write ``config``'s drop-in (the original: the file as it was) and reload systemd."""
        if config == self.original:
            restore_file(self.dropin_path, self.before)
        else:
            write_bytes_atomic(self.dropin_path, self.dropin_text(config).encode("utf-8"), mode=0o644, mkdir=True)
        run_systemctl(["daemon-reload"])

    def start(self, config: ServerConfig, progress: Callable[[float, str], None] | None = None) -> Started:
        shown = self.dropin_text(config) if config != self.original else "(the unit's original configuration)"
        if not self.confirm(f"restart {self.unit} with {self.dropin_path}:\n{shown}"):
            raise NotConfirmed(f"restart of {self.unit} not confirmed")
        began = time.monotonic()
        try:
            self.install(config)

            def ready() -> tuple[bool, str]:
                health = check_health(HealthRequest(url=self.url, wait=True, timeout_s=self.ready_timeout_s,
                                                    poll_s=2.0, api_key=self.api_key, unit=self.unit),
                                      progress=(lambda e, p, d: progress(e, p)) if progress else None)
                return health.ready, health.phase

            self.restarted = True
            result = restart_service(self.unit, max_used_mib=self.max_used_mib, gpu_timeout_s=self.gpu_timeout_s,
                                     gpu_wait=gpu_wait, wait_ready=ready)
        except (SystemctlError, InputError) as exc:
            return Started(ok=False, reason=str(exc), seconds=time.monotonic() - began, log_tail=self._tail())
        seconds = time.monotonic() - began
        if result.started and result.ready:
            return Started(ok=True, reason="ready", seconds=seconds)
        tail = self._tail()
        return Started(ok=False, reason=f"{result.detail}" + (f": {tail[-1]}" if tail else ""), seconds=seconds,
                       log_tail=tail)

    def _tail(self) -> list[str]:
        return read_unit_log_tail(self.unit, lines=30, secrets=[self.api_key])

    def stop(self) -> None:
        """A unit keeps running as systemd has it; tune stops nothing at the end."""

    def log_lines(self) -> list[str]:
        return read_unit_log_tail(self.unit, lines=5000, secrets=[self.api_key])

    def restore(self) -> None:
        """The drop-in as it was, systemd reloaded, and the unit restarted on it if tune had restarted it."""
        restore_file(self.dropin_path, self.before)
        try:
            run_systemctl(["daemon-reload"])
            if self.restarted:
                restart_service(self.unit, max_used_mib=self.max_used_mib, gpu_timeout_s=self.gpu_timeout_s,
                                gpu_wait=gpu_wait, wait_ready=None)
        except SystemctlError:
            pass  # the files are back; the document says to restart it by hand
