"""How many CPUs this process may use: what the trace decoder and the load client size their processes by."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
