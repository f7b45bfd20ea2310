"""The answer first: one screen per analysis that names the bottleneck, with its numbers.

Per phase (decode first): the step time, tokens, the top categories with their share of the step and time per
step, and one sentence naming what bounds the step: the host (the device idles most of the step), the
collectives, or the kernels of one category. Then the top findings (already merged across ranks and phases).
Everything here is read from the analysis document, so a saved analysis summarises as a fresh one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from servescope.core.analysis import AnalysisDoc, Finding, PhaseStats, RankAnalysis

__all__ = ["Bottleneck", "bottleneck", "render_summary"]

_PHASE_ORDER = ("decode", "mixed", "prefill", "unknown", "empty")
_TOP_CATEGORIES = 4
_TOP_FINDINGS = 3
_HOST_BOUND_IDLE = 0.4  # idle share of the step from which the host is named, when nothing on the device is larger
_COMMUNICATION = "communication"
_PHASE_WORDS = {"unknown": "whole", "mixed": "mixed prefill+decode"}
_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "info": "dim"}
_CATEGORY_WORDS = {"gemm": "GEMMs", "attention": "attention", "moe": "MoE experts", "norm": "norms",
                   "rotary": "rotary embedding", "activation": "activations", "elementwise": "elementwise kernels",
                   "memcpy": "memory copies", "other": "unclassified kernels"}


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """What bounds one phase's step on its slowest rank, and the sentence that says so."""

    phase: str
    rank: int
    kind: str  # "host" | "communication" | "compute" | "memory" | "other"
    what: str  # the category (or "idle") that bounds it
    share_of_step: float
    sentence: str


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def _slowest(doc: AnalysisDoc, phase: str) -> tuple[RankAnalysis, PhaseStats] | None:
    ranks = [(r, r.phases[phase]) for r in doc.ranks if phase in r.phases]
    return max(ranks, key=lambda rs: rs[1].step_us.mean) if ranks else None


def bottleneck(doc: AnalysisDoc, phase: str) -> Bottleneck | None:
    """What bounds ``phase``'s step on the rank whose step is slowest, or None without such steps."""
    found = _slowest(doc, phase)
    if found is None:
        return None
    rank, stats = found
    step = stats.step_us.mean
    if step <= 0:
        return None
    where = f" on rank {rank.rank}" if len(doc.ranks) > 1 else ""
    idle = stats.idle_us_per_step / step
    # collectives as one: on a step bound by communication, which collective matters less than that it is one
    comm_us = sum(c.per_step_us for n, c in stats.categories.items() if doc.categories.get(n) == _COMMUNICATION)
    top_name, top_us = max(((n, c.per_step_us) for n, c in stats.categories.items()
                            if doc.categories.get(n) != _COMMUNICATION), key=lambda nc: nc[1], default=("", 0.0))
    top_share, comm_share = top_us / step, comm_us / step
    if idle >= _HOST_BOUND_IDLE and idle >= max(top_share, comm_share):
        outside = ("the ranks spend {share} of it outside the measured operators (Python, scheduling)"
                   if rank.work_kind == "cpu_op" else "the device sits idle {share} of it")
        sentence = (f"The host bounds the {_PHASE_WORDS.get(phase, phase)} step{where}: "
                    f"{outside.format(share=f'{idle:.0%}')} ({_ms(stats.idle_us_per_step)} of {_ms(step)}), "
                    "more than any kind of work takes.")
        return Bottleneck(phase, rank.rank, "host", "idle", idle, sentence)
    if comm_share >= top_share and comm_us > 0:
        sentence = (f"Communication bounds the {_PHASE_WORDS.get(phase, phase)} step{where}: collectives take "
                    f"{comm_share:.0%} of it ({_ms(comm_us)} of {_ms(step)}); the largest other work, {top_name}, "
                    f"takes {top_share:.0%}.")
        return Bottleneck(phase, rank.rank, _COMMUNICATION, "communication", comm_share, sentence)
    if not top_name:
        return None
    words = _CATEGORY_WORDS.get(top_name, top_name)
    group = doc.categories.get(top_name, "other")
    sentence = (f"{words[0].upper()}{words[1:]} bound the {_PHASE_WORDS.get(phase, phase)} step{where}: "
                f"{top_share:.0%} of it ({_ms(top_us)} of {_ms(step)})"
                + (f"; the device idles {idle:.0%}" if idle >= 0.1 else "")
                + (f"; collectives take {comm_share:.0%}" if comm_share >= 0.1 else "") + ".")
    return Bottleneck(phase, rank.rank, group, top_name, top_share, sentence)


def _phase_line(phase: str, rank: RankAnalysis, stats: PhaseStats, many_ranks: bool) -> str:
    parts = [f"{phase}: {stats.steps} step{'s' if stats.steps != 1 else ''}", f"{_ms(stats.step_us.mean)}/step"]
    if stats.tokens_per_step is not None:
        tokens = f"{stats.tokens_per_step:.1f}".removesuffix(".0")
        if stats.prompt_tokens_per_step is not None:  # a step with prompt work: the tokens in, and out
            tokens = f"{stats.prompt_tokens_per_step:.1f}".removesuffix(".0") + f" in + {tokens} out"
        parts.append(f"{tokens} tokens/step")
    if stats.us_per_output_token is not None:
        parts.append(f"{_ms(stats.us_per_output_token)}/token")
    if many_ranks:
        parts.append(f"slowest rank {rank.rank}")
    return " · ".join(parts)


def _categories_line(stats: PhaseStats) -> str:
    step = stats.step_us.mean or 1.0
    top = sorted(stats.categories.items(), key=lambda nc: -nc[1].per_step_us)[:_TOP_CATEGORIES]
    shown = [f"{name} {c.per_step_us / step:.0%} ({_ms(c.per_step_us)})" for name, c in top]
    idle = stats.idle_us_per_step / step
    if idle >= 0.05:
        shown.append(f"idle {idle:.0%} ({_ms(stats.idle_us_per_step)})")
    return "  " + " · ".join(shown)


def _finding_line(finding: Finding) -> Text:
    line = Text("  ")
    line.append(f"{finding.severity:<6}", style=_SEVERITY_STYLE.get(finding.severity, ""))
    line.append(f" {finding.id}: ", style="bold")
    line.append(finding.message)
    return line


def render_summary(doc: AnalysisDoc, console: Console, phases: Sequence[str] | None = None) -> None:
    """Print the one-screen answer: per phase the step, its top categories and its bottleneck; top findings.

    ``phases``: only these phases (all when None).
    """
    ranks = sorted(r.rank for r in doc.ranks)
    head = f"servescope: {len(doc.inputs)} trace file{'s' if len(doc.inputs) != 1 else ''}"
    head += f", rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""
    console.print(Text(head, style="bold"))
    for trace in doc.traces:
        if trace.malformed_events:
            console.print(Text(f"  {trace.path}: {trace.malformed_events} malformed event"
                               f"{'s' if trace.malformed_events != 1 else ''} of {trace.events:,} left out (first: "
                               f"{'; '.join(trace.malformed_examples)})", style="yellow"))
    shown_phases = [p for p in _PHASE_ORDER if any(p in r.phases for r in doc.ranks) and p != "empty"
                    and (phases is None or p in phases)]
    for phase in shown_phases:
        found = _slowest(doc, phase)
        if found is None:
            continue
        rank, stats = found
        console.print(Text(_phase_line(phase, rank, stats, len(doc.ranks) > 1), style="bold"))
        console.print(Text(_categories_line(stats)))
        neck = bottleneck(doc, phase)
        if neck is not None:
            console.print(Text("  bottleneck: " + neck.sentence, style="bold"))
    if not shown_phases:
        console.print(Text("no steps: nothing to summarise"))
    order = {"high": 0, "medium": 1, "info": 2}
    findings = sorted(doc.findings, key=lambda f: order.get(f.severity, 3))
    if findings:
        shown = findings[:_TOP_FINDINGS]
        more = f" (top {len(shown)} of {len(findings)})" if len(findings) > len(shown) else ""
        console.print(Text(f"findings{more}", style="bold"))
        for finding in shown:
            console.print(_finding_line(finding))
    else:
        console.print(Text("findings: none"))
