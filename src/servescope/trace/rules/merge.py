"""One finding per cause: the instances of a rule on each rank and phase merged, with the ranks, the phases and
the range of the metric, the worst instance's numbers, and the advice any of them was given.

A rule that ``merge_with`` another (``communication_bound`` with ``collective_wait``) reports both in one finding
when they fire on the same rank and phase. The evidence keeps the numbers the rule's own message cites, whichever
message the finding shows.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from servescope.core.analysis import Advice, Finding
from servescope.core.messages import format_message
from servescope.trace.rules.advice import advice_text, checked_text

__all__ = ["PHASES_CHECKED", "SEVERITY_ORDER", "Instance", "fields_of", "merge_findings"]

Evidence = dict[str, float | int | str | None]
PHASES_CHECKED = ("decode", "mixed", "prefill", "unknown")
SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}
_PHASE_WORDS = {"unknown": "step", "mixed": "mixed prefill+decode"}
# Message fields filled when findings merge, not facts.
_MERGE_FIELDS = frozenset({"where", "range_pct", "advice", "phase", "s", "wait_where", "wait_s", "wait_range_pct"})


class Instance(msgspec.Struct):
    """One rule firing on one rank and phase (or across ranks), before merging."""

    rule: str
    severity: str
    value: float
    rank: int | None
    phase: str | None
    values: dict[str, Any]
    advice: tuple[Advice, ...]
    checked: tuple[str, ...] = ()


def fields_of(template: str) -> list[str]:
    """The field names a message template fills."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def _ranks_text(ranks: Sequence[int]) -> str:
    if not ranks:
        return "all ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _range_pct(values: Sequence[float]) -> str:
    lo, hi = 100 * min(values), 100 * max(values)
    return f"{hi:.1f}%" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}–{hi:.1f}%"


class _Group(msgspec.Struct):
    rule: str
    items: list[Instance]

    @property
    def worst(self) -> Instance:
        return max(self.items, key=lambda i: i.value)

    @property
    def ranks(self) -> list[int]:
        return sorted({i.rank for i in self.items if i.rank is not None})

    @property
    def phases(self) -> list[str]:
        present = {i.phase for i in self.items if i.phase is not None}
        return [p for p in PHASES_CHECKED if p in present]

    @property
    def severity(self) -> str:
        return min((i.severity for i in self.items), key=lambda s: SEVERITY_ORDER.get(s, 3))

    @property
    def where(self) -> set[tuple[int | None, str | None]]:
        return {(i.rank, i.phase) for i in self.items}


def _template(rule: Mapping[str, Any], ranks: Sequence[int], work_kind: Mapping[int, str]) -> str:
    cpu = bool(ranks) and all(work_kind.get(r) == "cpu_op" for r in ranks)
    return str(rule.get("message_cpu", rule["message"]) if cpu else rule["message"])


def merge_findings(instances: list[Instance], rules: Mapping[str, dict[str, Any]],
           work_kind: Mapping[int, str]) -> list[Finding]:
    """One finding per rule: its instances on every rank and phase, with the advice any of them is given."""
    groups: dict[tuple[str, str | None], _Group] = {}
    for inst in instances:  # a phase's rule speaks of that phase's steps alone: one finding per rule and phase
        key = (inst.rule, inst.phase if rules[inst.rule]["scope"] in ("phase", "across") else None)
        groups.setdefault(key, _Group(inst.rule, [])).items.append(inst)
    merged_into: dict[int, _Group] = {}  # id(group merged away) -> the group that reports it
    for group in groups.values():
        partner_id = rules[group.rule].get("merge_with")
        if not partner_id:
            continue
        for other in groups.values():
            if other.rule == partner_id and id(other) not in merged_into and group.where & other.where:
                merged_into[id(other)] = group
                break
    out: list[Finding] = []
    for group in groups.values():
        if id(group) in merged_into:
            continue
        partner = next((g for g in groups.values() if merged_into.get(id(g)) is group), None)
        out.append(_finding(group, rules[group.rule], partner, work_kind))
    return out


def _union_advice(group: _Group) -> list[Advice]:
    """The advice of the group's instances, worst instance first, each piece once."""
    ordered = [group.worst, *(i for i in group.items if i is not group.worst)]
    seen: dict[str, Advice] = {}
    for inst in ordered:
        for a in inst.advice:
            seen.setdefault(a.text, a)
    return list(seen.values())


def _finding(group: _Group, rule: Mapping[str, Any], partner: _Group | None,
             work_kind: Mapping[int, str]) -> Finding:
    worst = group.worst
    ranks, phases = group.ranks, group.phases
    values = dict(worst.values)
    phase_text = " and ".join(_PHASE_WORDS.get(p, p) for p in phases) or "all"
    values.update({
        "where": _ranks_text(ranks), "s": "s" if len(ranks) == 1 else "",
        "range_pct": _range_pct([i.value for i in group.items]), "phase": phase_text,
        "advice": "; ".join(advice_text(a) for a in advice) if (advice := _union_advice(group))
        else rule.get("no_advice", ""),
    })
    checked = list(dict.fromkeys(c for inst in group.items for c in inst.checked))
    template = own = _template(rule, ranks, work_kind)
    severity = group.severity
    evidence: Evidence = {"rule": group.rule}
    if partner is not None:
        pw = partner.worst
        values.update({
            "wait_where": _ranks_text(partner.ranks).capitalize(), "wait_s": "s" if len(partner.ranks) == 1 else "",
            "wait_range_pct": _range_pct([i.value for i in partner.items]),
            "skew_median_us": pw.values.get("skew_median_us"),
        })
        template = rule["message_merged"]
        severity = min(severity, partner.severity, key=lambda s: SEVERITY_ORDER.get(s, 3))
        evidence["rule"] = f"{group.rule}+{partner.rule}"
    if template.startswith("{where}"):
        values["where"] = values["where"].capitalize()
    message = format_message(template, values).replace("step step", "step")
    if checked:
        message += " " + checked_text(checked)

    metric = rule["metric"]
    evidence.update({
        "ranks": ",".join(str(r) for r in ranks) or None, "phases": ",".join(phases) or None,
        metric: round(worst.value, 4), f"{metric}_min": round(min(i.value for i in group.items), 4),
        "instances": len(group.items),
    })
    # the rule's own message's numbers too: a merged finding's evidence keeps what the unmerged one would carry
    # (the verdict reads them)
    for field in (*fields_of(template), *fields_of(own)):
        name = field.split(".")[0].split("[")[0]
        if name not in _MERGE_FIELDS and name not in evidence and name != "snippet":
            evidence[name] = _plain(values.get(name))
    if partner is not None:
        pw = partner.worst
        evidence.update({
            "wait_ranks": ",".join(str(r) for r in partner.ranks) or None,
            "wait_phases": ",".join(partner.phases) or None,
            "collective_wait_share": round(pw.value, 4),
            "collective_wait_share_min": round(min(i.value for i in partner.items), 4),
            "wait_us_per_step": _plain(pw.values.get("wait_us_per_step")),
            "collective_us_per_step": _plain(pw.values.get("collective_us_per_step")),
        })
    steps = sorted({i for inst in group.items for i in inst.values.get("step_indices", ())}) if phases else []
    return Finding(id=group.rule, severity=severity, message=message, evidence=evidence,
                   rank=ranks[0] if len(ranks) == 1 else None, phase=phases[0] if len(phases) == 1 else None,
                   steps=steps if len(phases) == 1 else [], advice=advice, checked=checked)


def _plain(value: Any) -> float | int | str | None:
    if value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, (float, np.floating)):
        return round(float(value), 4)
    return str(value)
