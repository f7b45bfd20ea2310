"""The ``profile`` views: its JSON document (the analysis plus ``trace_files``) and a header before the tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from servescope.core.analysis import AnalysisDoc
from servescope.core.document import encode as encode_document

__all__ = ["encode_profile", "render_capture"]


def encode_profile(doc: AnalysisDoc, trace_files: Sequence[Path], *,
                   capture: Mapping[str, Any] | None = None) -> bytes:
    """The ``analyze --json`` document with ``trace_files`` (and ``profile``, the run's settings) added."""
    body: dict[str, Any] = msgspec.to_builtins(doc)
    body["trace_files"] = [str(p) for p in trace_files]
    if capture is not None:
        body["profile"] = dict(capture)
    return encode_document(body)


def render_capture(console: Console, *, url: str, model: str, batch: int, output_tokens: int, input_tokens: int,
                   trace_files: Sequence[Path], usage: Sequence[Mapping[str, int]]) -> None:
    """One header block: what was profiled, what the server reported, which files were analyzed."""
    got = [u.get("completion_tokens") for u in usage]
    console.print(f"profiled {url} ({model}): {batch} concurrent × {output_tokens} output tokens, "
                  f"{input_tokens} input tokens; server usage completion_tokens: "
                  f"{', '.join('N/A' if g is None else str(g) for g in got)}", markup=False, soft_wrap=True)
    for path in trace_files:
        console.print(f"  trace: {path}", markup=False, soft_wrap=True)
