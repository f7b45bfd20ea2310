"""Two analyses side by side: per rank, each category's time per step before and after, and findings.

Either side may be trace files / a directory (analyzed now) or a saved ``analyze --json`` document.
"""

from __future__ import annotations

from pathlib import Path

from servescope import __version__
from servescope.core.analysis import AnalysisDoc, Finding, PhaseStats, decode_analysis
from servescope.core.diff import CategoryDelta, DiffDoc, RankDiff
from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.steps import PHASES

__all__ = ["diff_analyses", "diff_paths", "load_side"]


def load_side(path: Path, *, taxonomy: Path | None = None) -> AnalysisDoc:
    """A saved analysis when ``path`` is one, else the analysis of the traces at ``path``."""
    if path.is_file() and path.name.endswith(".json") and not path.name.endswith(".trace.json"):
        head = path.read_bytes()[:4096]
        if b'"servescope.analysis"' in head:
            return decode_analysis(path.read_bytes(), str(path))
    return analyze(AnalyzeRequest(paths=[path], taxonomy=taxonomy))


def _delta(before: float, after: float) -> CategoryDelta:
    return CategoryDelta(before_us=before, after_us=after, delta_us=after - before,
                         delta_pct=100 * (after - before) / before if before else None)


def _rank_diff(rank: int, a: PhaseStats, b: PhaseStats) -> RankDiff:
    names = list(dict.fromkeys([*a.categories, *b.categories]))
    cats = {
        n: _delta(a.categories[n].per_step_us if n in a.categories else 0.0,
                  b.categories[n].per_step_us if n in b.categories else 0.0)
        for n in names
    }
    cats = dict(sorted(cats.items(), key=lambda item: -abs(item[1].delta_us)))
    return RankDiff(
        rank=rank, steps_before=a.steps, steps_after=b.steps,
        step_us=_delta(a.step_us.mean, b.step_us.mean),
        busy_us=_delta(a.busy_us_per_step, b.busy_us_per_step),
        idle_us=_delta(a.idle_us_per_step, b.idle_us_per_step),
        categories=cats,
    )


def _key(f: Finding) -> tuple[str, int | None, str | None]:
    return (f.id, f.rank, f.phase)


def diff_analyses(before: AnalysisDoc, after: AnalysisDoc, *, phase: str = "decode",
                  before_name: str = "before", after_name: str = "after") -> DiffDoc:
    """Per rank present in both, ``phase``'s time per step by category, before → after.

    Raises:
        InputError: ``phase`` is not a phase, or neither analysis has a step of it on a common rank.
    """
    _check_phase(phase)
    a = {r.rank: r.phases[phase] for r in before.ranks if phase in r.phases}
    b = {r.rank: r.phases[phase] for r in after.ranks if phase in r.phases}
    common = sorted(set(a) & set(b))
    if not common:
        have = sorted({p for doc in (before, after) for r in doc.ranks for p in r.phases})
        raise InputError(f"{before_name}, {after_name}",
                         f"no rank has {phase} steps in both (phases present: {', '.join(have) or 'none'})")
    old = {_key(f): f for f in before.findings}
    new = {_key(f): f for f in after.findings}
    return DiffDoc(
        servescope_version=__version__, before=before_name, after=after_name, phase=phase,
        ranks=[_rank_diff(r, a[r], b[r]) for r in common],
        ranks_only_before=sorted(set(a) - set(b)), ranks_only_after=sorted(set(b) - set(a)),
        findings_appeared=[f for k, f in new.items() if k not in old],
        findings_gone=[f for k, f in old.items() if k not in new],
    )


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise InputError("--phase", f"no phase {phase!r}: use one of {', '.join(PHASES)}")


def diff_paths(before: Path, after: Path, *, phase: str = "decode", taxonomy: Path | None = None) -> DiffDoc:
    """``diff_analyses`` of two traces / saved analyses given by path (the phase checked before either is read)."""
    _check_phase(phase)
    return diff_analyses(load_side(before, taxonomy=taxonomy), load_side(after, taxonomy=taxonomy), phase=phase,
                         before_name=str(before), after_name=str(after))
