"""Whether the server being profiled was profiled before: rank traces in its profiler directory written since its
process started. A vLLM server stays slower after its first profile wherever the host's time shows in the step
(on the lent H100 by 5-26%, lasting; docs/measurements.md), so the runs without the profiler of a server profiled
before carry that slowdown, and are not its production step."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["earlier_profile_note"]


def earlier_profile_note(traces: Mapping[Path, tuple[int, int]], started: float | None) -> str | None:
    """One sentence naming the traces ``traces`` (path -> (size, mtime in ns), as found before this run) written
    since the server started (``started``, epoch seconds); None where none were, or the start is not known."""
    if started is None:
        return None
    since = sorted((mtime / 1e9, path) for path, (_, mtime) in traces.items() if mtime / 1e9 >= started)
    if not since:
        return None
    when = time.strftime("%H:%M:%S", time.localtime(since[-1][0]))
    return (f"this server was profiled before this run ({len(since)} trace file(s) in {since[-1][1].parent} written "
            f"since it started, the last at {when}): a vLLM server stays slower after its first profile, so its "
            f"runs without the profiler carry that; restart it and profile again for its production step")
