"""Former home of the document JSON helpers, kept as names for callers: the one encode/decode is
:mod:`servescope.core.document`."""

from __future__ import annotations

from servescope.core.analysis import decode_analysis
from servescope.core.document import encode as encode_document

__all__ = ["decode_analysis", "encode_analysis", "encode_document"]

encode_analysis = encode_document
