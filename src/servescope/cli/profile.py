"""profile: capture a live server's decode steps and analyze them."""

from __future__ import annotations
