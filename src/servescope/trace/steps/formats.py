"""How engines mark their steps and name their rank traces, as data: ``servescope/data/steps.toml``.

Each ``[[step]]`` entry is one engine's step marker (vLLM's ``execute_context_…_generation_…`` annotations,
SGLang's ``step[DECODE bs=32]``, vLLM V1's ``execute_model`` frames, ``ProfilerStep#N``), tried in the file's
order by :func:`servescope.trace.steps.find.find_steps`; each ``[[rank_name]]`` a file-name format that states a rank,
and each ``[[frontend]]`` one that marks a front end's trace, read by :mod:`servescope.trace.steps.ranks`. A new
engine's format is a new entry (with its real trace, which the tests run it on), not code.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec

from servescope.core.bundled import bundled_toml
from servescope.core.engines import check_engine, engine

__all__ = ["COUNTS", "MARKERS", "FrontendFormat", "RankNameFormat", "StepFormat", "StepFormats",
           "step_formats"]

MARKERS = ("annotation", "frame", "profiler_step")
COUNTS = ("prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens")
_PHASES = ("decode", "mixed", "prefill", "empty", "unknown")


class StepFormat(msgspec.Struct, frozen=True, kw_only=True):
    """One engine's step marker (see ``steps.toml`` for what each field means)."""

    id: str
    engine: str
    marker: str
    pattern: re.Pattern[str]
    step_source: str
    source: str
    examples: tuple[str, ...]
    trace: str
    modes: dict[str, str] = msgspec.field(default_factory=dict)
    prefer: re.Pattern[str] | None = None
    outermost: bool = False
    whole_window: bool = False
    graphs_by_default: bool = False  # its engine's (engines.toml), where it serves one
    serves: str | None = None  # the serving engine (an engines.toml id) whose steps these marks are, if one
    shared_form: re.Pattern[str] | None = None  # names of this form another engine writes too: they name no engine

    def parse(self, name: str) -> tuple[str, dict[str, int | None]] | None:
        """The phase and request counts (:data:`COUNTS`, None: not told) a marked name says, or None when this
        format does not mark ``name``.

        Example:
            >>> step_formats().step("vllm").parse("execute_context_0(0)_generation_4(4)")
            ('decode', {'prefill_requests': 0, 'prefill_tokens': 0, 'decode_requests': 4, 'decode_tokens': 4})
        """
        match = self.pattern.search(name)
        if match is None:
            return None
        groups = match.groupdict()
        counts = {key: _count(groups.get(key)) for key in COUNTS}
        if "mode" in groups:
            phase = self.modes.get(groups["mode"] or "", "unknown")
        elif "prefill_requests" in groups and "decode_requests" in groups:
            phase = _phase_of(counts["prefill_requests"] or 0, counts["decode_requests"] or 0)
        else:
            phase = "unknown"
        if "requests" in groups and phase in ("decode", "prefill"):
            counts[f"{phase}_requests"] = _count(groups["requests"])
        return phase, counts


class RankNameFormat(msgspec.Struct, frozen=True, kw_only=True):
    """A file-name format that states the rank (``pattern``'s one group)."""

    id: str
    engine: str
    pattern: re.Pattern[str]
    source: str
    examples: tuple[str, ...]
    trace: str


class FrontendFormat(msgspec.Struct, frozen=True, kw_only=True):
    """A file-name format of a front end's trace: the name contains ``contains``."""

    id: str
    engine: str
    contains: str
    source: str
    examples: tuple[str, ...]
    trace: str


class StepFormats(msgspec.Struct, frozen=True):
    """Every entry of ``steps.toml``, in the file's order."""

    steps: tuple[StepFormat, ...]
    rank_names: tuple[RankNameFormat, ...]
    frontends: tuple[FrontendFormat, ...]
    # [overlap]: a step's work still running this share of its span after the next step's began marks the steps
    # as overlapping (their windows then follow the cadence: servescope.trace.steps.cadence)
    overlap_tolerance: float = 0.01
    training_ops: tuple[re.Pattern[str], ...] = ()  # [training] ops: a backward pass or an optimizer step
    gaps_source: str = "gaps"  # [fallback]: the step_source of steps split at idle gaps
    whole_source: str = "whole"  # [fallback]: the step_source of one whole window

    def step(self, id: str) -> StepFormat:  # noqa: A002 - the entry's own key
        """The step format with this ``id``."""
        return next(f for f in self.steps if f.id == id)


def _count(text: str | None) -> int | None:
    return int(text) if text else None


def _phase_of(prefills: int, decodes: int) -> str:
    if prefills and decodes:
        return "mixed"
    return "prefill" if prefills else "decode" if decodes else "empty"


def _entry(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """One entry's keys, its patterns compiled and its examples a tuple; a bad entry fails loudly (it ships)."""
    out = dict(raw)
    for key in ("pattern", "prefer", "shared_form"):
        if key in out:
            try:
                out[key] = re.compile(out[key])
            except re.error as exc:
                raise ValueError(f"steps.toml {where} {raw.get('id')}: {key}: {exc}") from exc
    out["examples"] = tuple(out.get("examples", ()))
    if out.get("marker", "annotation") not in MARKERS:
        raise ValueError(f"steps.toml {where} {raw.get('id')}: marker {out['marker']!r} is none of {MARKERS}")
    if "serves" in out:  # the engine's own facts are its entry's in engines.toml
        out["graphs_by_default"] = engine(check_engine(out["serves"], "data/steps.toml",
                                                       f"{where} {raw.get('id')}: serves")).graphs_by_default
    if any(phase not in _PHASES for phase in out.get("modes", {}).values()):
        raise ValueError(f"steps.toml {where} {raw.get('id')}: a mode's phase is none of {_PHASES}")
    return out


@cache
def step_formats() -> StepFormats:
    """The bundled ``steps.toml``, read once."""
    data = bundled_toml("steps.toml")
    return StepFormats(
        steps=tuple(StepFormat(**_entry(raw, "[[step]]")) for raw in data.get("step", [])),
        rank_names=tuple(RankNameFormat(**_entry(raw, "[[rank_name]]")) for raw in data.get("rank_name", [])),
        frontends=tuple(FrontendFormat(**_entry(raw, "[[frontend]]")) for raw in data.get("frontend", [])),
        overlap_tolerance=float(data.get("overlap", {}).get("tolerance", 0.01)),
        training_ops=tuple(re.compile(p) for p in data.get("training", {}).get("ops", ())),
        gaps_source=data["fallback"]["gaps"], whole_source=data["fallback"]["whole"],
    )
