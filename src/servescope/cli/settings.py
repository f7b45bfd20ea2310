"""settings: the complete effective configuration of a deployed server."""

from __future__ import annotations
