"""The answer first: one screen per analysis that names the bottleneck, with its numbers.

Per phase (decode first): the step time, tokens, the top categories with their share of the device time and
time per step, the idle share of the step, and the verdict the analysis stored for the phase (the host, the
collectives, or the kernels of one category bound it: decided with the findings, by the same rules). Then the
top findings. Everything here is read from the analysis document (a category's label from its category table,
:mod:`servescope.core.categories`), so a saved analysis summarises as a fresh one.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from servescope.core.analysis import AnalysisDoc, Finding, PhaseStats, RankAnalysis, Verdict
from servescope.core.categories import CategoryTable, categories_of
from servescope.core.messages import step_time
from servescope.report.wrap import hang, path_tail

__all__ = ["bottleneck", "render_summary"]

_PHASE_ORDER = ("decode", "mixed", "prefill", "unknown", "empty")
_TOP_CATEGORIES = 4
_TOP_FINDINGS = 3
_CYCLE_SAID = 0.05  # the cycle is said beside the step where the host gaps add more than this share to it
_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "info": "dim"}


def _slowest(doc: AnalysisDoc, phase: str) -> tuple[RankAnalysis, PhaseStats] | None:
    ranks = [(r, r.phases[phase]) for r in doc.ranks if phase in r.phases]
    return max(ranks, key=lambda rs: rs[1].step_us.mean) if ranks else None


def bottleneck(doc: AnalysisDoc, phase: str) -> Verdict | None:
    """The verdict the analysis decided for ``phase`` (:mod:`servescope.trace.rules.verdict`), or None without one.

    Read from the document, never decided here: the headline says what the findings say."""
    return next((v for v in doc.verdicts if v.phase == phase), None)


def _cycle_us(rank: RankAnalysis, phase: str) -> float:
    """The phase's step cycle on ``rank``: its mean step plus the mean host gap before each (0 without steps)."""
    rows = [r for r in rank.steps if r.phase == phase]
    gaps = [r.gap_before_us for r in rows if r.gap_before_us is not None]
    return (sum(r.span_us for r in rows) / len(rows) + (sum(gaps) / len(gaps) if gaps else 0.0)) if rows else 0.0


def _phase_line(phase: str, rank: RankAnalysis, stats: PhaseStats, many_ranks: bool) -> str:
    step = f"{step_time(stats.step_us.mean)}/step"
    cycle = _cycle_us(rank, phase)
    if cycle > stats.step_us.mean * (1 + _CYCLE_SAID):  # one step time: the traced step; the cycle named as such
        step += f" ({step_time(cycle)} cycle with the host gap)"
    parts = [f"{phase}: {stats.steps} step{'s' if stats.steps != 1 else ''}", step]
    if stats.tokens_per_step is not None:
        tokens = f"{stats.tokens_per_step:.1f}".removesuffix(".0")
        if stats.prompt_tokens_per_step is not None:  # a step with prompt work: the tokens in, and out
            tokens = f"{stats.prompt_tokens_per_step:.1f}".removesuffix(".0") + f" in + {tokens} out"
        parts.append(f"{tokens} tokens/step")
    if stats.us_per_output_token is not None and stats.prompt_tokens_per_step is None:
        parts.append(f"{step_time(stats.us_per_output_token)}/token")
    if many_ranks:
        parts.append(f"slowest rank {rank.rank}")
    return " · ".join(parts)


def _categories_line(stats: PhaseStats, categories: CategoryTable) -> str:
    """The top categories as shares of the phase's device time (as the tables count them: they add up to 100%
    however streams overlap), then the idle time as a share of the step's wall time: each says its base."""
    step = stats.step_us.mean or 1.0
    top = sorted(stats.categories.items(), key=lambda nc: -nc[1].share)[:_TOP_CATEGORIES]
    shown = [f"{categories[name].label} {c.share:.0%} ({step_time(c.per_step_us)})" for name, c in top]
    lines = ["  device time: " + " · ".join(shown)]
    more = []
    idle = stats.idle_us_per_step / step
    if idle >= 0.05:
        more.append(f"idle {idle:.0%} of the step ({step_time(stats.idle_us_per_step)})")
    quant = stats.quant_standalone_share + stats.quant_fused_share
    if quant >= 0.01:
        more.append(f"quantization/casts {quant:.0%} of device time (standalone "
                    f"{stats.quant_standalone_share:.0%}, fused {stats.quant_fused_share:.0%})")
    if more:
        lines.append("  " + " · ".join(more))
    return "\n".join(lines)


def _finding_line(console: Console, finding: Finding) -> None:
    severity = f"{finding.severity:<6}"
    head = f"  {severity} {finding.id}: "
    hang(console, head + finding.message, indent=3 + len(severity),
         spans=[(2, 2 + len(severity), _SEVERITY_STYLE.get(finding.severity, "")),
                (2 + len(severity), len(head), "bold")])


def render_summary(doc: AnalysisDoc, console: Console, phases: Sequence[str] | None = None) -> None:
    """Print the one-screen answer: per phase the step, its top categories and its bottleneck; top findings.

    ``phases``: only these phases (all when None).
    """
    ranks = sorted(r.rank for r in doc.ranks)
    head = f"servescope: {len(doc.inputs)} trace file{'s' if len(doc.inputs) != 1 else ''}"
    head += f", rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""
    hang(console, head, style="bold")
    room = max(24, console.width // 2)
    for path, why in doc.left_out.items():  # found in a named folder, not readable: the rest were analysed
        shown = path_tail(path, max(24, console.width - len(f"  left out : {why}")))
        hang(console, f"  left out {shown}: {why}", style="yellow")
    for trace in doc.traces:
        if trace.malformed_events:
            hang(console, f"  {path_tail(trace.path, room)}: {trace.malformed_events} malformed event"
                          f"{'s' if trace.malformed_events != 1 else ''} of {trace.events:,} left out (first: "
                          f"{'; '.join(trace.malformed_examples)})", style="yellow")
    categories = categories_of(doc)
    shown_phases = [p for p in _PHASE_ORDER if any(p in r.phases for r in doc.ranks) and p != "empty"
                    and (phases is None or p in phases)]
    for phase in shown_phases:
        found = _slowest(doc, phase)
        if found is None:
            continue
        rank, stats = found
        hang(console, _phase_line(phase, rank, stats, len(doc.ranks) > 1), style="bold")
        for line in _categories_line(stats, categories).split("\n"):
            hang(console, line)
        if rank.steps_overlap is not None:
            o = rank.steps_overlap
            hang(console, f"  the steps overlap: each step's work spans {step_time(o.work_span_us)}, the steps start "
                          f"{step_time(o.cadence_us)} apart: step time and idle follow that cadence", style="yellow")
        neck = bottleneck(doc, phase)
        if neck is not None:
            hang(console, "  bottleneck: " + neck.sentence, style="bold")
        elif not doc.verdicts and doc.findings:
            hang(console, "  bottleneck: not in this document (written before verdicts were stored; "
                          "analyze the traces again)", style="dim")
    if not shown_phases:
        hang(console, "no steps: nothing to summarise")
    order = {"high": 0, "medium": 1, "info": 2}
    findings = sorted(doc.findings, key=lambda f: order.get(f.severity, 3))
    if findings:
        top = findings[:_TOP_FINDINGS]
        more = f" (top {len(top)} of {len(findings)})" if len(findings) > len(top) else ""
        hang(console, f"findings{more}", style="bold")
        for finding in top:
            _finding_line(console, finding)
    else:
        hang(console, "findings: none")
