"""``analyze``: trace files → one analysis document (steps, breakdown per rank and phase, findings).

The traces are found once (by the CLI, or here for a library caller), read once, and each worker rank's context
(:class:`RankContext`: its work with each row's launch and graph replay, its steps with each row's step) is made
once and passed to every stage; each rank's part of the document is built whole from it.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import msgspec

from servescope import __version__
from servescope.core.analysis import AnalysisDoc, InputFile, RankAnalysis, StepReference, TraceInfo
from servescope.core.categories import category_entries
from servescope.core.engines import engines
from servescope.core.errors import InputError
from servescope.trace.classify.kernel_types import precision_evidence
from servescope.trace.classify.taxonomy import Taxonomy, load_taxonomy
from servescope.trace.classify.work import Work, select_work
from servescope.trace.classify.work_category import CaptureReference, capture_reference, is_capture
from servescope.trace.read.files import EXAMPLE_NAME, EXAMPLES, Discovery, example_trace_dir, find_traces
from servescope.trace.read.readahead import ReadAhead
from servescope.trace.read.table import TraceData
from servescope.trace.rules.deployment import DeploymentInput, deployment_settings, load_deployment_rules
from servescope.trace.rules.engine import ENGINE_SETTING, engine_evidence
from servescope.trace.rules.facts import RankFacts, rank_facts
from servescope.trace.rules.findings import find_bottlenecks, load_rules
from servescope.trace.rules.verdict import decide_verdicts
from servescope.trace.steps.breakdown import RankBreakdown, break_down
from servescope.trace.steps.find import Steps, find_steps
from servescope.trace.steps.formats import step_formats
from servescope.trace.steps.measures import StepMeasures, measure_steps
from servescope.trace.steps.ranks import RankedTrace, assign_ranks, compare_ranks, rank_from_name

__all__ = ["EXAMPLES", "EXAMPLE_NAME", "AnalyzeRequest", "Progress", "RankContext", "analyze", "example_trace_dir",
           "rank_context"]

class Progress(Protocol):
    """Optional progress sink (the CLI passes a rich progress bar; tests pass None)."""

    def advance(self, description: str) -> None: ...


class AnalyzeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What to analyze and how; every option that changes a number is recorded in the result."""

    # the traces the CLI found (find_traces), else the files or directories to find them in
    paths: Discovery | Sequence[str | Path]
    taxonomy: str | Path | None = None
    step_gap_us: float | None = None
    # what the live server or saved settings documents told of the deployment, best first
    settings: Sequence[DeploymentInput] = ()
    # the decode step timed without the profiler (profile: the server's own /metrics)
    reference: StepReference | None = None


def _read_all(paths: Sequence[Path], progress: Progress | None, read_ahead: ReadAhead | None,
              named: Collection[Path] | None = None, left_out: dict[str, str] | None = None) -> list[TraceData]:
    """Every file's tables, read by ``read_ahead`` when given (else by a new one: several files are decoded in
    parallel processes). A file found in a directory (not among ``named``; None: every file is named) that
    cannot be read goes into ``left_out`` with its reason, unless no file at all could be read.

    Raises:
        InputError: a named file cannot be read, or no file can.
    """
    if read_ahead is None:
        with ReadAhead(paths) as own:
            return _read_all(paths, progress, own, named, left_out)
    out = []
    first: InputError | None = None
    for path in paths:
        if progress is not None:
            progress.advance(f"reading {path.name}")
        try:
            out.append(read_ahead.take(path))
        except InputError as exc:
            if named is None or path in named or left_out is None:
                raise
            left_out[str(path)] = exc.problem
            first = first or exc
    if not out and first is not None:
        raise first
    return out


def _capture_rank(data: TraceData) -> int | None:
    info = data.distributed or {}
    return int(info["rank"]) if isinstance(info.get("rank"), int) else rank_from_name(data.path.name)


def _captures_by_rank(captures: list[TraceData], taxonomy: Taxonomy) -> dict[int, CaptureReference]:
    """Each graph-capture trace's launches, by the rank it captured (-1: the one capture, for every rank)."""
    out: dict[int, CaptureReference] = {}
    for data in captures:
        rank = _capture_rank(data)
        out[rank if rank is not None and len(captures) > 1 else -1] = capture_reference(data, taxonomy)
    return out


class RankContext(msgspec.Struct, frozen=True):
    """What every stage of one worker rank's analysis reads, made once: its trace, its work (each row with the
    runtime call that launched it and whether a graph replayed it), its steps (each work row's step) and, once the
    breakdown measured them, each step's measures (rows, busy, idle gaps, graph time, phase), which the facts and
    the rules read."""

    rank: int
    data: TraceData
    work: Work
    steps: Steps
    measures: StepMeasures | None = None


def rank_context(trace: RankedTrace, *, gap_us: float | None = None) -> RankContext:
    """The context of one worker rank's trace (``gap_us``: as :func:`~servescope.trace.steps.find.find_steps`)."""
    assert trace.rank is not None
    work = select_work(trace.data)
    return RankContext(trace.rank, trace.data, work, find_steps(trace.data, work, gap_us=gap_us))


class _Rank(msgspec.Struct, frozen=True):
    """One rank analysed: its part of the document, and what the run-wide stages read besides."""

    doc: RankAnalysis
    breakdown: RankBreakdown
    facts: RankFacts
    context: RankContext  # with its step measures


def _analyze_rank(context: RankContext, taxonomy: Taxonomy, capture: CaptureReference | None) -> _Rank:
    """Break one rank's work down by step and phase, and take its facts; its document part built whole."""
    result = break_down(context.data, context.work, context.steps, taxonomy, rank=context.rank, capture=capture)
    measures = measure_steps(context.work, context.steps, result.steps)
    context = msgspec.structs.replace(context, measures=measures)
    facts = rank_facts(context.data, context.rank, result.steps, context.work, context.steps, measures)
    steps = result.steps
    doc = RankAnalysis(
        rank=context.rank, path=str(context.data.path), work_kind=context.work.kind,
        step_source=context.steps.source, unattributed_us=result.unattributed_us, phases=result.phases,
        steps=steps, basis_share=result.basis_share, graph_replay_share=facts.graph_replay_share,
        between_steps_us=sum(m.gap_before_us or 0.0 for m in measures.steps),
        steps_window_us=steps[-1].start_us + steps[-1].span_us - steps[0].start_us if steps else 0.0,
        steps_overlap=result.overlap,
    )
    return _Rank(doc, result, facts, context)


def _load_data_files() -> None:
    """Read the other data files the stages read (each read once a process, then kept), before the traces are
    waited for: while they decode in child processes, not after, when nothing else runs."""
    step_formats()
    engines()
    load_deployment_rules()
    precision_evidence()


def analyze(request: AnalyzeRequest, *, progress: Progress | None = None,
            read_ahead: ReadAhead | None = None) -> AnalysisDoc:
    """Analyze the traces of one run: every rank's steps, breakdown per phase, ranks compared, findings.

    ``read_ahead``: the files, already being decoded (the CLI starts that before importing this module).

    Raises:
        InputError: a path is missing, a file is not a readable trace, ranks clash, or the taxonomy
            override is bad.

    Example:
        >>> doc = analyze(AnalyzeRequest(paths=["traces/"]))  # doctest: +SKIP
        >>> doc.ranks[0].phases["decode"].categories["comm.all_reduce"].share  # doctest: +SKIP
    """
    taxonomy: Taxonomy = load_taxonomy(request.taxonomy)
    rules = load_rules()  # like the taxonomy, before the traces are waited for
    _load_data_files()
    discovery = request.paths if isinstance(request.paths, Discovery) else find_traces(request.paths)
    left_out: dict[str, str] = {}
    read = _read_all(discovery.traces, progress, read_ahead, set(discovery.named), left_out)
    captures = [d for d in read if is_capture(d)] if len(read) > 1 else []
    traces = assign_ranks([d for d in read if not any(d is c for c in captures)])
    capture_of = _captures_by_rank(captures, taxonomy)
    workers = sorted((t for t in traces if t.role == "worker"), key=lambda t: t.rank or 0)
    if not workers:
        raise InputError(", ".join(str(t.data.path) for t in traces),
                         "only front-end traces (*.async_llm.*): give the workers' rank traces too")
    contexts = [rank_context(t, gap_us=request.step_gap_us) for t in workers]
    ranks = [_analyze_rank(c, taxonomy, capture_of.get(c.rank, capture_of.get(-1))) for c in contexts]
    rank_docs = [r.doc for r in ranks]
    if all(not r.steps and not r.unattributed_us for r in rank_docs):
        raise InputError(", ".join(str(t.data.path) for t in workers),
                         "no work to analyze: no kernels, memcpy/memset or cpu_op events")
    gaps = [c.steps.gap_us for c in contexts if c.steps.gap_us is not None]
    per_rank = {r.doc.rank: r.breakdown for r in ranks}
    across = compare_ranks(per_rank)
    comm = [c for c in taxonomy.categories if taxonomy.is_communication(c)]
    facts = {r.doc.rank: r.facts for r in ranks}
    deployment = deployment_settings([c.data for c in contexts], [r.steps for r in rank_docs],
                                     [set(r.facts.measures.replayed_steps) for r in ranks], request.settings,
                                     graph_engine=any(c.steps.graphs_by_default for c in contexts))
    engine = engine_evidence([c.data for c in contexts], [c.steps.serves for c in contexts], request.settings)
    if engine is not None:  # which engine's flags advice may name (none on a training run)
        deployment = {ENGINE_SETTING: engine, **deployment}
    kernels = [k for r in ranks for k in r.breakdown.kernels]
    msg_bytes = {c.rank: list(c.data.device.msg_bytes.values()) for c in contexts}
    findings = find_bottlenecks(rank_docs, across, kernels, comm, msg_bytes, facts, rules, deployment=deployment,
                                reference=request.reference, categories=taxonomy.table)
    verdicts = decide_verdicts(rank_docs, findings, dict(taxonomy.categories), rules, taxonomy.words,
                               stacks={c.rank for c in contexts if len(c.data.frames)},
                               unprofiled=request.reference is not None)
    return AnalysisDoc(
        servescope_version=__version__,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        # not platform.platform(): it asks uname for the processor, which imports subprocess and runs it
        platform={"python": sys.version.split()[0],
                  "system": f"{platform.system()}-{platform.release()}-{platform.machine()}"},
        options={
            "taxonomy": taxonomy.source,
            "step_gap_us": request.step_gap_us if request.step_gap_us is not None else (max(gaps) if gaps else None),
        },
        inputs=[InputFile(path=str(d.path), size_bytes=d.size_bytes) for d in read],
        traces=[
            TraceInfo(path=str(t.data.path), rank=t.rank, role=t.role, events=t.data.event_count,
                      rank_source=t.rank_source,
                      world_size=(t.data.distributed or {}).get("world_size"),
                      malformed_events=t.data.malformed, malformed_examples=t.data.malformed_examples,
                      device=t.data.metadata.get("device_name"))
            for t in sorted(traces, key=lambda t: (t.role != "worker", t.rank or 0))
        ] + [TraceInfo(path=str(c.path), rank=_capture_rank(c), role="capture", events=c.event_count,
                       rank_source="capture", device=c.metadata.get("device_name")) for c in captures],
        ranks=rank_docs,
        kernels=kernels,
        device_totals={str(r): b.device_totals for r, b in per_rank.items()},
        categories=dict(taxonomy.categories),
        across_ranks=across,
        findings=findings,
        verdicts=verdicts,
        deployment=deployment,
        unprofiled=request.reference,
        left_out=left_out,
        category_table=category_entries(taxonomy.table),
    )
