"""Secrets out of text we show: re-exported from servescope.core.redact, where every feature can reach it."""

from __future__ import annotations

from servescope.core.redact import MASK, redact

__all__ = ["MASK", "redact"]
