"""Who holds GPU memory: per GPU the processes, their MiB, and (for processes of this host) user and
command line from /proc, secrets redacted.
"""

from __future__ import annotations

import os
import pwd
import shlex
from dataclasses import dataclass
from pathlib import Path

from servescope.core.gpu import GpuProcess, GpuSnapshot
from servescope.core.redact import redact
from servescope.gpu.errors import GpuUnavailable
from servescope.gpu.inventory import gpu_memory_holders, take_snapshot

__all__ = ["GpuHolders", "Holder", "HoldersReport", "find_gpu_holders", "proc_owner", "read_gpu_holders"]

PROC = Path("/proc")
_COMM_LEN = 15  # /proc/PID/comm keeps the first 15 bytes of the name


@dataclass(frozen=True, slots=True)
class Holder:
    """A process holding memory on one GPU (``nvidia-smi --query-compute-apps=pid,process_name,used_memory``).

    Attributes:
        name: the name NVML or nvidia-smi gives (often the executable's path).
        used_mib: None where the driver does not report it (e.g. inside some containers).
        user: the owner, from /proc; None when the pid is not a process of this host's /proc (another
            container or pid namespace) or cannot be read.
        cmdline: ``/proc/PID/cmdline`` joined with shell quoting, secrets redacted; None as for user.
    """

    pid: int
    name: str | None
    used_mib: int | None
    user: str | None
    cmdline: str | None


@dataclass(frozen=True, slots=True)
class GpuHolders:
    """One GPU's memory and who holds it, biggest holder first.

    Attributes:
        used_mib: ``memory.used``; None when the GPU does not report it.
        total_mib: ``memory.total``.
        held_mib: the holders' MiB summed (0 with no holder); None when holders exist but none reports
            its MiB. Can be below ``used_mib``: the driver's own use, and processes we cannot see.
    """

    gpu_index: int
    name: str | None
    used_mib: int | None
    total_mib: int | None
    held_mib: int | None
    holders: tuple[Holder, ...]


@dataclass(frozen=True, slots=True)
class HoldersReport:
    """Per GPU (index order) its holders; ``unplaced``: holders whose GPU the source did not say."""

    source: str
    taken_at: str
    gpus: tuple[GpuHolders, ...]
    unplaced: tuple[Holder, ...] = ()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, not ours to read, or no such pid here
        return None


def _same_program(name: str, argv: list[str], comm: str | None, exe: str | None) -> bool:
    """Whether the process in /proc is the one the GPU source named (pids of another namespace differ)."""
    want = os.path.basename(name)
    have = {os.path.basename(a) for a in (argv[:1] + ([exe] if exe else [])) if a}
    if want in have:
        return True
    return comm is not None and (comm == want or (len(comm) == _COMM_LEN and want.startswith(comm)))


def proc_owner(pid: int, name: str | None = None, *, proc: Path = PROC) -> tuple[str | None, str | None]:
    """(user, redacted command line) of `pid` from /proc; (None, None) when it is not readable there.

    Shell twin: ``ps -o user=,args= -p PID``. When `name` (the GPU source's process name) is given and
    the process at that pid runs another program, the pid belongs to another pid namespace (a container):
    (None, None), rather than another process's details.
    """
    base = proc / str(pid)
    raw = _read(base / "cmdline")
    if raw is None:
        return None, None
    argv = [a.decode("utf-8", errors="replace") for a in raw.split(b"\0") if a]
    if name:
        comm_raw = _read(base / "comm")
        comm = comm_raw.decode("utf-8", errors="replace").strip() if comm_raw is not None else None
        try:
            exe: str | None = os.readlink(base / "exe")
        except OSError:
            exe = None
        if not _same_program(name, argv, comm, exe):
            return None, None
    try:
        uid = (base).stat().st_uid
    except OSError:
        return None, None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)  # a uid without a passwd entry (container user)
    return user, redact(shlex.join(argv)) if argv else None


def _holder(proc: GpuProcess, root: Path) -> Holder:
    user, cmdline = proc_owner(proc.pid, proc.process_name, proc=root)
    return Holder(proc.pid, proc.process_name, proc.used_memory_mib, user, cmdline)


def find_gpu_holders(snapshot: GpuSnapshot, *, proc: Path = PROC) -> HoldersReport:
    """Per GPU its used memory, its holders (biggest first, with user and command line where /proc has
    them) and their total, from one snapshot."""
    gpus = []
    for use in gpu_memory_holders(snapshot):
        holders = tuple(_holder(p, proc) for p in use.processes)
        known = [h.used_mib for h in holders if h.used_mib is not None]
        held = sum(known) if known or not holders else None
        gpus.append(GpuHolders(use.gpu_index, use.name, use.used_mib, use.total_mib, held, holders))
    unplaced = tuple(_holder(p, proc) for p in snapshot.processes if p.gpu_index is None)
    return HoldersReport(snapshot.source, snapshot.taken_at, tuple(gpus), unplaced)


def read_gpu_holders(*, prefer: str = "nvml", proc: Path = PROC) -> HoldersReport:
    """The processes holding memory on this host's GPUs, NVML first, nvidia-smi as fallback.

    Raises:
        ValueError: `prefer` is not "nvml" or "nvidia-smi".
        GpuUnavailable: no GPU query works here, or it finds no GPU.
        GpuQueryError: a query failed.

    Example:
        >>> [(g.gpu_index, g.held_mib) for g in read_gpu_holders().gpus]   # doctest: +SKIP
        [(0, 12858)]
    """
    snapshot = take_snapshot(prefer=prefer)
    if not snapshot.gpus:
        raise GpuUnavailable(f"no GPU found ({snapshot.source})")
    return find_gpu_holders(snapshot, proc=proc)
