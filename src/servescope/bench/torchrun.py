"""One torchrun of ``bench comm``'s workers: started in a session of its own, watched for the curves rank 0
finishes, stopped on Ctrl-C or at its timeout (SIGTERM, then SIGKILL), and a failure named by its first error line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servescope.core.errors import InputError

__all__ = ["read_raw", "run_torchrun"]


def run_torchrun(cmd: list[str], env: dict[str, str], raw_path: Path, *, timeout_s: float, source: str,
                 on_curve: Callable[[str], None] | None = None) -> None:
    """Run ``cmd`` (torchrun of the workers that write their results to ``raw_path``) to its end.

    ``on_curve``: called with each op's name as rank 0 finishes its curve (its file is looked at every second).

    Raises:
        InputError: (naming ``source``) a worker failed (the first rank's error line), or no result came within
            ``timeout_s`` and the workers were stopped.
    """
    log_path = raw_path.with_suffix(".log")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = _wait(proc, raw_path, timeout_s, on_curve)
        except BaseException:          # Ctrl-C or timeout: torchrun ends its workers on SIGTERM
            _stop(proc)
            if isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise InputError(source, f"no result within {timeout_s:.0f} s; workers stopped") from None
            raise
    if rc != 0:
        raise InputError(source, _failure_line(raw_path, log_path, rc))


def read_raw(path: Path) -> dict[str, Any] | None:
    """The results rank 0 wrote so far, or None where it wrote none (or half a file)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data


def _wait(proc: subprocess.Popen[bytes], raw_path: Path, timeout_s: float,
          on_curve: Callable[[str], None] | None) -> int:
    """``proc.wait(timeout_s)``, reporting finished curves meanwhile.

    Raises:
        subprocess.TimeoutExpired: as ``proc.wait`` does.
    """
    if on_curve is None:
        return proc.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    reported = 0
    while True:
        try:
            rc = proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            reported = _new_curves(raw_path, reported, on_curve)
            continue
        _new_curves(raw_path, reported, on_curve)
        return rc


def _new_curves(raw_path: Path, reported: int, on_curve: Callable[[str], None]) -> int:
    """Report the curves rank 0 has written since ``reported`` (it rewrites its file after each); the new count."""
    raw = read_raw(raw_path)
    curves = raw.get("curves", []) if raw else []
    for c in curves[reported:]:
        on_curve(f"{c['op']}{' [graph]' if c.get('graph') else ''}{' failed' if c.get('error') else ''}")
    return max(reported, len(curves))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 40.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _failure_line(raw_path: Path, log_path: Path, rc: int) -> str:
    errs = sorted(raw_path.parent.glob(raw_path.name + ".rank*.err"))
    for err in errs:
        try:
            return "worker failed: " + str(json.loads(err.read_text(encoding="utf-8"))["error"])
        except (OSError, json.JSONDecodeError, KeyError):
            continue
    try:
        lines = [ln.strip() for ln in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        lines = []
    lines = [ln for ln in lines if ln and "warn" not in ln.lower()]
    return f"torchrun exited {rc}" + (f": {lines[-1][:300]}" if lines else "")
