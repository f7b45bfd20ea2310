"""One look at the GPUs (NVML first, nvidia-smi as fallback), who holds their memory, and waiting
until it is free.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servescope.core.gpu import GpuProcess, GpuSnapshot
from servescope.gpu.errors import GpuUnavailable
from servescope.gpu.nvml import nvml_snapshot
from servescope.gpu.smi import smi_snapshot

__all__ = ["PREFER", "GpuMemoryUse", "WaitResult", "gpu_memory_holders", "memory_used_probe", "take_snapshot",
           "wait_until_gpu_memory_free"]

#: The allowed values of take_snapshot's `prefer`.
PREFER = ("nvml", "nvidia-smi")


def take_snapshot(*, prefer: str = "nvml") -> GpuSnapshot:
    """Every GPU, its memory holders and the topology, from NVML or else nvidia-smi.

    Args:
        prefer: the source to try first, "nvml" or "nvidia-smi"; the other is the fallback when the
            first is unavailable (GpuUnavailable). Other failures (GpuQueryError) are not retried.

    Raises:
        ValueError: `prefer` is not one of PREFER.
        GpuUnavailable: neither source works here; the message gives both reasons.

    Example:
        >>> snap = take_snapshot()                       # doctest: +SKIP
        >>> [(g.index, g.name, g.memory_used_mib) for g in snap.gpus]
        [(0, 'NVIDIA H200', 0)]
    """
    if prefer not in PREFER:
        raise ValueError(f"prefer={prefer!r}: allowed values are {', '.join(PREFER)}")
    order = [nvml_snapshot, smi_snapshot] if prefer == "nvml" else [smi_snapshot, nvml_snapshot]
    reasons = []
    for source in order:
        try:
            return source()
        except GpuUnavailable as err:
            reasons.append(str(err))
    raise GpuUnavailable("no GPU query works here: " + "; ".join(reasons))


def memory_used_probe(*, gpus: Sequence[int] | None = None,
                      snapshot: Callable[[], GpuSnapshot] = take_snapshot) -> Callable[[], int | None]:
    """A function that returns the memory used now on ``gpus`` (all when None), MiB, or None.

    For ``health --wait``: a loading model fills GPU memory. Once no source can read the GPUs (no driver,
    no GPU) the probe stops trying and answers None. Shell twin:
    ``nvidia-smi --query-gpu=index,memory.used --format=csv``.
    """
    broken = False

    def probe() -> int | None:
        nonlocal broken
        if broken:
            return None
        try:
            snap = snapshot()
        except GpuUnavailable:
            broken = True
            return None
        used = [g.memory_used_mib for g in snap.gpus if gpus is None or g.index in gpus]
        known = [u for u in used if u is not None]
        return sum(known) if known else None

    return probe


@dataclass(frozen=True, slots=True)
class GpuMemoryUse:
    """One GPU's memory and the processes holding it, biggest first.

    Attributes:
        used_mib: ``memory.used``; None when the GPU does not report it.
        total_mib: ``memory.total``.
        processes: from ``--query-compute-apps``; memory can be held by processes we cannot see
            (another container), so their sum may be below ``used_mib``.
    """

    gpu_index: int
    name: str | None
    used_mib: int | None
    total_mib: int | None
    processes: tuple[GpuProcess, ...]


def gpu_memory_holders(snapshot: GpuSnapshot) -> tuple[GpuMemoryUse, ...]:
    """Per GPU (index order), its used memory and the processes holding it, biggest holder first.

    Processes whose GPU the source did not say (gpu_index None) are left out.
    """
    uses = []
    for gpu in sorted(snapshot.gpus, key=lambda g: g.index):
        procs = [p for p in snapshot.processes if p.gpu_index == gpu.index]
        procs.sort(key=lambda p: (-(p.used_memory_mib or 0), p.pid))
        uses.append(GpuMemoryUse(gpu.index, gpu.name, gpu.memory_used_mib, gpu.memory_total_mib, tuple(procs)))
    return tuple(uses)


@dataclass(frozen=True, slots=True)
class WaitResult:
    """How a wait for free GPU memory ended (or stands, when handed to `progress`).

    Attributes:
        ready: every watched GPU had used memory below ``max_used_mib`` on the last poll.
        polls: how many snapshots were taken.
        waited_s: monotonic seconds from the first poll to the last.
        busy: the watched GPUs still at or above the limit (or not reporting used memory) on the last
            poll, with their holders; empty when ready.
        last: the last snapshot.
    """

    ready: bool
    max_used_mib: int
    polls: int
    waited_s: float
    busy: tuple[GpuMemoryUse, ...]
    last: GpuSnapshot

    def describe(self) -> str:
        """One line for a user: ready, or which GPUs still hold how much, and who holds it."""
        if self.ready:
            return f"GPU memory free (< {self.max_used_mib} MiB used on every GPU) after {self.waited_s:.1f} s"
        parts = []
        for use in self.busy:
            used = "unknown" if use.used_mib is None else f"{use.used_mib} MiB"
            holders = ", ".join(
                f"pid {p.pid} {p.process_name or '?'} "
                + ("N/A" if p.used_memory_mib is None else f"{p.used_memory_mib} MiB")
                for p in use.processes
            )
            parts.append(f"GPU{use.gpu_index} {used} used" + (f" by {holders}" if holders else " (no visible process)"))
        return (
            f"GPU memory not free after {self.waited_s:.1f} s ({self.polls} polls, limit {self.max_used_mib} MiB): "
            + "; ".join(parts)
        )


def wait_until_gpu_memory_free(
    max_used_mib: int,
    timeout_s: float,
    poll_s: float,
    *,
    gpu_indices: Sequence[int] | None = None,
    query: Callable[[], GpuSnapshot] = take_snapshot,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[WaitResult], None] | None = None,
) -> WaitResult:
    """Poll until every GPU's used memory (``nvidia-smi --query-gpu=memory.used``) is below `max_used_mib`.

    Returns at the first poll where all watched GPUs are below the limit (ready), or at the first
    poll at or past `timeout_s` (not ready: ``busy`` names each GPU, its used MiB and its holders).
    A GPU that does not report used memory counts as busy. `progress`, when given, gets the
    interim result after every poll, so a wait is never silent.

    Args:
        max_used_mib: the limit; a GPU counts as free when its used memory is strictly below it.
        timeout_s: how long to keep polling, monotonic seconds; 0 polls once.
        poll_s: seconds between polls.
        gpu_indices: watch only these GPUs (NVML indices); None watches all.

    Raises:
        ValueError: a negative limit or timeout, a poll interval <= 0, or a GPU index not present.
        GpuUnavailable: the snapshot has no GPU at all.

    Example:
        >>> result = wait_until_gpu_memory_free(1024, 600, 5)   # doctest: +SKIP
        >>> result.ready, result.describe()
    """
    if max_used_mib < 0:
        raise ValueError(f"max_used_mib={max_used_mib}: must be >= 0")
    if timeout_s < 0:
        raise ValueError(f"timeout_s={timeout_s}: must be >= 0")
    if poll_s <= 0:
        raise ValueError(f"poll_s={poll_s}: must be > 0")
    start = clock()
    polls = 0
    while True:
        snapshot = query()
        polls += 1
        uses = gpu_memory_holders(snapshot)
        if not uses:
            raise GpuUnavailable(f"no GPU found ({snapshot.source})")
        if gpu_indices is not None:
            present = {u.gpu_index for u in uses}
            missing = sorted(set(gpu_indices) - present)
            if missing:
                raise ValueError(f"GPU index {missing} not present; allowed: {sorted(present)}")
            uses = tuple(u for u in uses if u.gpu_index in set(gpu_indices))
        busy = tuple(u for u in uses if u.used_mib is None or u.used_mib >= max_used_mib)
        elapsed = clock() - start
        result = WaitResult(not busy, max_used_mib, polls, elapsed, busy, snapshot)
        if progress is not None:
            progress(result)
        if not busy or elapsed >= timeout_s:
            return result
        sleep(min(poll_s, timeout_s - elapsed))
