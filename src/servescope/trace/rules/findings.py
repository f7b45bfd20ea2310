"""Rules that name the bottleneck and what to try, each with the numbers that triggered it.

Rules, thresholds, conditions and messages live in ``data/findings.toml``; this module computes the named
*facts* a rule's metric and conditions refer to, evaluates each rule where its scope says (each rank and phase,
each rank, each phase across ranks) and keeps only the advice the trace does not already follow;
:mod:`servescope.trace.rules.merge` makes one finding of each cause across ranks and phases. Every finding carries its
evidence: the values its message cites, the metric's range and where it held, so a reader can check the claim
against the tables.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import msgspec

from servescope.core.analysis import (
    Advice,
    CrossRankStats,
    Finding,
    KernelRow,
    PhaseStats,
    RankAnalysis,
    SettingEvidence,
    StepReference,
)
from servescope.core.bundled import bundled_toml
from servescope.core.categories import CATEGORY_OTHER, Category, bundled_categories
from servescope.core.errors import InputError
from servescope.core.kernel_names import shorten_kernel_name
from servescope.core.needle import any_of, keep_needles
from servescope.trace.classify.precision import quant_facts
from servescope.trace.rules.advice import advice_for, host_values
from servescope.trace.rules.engine import ENGINE_SETTING
from servescope.trace.rules.facts import RankFacts
from servescope.trace.rules.merge import PHASES_CHECKED, SEVERITY_ORDER, Instance, merge_findings
from servescope.trace.rules.snippet import taxonomy_snippet, unclassified
from servescope.trace.steps.formats import step_formats

__all__ = ["check_categories", "check_verdicts", "find_bottlenecks", "load_rules", "taxonomy_snippet"]



def load_rules() -> dict[str, Any]:
    """The bundled findings data: ``conditions``, ``kernels`` (families) and ``rules``."""
    return _load_rules_cached()


def check_verdicts(data: Mapping[str, Any], source: str) -> None:
    """Every rule declares a verdict kind of ``[verdict].kinds`` and every rule ``[verdict].order`` names exists
    and gives one (not ``none``); else an InputError naming ``source`` and the id."""
    verdict = data.get("verdict", {})
    kinds = set(verdict.get("kinds", ()))
    rules = data.get("rules", {})
    for rid, spec in rules.items():
        kind = spec.get("verdict")
        if kind not in kinds:
            raise InputError(source, f"rules.{rid}: verdict {kind!r} is not one of [verdict].kinds "
                                     f"({', '.join(sorted(kinds))})")
    for rid in verdict.get("order", ()):
        if rid not in rules:
            raise InputError(source, f"[verdict].order names rule {rid!r}, which [rules] does not define")
        if rules[rid]["verdict"] == "none":
            raise InputError(source, f"[verdict].order names rule {rid!r}, whose verdict is 'none'")


def check_categories(data: Mapping[str, Any], source: str, categories: Mapping[str, Category]) -> None:
    """Every ``categories`` list of a kernel family or condition names a category of the taxonomy; else an
    InputError naming ``source`` and the id."""
    for table in ("kernels", "conditions"):
        for key, spec in data.get(table, {}).items():
            unknown = [c for c in spec.get("categories", ()) if c not in categories]
            if unknown:
                raise InputError(source, f"{table}.{key}: category {unknown[0]!r} is not defined in taxonomy.toml")


@cache
def _load_rules_cached() -> dict[str, Any]:
    data = bundled_toml("findings.toml")
    check_verdicts(data, "data/findings.toml")
    check_categories(data, "data/findings.toml", bundled_categories())
    for table in ("kernels", "conditions"):  # compiled now: analyze loads the rules while the traces decode
        for spec in data.get(table, {}).values():
            for key in ("patterns", "exclude", "kernels"):
                if isinstance(spec.get(key), list):
                    any_of(tuple(spec[key]))
    keep_needles()
    return data


def _matcher(spec: Mapping[str, Any], key: str = "patterns") -> Callable[[str], bool]:
    """Whether a name matches one of ``spec[key]`` and none of ``spec["exclude"]`` (the pattern sets looked up once,
    not once a name)."""
    include, exclude = any_of(tuple(spec.get(key, ()))), any_of(tuple(spec.get("exclude", ())))

    def matches(name: str) -> bool:
        lower = name.lower() if name.isascii() else None
        return include.found(name, lower) and not exclude.found(name, lower)

    return matches


# ---------------------------------------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------------------------------------

class _Family(msgspec.Struct, frozen=True):
    share: float
    total_us: float
    calls: int
    top: str
    top_share: float


def _family(rows: Sequence[KernelRow], spec: Mapping[str, Any], total_us: float,
            families: Mapping[str, Mapping[str, Any]]) -> _Family:
    kinds = set(spec.get("kinds", ("kernel", "cpu_op", "gpu_memcpy", "gpu_memset")))
    cats = set(spec["categories"]) if "categories" in spec else None
    other = families[spec["exclude_family"]] if "exclude_family" in spec else None
    matches, excluded = _matcher(spec), _matcher(other) if other is not None else None
    picked = [k for k in rows if k.kind in kinds and (cats is None or k.category in cats) and matches(k.name)
              and (excluded is None or not excluded(k.name))]
    by_name: dict[str, float] = {}
    for k in picked:
        by_name[k.name] = by_name.get(k.name, 0.0) + k.total_us
    total = sum(by_name.values())
    top = max(by_name, key=lambda n: by_name[n]) if by_name else None
    return _Family(
        share=total / total_us if total_us > 0 else 0.0, total_us=total, calls=sum(k.count for k in picked),
        top=shorten_kernel_name(top, max_chars=100) if top else "N/A",
        top_share=by_name[top] / total_us if top and total_us > 0 else 0.0,
    )


def _rank_values(ra: RankAnalysis, rows: Sequence[KernelRow], facts: RankFacts | None,
                 data: Mapping[str, Any]) -> dict[str, Any]:
    """The rank-wide facts: graph replays and the kernel families over all of the rank's work."""
    total = sum(k.total_us for k in rows)
    steps = max(sum(s.steps for s in ra.phases.values()), 1)
    fam = {name: _family(rows, spec, total, data["kernels"]) for name, spec in data["kernels"].items()}
    cast, transfer, unfused, fused = fam["cast"], fam["host_transfer"], fam["unfused"], fam["fused_pointwise"]
    pointwise = unfused.total_us + fused.total_us
    graph = facts.graph_replay_share if facts is not None else ra.graph_replay_share
    return {
        "rank": ra.rank, "cpu_work": 1.0 if ra.work_kind == "cpu_op" else 0.0, "graph_replay_share": graph,
        "cast_share": cast.share, "cast_calls_per_step": cast.calls / steps, "top_cast": cast.top,
        "top_cast_pct": 100 * cast.top_share,
        "host_transfer_share": transfer.share, "transfer_calls_per_step": transfer.calls / steps,
        "transfer_us_per_step": transfer.total_us / steps, "top_transfer": transfer.top,
        "unfused_share": unfused.share, "unfused_calls_per_step": unfused.calls / steps,
        "unfused_mean_call_us": unfused.total_us / unfused.calls if unfused.calls else None,
        "top_unfused": unfused.top, "fused_pointwise_share": fused.share,
        "fused_pointwise_of_pointwise": fused.total_us / pointwise if pointwise > 0 else 0.0,
        **_capture_values(facts),
        # marks a serving engine writes (an entry of steps.toml that `serves` one) gave the steps
        "engine_steps": 1.0 if ra.step_source in {f.step_source for f in step_formats().steps if f.serves} else 0.0,
        **_overlap_values(ra),
        # quantization / casts ([[precision]] in taxonomy.toml): quant_share, quant_standalone_share,
        # quant_fused_share, top_quant, top_quant_category, top_quant_pct
        **quant_facts(list(ra.phases.values())),
    }


def _overlap_values(ra: RankAnalysis) -> dict[str, Any]:
    """Whether the steps' device work overlapped the next step's, and by how much (trace/cadence.py)."""
    note = ra.steps_overlap
    if note is None:
        return {"steps_overlap": 0.0}
    return {"steps_overlap": 1.0, "overlap_pairs": note.pairs, "step_pairs": max(len(ra.steps) - 1, 0),
            "work_span_ms": note.work_span_us / 1000, "cadence_ms": note.cadence_us / 1000,
            "max_overlap_ms": note.max_overlap_us / 1000}


def _capture_values(facts: RankFacts | None) -> dict[str, Any]:
    """Kernel launches recorded into graphs by stream captures, against the kernels the device ran."""
    if facts is None:
        return {"captured_launch_share": 0.0}
    captured, run = facts.captured_launches, facts.kernels_run
    return {"graph_captures": facts.graph_captures, "captured_launches": captured, "kernels_run": run,
            "captured_launch_share": captured / (captured + run) if captured else 0.0}


def _phase_values(ra: RankAnalysis, phase: str, stats: PhaseStats, facts: RankFacts | None,
                  comm_categories: Sequence[str], sizes: Sequence[int],
                  table: Mapping[str, Category]) -> dict[str, Any]:
    """The facts of one rank's phase: category shares, idle (steady or one gap), graph replays. ``table``: the
    taxonomy's categories, whose marks (role, collective) say which categories a fact sums."""
    cats = stats.categories
    comm = {c: cats[c] for c in comm_categories if c in cats}
    comm_total = sum(c.total_us for c in comm.values())
    attention = [cats[c] for c in cats if c in table and table[c].role == "attention"]

    def of_collective(op: str) -> float:  # the share of the collective time in categories that run ``op``
        us = sum(s.total_us for c, s in comm.items() if c in table and table[c].collective == op)
        return us / comm_total if comm_total else 0.0

    comm_calls = sum(c.calls_per_step for c in comm.values())
    step = stats.step_us.mean
    values: dict[str, Any] = {
        "phase_name": phase, "step_us": step, "busy_us_per_step": stats.busy_us_per_step,
        "idle_us_per_step": stats.idle_us_per_step,
        "idle_share_mean": stats.idle_us_per_step / step if step > 0 else 0.0,
        "comm_share": sum(c.share for c in comm.values()),
        "share_pct": 100 * sum(c.share for c in comm.values()),
        "per_step_us": comm_total / stats.steps, "calls_per_step": comm_calls,
        "mean_call_us": comm_total / (comm_calls * stats.steps) if comm_calls else 0.0,
        "top_comm": max(comm, key=lambda c: comm[c].total_us) if comm else None,
        "all_to_all_share_of_comm": of_collective("all_to_all"),
        "all_reduce_share_of_comm": of_collective("all_reduce"),
        "median_msg_bytes": int(statistics.median(sizes)) if sizes else None,
        "attention_share": sum(s.share for s in attention),
        "other_share": cats[CATEGORY_OTHER].share if CATEGORY_OTHER in cats else 0.0,
        "comm_us_per_step": comm_total / stats.steps if stats.steps else 0.0,
        "quant_standalone_us": stats.quant_standalone_us_per_step,
        "quant_fused_us": stats.quant_fused_us_per_step,
        "quant_phase_share": stats.quant_standalone_share + stats.quant_fused_share,
        "quant_phase_pct": 100 * (stats.quant_standalone_share + stats.quant_fused_share),
        "quant_standalone_pct": 100 * stats.quant_standalone_share,
        "quant_fused_pct": 100 * stats.quant_fused_share,
    }
    if attention and values["attention_share"]:
        values["attention_us_per_step"] = sum(s.per_step_us for s in attention)
    gaps = facts.measures.of_phase(phase) if facts is not None else []  # each step's, measured once
    if gaps:
        shares = [g.idle_us / g.span_us for g in gaps if g.span_us > 0]
        idle_total = sum(g.idle_us for g in gaps)
        worst = max(gaps, key=lambda g: g.largest_gap_us)
        middle = sorted(gaps, key=lambda g: g.idle_us / g.span_us if g.span_us > 0 else 0.0)[(len(gaps) - 1) // 2]
        values.update({
            "median_idle_us": middle.idle_us, "median_step_us": middle.span_us,
            "idle_share": float(statistics.median(shares)) if shares else 0.0,
            "largest_gap_us": worst.largest_gap_us, "gap_step": worst.step, "gap_at_us": worst.largest_gap_at_us,
            "largest_gap_of_idle": min(worst.largest_gap_us / idle_total, 1.0) if idle_total > 0 else 0.0,
        })
        values["largest_gap_of_idle_pct"] = 100 * values["largest_gap_of_idle"]
    values["idle_pct"] = 100 * values.get("idle_share", values["idle_share_mean"])
    values["idle_pct_mean"] = 100 * values["idle_share_mean"]
    values["phase_graph_share"] = (facts.measures.graph_share(phase) or 0.0) if facts is not None else None
    return values


# ---------------------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------------------

def _kernel_conditions(rows: Sequence[KernelRow], data: Mapping[str, Any]) -> dict[str, bool]:
    """Every ``kernels`` condition for one rank's kernels (their names; of its ``categories`` only, where the
    condition names some), evaluated once."""
    names = sorted({k.name for k in rows})
    by_category: dict[str, set[str]] = {}
    for k in rows:
        by_category.setdefault(k.category, set()).add(k.name)
    out: dict[str, bool] = {}
    for c, spec in data["conditions"].items():
        if "kernels" not in spec:
            continue
        picked = names if "categories" not in spec else sorted(
            {n for cat in spec["categories"] for n in by_category.get(cat, ())})
        out[c] = any(map(_matcher(spec, "kernels"), picked))
    return out


def _condition(name: str, values: Mapping[str, Any], kernel_holds: Mapping[str, bool],
               data: Mapping[str, Any]) -> bool:
    spec = data["conditions"][name]
    if "kernels" in spec:
        return kernel_holds.get(name, False)
    value = values.get(spec["fact"])
    if value is None:
        return False  # not measured: neither proven nor ruled out
    if "at_least" in spec:
        return bool(value >= spec["at_least"])
    return bool(value < spec["below"])


def _severity(value: float, rule: Mapping[str, Any]) -> str | None:
    if "info" in rule:
        return "info" if value >= rule["info"] else None
    if value >= rule["high"]:
        return "high"
    if value >= rule["medium"]:
        return "medium"
    return None


def _evaluate(rule_id: str, rule: Mapping[str, Any], values: dict[str, Any], names: Mapping[str, bool],
              data: Mapping[str, Any], *, rank: int | None, phase: str | None,
              deployment: Mapping[str, SettingEvidence] | None = None) -> Instance | None:
    value = values.get(rule["metric"])
    if value is None:
        return None
    severity = _severity(float(value), rule)
    if severity is None:
        return None
    holds = {c: _condition(c, values, names, data) for c in (*rule.get("needs", ()), *rule.get("ruled_out_by", ()))}
    if not all(holds[c] for c in rule.get("needs", ())) or any(holds[c] for c in rule.get("ruled_out_by", ())):
        return None
    advice: list[Advice] = []
    checked: list[str] = []
    for spec in rule.get("advice", ()):
        if not all(_condition(c, values, names, data) for c in spec.get("when", ())) or any(
                _condition(c, values, names, data) for c in spec.get("unless", ())):
            continue
        given, what = advice_for(spec, values, deployment or {})
        advice.extend([given] if given is not None else [])
        checked.extend([what] if what is not None else [])
    floor = rule.get("min_gain_share")
    if floor is not None and not any(a.gain is not None and a.gain.step_us > 0 and a.gain.high_us / a.gain.step_us
                                     >= floor for a in advice):
        return None  # what it would advise saves nothing that shows (rounds to 0% of the step)
    return Instance(rule_id, severity, float(value), rank, phase, values, tuple(advice), tuple(checked))


def _deployment_values(deployment: Mapping[str, SettingEvidence], graph_share: float) -> dict[str, float]:
    """Facts the rules read from the deployment: the serving engine (or a training run), the platform, and whether
    graphs are expected to run."""
    graphs = deployment.get("cuda_graphs")
    platform = deployment.get("platform")
    engine = deployment.get(ENGINE_SETTING)
    served = engine.value if engine is not None else ""
    return {"engine_vllm": 1.0 if served == "vllm" else 0.0, "engine_sglang": 1.0 if served == "sglang" else 0.0,
            "training_run": 1.0 if served == "training" else 0.0,
            "graphs_expected": 1.0 if graph_share > 0 or (graphs is not None and graphs.value in ("on", "not replayed"))
            else 0.0,
            "platform_rocm": 1.0 if platform is not None and platform.value == "rocm" else 0.0}


def find_bottlenecks(ranks: list[RankAnalysis], across: list[CrossRankStats], kernels: list[KernelRow],
                     comm_categories: list[str], msg_bytes: dict[int, list[int]],
                     facts: Mapping[int, RankFacts] | None = None,
                     rules_data: Mapping[str, Any] | None = None, *,
                     deployment: Mapping[str, SettingEvidence] | None = None,
                     reference: StepReference | None = None,
                     categories: Mapping[str, Category] | None = None) -> list[Finding]:
    """All findings for one analysis, most severe first, one per cause.

    Args:
        comm_categories: the taxonomy's communication categories.
        msg_bytes: per rank, the message sizes collective kernels recorded (may be empty).
        facts: per rank, graph replays and idle gaps (:func:`servescope.trace.rules.facts.rank_facts`); without
            them no rule that needs them fires.
        rules_data: the findings data to apply (default: the bundled :func:`load_rules`).
        deployment: the effective settings advice is checked against (:mod:`servescope.trace.rules.deployment`).
        reference: the decode step timed without the profiler (``profile``), for what the profiler stretched.
        categories: the taxonomy's categories (default: the bundled ones), whose marks say which a fact sums.
    """
    data = rules_data if rules_data is not None else load_rules()
    table = categories if categories is not None else bundled_categories()
    rules: dict[str, dict[str, Any]] = data["rules"]
    facts = facts or {}
    instances: list[Instance] = []
    by_rank_kernels: dict[int, list[KernelRow]] = {}
    for k in kernels:
        by_rank_kernels.setdefault(k.rank, []).append(k)
    for ra in ranks:
        rows = by_rank_kernels.get(ra.rank, [])
        names = _kernel_conditions(rows, data)
        rank_values = _rank_values(ra, rows, facts.get(ra.rank), data)
        rank_values["top_other"], rank_values["snippet"] = unclassified(rows)
        rank_values.update(_deployment_values(deployment or {}, rank_values["graph_replay_share"]))
        for rule_id, rule in rules.items():
            if rule["scope"] == "rank":
                found = _evaluate(rule_id, rule, dict(rank_values), names, data, rank=ra.rank, phase=None,
                                  deployment=deployment)
                instances.extend([found] if found else [])
        for phase in PHASES_CHECKED:
            stats = ra.phases.get(phase)
            if stats is None or stats.steps == 0:
                continue
            values = {**rank_values, **_phase_values(ra, phase, stats, facts.get(ra.rank), comm_categories,
                                                     msg_bytes.get(ra.rank) or [], table),
                      **host_values(ra, phase, stats, facts.get(ra.rank), reference)}
            for rule_id, rule in rules.items():
                if rule["scope"] == "phase":
                    found = _evaluate(rule_id, rule, values, names, data, rank=ra.rank, phase=phase,
                                      deployment=deployment)
                    instances.extend([found] if found else [])
    instances.extend(_across(rules, across, data))
    out = merge_findings(instances, rules, {ra.rank: ra.work_kind for ra in ranks})
    out.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), f.id, f.rank if f.rank is not None else -1))
    return out


def _across(rules: Mapping[str, dict[str, Any]], across: list[CrossRankStats],
            data: Mapping[str, Any]) -> list[Instance]:
    out: list[Instance] = []
    for cross in across:
        if cross.phase not in PHASES_CHECKED:
            continue
        spread = cross.step_us
        ratio = spread.max_us / spread.min_us if spread.min_us > 0 else 1.0
        values: dict[str, Any] = {
            "rank_imbalance_ratio": ratio, "ratio": ratio, "max_rank": spread.max_rank, "max_us": spread.max_us,
            "min_rank": spread.min_rank, "min_us": spread.min_us,
        }
        found = _evaluate("rank_imbalance", rules["rank_imbalance"], values, {}, data, rank=None, phase=cross.phase)
        out.extend([found] if found else [])
        skew = cross.collective_start_skew_us
        for rank, share in cross.collective_wait_share.items():
            values = {
                "collective_wait_share": share, "wait_rank": int(rank), "wait_share_pct": 100 * share,
                "wait_us_per_step": cross.collective_wait_us_per_step[rank],
                "collective_us_per_step": cross.collective_us_per_step[rank],
                "skew_median_us": skew.median if skew is not None else None,
            }
            found = _evaluate("collective_wait", rules["collective_wait"], values, {}, data, rank=int(rank),
                              phase=cross.phase)
            out.extend([found] if found else [])
    return out
