"""The catalogue of changes speaking where findings are printed: ``analyze``, ``profile``, ``bench serve``.

:func:`evidence_of_analysis` turns an analysis into :class:`~servescope.core.changes.ChangeEvidence`;
:func:`next_steps` says the catalogue's first candidates for any evidence in sentences (``bench serve`` builds its
evidence from the knee's cause: ``ChangeEvidence(knee_cause=..., cause_figures=..., load=..., argv=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servescope.core.analysis import AnalysisDoc
from servescope.core.changes import ChangeEvidence, SeenFinding, catalogue_engine, match_changes
from servescope.core.knee import next_probe
from servescope.core.serve import ServeResult

__all__ = ["analysis_next_steps", "evidence_of_analysis", "knee_figures", "next_steps", "serve_next_steps"]

_STEADY_STEPS = 3  # a phase finding about fewer steps (an admission step or two) is context, not advice


def analysis_next_steps(doc: AnalysisDoc, *, argv: Sequence[str] = (),
                        log_lines: Sequence[str] = ()) -> list[str]:
    """:func:`next_steps` of an analysis, with the server's command line and log lines where known; none where the
    analysis does not show the catalogue's engine serving the run (a training trace, another engine, no evidence)."""
    engine = doc.deployment.get("engine")
    if engine is None or engine.value != catalogue_engine():
        return []
    return next_steps(evidence_of_analysis(doc, argv=list(argv), log_lines=list(log_lines)))


def next_steps(ev: ChangeEvidence, *, limit: int = 3) -> list[str]:
    """The catalogue's answer in sentences, for analyze / profile / bench serve: the top candidates
    (``--max-num-seqs 8: let more requests run at once (+10-70%)``), then what waits on an input."""
    matched = match_changes(ev)
    lines = [f"{c.edit.describe()}: {c.label} (predicted {c.gain_low:+.0%} to {c.gain_high:+.0%} goodput; "
             f"`servescope tune` tries it)" for c in matched.candidates[:limit]]
    lines += [f"{n.label}: {n.detail}" for n in matched.ruled_out if n.reason == "needs_input"]
    return lines


def evidence_of_analysis(doc: AnalysisDoc, **more: Any) -> ChangeEvidence:
    """An analysis (``analyze``, ``profile``) as evidence: its findings about steady state (a phase finding about
    fewer than three steps, such as one admission step, is left out), the saving its advice predicts as a share of
    the step, and the deployment settings it checked; ``more`` sets other fields (``log_lines``, ``argv``, ...)."""
    seen: list[SeenFinding] = []
    for finding in doc.findings:
        if finding.steps and len(finding.steps) < _STEADY_STEPS:
            continue
        gains = {a.setting or "": [a.gain.low_us / a.gain.step_us, a.gain.high_us / a.gain.step_us]
                 for a in finding.advice if a.gain is not None and a.gain.step_us > 0}
        facts = {k: float(v) for k, v in finding.evidence.items() if isinstance(v, int | float)}
        seen.append(SeenFinding(id=finding.id, severity=finding.severity, phase=finding.phase, gains=gains, facts=facts,
                                advice_settings=[a.setting for a in finding.advice if a.setting]))
    platform = doc.deployment.get("platform")
    batches = [p.tokens_per_step for r in doc.ranks for name, p in r.phases.items()
               if name == "decode" and p.tokens_per_step]
    fields: dict[str, Any] = {"findings": seen, "settings": dict(doc.deployment),
                              "platform": platform.value if platform else None,
                              "load": max(batches) if batches else None, **more}
    return ChangeEvidence(**fields)


def knee_figures(result: ServeResult) -> dict[str, float]:
    """The figures the catalogue reads of a knee search: its cause's evidence, and ``next_load``: where the knee can
    move once the step is shorter, the least load seen to miss the targets, or, where the search stopped before
    any load above the knee was measured (its budget ran out first: the knee is a lower bound), the load it would
    have measured next."""
    figures = dict(result.cause.evidence) if result.cause else {}
    if _streams(result) is None or (knee := result.knee) is None:
        return figures
    after = knee.next_load
    if after is None and result.search is not None:  # a floor knee: on the H100 capture-size servers knees of 64+
        after = next_probe(knee.load, result.search.max_load)  # moved to 96 once 64 was captured (twice of 3)
    if after is not None:
        figures["next_load"] = after
    return figures


def _streams(result: ServeResult) -> float | None:
    """The knee's load where it is a number of streams (what the catalogue reads as the batch served); None for a
    knee of requests/s (``--rate auto``) or none."""
    return result.knee.load if result.knee is not None and result.knee.unit == "streams" else None


def serve_next_steps(result: ServeResult, *, argv: Sequence[str] = ()) -> list[str]:
    """:func:`next_steps` of a ``bench serve`` result: the knee's cause and its figures at the knee's load, and
    the points' findings (``front_end_bound``), with the server's command line where known."""
    seen = {f.id: SeenFinding(id=f.id, severity=f.severity) for p in result.points for f in p.findings}
    cause = result.cause
    return next_steps(ChangeEvidence(
        knee_cause=cause.id if cause else None, cause_figures=knee_figures(result),
        load=_streams(result), findings=list(seen.values()), argv=list(argv)))
