"""The ``bench comm --json`` document: the curve file measured, the best all_reduce at decode sizes, the unit's
``Environment=`` lines and what failed.

The curve file itself (:class:`~servescope.core.comm.CurveDoc`, ``servescope.comm-curves/1``) stays a stdlib
dataclass: ``plan`` reads it and it is bundled as data; msgspec decodes it here with the same field checks.
"""

from __future__ import annotations

import msgspec

from servescope.core.comm import CurveDoc
from servescope.core.document import Document

__all__ = ["CommResultDoc", "DecodeChoiceRow"]


class DecodeChoiceRow(msgspec.Struct, kw_only=True, frozen=True):
    """The fastest all_reduce curve at one decode message size (``hidden × batch × elem`` bytes); µs."""

    batch: int
    bytes: int
    variant: str
    graph: bool
    time_us: float
    default_time_us: float | None


class CommResultDoc(Document, kw_only=True, frozen=True):
    """One ``bench comm`` run. ``output`` is the curve file written (``-o``), ``None`` without one."""

    schema: str = "servescope.bench_comm"
    schema_version: int = 1
    curves: CurveDoc
    best_at_decode: list[DecodeChoiceRow]
    environment: list[str]
    failures: list[str]
    output: str | None
