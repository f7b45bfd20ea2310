"""A server servescope starts and stops itself (``tune --launch "vllm serve …"``): containers, machines without
systemd.

Each start runs the command in its own process session with its output in a fresh log file, waits until the
server is ready (``health --wait`` on its pid: a process that exits fails at once, with its log's last lines);
each stop sends SIGINT to the server, then SIGTERM and SIGKILL to whatever is left of its session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from servescope.core.changes import flag_values
from servescope.core.errors import InputError
from servescope.server.health import HealthRequest, check_health
from servescope.server.process import process_start_ticks, read_log_tail
from servescope.server.sessions import session_pids, wait_session_gone
from servescope.tune.edit import ServerConfig
from servescope.tune.target import Started

__all__ = ["LaunchTarget", "stop_session"]

_STOP_GRACE_S = 30.0
_KILL_GRACE_S = 10.0


def stop_session(pid: int, *, start_ticks: int | None = None, popen: subprocess.Popen[bytes] | None = None) -> bool:
    """Stop the server whose session leader is ``pid`` (SIGINT, then SIGTERM and SIGKILL to its session); False
    when it was already gone (or the pid now belongs to another process, by ``start_ticks``)."""
    if start_ticks is not None and process_start_ticks(pid) != start_ticks:
        return False
    if not session_pids(pid):
        return False
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    for sig, grace in ((None, _STOP_GRACE_S), (signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, _KILL_GRACE_S)):
        if sig is not None:
            for child in session_pids(pid):
                try:
                    os.kill(child, sig)
                except ProcessLookupError:
                    pass
        if popen is not None:
            try:
                popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if wait_session_gone(pid, grace if popen is None else 1.0):
            return True
    return False


class LaunchTarget:
    """The server of ``original`` (a command line and environment), on ``url``; logs under ``log_dir``.

    ``on_start(pid, start_ticks)`` is told each new process (the journal records it, so that ``tune --restore``
    can stop it after a crash of servescope itself).
    """

    kind = "launch"

    def __init__(self, original: ServerConfig, *, url: str, log_dir: Path, ready_timeout_s: float,
                 api_key: str | None = None, on_start: Callable[[int, int | None], None] | None = None,
                 extra_argv: tuple[str, ...] = ()) -> None:
        if not original.argv:
            raise InputError("--launch", "an empty command")
        self.original = original
        self.url = url
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.api_key = api_key
        self.on_start = on_start
        self.extra_argv = extra_argv  # run with every configuration, never part of one (the profiler's flags)
        self.log_path: Path | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def name(self) -> str:
        """The served model (``--model``, or the word after ``serve``), else the program."""
        argv = self.original.argv
        model = flag_values(argv).get("--model", [None])[-1] or next(
            (argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "serve"), None)
        return Path(model).name if model else Path(argv[0]).name

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def pid(self) -> int | None:
        """The running server's process (its own session: it outlives servescope when left running)."""
        return self._popen.pid if self.running() and self._popen is not None else None

    def start(self, config: ServerConfig, progress: Callable[[float, str], None] | None = None) -> Started:
        """Start ``config`` (stopping any server of ours first) and wait until it is ready or gone."""
        self.stop()
        self._starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"server-{self._starts}.log"
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            try:
                self._popen = subprocess.Popen([*config.argv, *self.extra_argv], env={**os.environ, **config.env},
                                               stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
            except OSError as exc:
                return Started(ok=False, reason=f"cannot run {config.argv[0]}: {exc.strerror or exc}",
                               seconds=time.monotonic() - began, log_tail=[])
        if self.on_start is not None:
            self.on_start(self._popen.pid, process_start_ticks(self._popen.pid))

        def said(elapsed_s: float, phase: str, detail: str | None) -> None:
            if progress is not None:
                progress(elapsed_s, phase if detail is None else f"{phase}: {detail}")

        health = check_health(HealthRequest(url=self.url, wait=True, timeout_s=self.ready_timeout_s, poll_s=1.0,
                                            api_key=self.api_key, pid=self._popen.pid, log_path=self.log_path),
                              progress=lambda e, p, d: said(e, p, d))
        seconds = time.monotonic() - began
        if health.ready:
            return Started(ok=True, reason="ready", seconds=seconds, log_tail=[])
        tail = read_log_tail(self.log_path, lines=30, secrets=[self.api_key])
        self.stop()
        return Started(ok=False, reason=f"{health.phase}: {_why(tail) or health.phase}", seconds=seconds,
                       log_tail=tail)

    def stop(self) -> None:
        if self._popen is not None:
            stop_session(self._popen.pid, popen=self._popen)
            self._popen = None

    def log_lines(self) -> list[str]:
        """The current server's whole log (the lines a change's evidence may quote)."""
        if self.log_path is None:
            return []
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []

    def restore(self) -> None:
        """The command line was never written anywhere: stopping the server is all there is to undo."""
        self.stop()


def _why(tail: list[str]) -> str | None:
    """The line of a failed start's log that says why: an error line, the last one."""
    for line in reversed(tail):
        low = line.lower()
        if "error" in low or "unrecognized arguments" in low or "out of memory" in low or "exception" in low:
            return line.strip()[:300]
    return tail[-1].strip()[:300] if tail else None
