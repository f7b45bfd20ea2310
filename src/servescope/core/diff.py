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


class DiffDoc(Document, kw_only=True, frozen=True):
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
