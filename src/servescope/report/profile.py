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
                   trace_files: Sequence[Path], usage: Sequence[Mapping[str, int]],
                   unprofiled_ms: float | None = None, runs_ms: Sequence[float] = (),
                   profiled_ms: float | None = None, other_batches_ms: Mapping[int, float] | None = None,
                   after_note: str | None = None, before_note: str | None = None) -> None:
    """One header block: what was profiled, what the server reported (its inter-token latency over each unprofiled
    run, ``unprofiled_ms`` their median, over the profiled batch, and the median at each other batch timed; what
    the runs after the window showed, and whether the server had been profiled before), which files were analyzed."""
    got = [u.get("completion_tokens") for u in usage]
    console.print(f"profiled {url} ({model}): {batch} concurrent × {output_tokens} output tokens, "
                  f"{input_tokens} input tokens; server usage completion_tokens: "
                  f"{', '.join('N/A' if g is None else str(g) for g in got)}", markup=False, soft_wrap=True)
    if unprofiled_ms is not None:
        each = f" (median of {len(runs_ms)} runs: {', '.join(f'{r:.2f}' for r in runs_ms)})" if len(runs_ms) > 1 else ""
        under = f"; under the profiler {profiled_ms:.2f} ms" if profiled_ms is not None else ""
        console.print(f"  server's inter-token latency without the profiler: {unprofiled_ms:.2f} ms{each}{under}",
                      markup=False, soft_wrap=True)
    if other_batches_ms:
        console.print("  the same without the profiler at other batches: " + ", ".join(
            f"{b} → {ms:.2f} ms" for b, ms in sorted(other_batches_ms.items())), markup=False, soft_wrap=True)
    for note in (before_note, after_note):
        if note:
            console.print(f"  {note}", markup=False, soft_wrap=True)
    for path in trace_files:
        console.print(f"  trace: {path}", markup=False, soft_wrap=True)
