"""Test helpers: the real traces in ../shared/traces (never copied into the repo), read by a plain route."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "traces"


def all_shared_traces() -> list[Path]:
    """Every real trace in ../shared/traces; fails loudly when the folder is missing."""
    found = sorted(TRACES.glob("*/*.json.gz"))
    assert found, f"no traces under {TRACES}: CI lays ../shared beside the checkout"
    return found


def load_events(path: Path) -> list[dict[str, Any]]:
    """Plain json.load of a trace: the independent route the tests compare against."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    return doc["traceEvents"] if isinstance(doc, dict) else doc
