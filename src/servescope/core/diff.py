"""The diff document: two analyses side by side (``servescope diff A B --json``)."""

from __future__ import annotations

import msgspec

from servescope.core.analysis import Finding
from servescope.core.document import Document

__all__ = ["CategoryDelta", "DiffDoc", "RankDiff"]


class CategoryDelta(msgspec.Struct, kw_only=True):
    """One figure before and after, per step, in µs; ``delta_pct`` is None when ``before`` is 0."""

    before_us: float
    after_us: float
    delta_us: float
    delta_pct: float | None


class RankDiff(msgspec.Struct, kw_only=True):
    rank: int
    steps_before: int
    steps_after: int
    step_us: CategoryDelta
    busy_us: CategoryDelta
    idle_us: CategoryDelta
    categories: dict[str, CategoryDelta]


class SettingChange(msgspec.Struct, kw_only=True):
    """A deployment setting that differs between the two sides (``None``: no source told it on that side)."""

    setting: str
    before: str | None
    after: str | None


class PredictionCheck(msgspec.Struct, kw_only=True):
    """One piece of the before side's advice, its predicted saving against the measured change.

    ``applied``: its setting is one that changed (the change the after side made); ``outcome``: ``held`` (the
    measured saving lies in the range), ``short`` (below it), ``exceeded`` (above it).
    """

    finding: str
    advice: str
    setting: str | None
    applied: bool
    low_us: float
    high_us: float
    measured_saving_us: float
    outcome: str


class DiffDoc(Document, kw_only=True, frozen=True):
    """Two analyses compared in one ``phase``: ``before`` and ``after`` name them (their files); per rank with steps
    of the phase on both sides, its step, busy and idle time and each category (:class:`RankDiff`); the ranks on one
    side only; the findings that appeared and those gone; the settings that changed, and the before side's advice
    checked against the measured change (:class:`PredictionCheck`)."""

    schema: str = "servescope.diff"
    schema_version: int = 1
    servescope_version: str
    before: str
    after: str
    phase: str
    ranks: list[RankDiff]
    ranks_only_before: list[int]
    ranks_only_after: list[int]
    findings_appeared: list[Finding]
    findings_gone: list[Finding]
    # the step cycle before and after (µs): the unprofiled step where both sides were timed without the
    # profiler (profile), else the traced step with the host gap after it; and where it came from
    cycle_us: CategoryDelta | None = None
    cycle_source: str | None = None
    settings_changed: list[SettingChange] = msgspec.field(default_factory=list)
    predictions: list[PredictionCheck] = msgspec.field(default_factory=list)
