"""``analyze`` as one feature function: the paths a user names → the analysis document and what its text needs.

:func:`analyze_traces` does the whole command but its flags and its output: it finds the traces (once), reads the
settings and profile documents beside them as evidence, says what a named directory held besides traces, takes
the read-ahead that already decodes them (or starts one before the analysis is imported) and runs
:func:`servescope.trace.analyze.analyze`. The command line parses, calls it, and emits what it returns.

This module imports only the standard library and the light parts of ``trace/`` at import time: the analysis
(numpy and every rule) is imported once the traces decode in child processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from servescope.core.analysis import AnalysisDoc
    from servescope.trace.analyze import Progress
    from servescope.trace.read.files import Discovery
    from servescope.trace.read.readahead import ReadAhead

__all__ = ["AnalyzeRun", "HeadStart", "analyze_traces"]


class HeadStart(Protocol):
    """Traces found and decoding before the caller knew its flags (the command line's head start)."""

    def found(self, chosen: Sequence[Path]) -> Discovery: ...

    def claim(self, found: Sequence[Path]) -> ReadAhead | None: ...


@dataclass(frozen=True, slots=True)
class AnalyzeRun:
    """The analysis of the traces named (its next steps in it), the server's command line from the settings
    evidence, and the traces read."""

    doc: AnalysisDoc
    argv: list[str]
    traces: list[Path]


def analyze_traces(paths: Sequence[Path], *, example: bool = False, example_name: str | None = None,
                   taxonomy: Path | None = None, step_gap_us: float | None = None, settings: Sequence[Path] = (),
                   warn: Callable[[str], None] | None = None, progress: Progress | None = None,
                   head_start: HeadStart | None = None) -> AnalyzeRun:
    """Analyze the traces in ``paths`` (files or directories) and, with ``example`` or ``example_name``, a bundled
    example's (by default :data:`~servescope.trace.read.files.EXAMPLE_NAME`).

    ``settings``: saved settings documents of the server (those found beside the traces are read too).
    ``warn``: told each line about what a named directory held besides traces (the bundled example's own side
    files and the evidence used go unsaid), before the analysis runs. ``head_start``: the traces already found
    and decoding (the command line's), used when they are exactly the ones named.

    Raises:
        InputError: a path, a settings document, a trace or the taxonomy cannot be used (one line).
    """
    from servescope.trace.read.files import example_trace_dir, find_traces, left_out_lines
    from servescope.trace.read.readahead import ReadAhead
    from servescope.trace.rules.deployment import evidence_beside

    chosen = list(paths)
    bundled = None
    if example or example_name is not None:
        bundled = example_trace_dir(example_name) if example_name is not None else example_trace_dir()
    if bundled is not None:
        chosen.append(bundled)
    discovery = head_start.found(chosen) if head_start is not None else find_traces(chosen)
    found = discovery.traces
    evidence = evidence_beside(discovery, settings)
    if warn is not None:
        for line in left_out_lines([(p, why) for p, why in discovery.left_out
                                    if (bundled is None or not p.is_relative_to(bundled)) and p not in evidence.used]):
            warn(line)
    claimed = head_start.claim(found) if head_start is not None else None
    with claimed or ReadAhead(found, min_files=1) as read_ahead:  # decoding starts before the analysis' imports
        from servescope.core.next_steps import analysis_next_steps  # all imported while the traces decode
        from servescope.trace.analyze import AnalyzeRequest, analyze

        request = AnalyzeRequest(paths=discovery, taxonomy=taxonomy, step_gap_us=step_gap_us,
                                 settings=evidence.settings, reference=evidence.reference)
        doc = analyze(request, progress=progress, read_ahead=read_ahead)
    argv = list(next((s.argv for s in evidence.settings if s.argv), []))
    from servescope.core.next_steps import analysis_next_steps
    from servescope.trace.read.files import log_lines_beside

    steps = analysis_next_steps(doc, argv=argv, log_lines=log_lines_beside(found))
    if steps:  # in the document, so that -o, --json and `report` say them too
        import msgspec

        doc = msgspec.structs.replace(doc, next_steps=steps)
    return AnalyzeRun(doc=doc, argv=argv, traces=list(found))
