"""plan: what another parallel layout would cost."""

from __future__ import annotations
