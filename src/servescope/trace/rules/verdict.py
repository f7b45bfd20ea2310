"""One judge: what bounds each phase's step, decided from the findings the rules gave, never beside them.

For each phase (decode first) on the rank whose step is slowest, the first finding of that phase among the
rules ``[verdict].order`` of ``data/findings.toml`` names the bottleneck, with the finding's own numbers and the
verdict its rule declares (``verdict``: host, communication or capture; an unknown kind is an error); where
none fired, the category with the most device time does. So the headline, the JSON and the HTML report all say
what the findings say, and a saved document carries the verdict (``report`` shows it without re-deciding).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from servescope.core.analysis import Finding, PhaseStats, RankAnalysis, Verdict
from servescope.core.messages import step_time

__all__ = ["PHASE_ORDER", "decide_verdicts"]

PHASE_ORDER = ("decode", "mixed", "prefill", "unknown")
_PHASE_WORDS = {"unknown": "whole", "mixed": "mixed prefill+decode"}
_COMMUNICATION = "communication"


def _num(evidence: Mapping[str, Any], key: str) -> float | None:
    value = evidence.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _slowest(ranks: Sequence[RankAnalysis], phase: str) -> tuple[RankAnalysis, PhaseStats] | None:
    found = [(r, r.phases[phase]) for r in ranks if phase in r.phases and r.phases[phase].steps]
    return max(found, key=lambda rs: rs[1].step_us.mean) if found else None


def _host(phase: str, rank: RankAnalysis, stats: PhaseStats, finding: Finding, where: str,
          stretch: Finding | None, caveat: str | None = None) -> Verdict:
    ev = finding.evidence
    idle = _num(ev, "idle_share") or 0.0  # launch_bound's and cpu_overhead's metric: the median step's share
    pct = _num(ev, "idle_pct") or 100 * idle  # as the finding's message prints it
    idle_us = _num(ev, "median_idle_us") or stats.idle_us_per_step
    step = _num(ev, "median_step_us") or stats.step_us.mean
    outside = ("the ranks spend {share} of it outside the measured operators (Python, scheduling)"
               if rank.work_kind == "cpu_op" else "the device sits idle {share} of it")
    sentence = (f"The host bounds the {_PHASE_WORDS.get(phase, phase)} step{where}: "
                f"{outside.format(share=f'{pct:.1f}%')} (median step, {step_time(idle_us)} of {step_time(step)}), "
                "more than any kind of work takes.")
    unprofiled = None
    if stretch is not None and (u := _num(stretch.evidence, "idle_pct_unprofiled")) is not None:
        unprofiled = f"holds without the profiler: the device idles {u:.0f}% of the unprofiled step"
        sentence += f" It holds without the profiler: {u:.0f}% idle."
    elif caveat is not None and rank.work_kind == "device":
        batch = f"{stats.tokens_per_step:.0f}" if phase == "decode" and stats.tokens_per_step else "B"
        caveat = caveat.replace("{batch}", batch)
        sentence += " " + caveat
    else:
        caveat = None
    return Verdict(phase=phase, rank=rank.rank, kind="host", what="idle", share=idle, base="step",
                   sentence=sentence, finding=finding.id, steps=stats.steps, unprofiled=unprofiled, caveat=caveat)


def _communication(phase: str, rank: RankAnalysis, stats: PhaseStats, finding: Finding, where: str) -> Verdict:
    share = _num(finding.evidence, "comm_share") or 0.0
    pct = _num(finding.evidence, "share_pct") or 100 * share  # as the finding's message prints it
    per_step = _num(finding.evidence, "per_step_us") or 0.0
    sentence = (f"Communication bounds the {_PHASE_WORDS.get(phase, phase)} step{where}: collectives take "
                f"{pct:.1f}% of its device time ({step_time(per_step)} a step).")
    wait = _num(finding.evidence, "collective_wait_share")
    if wait is not None:  # merged with collective_wait: the time is waiting for the other ranks, not transfers
        sentence = (f"The ranks arrive at the collectives out of step in the {_PHASE_WORDS.get(phase, phase)} step"
                    f"{where}: collectives take {pct:.1f}% of its device time ({step_time(per_step)} a step), up to "
                    f"{wait:.0%} of that waiting for the other ranks; the transport is not what bounds it.")
    return Verdict(phase=phase, rank=rank.rank, kind=_COMMUNICATION, what="communication", share=share,
                   base="device time", sentence=sentence, finding=finding.id, steps=stats.steps)


def _capture(phase: str, rank: RankAnalysis, stats: PhaseStats, finding: Finding, where: str) -> Verdict:
    captured = _num(finding.evidence, "captured_launches") or 0.0
    run = _num(finding.evidence, "kernels_run") or 0.0
    sentence = (f"No served step to judge{where}: the trace records graph capture ({captured:.0f} kernel launches "
                f"went into graphs, {run:.0f} kernels ran); profile the graphs' replays.")
    return Verdict(phase=phase, rank=rank.rank, kind="other", what="graph capture",
                   share=_num(finding.evidence, "captured_launch_share") or 0.0, base="kernel launches",
                   sentence=sentence, finding=finding.id, steps=stats.steps)


def _largest(phase: str, rank: RankAnalysis, stats: PhaseStats, categories: Mapping[str, str],
             words_of: Mapping[str, str], where: str, stretch: Finding | None, gap: Finding | None) -> Verdict | None:
    if not stats.categories:
        return None
    name, top = max(stats.categories.items(), key=lambda nc: nc[1].share)
    words = words_of.get(name, name)
    step = stats.step_us.mean
    idle = stats.idle_us_per_step / step if step > 0 else 0.0
    sentence = (f"{words[0].upper()}{words[1:]} take the most device time in the {_PHASE_WORDS.get(phase, phase)} "
                f"step{where}: {top.share:.1%} of it ({step_time(top.per_step_us)} a step)")
    unprofiled = None
    if stretch is not None and (u := _num(stretch.evidence, "idle_pct_unprofiled")) is not None:
        unprofiled = f"the trace's idle {idle:.0%} is the profiler's: without it the device idles {u:.0f}%"
        sentence += (f"; the device idles {idle:.0%} of the traced step, but {u:.0f}% without the profiler "
                     "(the profiler's own host time), so the host does not bound it")
    elif gap is not None:
        sentence += (f"; the device idles {idle:.0%} of the step, most of it one host pause (host_gap), "
                     "not a steady bound")
    elif idle >= 0.1:
        sentence += f"; the device idles {idle:.0%} of the step"
    return Verdict(phase=phase, rank=rank.rank, kind=categories.get(name, "other"), what=name, share=top.share,
                   base="device time", sentence=sentence + ".", finding=None, steps=stats.steps,
                   unprofiled=unprofiled)


def decide_verdicts(ranks: Sequence[RankAnalysis], findings: Sequence[Finding], categories: Mapping[str, str],
                    rules: Mapping[str, Any], words: Mapping[str, str] | None = None, *,
                    stacks: Collection[int] = (), unprofiled: bool = False) -> list[Verdict]:
    """One verdict per phase with steps, decode first, from the findings (see the module docstring); ``words``:
    what the sentence calls each category's kernels (the taxonomy's ``words``; a name it lacks stands as is).

    ``stacks``: the ranks whose traces recorded python stacks; where the step was not timed without the profiler
    (``unprofiled`` false, no ``profiler_stretch`` finding) a host verdict on such a rank carries the caveat of
    ``[verdict].stretch_caveat``."""
    caveat_text = rules.get("verdict", {}).get("stretch_caveat")
    order: list[str] = list(rules.get("verdict", {}).get("order", ()))
    out: list[Verdict] = []
    for phase in PHASE_ORDER:
        found = _slowest(ranks, phase)
        if found is None:
            continue
        rank, stats = found
        where = f" on rank {rank.rank}" if len(ranks) > 1 else ""
        # a rank-wide finding (no phase) speaks for every phase of its ranks
        of_phase = [f for f in findings if f.phase == phase or phase in str(f.evidence.get("phases") or "").split(",")
                    or (f.phase is None and not f.evidence.get("phases")
                        and str(rank.rank) in str(f.evidence.get("ranks") or "").split(","))]
        stretch = next((f for f in of_phase if f.id == "profiler_stretch"), None)
        gap = next((f for f in of_phase if f.id == "host_gap"), None)
        verdict: Verdict | None = None
        for rule in order:
            finding = next((f for f in of_phase if f.id.split("+")[0] == rule
                            or str(f.evidence.get("rule", "")).split("+")[0] == rule), None)
            if finding is None:
                continue
            kind = rules.get("rules", {}).get(rule, {}).get("verdict")
            if kind == "communication":
                verdict = _communication(phase, rank, stats, finding, where)
            elif kind == "capture":
                verdict = _capture(phase, rank, stats, finding, where)
            elif kind == "host":
                verdict = _host(phase, rank, stats, finding, where, stretch,
                                caveat_text if rank.rank in stacks and not unprofiled else None)
            else:  # check_verdicts refuses such a file when it is read: this is a caller's own rules
                raise ValueError(f"rule {rule!r} in [verdict].order declares verdict {kind!r}, which no verdict "
                                 "builds (host, communication, capture)")
            break
        if verdict is None:
            verdict = _largest(phase, rank, stats, categories, words or {}, where, stretch, gap)
        if verdict is not None:
            out.append(verdict)
    return out
