"""Is the server process alive? One query for ``/proc/PID`` and one for a systemd unit, plus its log tail.

Shell twins::

    cat /proc/PID/stat                      # field 3: state (Z = zombie), field 22: start time
    systemctl show -p MainPID,ActiveState,SubState NAME
    journalctl -u NAME -n 20 --no-pager -o cat
    tail -n 20 LOG
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from servescope.core.engines import Engine, detect_engine, engine
from servescope.core.errors import InputError
from servescope.core.health import ProcessInfo
from servescope.core.redact import redact
from servescope.core.settings import ProcessRecord, ProcessSeen

__all__ = ["find_processes", "is_local_url", "local_server", "process_start_ticks", "read_log_tail", "read_process",
           "read_process_record", "read_unit", "read_unit_log_tail", "serving_engine"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TAIL_BYTES = 64 * 1024
_UNIT_TIMEOUT_S = 10.0
Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def read_process(pid: int, *, proc: Path = Path("/proc"), start_ticks: int | None = None) -> ProcessInfo:
    """The state of process ``pid`` from ``/proc/PID/stat``; a zombie or a missing pid is not alive.

    Args:
        start_ticks: the process start time (``stat`` field 22) seen earlier; a different one means
            the pid was reused by another process, so the one we watched is gone.
    """
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ProcessInfo(pid=pid, alive=False, detail=f"no process {pid}")
    except OSError as exc:
        return ProcessInfo(pid=pid, alive=False, detail=f"cannot read /proc/{pid}/stat: {exc.strerror}")
    # comm (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(")") + 2:].split()
    state = fields[0]
    ticks = int(fields[19]) if len(fields) > 19 else None
    if start_ticks is not None and ticks is not None and ticks != start_ticks:
        return ProcessInfo(pid=pid, alive=False, detail=f"process {pid} exited (the pid now belongs to another)")
    if state in ("Z", "X"):
        status = int(fields[49]) if len(fields) > 49 else None  # field 52, exit_code (Linux 3.5+)
        return ProcessInfo(pid=pid, alive=False, state=state, exit_status=status,
                           detail=f"process {pid} exited ({_describe_wait_status(status)}; a zombie)")
    return ProcessInfo(pid=pid, alive=True, state=state, detail=f"process {pid} is running (state {state})")


def process_start_ticks(pid: int, *, proc: Path = Path("/proc")) -> int | None:
    """``/proc/PID/stat`` field 22 (start time in clock ticks), or None when the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else None


def _describe_wait_status(status: int | None) -> str:
    if status is None:
        return "exit status not available"
    if status & 0x7F:
        return f"killed by signal {status & 0x7F}"
    return f"exit code {(status >> 8) & 0xFF}"


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=_UNIT_TIMEOUT_S, check=False)


def read_unit(unit: str, *, run: Runner = _run) -> ProcessInfo:
    """The state of systemd unit ``unit``: alive while ``activating``/``active`` (or reloading).

    ``failed``, ``inactive`` and ``deactivating`` count as not alive (a stopped or crashed server).

    Raises:
        InputError: systemctl is not installed, or cannot answer (no systemd as init, no such bus).
    """
    if shutil.which("systemctl") is None:
        raise InputError("--unit", "systemctl not found: --unit needs systemd; use --pid PID instead")
    try:
        done = run(["systemctl", "show", "-p", "MainPID,ActiveState,SubState,LoadState", unit])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError("--unit", f"systemctl show {unit} failed: {exc}") from None
    if done.returncode != 0:
        why = " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
        raise InputError("--unit", f"systemctl show {unit} failed: {why}")
    props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if props.get("LoadState") == "not-found":
        raise InputError("--unit", f"no systemd unit {unit!r}")
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    pid = int(props.get("MainPID", "0") or 0) or None
    alive = active in ("active", "activating", "reloading")
    return ProcessInfo(pid=pid, alive=alive, state=f"{active}/{sub}", unit=unit,
                       detail=f"unit {unit} is {active} ({sub})" + (f", main pid {pid}" if pid else ""))


def read_log_tail(path: Path, *, lines: int = 20, secrets: Sequence[str | None] = ()) -> list[str]:
    """The last ``lines`` non-empty lines of the log file ``path``, without colour codes, redacted.

    Reads only the file's last 64 KiB; a missing or unreadable log gives ``[]``.
    """
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - _TAIL_BYTES))
            data = handle.read()
    except OSError:
        return []
    return _clean(data.decode("utf-8", "replace").replace("\r", "\n").splitlines(), lines, secrets)


def read_unit_log_tail(unit: str, *, lines: int = 20, secrets: Sequence[str | None] = (),
                       run: Runner = _run) -> list[str]:
    """The last ``lines`` journal lines of ``unit`` (``journalctl -u``), or ``[]`` when there is no journal."""
    if shutil.which("journalctl") is None:
        return []
    try:
        done = run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"])
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return _clean(done.stdout.splitlines(), lines, secrets)


def _clean(raw: Sequence[str], lines: int, secrets: Sequence[str | None]) -> list[str]:
    kept = [redact(_ANSI.sub("", line).rstrip(), secrets) for line in raw]
    kept = [line for line in kept if line.strip()]
    return kept[-lines:] if lines > 0 else []


def _stat_fields(stat: str) -> list[str]:
    """``/proc/PID/stat`` fields from field 3 (state) on; comm (field 2) may hold spaces and parentheses."""
    return stat[stat.rindex(")") + 2:].split()


def _split_nul(data: bytes) -> list[str]:
    return [part.decode("utf-8", "replace") for part in data.split(b"\0") if part]


_CAP_SYS_PTRACE = 19
_WHOLE_UID_MAP = ["0", "0", "4294967295"]  # /proc/self/uid_map of the initial user namespace


def _status_field(path: Path, key: str) -> str | None:
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(f"{key}:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _environ_denied(pid: int, where: Path) -> str:
    """Why the kernel would not show ``/proc/PID/environ``, as far as this process can tell (what to do, too).

    The kernel shows it to a caller that may ptrace the process (``PTRACE_MODE_READ``): the same user when
    the process is dumpable, else one with ``CAP_SYS_PTRACE`` over it; root without that capability (a
    container), or root of a user namespace over a process outside it, is refused like anyone.
    """
    euid = os.geteuid()
    owner = _status_field(where / "status", "Uid")
    owner_uid = int(owner.split()[0]) if owner and owner.split()[0].isdigit() else None
    if euid != 0:
        if owner_uid is not None and owner_uid != euid:
            return (f"permission denied: process {pid} belongs to uid {owner_uid}, not to you (uid {euid}); "
                    "run as root or as the service's user")
        return (f"permission denied though process {pid} is yours: it is not dumpable (setuid, or "
                "prctl(PR_SET_DUMPABLE, 0)) or ptrace is restricted (Yama ptrace_scope); run as root")
    reasons = []
    caps = _status_field(Path("/proc/self/status"), "CapEff")
    if caps is not None and not int(caps, 16) >> _CAP_SYS_PTRACE & 1:
        reasons.append("this root lacks CAP_SYS_PTRACE (a container that drops it: add it, or run on the host)")
    try:
        in_namespace = Path("/proc/self/uid_map").read_text().split() != _WHOLE_UID_MAP
    except OSError:
        in_namespace = False
    if in_namespace:
        reasons.append("this root is root of a user namespace only, with no privilege over processes outside it")
    if not reasons:
        reasons.append("neither a missing capability nor a user namespace explains it: a security module "
                       "(AppArmor, SELinux, Yama) or a process that made itself undumpable")
    return f"permission denied to root: the kernel withholds process {pid}'s environment; " + "; ".join(reasons)


def read_process_record(pid: int, *, proc: Path = Path("/proc")) -> ProcessRecord:
    """The command line, environment, start time, user and working folder of process ``pid``.

    Shell twins: ``tr '\\0' ' ' < /proc/PID/cmdline``, ``tr '\\0' '\\n' < /proc/PID/environ``,
    ``ps -o lstart= -p PID``. The start time is ``stat`` field 22 (clock ticks after boot) placed on the
    wall clock through ``CLOCK_BOOTTIME`` (the clock the kernel counts it on), good to ~10 ms.

    Raises:
        InputError: no such process, a kernel thread (no command line), or ``environ`` not readable
            (another user's process: run as root or as the service's user).
    """
    where = proc / str(pid)
    try:
        stat = (where / "stat").read_text(encoding="utf-8", errors="replace")
        argv = _split_nul((where / "cmdline").read_bytes())
    except FileNotFoundError:
        raise InputError(f"--pid {pid}", "no such process") from None
    except OSError as exc:
        raise InputError(f"/proc/{pid}", f"cannot read: {exc.strerror or exc}") from None
    if not argv:
        raise InputError(f"--pid {pid}", "no command line (a kernel thread or a zombie), not a server")
    try:
        env_words = _split_nul((where / "environ").read_bytes())
    except PermissionError:
        raise InputError(f"/proc/{pid}/environ", _environ_denied(pid, where)) from None
    except OSError as exc:
        raise InputError(f"/proc/{pid}/environ", f"cannot read: {exc.strerror or exc}") from None
    env: dict[str, str] = {}
    for word in env_words:
        name, sep, value = word.partition("=")
        if sep:
            env[name] = value
    fields = _stat_fields(stat)
    ppid = int(fields[1]) if len(fields) > 1 else None
    start_time = None
    if len(fields) > 19:
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        start_time = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    uid = None
    try:
        for line in (where / "status").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        cwd: str | None = os.readlink(where / "cwd")
    except OSError:
        cwd = None
    return ProcessRecord(pid=pid, ppid=ppid, argv=argv, env=env, start_time=start_time, uid=uid, cwd=cwd)


def find_processes(match: Callable[[list[str]], bool], *, proc: Path = Path("/proc")) -> list[ProcessSeen]:
    """Every process whose command line ``match`` accepts, by pid (``ps -eo pid,ppid,args | grep ...``).

    Processes that exit while we look, or that we may not read, are left out.
    """
    found: list[ProcessSeen] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = _split_nul((entry / "cmdline").read_bytes())
            if not argv or not match(argv):
                continue
            fields = _stat_fields((entry / "stat").read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError):
            continue
        found.append(ProcessSeen(pid=int(entry.name), ppid=int(fields[1]) if len(fields) > 1 else None,
                                 argv=argv))
    return sorted(found, key=lambda seen: seen.pid)


def is_local_url(url: str) -> bool:
    """True when ``url``'s host is this machine (loopback, or one of its own names/addresses)."""
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "::1") or host.startswith("127."):
        return True
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    if host in names:
        return True
    try:
        own = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return host in own


def serving_engine(argv: list[str], port: int) -> Engine | None:
    """The engine (``data/engines.toml``) that ``argv`` runs on ``port``, else None."""
    found = detect_engine(argv)
    for i, arg in enumerate(argv if found is not None else ()):
        if arg == f"--port={port}" or (arg == "--port" and i + 1 < len(argv) and argv[i + 1] == str(port)):
            return engine(found[0]) if found is not None else None
    return None


def local_server(url: str, proc: Path = Path("/proc")) -> ProcessRecord | None:
    """The process serving ``url``'s port on this machine (the lowest pid of those that do), else None."""
    try:
        port = urlsplit(url).port
    except ValueError:  # not a URL: no process serves it (the client says what is wrong with it)
        return None
    if port is None or not is_local_url(url):
        return None
    pids = [p.pid for p in find_processes(lambda argv: serving_engine(argv, port) is not None, proc=proc)]
    try:
        return read_process_record(min(pids), proc=proc) if pids else None
    except (OSError, InputError):
        return None
