"""The ``plan --json`` document: every layout of a model on N GPUs, at each batch.

The top level is typed here; each layout, point, factor and calibration is an object whose keys
:mod:`servescope.plan.planner` documents (``layouts[].points[].tokens_per_s``, ``fits_kv``, ...). ``plan`` builds
the document as plain data and converts it here before writing, so a saved plan is checked on the way in and out.
"""

from __future__ import annotations

from typing import Any

import msgspec

from servescope.core.document import Document

__all__ = ["PLAN_SCHEMA", "PLAN_SCHEMA_VERSION", "PlanDoc", "plan_document"]

PLAN_SCHEMA = "servescope.plan"
PLAN_SCHEMA_VERSION = 1


class PlanDoc(Document, kw_only=True, frozen=True):
    """A plan: inputs (``inputs``: model, hardware, gpus, batches, context, comm and calibrate files), the model
    and hardware as read, factors with origins, per-layout memory and points, crossovers and the choice."""

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

    def as_dict(self) -> dict[str, Any]:
        """The document as plain data, as :func:`servescope.plan.planner.run_plan` returns it."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


def plan_document(data: dict[str, Any]) -> PlanDoc:
    """``run_plan``'s plain data as a :class:`PlanDoc` (a wrong type raises ``msgspec.ValidationError``)."""
    return msgspec.convert(data, PlanDoc)
