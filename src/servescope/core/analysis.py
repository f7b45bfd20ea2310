"""The analysis result document: what ``servescope analyze --json`` writes and ``report`` re-renders.

Every view (table, JSON, HTML, diff) reads this document, never live trace objects, so a saved analysis
renders exactly as a fresh one. Times are microseconds (``_us``); shares are fractions of 0..1.
``None`` means *not available* and is written as ``null``.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "SCHEMA_VERSION",
    "AnalysisDoc",
    "CategoryStats",
    "CrossRankCategory",
    "CrossRankStats",
    "DeviceTotal",
    "Finding",
    "InputFile",
    "KernelRow",
    "PhaseStats",
    "RankAnalysis",
    "StepRow",
    "Summary",
    "TraceInfo",
]

SCHEMA_VERSION = 1


class Summary(msgspec.Struct, kw_only=True):
    """Mean and median of a per-step quantity, in µs."""

    mean: float
    median: float


class CategoryStats(msgspec.Struct, kw_only=True):
    """One category within one phase of one rank."""

    total_us: float
    share: float
    per_step_us: float
    calls_per_step: float
    mean_call_us: float


class PhaseStats(msgspec.Struct, kw_only=True):
    """Steps of one phase (decode, prefill, mixed, unknown) on one rank."""

    steps: int
    step_us: Summary
    busy_us_per_step: float
    idle_us_per_step: float
    device_us_per_step: float
    tokens_per_step: float | None
    us_per_output_token: float | None
    categories: dict[str, CategoryStats]


class StepRow(msgspec.Struct, kw_only=True):
    """One step: its phase, window and time per category (for per-step charts and diffs)."""

    index: int
    name: str
    phase: str
    start_us: float
    span_us: float
    busy_us: float
    prefill_requests: int | None = None
    prefill_tokens: int | None = None
    decode_requests: int | None = None
    decode_tokens: int | None = None
    categories: dict[str, float] = msgspec.field(default_factory=dict)


class RankAnalysis(msgspec.Struct, kw_only=True):
    rank: int
    path: str
    work_kind: str  # "device": kernels/memcpy/memset; "cpu_op": leaf CPU ops (traces without device events)
    step_source: str  # "annotation" | "profiler_step" | "gaps" | "whole"
    unattributed_us: float
    phases: dict[str, PhaseStats]
    steps: list[StepRow] = msgspec.field(default_factory=list)


class KernelRow(msgspec.Struct, kw_only=True):
    rank: int
    name: str
    category: str
    kind: str
    count: int
    total_us: float


class DeviceTotal(msgspec.Struct, kw_only=True):
    count: int
    total_us: float


class CrossRankCategory(msgspec.Struct, kw_only=True):
    """A category's per-step time across ranks."""

    min_us: float
    median_us: float
    max_us: float
    min_rank: int
    max_rank: int


class CrossRankStats(msgspec.Struct, kw_only=True):
    """One phase across ranks: spread per category and collective time spent waiting."""

    phase: str
    ranks: list[int]
    steps_compared: int
    categories: dict[str, CrossRankCategory]
    step_us: CrossRankCategory
    collective_us_per_step: dict[str, float]
    collective_wait_us_per_step: dict[str, float]
    collective_wait_share: dict[str, float]
    collective_start_skew_us: Summary | None


class Finding(msgspec.Struct, kw_only=True):
    id: str
    severity: str  # "high" | "medium" | "info"
    message: str
    evidence: dict[str, float | int | str | None]
    rank: int | None = None
    phase: str | None = None


class TraceInfo(msgspec.Struct, kw_only=True):
    path: str
    rank: int | None
    role: str  # "worker" | "frontend"
    events: int
    rank_source: str  # "distributedInfo" | "filename" | "only file" | "none"
    world_size: int | None = None


class InputFile(msgspec.Struct, kw_only=True):
    path: str
    size_bytes: int


class AnalysisDoc(msgspec.Struct, kw_only=True):
    schema: str = "servescope.analysis"
    schema_version: int = SCHEMA_VERSION
    servescope_version: str
    created_at: str
    platform: dict[str, str]
    options: dict[str, str | int | float | bool | None]
    inputs: list[InputFile]
    traces: list[TraceInfo]
    ranks: list[RankAnalysis]
    kernels: list[KernelRow]
    device_totals: dict[str, dict[str, DeviceTotal]]
    categories: dict[str, str]  # category -> group (communication | compute | memory | other)
    across_ranks: list[CrossRankStats]
    findings: list[Finding]
