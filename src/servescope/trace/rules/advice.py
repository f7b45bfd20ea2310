"""A finding's advice: kept only where the deployment does not already follow it, each with what it would save.

A piece of advice in ``data/findings.toml`` may name the deployment ``setting`` it changes and the values that
mean it is already ``in_place``; :mod:`servescope.trace.rules.deployment` tells the setting's value and its source.
Where the value is in place the advice is dropped and the finding says what it checked; where no source told,
the advice stays and says so. ``gain`` turns a fact of the phase (µs per step) into the range the change would
save: ``[low, high]`` × the basis, with the sentence that says why (the ranges are checked against measured A/B
pairs in ``tests/trace/test_advice_ab.py`` and ``docs/measurements.md``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from servescope.core.analysis import Advice, Gain, PhaseStats, RankAnalysis, SettingEvidence, StepReference, StepRow
from servescope.core.messages import format_message, step_time
from servescope.trace.rules.deployment import describe
from servescope.trace.rules.facts import RankFacts

__all__ = ["advice_for", "advice_text", "checked_text", "host_values", "step_cycle_us"]


def _gain(spec: Mapping[str, Any], values: Mapping[str, Any]) -> Gain | None:
    gain = spec.get("gain")
    if not gain:
        return None
    basis = values.get(gain["basis"])
    # the whole step cycle: the step timed without the profiler where profile measured it, else the traced step
    # with the host gap that follows it (what a change could shorten)
    step = values.get("reference_step_us") or values.get("period_us") or values.get("step_us")
    if not isinstance(basis, (int, float)) or not isinstance(step, (int, float)) or basis <= 0 or step <= 0:
        return None
    why = format_message(gain["why"], {**values, "basis_us": basis})
    high = min(gain["high"] * basis, float(step))  # no change saves more than the step
    return Gain(low_us=round(min(gain["low"] * basis, high), 1), high_us=round(high, 1), step_us=round(float(step), 1),
                basis=why)


def advice_for(spec: Mapping[str, Any], values: Mapping[str, Any],
               deployment: Mapping[str, SettingEvidence]) -> tuple[Advice | None, str | None]:
    """The advice ``spec`` gives here (None when its setting is already in place) and what was checked."""
    setting = spec.get("setting")
    if setting is None:
        return Advice(text=format_message(spec["text"], values), gain=_gain(spec, values)), None
    evidence = deployment.get(setting)
    checked = describe(setting, evidence)
    contains = spec.get("in_place_contains")
    if evidence is not None and (evidence.value in spec.get("in_place", ())
                                 or (contains is not None and contains in evidence.value)):
        return None, checked
    return Advice(text=format_message(spec["text"], values), setting=setting, setting_known=evidence is not None,
                  gain=_gain(spec, values)), checked


def advice_text(advice: Advice) -> str:
    """One piece of advice as the message shows it: the change, what it would save, whether it may be on."""
    text = advice.text
    if advice.gain is not None:
        g = advice.gain
        text += (f" [expected: saves {step_time(g.low_us)}–{step_time(g.high_us)} of the {step_time(g.step_us)} "
                 f"step cycle ({g.low_us / g.step_us:.0%}–{g.high_us / g.step_us:.0%}): {g.basis}]")
    return text


def checked_text(checked: list[str]) -> str:
    """``Checked: async scheduling: on, from …; CUDA graphs: on, from …``."""
    return "Checked: " + "; ".join(checked) + "." if checked else ""


def _steps_text(indices: Sequence[int]) -> str:
    """``steps 0, 2–7``: the step indices, runs joined."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    shown = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    return f"step{'s' if len(indices) != 1 else ''} {shown}"


def step_cycle_us(rows: Sequence[StepRow]) -> float:
    """A phase's step cycle (µs): its steps' mean span plus the mean host gap before each (between steps, the
    device waits for the host too). What a gain is predicted on and what ``diff`` measures; 0 without steps."""
    if not rows:
        return 0.0
    gaps = [r.gap_before_us for r in rows if r.gap_before_us is not None]
    return statistics.fmean(r.span_us for r in rows) + (statistics.fmean(gaps) if gaps else 0.0)


def host_values(ra: RankAnalysis, phase: str, stats: PhaseStats, facts: RankFacts | None,
                 reference: StepReference | None) -> dict[str, Any]:
    """How much of the phase's step the host leaves the device waiting, with the profiler and (for decode,
    where ``profile`` timed it) without: the basis of what async scheduling or graphs would save."""
    rows = {r.index: r for r in ra.steps if r.phase == phase}
    period = step_cycle_us(list(rows.values()))
    busy = stats.busy_us_per_step
    values: dict[str, Any] = {"steps_text": _steps_text(sorted(rows)), "step_indices": sorted(rows),
                              "period_us": period, "between_steps_us": period - stats.step_us.mean}
    exposed = max(period - busy, 0.0)
    if reference is not None and phase == "decode" and reference.step_us > 0:
        exposed = max(reference.step_us - busy, 0.0)
        values.update({
            "reference_step_us": reference.step_us, "reference_source": reference.source,
            "idle_share_unprofiled": exposed / reference.step_us,
            "idle_pct_unprofiled": 100 * exposed / reference.step_us,
            "stretch": period / reference.step_us - 1.0, "stretch_pct": 100 * (period / reference.step_us - 1.0),
        })
    values["host_exposed_us"] = exposed
    values["overlap_bound_us"] = min(exposed, busy)
    step_gaps = facts.measures.of_phase(phase) if facts is not None else []  # each step's measures, made once
    if step_gaps:
        replayed = facts.measures.replayed_steps if facts is not None else frozenset()  # decided by the steps
        eager = [g.step for g in step_gaps if g.step not in replayed]
        values["eager_step_share"] = len(eager) / len(step_gaps)
        values["eager_steps_text"] = _steps_text(eager)
        values["eager_host_exposed_us"] = exposed * len(eager) / len(step_gaps)
        tokens = [(rows[i].prefill_tokens or 0) + (rows[i].decode_tokens or 0) for i in eager if i in rows]
        values["eager_max_tokens"] = max(tokens) if any(tokens) else "the batch"
    values["quant_standalone_of_quant"] = (stats.quant_standalone_us_per_step / quant
                                           if (quant := stats.quant_standalone_us_per_step
                                               + stats.quant_fused_us_per_step) > 0 else 0.0)
    return values
