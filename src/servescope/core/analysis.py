"""The analysis result document: what ``servescope analyze --json`` writes and ``report`` re-renders.

Every view (table, JSON, HTML, diff) reads this document, never live trace objects, so a saved analysis
renders exactly as a fresh one. Times are microseconds (``_us``); shares are fractions of 0..1.
``None`` means *not available* and is written as ``null``.
"""

from __future__ import annotations

import msgspec

from servescope.core.categories import CategoryEntry
from servescope.core.document import Document

__all__ = [
    "SCHEMA_VERSION",
    "AnalysisDoc",
    "CategoryStats",
    "CrossRankCategory",
    "CrossRankStats",
    "DeviceTotal",
    "BASES",
    "Advice",
    "BatchStep",
    "CategoryEntry",
    "CollectiveStats",
    "Finding",
    "Gain",
    "SettingEvidence",
    "StepReference",
    "Verdict",
    "InputFile",
    "KernelRow",
    "MessageSize",
    "PhaseStats",
    "RankAnalysis",
    "StepRow",
    "StepOverlap",
    "Summary",
    "TraceInfo",
    "decode_analysis",
]

# 2 (2026-12-06): the device of each trace (TraceInfo.device), the resolved category table (category_table) and each
# phase's collectives (PhaseStats.collectives). A version-1 document still reads: its category table is resolved
# on reading (upgraded), and what needs the rest says that the document does not record it.
SCHEMA_VERSION = 2


class Summary(msgspec.Struct, kw_only=True):
    """Mean and median of a per-step quantity, in µs."""

    mean: float
    median: float


class CategoryStats(msgspec.Struct, kw_only=True):
    """One category within one phase of one rank."""

    total_us: float
    share: float
    per_step_us: float
    calls_per_step: float
    mean_call_us: float


class MessageSize(msgspec.Struct, kw_only=True, frozen=True):
    """The calls of one collective at one message size (nccl-tests' size: an all-gather's gathered output, any
    other collective's input), and their time in µs."""

    bytes: int  # the message size, bytes
    calls: int  # kernels that moved it
    total_us: float  # their time together


class CollectiveStats(msgspec.Struct, kw_only=True, frozen=True):
    """The kernels of one communication category within one phase of one rank: the sizes they moved and the group.

    Attributes:
        group: the ranks of the group they ran over (the kernels' ``Group size``, the most frequent; None: not
            recorded).
        sizes: by size, the calls whose kernel recorded its message (PyTorch's ``In msg nelems`` / ``Out msg
            nelems`` and ``dtype``); the category's other calls recorded none (vLLM's custom all-reduce, a CPU
            ``shm_allreduce``).
        kernels: calls by kernel name, most first (the implementation that ran).
    """

    group: int | None = None
    sizes: list[MessageSize] = msgspec.field(default_factory=list)
    kernels: dict[str, int] = msgspec.field(default_factory=dict)


class PhaseStats(msgspec.Struct, kw_only=True):
    """Steps of one phase (decode, prefill, mixed, unknown) on one rank."""

    steps: int
    step_us: Summary
    busy_us_per_step: float
    idle_us_per_step: float
    device_us_per_step: float
    tokens_per_step: float | None
    us_per_output_token: float | None
    categories: dict[str, CategoryStats]
    prompt_tokens_per_step: float | None = None  # prompt tokens computed a step, where the engine's marker counts them
    # Quantization and casts (taxonomy.toml [[precision]] rules), apart from the categories; shares are of
    # device_us_per_step, like the categories'.
    quant_standalone_us_per_step: float = 0.0  # µs a step in kernels that only quantize, dequantize or cast
    # µs a step in kernels of another category (norm, activation, GEMM) that carry a quantization fused into
    # them: the whole kernel's time, an upper bound of the quantization's own cost there
    quant_fused_us_per_step: float = 0.0
    quant_standalone_share: float = 0.0  # quant_standalone_us_per_step as a share of device_us_per_step
    quant_fused_share: float = 0.0  # quant_fused_us_per_step as a share of device_us_per_step
    # µs a step per role (quantize, dequantize, cast), standalone and fused together
    quant_role_us_per_step: dict[str, float] = msgspec.field(default_factory=dict)
    quant_top_kernel: str | None = None  # the kernel with the most quantization / cast time in this phase
    quant_top_category: str | None = None  # its category (quantize, elementwise: standalone; norm, activation: fused)
    quant_top_share: float = 0.0  # its share of device_us_per_step
    # per communication category in this phase: the message sizes its kernels recorded, their group and kernel names
    # (plan --calibrate prices the capture's collectives from them)
    collectives: dict[str, CollectiveStats] = msgspec.field(default_factory=dict)


class StepRow(msgspec.Struct, kw_only=True, frozen=True):
    """One step: its phase, window and time per category (for per-step charts and diffs).

    The one step type from recognition to the document: the step finder makes it from the engine's marker (name,
    phase, request mix; ``start_us``/``span_us`` the marker's range, ``busy_us`` 0), and the breakdown measures it
    (``start_us``/``span_us`` its work's span, ``busy_us``, ``categories``, ``gap_before_us``).
    """

    index: int
    name: str
    phase: str
    start_us: float
    span_us: float
    busy_us: float
    prefill_requests: int | None = None
    prefill_tokens: int | None = None
    decode_requests: int | None = None
    decode_tokens: int | None = None
    categories: dict[str, float] = msgspec.field(default_factory=dict)
    # Time from the end of the previous step to this one's start: host time between steps (None: first step).
    gap_before_us: float | None = None


class StepOverlap(msgspec.Struct, kw_only=True, frozen=True):
    """Steps whose device work overlaps the next step's: the device ran behind the marks (a queue the host
    filled ahead, a copy stream on time while the compute stream lags). Their work spans are not the step time;
    the steps' windows follow the cadence instead, from each step's first device operation to the next one's
    (the last step: the longer of its mark and the median window, within its own work's span), and busy time is
    the union of all device work in each window."""

    pairs: int  # consecutive steps whose work spans overlap (beyond steps.toml's overlap tolerance)
    max_overlap_us: float  # the largest overlap: a step's work still running after the next one's began
    work_span_us: float  # mean of the steps' work spans (first to last operation each step launched)
    cadence_us: float  # mean of the windows the steps now have


class RankAnalysis(msgspec.Struct, kw_only=True, frozen=True):
    rank: int
    path: str
    work_kind: str  # "device": kernels/memcpy/memset; "cpu_op": leaf CPU ops (traces without device events)
    step_source: str  # "annotation" | "execute_model" | "profiler_step" | "gaps" | "whole"
    unattributed_us: float
    phases: dict[str, PhaseStats]
    steps: list[StepRow] = msgspec.field(default_factory=list)
    # Share of the rank's work time whose category was decided by each basis (see KernelRow.basis).
    basis_share: dict[str, float] = msgspec.field(default_factory=dict)
    # Facts about how the trace ran that findings check before advising (graph replays, custom all-reduce).
    graph_replay_share: float = 0.0  # share of device work time launched by CUDA/HIP graph replays
    # Host time between consecutive steps (sum of StepRow.gap_before_us) and the time from the first step's
    # start to the last one's end: how much of the captured window the engine spent outside its steps.
    between_steps_us: float = 0.0
    steps_window_us: float = 0.0
    # The steps' device work overlapped the next step's: their windows follow the cadence (None: no overlap).
    steps_overlap: StepOverlap | None = None


BASES = ("op", "graph", "peer", "name", "unknown")


class KernelRow(msgspec.Struct, kw_only=True):
    """One kernel (or CPU op) name on one rank, for one category and the basis that decided it.

    ``basis``: ``op`` (the CPU op / annotation / python frame that launched it), ``graph`` (a graph replay,
    its context carried over from the capture trace), ``peer`` (no launch context; the same name was
    decided by ``op`` elsewhere in the run), ``name`` (the name rules), ``unknown`` (nothing decided:
    category ``other``). A name launched from several contexts has one row per (category, basis).
    ``launch_op``: the frame that decided it (``op``/``graph``/``peer``), else None.
    """

    rank: int
    name: str
    category: str
    kind: str
    count: int
    total_us: float
    basis: str = "name"
    launch_op: str | None = None


class DeviceTotal(msgspec.Struct, kw_only=True):
    """Events of one device kind (kernel, memcpy, memset) over the whole trace: how many, and their time in µs."""

    count: int
    total_us: float


class CrossRankCategory(msgspec.Struct, kw_only=True):
    """A category's per-step time across ranks."""

    min_us: float
    median_us: float
    max_us: float
    min_rank: int
    max_rank: int


class CrossRankStats(msgspec.Struct, kw_only=True):
    """One phase across ranks: spread per category and collective time spent waiting."""

    phase: str
    ranks: list[int]
    steps_compared: int
    categories: dict[str, CrossRankCategory]
    step_us: CrossRankCategory
    collective_us_per_step: dict[str, float]
    collective_wait_us_per_step: dict[str, float]
    collective_wait_share: dict[str, float]
    collective_start_skew_us: Summary | None


class SettingEvidence(msgspec.Struct, kw_only=True, frozen=True):
    """One effective setting of the deployment, as the best source that told it.

    ``value``: ``on`` / ``off`` for switches, else the value (``fp8``, ``32``, ``rocm``); ``source``: ``server``
    (the live process and API during ``profile``), ``settings`` (a saved ``settings`` document), ``trace`` (what
    the trace shows), ``default`` (the engine version's default, no flag overriding it); ``detail``: where exactly.
    """

    value: str
    source: str
    detail: str


class Gain(msgspec.Struct, kw_only=True, frozen=True):
    """What a piece of advice would save per step (µs), with the figure it is computed from."""

    low_us: float
    high_us: float
    step_us: float  # the step it would be saved from (the unprofiled one where measured)
    basis: str  # the sentence that says where the range comes from


class Advice(msgspec.Struct, kw_only=True, frozen=True):
    """One piece of advice a finding gives: the change, the setting it is about and what it would save."""

    text: str
    setting: str | None = None  # the deployment setting the advice changes (None: none)
    setting_known: bool = False  # a source told the setting's value (and it is not already in place)
    gain: Gain | None = None


class Finding(msgspec.Struct, kw_only=True):
    id: str
    severity: str  # "high" | "medium" | "info"
    message: str
    evidence: dict[str, float | int | str | None]
    rank: int | None = None
    phase: str | None = None
    steps: list[int] = msgspec.field(default_factory=list)  # StepRow.index of the steps it is about (phase rules)
    advice: list[Advice] = msgspec.field(default_factory=list)
    # "async scheduling: on, from the trace's scheduler frames": the settings its advice was checked against
    checked: list[str] = msgspec.field(default_factory=list)


class Verdict(msgspec.Struct, kw_only=True, frozen=True):
    """What bounds one phase's step: the one judgement the headline, the JSON and the HTML report all show.

    ``kind``: ``host`` | ``communication`` | ``compute`` | ``memory`` | ``other``; ``what``: the category (or
    ``idle``, or ``graph capture`` for a trace that records graph capture rather than steps); ``share``: of
    ``base`` (``step``: the step's wall time, for idle; ``device time``: the summed time of the phase's kernels,
    for a category, as the tables count it; ``kernel launches``: the launches captured into graphs); ``finding``:
    the finding id that decided it (None when no rule fired and the largest category names it); ``unprofiled``:
    for a host verdict where the step was also timed without the profiler, whether it holds there (None: not
    timed).
    """

    phase: str
    rank: int
    kind: str
    what: str
    share: float
    base: str
    sentence: str
    finding: str | None = None
    steps: int = 0
    unprofiled: str | None = None
    # a host verdict where python stacks were recorded and nothing timed the step without the profiler: the
    # profiler's measured stretch and the command that measures the reference (findings.toml [verdict])
    caveat: str | None = None


class BatchStep(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The same server's step without the profiler at one batch (µs): its runs' median, and each run."""

    batch: int
    step_us: float
    runs_us: tuple[float, ...] = ()


class StepReference(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The same server's step time without the profiler (µs), and where it was measured.

    Attributes:
        runs_us: each run's step where several were timed (``step_us`` is their median); empty for one.
        other_batches: the same server's step at other batches, timed beside the capture (``servescope profile
            --unprofiled-batches``), by batch: the host's cycle where one batch cannot tell it.
    """

    step_us: float
    source: str
    runs_us: tuple[float, ...] = ()
    other_batches: tuple[BatchStep, ...] = ()

    @property
    def spread(self) -> float:
        """How far the runs lay apart, as a share of the median step: (slowest - fastest) / median; 0 for one."""
        return (max(self.runs_us) - min(self.runs_us)) / self.step_us if self.runs_us and self.step_us > 0 else 0.0


class TraceInfo(msgspec.Struct, kw_only=True):
    path: str
    rank: int | None
    role: str  # "worker" | "frontend" | "capture" (a graph-capture trace whose launches name the replayed kernels)
    events: int
    rank_source: str  # "distributedInfo" | "filename" | "only file" | "none"
    world_size: int | None = None
    # events left out as malformed (a field of the wrong type, a negative duration, a time out of range)
    malformed_events: int = 0
    malformed_examples: list[str] = msgspec.field(default_factory=list)
    device: str | None = None  # the first device the trace's header names (deviceProperties); null: none (CPU)


class InputFile(msgspec.Struct, kw_only=True):
    path: str
    size_bytes: int


class AnalysisDoc(Document, kw_only=True, frozen=True):
    schema: str = "servescope.analysis"
    schema_version: int = SCHEMA_VERSION
    servescope_version: str
    created_at: str
    platform: dict[str, str]
    options: dict[str, str | int | float | bool | None]
    inputs: list[InputFile]
    traces: list[TraceInfo]
    ranks: list[RankAnalysis]
    kernels: list[KernelRow]
    device_totals: dict[str, dict[str, DeviceTotal]]
    categories: dict[str, str]  # category -> group (communication | compute | memory | other)
    across_ranks: list[CrossRankStats]
    findings: list[Finding]
    # One verdict per phase (decode first), decided with the findings from the same rules.
    verdicts: list[Verdict] = msgspec.field(default_factory=list)
    # The deployment's effective settings the findings checked their advice against, by setting id.
    deployment: dict[str, SettingEvidence] = msgspec.field(default_factory=dict)
    # The step time without the profiler, where profile measured it (the server's own /metrics).
    unprofiled: StepReference | None = None
    # Files found in a named directory that could not be read (path -> why): left out, the rest analysed.
    left_out: dict[str, str] = msgspec.field(default_factory=dict)
    # The catalogue's next steps for this server (data/changes.toml: what `tune` would try), from the findings, the
    # deployment settings, the server's command line and its log lines beside the traces; absent (not written)
    # where none applies, so documents without any stay as they were.
    next_steps: list[str] | msgspec.UnsetType = msgspec.UNSET
    # Each category of ``categories`` as the taxonomy resolved it (label, colour, planner role, words, marks): the
    # views and plan read it here, never the taxonomy again. Empty in a version-1 document until it is upgraded.
    category_table: dict[str, CategoryEntry] = msgspec.field(default_factory=dict)

    def upgraded(self) -> AnalysisDoc:
        """This document in the current schema: a version-1 one gets the category table its taxonomy gives
        (``core.categories.legacy_category_table``: the user file it names where it still is, else the bundled
        one), as the views resolved it when it was written; a current one as it is."""
        if self.schema_version >= 2 or self.category_table:
            return self
        from servescope.core.categories import legacy_category_table

        return msgspec.structs.replace(self, category_table=legacy_category_table(self))


def decode_analysis(data: bytes, source: str) -> AnalysisDoc:
    """The analysis document saved in ``data`` (read from ``source``) by ``analyze --json``.

    Raises:
        InputError: ``data`` is not JSON, not a ``servescope.analysis`` document, of a newer schema
            version, or a field has the wrong type (one line naming ``source``).
    """
    from servescope.core.document import decode_as

    return decode_as(data, source, AnalysisDoc)
