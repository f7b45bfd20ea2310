"""Group trace files into one run by rank, and compare ranks.

A file's rank comes from the trace's own ``distributedInfo.rank``, else from its name (``rank3``,
``rank-3``, ``_rank3``, ``tp0…rank3``, SGLang's ``TP-3``: the ``[[rank_name]]`` formats of
``servescope/data/steps.toml``). vLLM's API-server trace (``*.async_llm.*``, a ``[[frontend]]`` format there, or
among other traces one without rank and without any kernel, CPU op or annotation, whatever its name) has no
rank: it is the front end, listed but never taken for rank 0.

Across ranks, a collective finishes on every rank at about the same moment, so a rank that arrives
early sees its collective kernel stretch while it waits for the slowest one. Matching the k-th
collective of a step on every rank, the shortest of them is the transfer itself; what a rank spends
beyond that is **waiting** for the slowest rank.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import msgspec
import numpy as np

from servescope.core.analysis import CrossRankCategory, CrossRankStats, PhaseStats, Summary
from servescope.core.errors import InputError
from servescope.trace.read.table import TraceData
from servescope.trace.steps.breakdown import RankBreakdown
from servescope.trace.steps.formats import step_formats

__all__ = [
    "RankedTrace", "assign_ranks", "compare_ranks", "is_frontend", "rank_from_name",
]

class RankedTrace(msgspec.Struct, frozen=True):
    data: TraceData
    rank: int | None
    role: str  # "worker" | "frontend"
    rank_source: str


def is_frontend(path: Path) -> bool:
    """True for a front end's trace by its name: vLLM's API server's
    (``{host}_{pid}.async_llm.{ns}.pt.trace.json.gz``)."""
    return any(f.contains in path.name for f in step_formats().frontends)


def _holds_no_work(data: TraceData) -> bool:
    """No kernel, no CPU op, no annotation: vLLM's API-server trace whatever its file is called (it runs no torch
    ops; with stacks on it holds python frames only)."""
    return not (len(data.device) or len(data.cpu_ops) or len(data.annotations))


def rank_from_name(name: str) -> int | None:
    """The rank a file name states (``rank3``, ``rank-3``, ``tp0_pp0_rank3``, ``TP-3``), if any."""
    for fmt in step_formats().rank_names:
        matches = fmt.pattern.findall(name)
        if matches:
            return int(matches[-1])
    return None


def assign_ranks(traces: list[TraceData]) -> list[RankedTrace]:
    """Rank and role of every trace of one run.

    Raises:
        InputError: two traces claim the same rank, or several traces have no rank at all.
    """
    ranked: list[RankedTrace] = []
    for data in traces:
        info = data.distributed or {}
        if "rank" not in info and (is_frontend(data.path) or (len(traces) > 1 and _holds_no_work(data))):
            ranked.append(RankedTrace(data, None, "frontend", "none"))
        elif isinstance(info.get("rank"), int):
            ranked.append(RankedTrace(data, int(info["rank"]), "worker", "distributedInfo"))
        elif (by_name := rank_from_name(data.path.name)) is not None:
            ranked.append(RankedTrace(data, by_name, "worker", "filename"))
        else:
            ranked.append(RankedTrace(data, None, "worker", "none"))
    workers = [r for r in ranked if r.role == "worker"]
    rankless = [r for r in workers if r.rank is None]
    if rankless and len(workers) > 1:
        names = ", ".join(r.data.path.name for r in rankless)
        raise InputError(names, "cannot tell which rank this trace is (no distributedInfo.rank, no rankN in "
                                "the name); analyze it on its own or rename it")
    if rankless:
        only = rankless[0]
        ranked[ranked.index(only)] = RankedTrace(only.data, 0, "worker", "only file")
    seen: dict[int, Path] = {}
    for r in ranked:
        if r.rank is not None:
            if r.rank in seen:
                raise InputError(str(r.data.path), f"rank {r.rank} again (also {seen[r.rank]}); "
                                                   "traces of different runs? analyze them separately")
            seen[r.rank] = r.data.path
    return ranked


def _spread(values: dict[int, float]) -> CrossRankCategory:
    ranks = sorted(values, key=lambda r: values[r])
    return CrossRankCategory(
        min_us=values[ranks[0]], median_us=float(statistics.median(values.values())), max_us=values[ranks[-1]],
        min_rank=ranks[0], max_rank=ranks[-1],
    )


def compare_ranks(per_rank: dict[int, RankBreakdown]) -> list[CrossRankStats]:
    """Per phase on two or more ranks: category spread per step and collective waiting per rank."""
    if len(per_rank) < 2:
        return []
    out: list[CrossRankStats] = []
    phase_names = dict.fromkeys(p for b in per_rank.values() for p in b.phases)
    for phase in phase_names:
        present = {r: b for r, b in per_rank.items() if phase in b.phases}
        if len(present) < 2:
            continue
        stats: dict[int, PhaseStats] = {r: b.phases[phase] for r, b in present.items()}
        categories = dict.fromkeys(c for s in stats.values() for c in s.categories)
        spread = {
            c: _spread({r: s.categories[c].per_step_us if c in s.categories else 0.0 for r, s in stats.items()})
            for c in categories
        }
        steps = {r: [i for i, row in enumerate(b.steps) if row.phase == phase] for r, b in present.items()}
        n = min(len(v) for v in steps.values())
        wait = dict.fromkeys(present, 0.0)
        coll = dict.fromkeys(present, 0.0)
        skews: list[float] = []
        for k in range(n):
            comms = {r: present[r].step_comm[steps[r][k]] for r in present}
            for r, c in comms.items():
                coll[r] += float(c.dur_us.sum())
            counts = {len(c.dur_us) for c in comms.values()}
            if len(counts) != 1 or counts == {0}:
                continue  # ranks ran different collectives in this step: nothing to match
            durs = np.vstack([comms[r].dur_us for r in present])
            starts = np.vstack([comms[r].start_us for r in present])
            shortest = durs.min(axis=0)
            for i, r in enumerate(present):
                wait[r] += float((durs[i] - shortest).sum())
            skews.extend((starts.max(axis=0) - starts.min(axis=0)).tolist())
        per_step = max(n, 1)
        out.append(CrossRankStats(
            phase=phase,
            ranks=sorted(present),
            steps_compared=n,
            categories=spread,
            step_us=_spread({r: s.step_us.mean for r, s in stats.items()}),
            collective_us_per_step={str(r): coll[r] / per_step for r in sorted(present)},
            collective_wait_us_per_step={str(r): wait[r] / per_step for r in sorted(present)},
            collective_wait_share={str(r): (wait[r] / coll[r] if coll[r] else 0.0) for r in sorted(present)},
            collective_start_skew_us=(Summary(mean=float(np.mean(skews)), median=float(statistics.median(skews)))
                                      if skews else None),
        ))
    return out
