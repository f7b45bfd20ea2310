"""systemctl, the one place servescope calls it: ``systemctl start|stop|daemon-reload|show``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from servescope.core.errors import ServescopeError

__all__ = ["STATUS_PROPERTIES", "SystemctlError", "run_systemctl", "show_unit"]

#: What ``service status`` reads (``systemctl show NAME -p ...``).
STATUS_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts",
                     "ExecMainStartTimestamp", "FragmentPath", "TimeoutStartUSec")


class SystemctlError(ServescopeError):
    """systemctl is missing or a systemctl command failed (its stderr in the message)."""


def run_systemctl(args: Sequence[str], *, timeout_s: float | None = None) -> str:
    """``systemctl ARGS``: its stdout; SystemctlError when missing, non-zero or past ``timeout_s``."""
    binary = shutil.which("systemctl")
    if binary is None:
        raise SystemctlError("systemctl not found on PATH (is this a systemd machine?)")
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SystemctlError(f"systemctl {' '.join(args)}: no answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise SystemctlError(f"systemctl {' '.join(args)} failed (exit {done.returncode}): "
                             + (why[-1] if why else "no message"))
    return done.stdout


def show_unit(name: str, properties: Sequence[str] = STATUS_PROPERTIES) -> dict[str, str]:
    """``systemctl show NAME -p P1,P2``: property → value ("" where systemd has none)."""
    text = run_systemctl(["show", name, "-p", ",".join(properties)])
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value
    return values
