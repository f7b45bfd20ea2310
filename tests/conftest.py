"""Shared fixtures; the helpers they use live in tracefiles.py (importable as `tracefiles`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefiles import all_shared_traces


@pytest.fixture(scope="session")
def shared_traces() -> list[Path]:
    return all_shared_traces()
