"""The ``plan --json`` document: every layout of a model on N GPUs, at each batch.

The top level is typed here; each layout, point, factor and calibration is an object whose keys
:mod:`servescope.plan.planner` documents (``layouts[].points[].tokens_per_s``, ``fits_kv``, ...). ``plan`` builds
the document as plain data and converts it here before writing, so a saved plan is checked on the way in and out.
"""

from __future__ import annotations

from typing import Any

import msgspec

from servescope.core.document import Document

__all__ = ["PLAN_SCHEMA", "PLAN_SCHEMA_VERSION", "EpTpAt", "EpTpCrossing", "EpTpSide", "EpVsTp", "PlanDoc",
           "plan_document"]

PLAN_SCHEMA = "servescope.plan"
PLAN_SCHEMA_VERSION = 1


class EpTpSide(msgspec.Struct, kw_only=True, frozen=True):
    """One side (the fastest EP or TP layout) at one batch: its step, parts and collectives.

    Attributes:
        layout: the layout's name (``TP=8 EP=8``).
        step_ms: its predicted decode step.
        parts_ms: ``weights``, ``attention``, ``collectives``, ``other``.
        origins: per part, where its figures come from (as the layout's point says).
        collectives: per collective of the step ``{op, what, count, group, bytes_each, us_each, wait_us_each,
            ms, origin, path}``: the count and time a call behind the collectives part.
        all_to_all: its all-to-all as the PCIe model priced it (``senders``, ``bytes_each``, ``link_bytes``,
            ``bridge_bytes``, ``link_gbps``, ``link_efficiency``, ``bridge_gbps``, ``latency_us`` each ``{value,
            unit, origin, source}``, ``link_us``, ``bridge_us``, ``bound``, ``us``, ``assumption``); ``null``
            where no all-to-all or another figure priced it.
    """

    layout: str
    step_ms: float
    parts_ms: dict[str, float]
    origins: dict[str, list[str]]
    collectives: list[dict[str, Any]]
    all_to_all: dict[str, Any] | None = None


class EpTpAt(msgspec.Struct, kw_only=True, frozen=True):
    """The fastest EP and TP layouts at one batch."""

    batch: int
    ep: EpTpSide
    tp: EpTpSide


class EpTpCrossing(msgspec.Struct, kw_only=True, frozen=True):
    """A batch where the faster of EP and TP changes: ``faster_below`` up to ``batch − 1``, ``faster_from`` at it."""

    batch: int
    faster_below: str  # the layout faster one batch below
    faster_from: str  # the layout faster at the batch


class EpVsTp(msgspec.Struct, kw_only=True, frozen=True):
    """Where EP and TP cross over batch: the fastest layout with expert parallelism against the tensor-parallel one.

    Attributes:
        ep_layouts: the feasible layouts with EP (``TP=8 EP=8``, ``DP=8 EP=8``); the fastest at each batch is
            EP's side.
        tp_layouts: the feasible layout splitting everything over all GPUs by TP (``TP=8``).
        searched: ``[first, last]`` batch searched (every power of two, then bisection to the integer batch).
        faster_first: the layout faster at the first batch searched.
        crossover_batch: the first batch at which the other side is faster; ``null``: none in the range.
        crossings: every change of the faster side found.
        at: the two sides one batch below and at the crossover (without one: at the first and last batch).
        kv_max_batch: per layout, the most requests its KV cache holds at the plan's context.
        sentence: the answer in one sentence, naming the batch.
        reasons: the reason in numbers: the collectives (count × µs a call), the other parts, the all-to-all's
            bound, the KV cache.
    """

    ep_layouts: list[str]
    tp_layouts: list[str]
    searched: list[int]
    faster_first: str
    crossover_batch: int | None
    crossings: list[EpTpCrossing]
    at: list[EpTpAt]
    kv_max_batch: dict[str, int]
    sentence: str
    reasons: list[str]


class PlanDoc(Document, kw_only=True, frozen=True):
    """A plan: inputs (``inputs``: model, hardware, gpus, batches, context, comm and calibrate files), the model
    and hardware as read, factors with origins, per-layout memory and points, crossovers and the choice, and where
    EP and TP cross."""

    schema: str = PLAN_SCHEMA
    schema_version: int = PLAN_SCHEMA_VERSION
    servescope_version: str
    created_at: str
    platform: dict[str, str]
    inputs: dict[str, Any]
    model: dict[str, Any]
    hardware: dict[str, Any]
    gpus: int
    context: int
    batches: list[int]
    factors: dict[str, dict[str, Any]]
    curves: list[dict[str, Any]]
    calibration: dict[str, Any] | None
    layouts: list[dict[str, Any]]
    skipped: list[str]
    crossovers: list[dict[str, Any]]
    recommendation: dict[str, Any]
    forced: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    ep_vs_tp: EpVsTp | None = None  # where EP and TP cross over batch, with the reason in numbers (MoE models)

    def as_dict(self) -> dict[str, Any]:
        """The document as plain data, as :func:`servescope.plan.planner.run_plan` returns it."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


def plan_document(data: dict[str, Any]) -> PlanDoc:
    """``run_plan``'s plain data as a :class:`PlanDoc` (a wrong type raises ``msgspec.ValidationError``)."""
    return msgspec.convert(data, PlanDoc)
