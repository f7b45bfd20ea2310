"""Rules that name the bottleneck, each with the numbers that triggered it.

Thresholds and messages live in ``data/findings.toml``. Every finding carries its evidence: the
measured values (share, calls per step, µs per call, message bytes where the trace records them) so a
reader can check the claim against the tables.
"""

from __future__ import annotations

import string
import tomllib
from importlib.resources import files
from typing import Any

import numpy as np

from servescope.core.analysis import CrossRankStats, Finding, KernelRow, PhaseStats, RankAnalysis

__all__ = ["find_bottlenecks", "load_rules"]

Evidence = dict[str, float | int | str | None]
_PHASES_CHECKED = ("decode", "mixed", "prefill", "unknown")
_PHASE_WORDS = {"unknown": "step", "mixed": "mixed prefill+decode"}


def load_rules() -> dict[str, dict[str, Any]]:
    """The bundled finding rules (thresholds and message templates)."""
    text = (files("servescope") / "data" / "findings.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _severity(value: float, rule: dict[str, Any]) -> str | None:
    if value >= rule["high"]:
        return "high"
    if value >= rule["medium"]:
        return "medium"
    return None


class _MessageFormatter(string.Formatter):
    """Formats a rule's message; a value that is not available prints as N/A whatever its format."""

    def format_field(self, value: Any, format_spec: str) -> str:
        return "N/A" if value is None else super().format_field(value, format_spec)


_FORMATTER = _MessageFormatter()


def _finding(rule_id: str, rule: dict[str, Any], severity: str, evidence: Evidence, *,
             rank: int | None, phase: str, cpu: bool = False) -> Finding:
    fields = {**evidence, "phase": _PHASE_WORDS.get(phase, phase)}
    template = rule.get("message_cpu", rule["message"]) if cpu else rule["message"]
    return Finding(id=rule_id, severity=severity, message=_FORMATTER.format(template, **fields),
                   evidence=evidence, rank=rank, phase=phase)


def _share_rule(rule_id: str, rule: dict[str, Any], stats: PhaseStats, names: list[str], *, rank: int,
                phase: str, extra: Evidence, cpu: bool = False) -> Finding | None:
    picked = [stats.categories[n] for n in names if n in stats.categories]
    if not picked:
        return None
    share = sum(c.share for c in picked)
    severity = _severity(share, rule)
    if severity is None:
        return None
    total = sum(c.per_step_us * stats.steps for c in picked)
    calls = sum(c.calls_per_step for c in picked)
    evidence: Evidence = {
        "rank": rank, "phase": phase, "share": round(share, 4), "share_pct": 100 * share,
        "per_step_us": total / stats.steps, "calls_per_step": calls,
        "mean_call_us": total / (calls * stats.steps) if calls else 0.0,
        "step_us": stats.step_us.mean, **extra,
    }
    return _finding(rule_id, rule, severity, evidence, rank=rank, phase=phase, cpu=cpu)


def _top_kernel(kernels: list[KernelRow], rank: int, categories: set[str]) -> str:
    for k in kernels:  # sorted by time
        if k.rank == rank and k.category in categories:
            return k.name[:80]
    return "N/A"


def find_bottlenecks(ranks: list[RankAnalysis], across: list[CrossRankStats], kernels: list[KernelRow],
                     comm_categories: list[str], msg_bytes: dict[int, list[int]]) -> list[Finding]:
    """All findings for one analysis, most severe first.

    Args:
        comm_categories: the taxonomy's communication categories.
        msg_bytes: per rank, the message sizes collective kernels recorded (may be empty).
    """
    rules = load_rules()
    out: list[Finding] = []
    for ra in ranks:
        for phase in _PHASES_CHECKED:
            stats = ra.phases.get(phase)
            if stats is None:
                continue
            sizes = msg_bytes.get(ra.rank) or []
            comm_extra: Evidence = {"median_msg_bytes": int(np.median(sizes)) if sizes else None}
            found = [
                _share_rule("communication_bound", rules["communication_bound"], stats, comm_categories,
                            rank=ra.rank, phase=phase, extra=comm_extra, cpu=ra.work_kind == "cpu_op"),
                _share_rule("cast_bound", rules["cast_bound"], stats, ["elementwise", "memcpy"], rank=ra.rank,
                            phase=phase,
                            extra={"top_kernel": _top_kernel(kernels, ra.rank, {"elementwise", "memcpy"})}),
                _share_rule("attention_heavy", rules["attention_heavy"], stats, ["attention"], rank=ra.rank,
                            phase=phase, extra={}),
                _idle_rule(rules, stats, ra, phase),
            ]
            out.extend(f for f in found if f is not None)
    out.extend(_imbalance(rules, across))
    order = {"high": 0, "medium": 1, "info": 2}
    out.sort(key=lambda f: (order.get(f.severity, 3), f.id, f.rank or 0))
    return out


def _idle_rule(rules: dict[str, dict[str, Any]], stats: PhaseStats, ra: RankAnalysis, phase: str) -> Finding | None:
    rule_id = "launch_bound" if ra.work_kind == "device" else "cpu_overhead"
    rule = rules[rule_id]
    step = stats.step_us.mean
    idle = stats.idle_us_per_step / step if step > 0 else 0.0
    severity = _severity(idle, rule)
    if severity is None:
        return None
    evidence: Evidence = {"rank": ra.rank, "phase": phase, "idle_share": round(idle, 4), "idle_pct": 100 * idle,
                          "idle_us_per_step": stats.idle_us_per_step, "step_us": step,
                          "busy_us_per_step": stats.busy_us_per_step}
    return _finding(rule_id, rule, severity, evidence, rank=ra.rank, phase=phase)


def _imbalance(rules: dict[str, dict[str, Any]], across: list[CrossRankStats]) -> list[Finding]:
    out: list[Finding] = []
    for cross in across:
        if cross.phase not in _PHASES_CHECKED:
            continue
        spread = cross.step_us
        ratio = spread.max_us / spread.min_us if spread.min_us > 0 else 1.0
        severity = _severity(ratio, rules["rank_imbalance"])
        if severity is not None:
            evidence: Evidence = {
                "phase": cross.phase, "ratio": round(ratio, 4), "max_rank": spread.max_rank,
                "max_us": spread.max_us, "min_rank": spread.min_rank, "min_us": spread.min_us,
            }
            out.append(_finding("rank_imbalance", rules["rank_imbalance"], severity, evidence, rank=None,
                                phase=cross.phase))
        for rank, share in cross.collective_wait_share.items():
            severity = _severity(share, rules["collective_wait"])
            if severity is None:
                continue
            skew = cross.collective_start_skew_us
            evidence = {
                "phase": cross.phase, "wait_rank": int(rank), "wait_share": round(share, 4),
                "wait_share_pct": 100 * share, "wait_us_per_step": cross.collective_wait_us_per_step[rank],
                "collective_us_per_step": cross.collective_us_per_step[rank],
                "skew_median_us": skew.median if skew is not None else None,
            }
            out.append(_finding("collective_wait", rules["collective_wait"], severity, evidence, rank=int(rank),
                                phase=cross.phase))
    return out
