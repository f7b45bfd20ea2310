"""A recorded vLLM server's ``/metrics``, saved before and after a run (``metrics-RUN-before.txt.gz`` /
``-after.txt.gz``), read with plain parsing: what its counters moved by over the run, for tests that hold a
client's figures against the server's own."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

_SAMPLE = re.compile(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)$")


def metrics(data: Path, run: str, when: str) -> dict[str, float]:
    """Each metric's value summed over its label sets (histogram buckets left out)."""
    out: dict[str, float] = {}
    for line in gzip.decompress((data / f"metrics-{run}-{when}.txt.gz").read_bytes()).decode().splitlines():
        m = _SAMPLE.match(line)
        if m is None or "le=" in (m.group(2) or ""):
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def served(data: Path, run: str) -> dict[str, float]:
    """What the server's counters moved by over the run."""
    before, after = metrics(data, run, "before"), metrics(data, run, "after")
    return {k: after[k] - before.get(k, 0.0) for k in after}


def server_mean_ms(data: Path, run: str, histogram: str) -> float:
    """The mean of one of the server's histograms (in seconds) over the run, in ms."""
    moved = served(data, run)
    return 1e3 * moved[f"{histogram}_sum"] / moved[f"{histogram}_count"]
