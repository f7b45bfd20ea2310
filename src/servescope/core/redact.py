"""Secrets out of text we show: known key values, ``Bearer`` tokens, ``--api-key X``, ``*_TOKEN=X``.

Shared by every feature that shows text it did not write (server errors, process command lines).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MASK", "redact"]

MASK = "***"
_PATTERNS = (
    # Authorization: Bearer <token>
    re.compile(r"(?i)(\bbearer\s+)[^\s'\",]+"),
    # --api-key X, --api-key=X, --hf-token X ...
    re.compile(r"(?i)(--[\w-]*(?:api[-_]?key|token|secret|password)[= ]\s*)[^\s'\",]+"),
    # API_KEY=X, HF_TOKEN=X, MY_SECRET: X, 'api_key': 'X'
    re.compile(r"(?i)(\b[\w.-]*(?:api[-_]?key|token|secret|password)\b['\"]?\s*[=:]\s*\[?\s*['\"]?)"
               r"(?!\*\*\*)[^\s'\",\]}]+"),
)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with each of ``secrets`` and anything shaped like a credential replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text
