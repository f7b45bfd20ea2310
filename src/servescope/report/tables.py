"""Terminal tables of an analysis document (``servescope analyze`` / ``servescope report``).

Only renders: every figure comes from the :class:`~servescope.core.analysis.AnalysisDoc`, a category's label from
the document's category table (:func:`servescope.core.categories.categories_of`). Times print as ms with 3 decimals
or µs with 1, shares as % with 1, and anything not available as ``N/A``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from servescope.core.analysis import (
    AnalysisDoc,
    CrossRankStats,
    Finding,
    KernelRow,
    PhaseStats,
    RankAnalysis,
    Summary,
)
from servescope.core.categories import COMMUNICATION, CategoryTable, categories_of
from servescope.report.kernel_names import distinct_kernel_names, shorten_kernel_name
from servescope.report.wrap import hang, path_tail

__all__ = [
    "KNOWN_PHASES",
    "format_count",
    "format_evidence",
    "format_ms",
    "format_share",
    "format_us",
    "ordered_phases",
    "phase_summary",
    "plural",
    "rank_keys",
    "render_analysis",
    "skew_text",
    "sort_findings",
    "top_kernels",
]

KNOWN_PHASES = ("decode", "mixed", "prefill", "unknown", "empty")  # display order
_SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}
_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "info": "dim"}
_NA = "N/A"


def format_ms(us: float | None) -> str:
    """``us`` microseconds as milliseconds with 3 decimals (``1234.5`` → ``1.234``)."""
    return _NA if us is None else f"{us / 1000:.3f}"


def format_us(us: float | None) -> str:
    """Microseconds with 1 decimal."""
    return _NA if us is None else f"{us:.1f}"


def format_share(share: float | None) -> str:
    """A 0..1 share as a percentage with 1 decimal (``0.625`` → ``62.5%``)."""
    return _NA if share is None else f"{share * 100:.1f}%"


def format_count(value: float | None) -> str:
    """A mean count (calls or tokens per step) with 1 decimal."""
    return _NA if value is None else f"{value:.1f}"


def _plain(value: float) -> str:
    if value.is_integer():
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")


def format_evidence(evidence: dict[str, float | int | str | None]) -> str:
    """A finding's evidence as ``k=v`` pairs; a key ending ``_us``, ``_ms`` or ``share`` sets the format."""
    parts: list[str] = []
    for key, value in evidence.items():
        if value is None:
            text = _NA
        elif isinstance(value, bool) or isinstance(value, str):
            text = str(value)
        elif isinstance(value, int):
            text = str(value)
        elif key.endswith("_us"):
            text = format_us(value)
        elif key.endswith("_ms"):
            text = f"{value:.3f}"
        elif key.endswith("share"):
            text = format_share(value)  # shares are 0..1
        else:
            text = _plain(value)
        parts.append(f"{key}={text}")
    return ", ".join(parts)


def ordered_phases(names: Iterable[str], only: Sequence[str] | None = None) -> list[str]:
    """``names`` in display order (decode, mixed, prefill, unknown, empty, then others), kept to ``only``.

    Raises:
        ValueError: ``only`` names a phase that is not one of :data:`KNOWN_PHASES`.
    """
    if only is not None:
        bad = [p for p in only if p not in KNOWN_PHASES]
        if bad:
            raise ValueError(f"unknown phase {', '.join(map(repr, bad))}; allowed: {', '.join(KNOWN_PHASES)}")
    rank = {p: i for i, p in enumerate(KNOWN_PHASES)}
    picked = [p for p in dict.fromkeys(names) if only is None or p in only]
    return sorted(picked, key=lambda p: (rank.get(p, len(rank)), p))


def top_kernels(kernels: Sequence[KernelRow], top: int) -> list[KernelRow]:
    """The ``top`` kernel rows by total time (ties: rank, then name)."""
    return sorted(kernels, key=lambda k: (-k.total_us, k.rank, k.name))[:top]


def sort_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Findings by severity (high, medium, info, other), keeping their order within one severity."""
    return sorted(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, len(_SEVERITY_ORDER)))


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _table(title: str | None = None) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)


def _group(doc: AnalysisDoc, category: str) -> str:
    return doc.categories.get(category, _NA)


def _line(console: Console, text: str, style: str = "") -> None:
    hang(console, text, style=style)


def _render_traces(doc: AnalysisDoc, console: Console) -> None:
    _line(console, f"servescope {doc.servescope_version} analysis, created {doc.created_at}", "bold")
    table = _table("traces")
    rows = [[_NA if t.rank is None else str(t.rank), t.role, f"{t.events:,}", t.rank_source] for t in doc.traces]
    headers = ("rank", "role", "events", "rank source")
    fixed = sum(max(len(h), *(len(r[i]) for r in rows)) + 3 for i, h in enumerate(headers)) if rows else 0
    room = max(24, console.width - fixed)  # the path takes what is left of the line
    table.add_column("path", no_wrap=True, min_width=min(room, max((len(t.path) for t in doc.traces), default=4)))
    for header in headers:
        table.add_column(header, justify="right" if header in ("rank", "events") else "left", no_wrap=True)
    for trace, row in zip(doc.traces, rows, strict=True):
        table.add_row(Text(path_tail(trace.path, room)), *row)
    console.print(table)
    if doc.inputs:
        total_bytes = sum(f.size_bytes for f in doc.inputs)
        _line(console, f"inputs: {len(doc.inputs)} file(s), {total_bytes / 1e6:.1f} MB")


def phase_summary(stats: PhaseStats) -> tuple[str, str]:
    """Two lines on a phase's steps: their count and step time, then busy/idle/device time and tokens."""
    steps = (f"{plural(stats.steps, 'step')}, step mean {format_ms(stats.step_us.mean)} ms, "
             f"median {format_ms(stats.step_us.median)} ms")
    per_step = (f"per step: busy {format_ms(stats.busy_us_per_step)} ms, "
                f"idle {format_ms(stats.idle_us_per_step)} ms, "
                f"device {format_ms(stats.device_us_per_step)} ms, "
                + (f"prompt tokens {format_count(stats.prompt_tokens_per_step)}, "
                   if stats.prompt_tokens_per_step is not None else "")
                + f"tokens {format_count(stats.tokens_per_step)}; "
                + f"µs per output token {format_us(stats.us_per_output_token)}")
    return steps, per_step


def quant_summary(stats: PhaseStats) -> str | None:
    """One line on the phase's quantization and casts (shares of device time, standalone and fused), or None
    where no kernel of the phase quantizes, dequantizes or casts (and in documents written before)."""
    if stats.quant_standalone_us_per_step <= 0 and stats.quant_fused_us_per_step <= 0:
        return None
    most = (f"; most in {shorten_kernel_name(stats.quant_top_kernel)} ({stats.quant_top_category}, "
            f"{format_share(stats.quant_top_share)})" if stats.quant_top_kernel else "")
    return (f"quantization/casts {format_share(stats.quant_standalone_share + stats.quant_fused_share)} of device "
            f"time: standalone {format_share(stats.quant_standalone_share)} "
            f"({format_us(stats.quant_standalone_us_per_step)} µs/step), fused into other kernels "
            f"{format_share(stats.quant_fused_share)} ({format_us(stats.quant_fused_us_per_step)} µs/step){most}")


def _render_phase(doc: AnalysisDoc, categories: CategoryTable, console: Console, rank: int, phase: str,
                  stats: PhaseStats) -> None:
    steps, per_step = phase_summary(stats)
    _line(console, f"rank {rank} · {phase}: {steps}", "bold")
    _line(console, f"  {per_step}")
    quant = quant_summary(stats)
    if quant is not None:
        _line(console, f"  {quant}")
    table = _table()
    table.add_column("category")
    table.add_column("group")
    for header in ("share", "µs/step", "calls/step", "µs/call"):
        table.add_column(header, justify="right")
    by_group: dict[str, float] = {}
    for name, cat in sorted(stats.categories.items(), key=lambda item: (-item[1].total_us, item[0])):
        group = _group(doc, name)
        by_group[group] = by_group.get(group, 0.0) + cat.share
        table.add_row(Text(categories[name].label), group, format_share(cat.share), format_us(cat.per_step_us),
                      format_count(cat.calls_per_step), format_us(cat.mean_call_us),
                      style="red" if group == COMMUNICATION else None)
    console.print(table)
    if by_group:
        ordered = sorted(by_group.items(), key=lambda item: (-item[1], item[0]))
        _line(console, "  by group: " + ", ".join(f"{g} {format_share(s)}" for g, s in ordered))


def _render_rank(doc: AnalysisDoc, categories: CategoryTable, console: Console, rank: RankAnalysis,
                 phases: Sequence[str] | None) -> None:
    console.print()
    head = f"rank {rank.rank}: "
    _line(console, f"{head}{path_tail(rank.path, max(24, console.width - len(head)))} (work: {rank.work_kind}, "
                   f"steps from {rank.step_source}, unattributed {format_ms(rank.unattributed_us)} ms)",
          "bold underline")
    if rank.steps_overlap is not None:
        o = rank.steps_overlap
        _line(console, f"  steps overlap: {o.pairs} consecutive pair(s), by up to {format_ms(o.max_overlap_us)} ms; "
                       f"work spans {format_ms(o.work_span_us)} ms a step, the steps {format_ms(o.cadence_us)} ms "
                       "apart: step time and idle follow the cadence")
    if rank.basis_share:
        _line(console, "  " + decided_by(rank))
    if rank.steps_window_us > 0:
        _line(console, f"  between steps: {format_ms(rank.between_steps_us)} ms of the "
                       f"{format_ms(rank.steps_window_us)} ms from first step to last "
                       f"({format_share(rank.between_steps_us / rank.steps_window_us)}): host time outside steps")
    names = ordered_phases(rank.phases, phases)
    if not names:
        _line(console, "  no steps" + ("" if phases is None else " in the selected phases"))
    for phase in names:
        console.print()
        _render_phase(doc, categories, console, rank.rank, phase, rank.phases[phase])


_BASIS_WORDS = {"op": "launching op", "graph": "graph capture", "peer": "same kernels launched eagerly",
                "name": "kernel name", "unknown": "unknown"}


def decided_by(rank: RankAnalysis) -> str:
    """One line: how much of the rank's work time each kind of evidence classified."""
    if not rank.basis_share:
        return "categories decided by: N/A"
    parts = [f"{_BASIS_WORDS.get(b, b)} {format_share(s)}"
             for b, s in sorted(rank.basis_share.items(), key=lambda item: -item[1])]
    return "categories decided by: " + ", ".join(parts)


def rank_keys(*per_rank: dict[str, float]) -> list[str]:
    """The rank keys (``"0"``, ``"1"``, …) of per-rank dicts, in numeric order."""
    keys = {k for d in per_rank for k in d}
    return sorted(keys, key=lambda k: (int(k), "") if k.lstrip("-").isdigit() else (0, k))


def skew_text(skew: Summary | None) -> str:
    """The collective start skew as ``mean … µs, median … µs``, or N/A."""
    return _NA if skew is None else f"mean {format_us(skew.mean)} µs, median {format_us(skew.median)} µs"


def _render_across(doc: AnalysisDoc, categories: CategoryTable, console: Console, cross: CrossRankStats) -> None:
    console.print()
    ranks = ", ".join(str(r) for r in cross.ranks)
    compared = plural(cross.steps_compared, "step")
    _line(console, f"across ranks · {cross.phase}: ranks {ranks}; {compared} compared", "bold underline")
    table = _table()
    table.add_column("per step")
    for header in ("min µs", "rank", "median µs", "max µs", "rank"):
        table.add_column(header, justify="right")
    rows = sorted(cross.categories.items(), key=lambda item: (-item[1].median_us, item[0]))
    for i, (name, c) in enumerate([("step (span)", cross.step_us), *rows]):
        style = "red" if i and _group(doc, name) == COMMUNICATION else None
        label = categories[name].label if i else name
        table.add_row(Text(label), format_us(c.min_us), str(c.min_rank), format_us(c.median_us),
                      format_us(c.max_us), str(c.max_rank), style=style, end_section=i == 0)
    console.print(table)
    coll = _table()
    coll.add_column("rank", justify="right")
    for header in ("collective µs/step", "wait µs/step", "wait share"):
        coll.add_column(header, justify="right")
    keys = rank_keys(cross.collective_us_per_step, cross.collective_wait_us_per_step,
                     cross.collective_wait_share)
    for key in keys:
        coll.add_row(key, format_us(cross.collective_us_per_step.get(key)),
                     format_us(cross.collective_wait_us_per_step.get(key)),
                     format_share(cross.collective_wait_share.get(key)))
    if keys:
        console.print(coll)
    _line(console, f"  collective start skew: {skew_text(cross.collective_start_skew_us)}")


def _render_kernels(categories: CategoryTable, console: Console, kernels: Sequence[KernelRow], top: int) -> None:
    picked = top_kernels(kernels, top)
    if not picked:
        return
    console.print()
    table = _table(f"top {len(picked)} of {len(kernels)} kernels by total time")
    many_ranks = len({k.rank for k in kernels}) > 1
    if many_ranks:
        table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("category", no_wrap=True, overflow="ellipsis", max_width=18)
    for header in ("count", "total ms", "mean µs"):  # numbers are never cut: the name gives way
        table.add_column(header, justify="right", no_wrap=True, min_width=len(header))
    table.add_column("by", no_wrap=True)
    rows = [[*([str(k.rank)] if many_ranks else []), categories[k.category].label[:18], f"{k.count:,}",
             format_ms(k.total_us), format_us(k.total_us / k.count if k.count else None), k.basis] for k in picked]
    headers = [*(["rank"] if many_ranks else []), "category", "count", "total ms", "mean µs", "by"]
    fixed = sum(max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)) + 3 * len(headers)
    width = max(20, min(60, console.width - fixed))  # the name takes what is left of the line
    table.add_column("name", no_wrap=True, overflow="ellipsis", min_width=20)
    for row, name in zip(rows, distinct_kernel_names([k.name for k in picked], max_chars=width), strict=True):
        table.add_row(*(Text(cell) for cell in row), Text(name))  # Text: names are never read as markup
    console.print(table)


def _render_findings(console: Console, findings: Sequence[Finding]) -> None:
    console.print()
    if not findings:
        _line(console, "findings: none")
        return
    _line(console, "findings", "bold")
    for f in sort_findings(findings):  # blocks, not a table: a message needs the whole line at any width
        ranks = f.evidence.get("ranks")
        where = (f"ranks {ranks}" if isinstance(ranks, str) and "," in ranks else
                 "all ranks" if f.rank is None else f"rank {f.rank}")
        where += "" if f.phase is None else f" · {f.phase}"
        head = Text()
        head.append(f.severity, style=_SEVERITY_STYLE.get(f.severity, ""))
        head.append(f"  {f.id}  ", style="bold")
        head.append(where)
        console.print(head)
        console.print(Text("  " + f.message))
        if f.evidence:
            console.print(Text("  evidence: " + format_evidence(f.evidence), style="dim"))


def render_analysis(doc: AnalysisDoc, console: Console, *, top: int = 15,
                    phases: Sequence[str] | None = None) -> None:
    """Print an analysis as tables: traces, each rank's phases, ranks compared, top kernels, findings.

    Args:
        doc: the analysis document (fresh or loaded from a saved ``--json`` file).
        console: where to print.
        top: how many kernels to list, by total time (0 lists none).
        phases: only these phases (of :data:`KNOWN_PHASES`); ``None`` shows all.

    Raises:
        ValueError: ``top`` is negative or ``phases`` names an unknown phase.

    Example:
        >>> from rich.console import Console
        >>> render_analysis(doc, Console(), top=10, phases=["decode"])  # doctest: +SKIP
    """
    if top < 0:
        raise ValueError(f"top must be 0 or more, not {top}")
    ordered_phases([], phases)  # validates before anything is printed
    from servescope.report.summary import render_summary  # noqa: PLC0415 - keeps this module's import light

    render_summary(doc, console, phases)
    console.print()
    _line(console, "details", "bold underline")
    _render_traces(doc, console)
    categories = categories_of(doc)
    for rank in sorted(doc.ranks, key=lambda r: r.rank):
        _render_rank(doc, categories, console, rank, phases)
    for phase in ordered_phases((c.phase for c in doc.across_ranks), phases):
        for cross in doc.across_ranks:
            if cross.phase == phase:
                _render_across(doc, categories, console, cross)
    _render_kernels(categories, console, doc.kernels, top)
    _render_findings(console, doc.findings)
    if doc.next_steps:
        from servescope.report.tune import render_next_steps  # noqa: PLC0415 - only where the document holds some

        render_next_steps(list(doc.next_steps), console)
