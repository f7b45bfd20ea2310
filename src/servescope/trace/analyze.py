"""``analyze``: trace files → one analysis document (steps, breakdown per rank and phase, findings)."""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import msgspec

from servescope import __version__
from servescope.core.analysis import AnalysisDoc, InputFile, KernelRow, RankAnalysis, StepReference, TraceInfo
from servescope.core.errors import InputError
from servescope.trace.breakdown import RankBreakdown, break_down
from servescope.trace.classify import CaptureReference, capture_reference, is_capture
from servescope.trace.deployment import DeploymentInput, deployment_settings
from servescope.trace.facts import rank_facts
from servescope.trace.files import EXAMPLE_NAME, EXAMPLES, discover_traces, example_trace_dir
from servescope.trace.findings import find_bottlenecks, load_rules
from servescope.trace.ranks import assign_ranks, compare_ranks, rank_from_name
from servescope.trace.readahead import ReadAhead
from servescope.trace.steps import find_steps
from servescope.trace.table import TraceData
from servescope.trace.taxonomy import Taxonomy, load_taxonomy
from servescope.trace.verdict import decide_verdicts
from servescope.trace.work import select_work

__all__ = ["EXAMPLES", "EXAMPLE_NAME", "AnalyzeRequest", "Progress", "analyze", "example_trace_dir"]

class Progress(Protocol):
    """Optional progress sink (the CLI passes a rich progress bar; tests pass None)."""

    def advance(self, description: str) -> None: ...


class AnalyzeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What to analyze and how; every option that changes a number is recorded in the result."""

    paths: Sequence[str | Path]
    taxonomy: str | Path | None = None
    step_gap_us: float | None = None
    # what the live server or saved settings documents told of the deployment, best first
    settings: Sequence[DeploymentInput] = ()
    # the decode step timed without the profiler (profile: the server's own /metrics)
    reference: StepReference | None = None


def _read_all(paths: Sequence[Path], progress: Progress | None, read_ahead: ReadAhead | None) -> list[TraceData]:
    """Every file's tables, read by ``read_ahead`` when given (else by a new one: several files are decoded in
    parallel processes)."""
    if read_ahead is None:
        with ReadAhead(paths) as own:
            return _read_all(paths, progress, own)
    out = []
    for path in paths:
        if progress is not None:
            progress.advance(f"reading {path.name}")
        out.append(read_ahead.take(path))
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
    files_found = discover_traces(request.paths)
    read = _read_all(files_found, progress, read_ahead)
    captures = [d for d in read if is_capture(d)] if len(read) > 1 else []
    traces = assign_ranks([d for d in read if not any(d is c for c in captures)])
    capture_of = _captures_by_rank(captures, taxonomy)
    workers = sorted((t for t in traces if t.role == "worker"), key=lambda t: t.rank or 0)
    per_rank: dict[int, RankBreakdown] = {}
    rank_docs: list[RankAnalysis] = []
    kernels: list[KernelRow] = []
    msg_bytes: dict[int, list[int]] = {}
    gaps: list[float] = []
    for trace in workers:
        assert trace.rank is not None
        work = select_work(trace.data)
        steps = find_steps(trace.data, work, gap_us=request.step_gap_us)
        if steps.gap_us is not None:
            gaps.append(steps.gap_us)
        result = break_down(trace.data, work, steps, taxonomy, rank=trace.rank,
                            capture=capture_of.get(trace.rank, capture_of.get(-1)))
        per_rank[trace.rank] = result
        kernels.extend(result.kernels)
        msg_bytes[trace.rank] = list(trace.data.device.msg_bytes.values())
        rank_docs.append(RankAnalysis(
            rank=trace.rank, path=str(trace.data.path), work_kind=work.kind, step_source=steps.source,
            unattributed_us=result.unattributed_us, phases=result.phases, steps=result.steps,
            basis_share=result.basis_share,
            between_steps_us=sum(r.gap_before_us or 0.0 for r in result.steps),
            steps_window_us=(result.steps[-1].start_us + result.steps[-1].span_us - result.steps[0].start_us
                             if result.steps else 0.0),
        ))
    if not workers:
        raise InputError(", ".join(str(t.data.path) for t in traces),
                         "only front-end traces (*.async_llm.*): give the workers' rank traces too")
    if all(not r.steps and not r.unattributed_us for r in rank_docs):
        raise InputError(", ".join(str(t.data.path) for t in workers),
                         "no work to analyze: no kernels, memcpy/memset or cpu_op events")
    across = compare_ranks(per_rank)
    comm = [c for c in taxonomy.categories if taxonomy.is_communication(c)]
    data_of = {t.rank: t.data for t in workers}
    facts = {r.rank: rank_facts(data_of[r.rank], r.rank, r.steps) for r in rank_docs}
    for r in rank_docs:
        r.graph_replay_share = facts[r.rank].graph_replay_share
    deployment = deployment_settings([data_of[r.rank] for r in rank_docs], [r.steps for r in rank_docs],
                                     [{g.step for gs in facts[r.rank].gaps.values() for g in gs if g.graph_us > 0}
                                      for r in rank_docs], request.settings)
    findings = find_bottlenecks(rank_docs, across, kernels, comm, msg_bytes, facts, rules, deployment=deployment,
                                reference=request.reference)
    verdicts = decide_verdicts(rank_docs, findings, dict(taxonomy.categories), rules)
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
                      malformed_events=t.data.malformed, malformed_examples=t.data.malformed_examples)
            for t in sorted(traces, key=lambda t: (t.role != "worker", t.rank or 0))
        ] + [TraceInfo(path=str(c.path), rank=_capture_rank(c), role="capture", events=c.event_count,
                       rank_source="capture") for c in captures],
        ranks=rank_docs,
        kernels=kernels,
        device_totals={str(r): b.device_totals for r, b in per_rank.items()},
        categories=dict(taxonomy.categories),
        across_ranks=across,
        findings=findings,
        verdicts=verdicts,
        deployment=deployment,
        unprofiled=request.reference,
    )
