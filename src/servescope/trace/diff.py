"""Two analyses side by side: per rank, each category's time per step before and after, and findings.

Either side may be trace files / a directory (analyzed now) or a saved ``analyze --json`` document.
"""

from __future__ import annotations

from pathlib import Path

from servescope import __version__
from servescope.core.analysis import AnalysisDoc, Finding, PhaseStats, decode_analysis
from servescope.core.diff import CategoryDelta, DiffDoc, PredictionCheck, RankDiff, SettingChange
from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.read.files import find_traces
from servescope.trace.rules.advice import step_cycle_us
from servescope.trace.rules.deployment import evidence_beside
from servescope.trace.steps.find import PHASES

__all__ = ["check_predictions", "diff_analyses", "diff_paths", "load_side", "measured_cycle", "setting_changes"]


def load_side(path: Path, *, taxonomy: Path | None = None) -> AnalysisDoc:
    """A saved analysis when ``path`` is one, else the analysis of the traces at ``path``."""
    if path.is_file() and path.name.endswith(".json") and not path.name.endswith(".trace.json"):
        head = path.read_bytes()[:4096]
        if b'"servescope.analysis"' in head:
            return decode_analysis(path.read_bytes(), str(path))
    discovery = find_traces([path])
    evidence = evidence_beside(discovery)  # the server's settings and unprofiled step, where saved beside
    return analyze(AnalyzeRequest(paths=discovery, taxonomy=taxonomy, settings=evidence.settings,
                                  reference=evidence.reference))


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


def _cycle(doc: AnalysisDoc, phase: str) -> float | None:
    """The phase's mean step plus the host gap before the next, on the slowest rank (µs)."""
    cycles = [step_cycle_us(rows) for r in doc.ranks if (rows := [s for s in r.steps if s.phase == phase])]
    return max(cycles) if cycles else None


def measured_cycle(before: AnalysisDoc, after: AnalysisDoc, phase: str) -> tuple[CategoryDelta | None, str | None]:
    """The step cycle before → after: the steps timed without the profiler where both sides were (decode),
    else the traced cycles."""
    if phase == "decode" and before.unprofiled is not None and after.unprofiled is not None:
        return (_delta(before.unprofiled.step_us, after.unprofiled.step_us),
                f"without the profiler: {before.unprofiled.source}")
    a, b = _cycle(before, phase), _cycle(after, phase)
    if a is None or b is None:
        return None, None
    return _delta(a, b), "the traced step plus the host gap after it (stretched by the profiler)"


def setting_changes(before: AnalysisDoc, after: AnalysisDoc) -> list[SettingChange]:
    """The deployment settings whose value differs between the two sides (either side's best source)."""
    out = []
    for sid in dict.fromkeys([*before.deployment, *after.deployment]):
        a, b = before.deployment.get(sid), after.deployment.get(sid)
        va, vb = (a.value if a else None), (b.value if b else None)
        if va != vb and sid not in ("max_num_batched_tokens", "max_num_seqs"):  # bounds seen, not settings made
            out.append(SettingChange(setting=sid, before=va, after=vb))
    return out


def check_predictions(before: AnalysisDoc, phase: str, saving_us: float,
                      changed: list[SettingChange]) -> list[PredictionCheck]:
    """Each piece of the before side's advice for ``phase`` that predicted a saving, against the measured one."""
    moved = {c.setting for c in changed}
    out = []
    for f in before.findings:
        if f.phase != phase:
            continue
        for a in f.advice:
            if a.gain is None:
                continue
            outcome = ("held" if a.gain.low_us <= saving_us <= a.gain.high_us
                       else "short" if saving_us < a.gain.low_us else "exceeded")
            out.append(PredictionCheck(finding=f.id, advice=a.text, setting=a.setting,
                                       applied=a.setting is not None and a.setting in moved, low_us=a.gain.low_us,
                                       high_us=a.gain.high_us, measured_saving_us=saving_us, outcome=outcome))
    return sorted(out, key=lambda p: not p.applied)


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
        raise InputError(f"{before_name}, {after_name}", _mismatch(before, after, phase))
    old = {_key(f): f for f in before.findings}
    new = {_key(f): f for f in after.findings}
    cycle, source = measured_cycle(before, after, phase)
    changed = setting_changes(before, after)
    return DiffDoc(
        servescope_version=__version__, before=before_name, after=after_name, phase=phase,
        ranks=[_rank_diff(r, a[r], b[r]) for r in common],
        ranks_only_before=sorted(set(a) - set(b)), ranks_only_after=sorted(set(b) - set(a)),
        findings_appeared=[f for k, f in new.items() if k not in old],
        findings_gone=[f for k, f in old.items() if k not in new],
        cycle_us=cycle, cycle_source=source, settings_changed=changed,
        predictions=check_predictions(before, phase, -cycle.delta_us, changed) if cycle is not None else [],
    )


def _holds(doc: AnalysisDoc) -> str:
    """``rank 3 (unknown steps)``, ``ranks 0 (decode, prefill steps), 1 (decode steps)``: what one side holds."""
    each = [f"{r.rank} ({', '.join(p for p in PHASES if p in r.phases) or 'no'} steps)" for r in doc.ranks]
    return f"rank{'s' if len(each) != 1 else ''} {', '.join(each)}" if each else "no rank"


def _mismatch(before: AnalysisDoc, after: AnalysisDoc, phase: str) -> str:
    """Why no rank has ``phase`` steps on both sides: each side's ranks and phases, the rank and phase mismatch
    named, and the ``--phase`` both sides share where one does."""
    ranks_a, ranks_b = {r.rank for r in before.ranks}, {r.rank for r in after.ranks}
    why: list[str] = []
    if not ranks_a & ranks_b:
        why.append(f"the two sides hold different ranks ({', '.join(map(str, sorted(ranks_a)))} against "
                   f"{', '.join(map(str, sorted(ranks_b)))}): diff compares a rank with itself")
    phases_a = {p for r in before.ranks for p in r.phases}
    phases_b = {p for r in after.ranks for p in r.phases}
    if phase not in phases_a or phase not in phases_b:
        lacking = [side for side, have in (("the before side", phases_a), ("the after side", phases_b))
                   if phase not in have]
        shared = [p for p in PHASES if p in phases_a & phases_b]
        hint = f" (both have {', '.join(shared)}: --phase {shared[0]})" if shared else ""
        why.append(("neither side has" if len(lacking) == 2 else f"{lacking[0]} has no") + f" {phase} steps{hint}")
    if not why:
        why.append(f"no rank has {phase} steps on both sides")
    return f"before holds {_holds(before)}, after {_holds(after)}: " + "; ".join(why)


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise InputError("--phase", f"no phase {phase!r}: use one of {', '.join(PHASES)}")


def diff_paths(before: Path, after: Path, *, phase: str = "decode", taxonomy: Path | None = None) -> DiffDoc:
    """``diff_analyses`` of two traces / saved analyses given by path (the phase checked before either is read)."""
    _check_phase(phase)
    return diff_analyses(load_side(before, taxonomy=taxonomy), load_side(after, taxonomy=taxonomy), phase=phase,
                         before_name=str(before), after_name=str(after))
