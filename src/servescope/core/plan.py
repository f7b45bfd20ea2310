"""The ``plan --json`` document: every layout of a model on N GPUs, at each batch.

:mod:`servescope.plan.planner` builds these types and :mod:`servescope.report.plan` renders them; a saved plan
decodes into them (``servescope report``), so a fresh and a saved plan render alike.

A few keys came later than the first plans: the hardware profile's floors and all-reduce switches, the
calibration's ``mode``, ``routing``, ``points`` and ``comm_points``, ``inputs.env``, a collective's ``wait_ms``
and ``paths``, a path's ``path``. Their types carry ``None`` (absent in a plan written before them) and are left
out of the JSON while ``None``, so an older plan reads and writes back as it was; every plan written now has them.
"""

from __future__ import annotations

import msgspec

from servescope.core.document import Document
from servescope.core.plan_bands import A2aWhatIf, BatchCall, FigureTerm, Measurement

__all__ = ["PLAN_SCHEMA", "PLAN_SCHEMA_VERSION", "CalibrationPoint", "CapturedPoint", "CollectivePath", "Crossover",
           "CurveUsed", "BatchCall", "EpTpAt", "FigureTerm", "Measurement", "EpTpCollective", "EpTpCrossing",
           "EpTpSide", "EpVsTp", "Factor", "Figure", "InputFile", "LayoutMemoryGib", "MessageSize", "OpPerStep",
           "PcieAllToAllTerms", "PlanCalibration", "PlanDoc", "PlanHardware", "PlanInputs", "PlanLayout",
           "PlanModel", "PlanPoint", "Recommendation"]

PLAN_SCHEMA = "servescope.plan"
PLAN_SCHEMA_VERSION = 1


class PlanDoc(Document, kw_only=True, frozen=True):
    """A plan: inputs (``inputs``: model, hardware, gpus, batches, context, comm and calibrate files), the model
    and hardware as read, factors with origins, per-layout memory and points, crossovers and the choice, and where
    EP and TP cross.

    Attributes:
        factors: every scalar factor of the step model by name (``comm_KIND_base_us`` / ``_hop_us`` for the α-β
            estimate's terms).
        curves: the collective curve documents used, the user's (``--comm``) first.
        calibration: what ``--calibrate`` fitted; ``null`` without it.
        layouts: each candidate layout with its memory and its point at each batch.
        skipped: the layouts left out, one line each.
        crossovers: where two feasible layouts swap places between two requested batches.
        forced: the inputs used with ``--force`` although their provenance differs from the plan (also first in
            ``notes``).
    """

    schema: str = PLAN_SCHEMA
    schema_version: int = PLAN_SCHEMA_VERSION
    servescope_version: str
    created_at: str
    platform: dict[str, str]
    inputs: PlanInputs
    model: PlanModel
    hardware: PlanHardware
    gpus: int
    context: int
    batches: list[int]
    factors: dict[str, Factor]
    curves: list[CurveUsed]
    calibration: PlanCalibration | None
    layouts: list[PlanLayout]
    skipped: list[str]
    crossovers: list[Crossover]
    recommendation: Recommendation
    forced: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    ep_vs_tp: EpVsTp | None = None  # where EP and TP cross over batch, with the reason in numbers (MoE models)
    ep_all_to_all: A2aWhatIf | None = None  # EP with all-to-all in place of the MoE all-reduce, per batch (what-if)


class InputFile(msgspec.Struct, kw_only=True, frozen=True):
    """A file the plan read: its path as given and its size (``null`` when it is not a file)."""

    path: str
    size_bytes: int | None


class PlanInputs(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The request as given: model and hardware (names or files), GPUs, batches, context, the ``--comm`` and
    ``--calibrate`` files, CUDA-graph curves or eager (``graph``) and the unit's environment (``env``; absent in
    plans written before it)."""

    model: str
    hardware: str
    gpus: int
    batches: list[int]
    context: int
    comm: InputFile | None
    calibrate: InputFile | None
    graph: bool
    env: dict[str, str] | None = None
    topology: InputFile | None = None  # an `nvidia-smi topo -m` file (plan --topology)


class PlanModel(msgspec.Struct, kw_only=True, frozen=True):
    """The model as read (:class:`servescope.plan.model.ModelArch`, with ``moe_layers``); sizes in elements."""

    name: str
    source: str  # the preset or config.json it was read from
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # a dense layer's MLP
    vocab: int
    experts: int  # routed experts per MoE layer (0: a dense model)
    top_k: int
    moe_intermediate: int
    shared_experts: int
    first_dense_layers: int  # layers before the first MoE block
    dense_layer_ids: list[int]  # later layers without a MoE block
    # MLA's sizes (null: not MLA)
    q_lora_rank: int | None
    kv_lora_rank: int | None
    qk_nope_head_dim: int | None
    qk_rope_head_dim: int | None
    v_head_dim: int | None
    dtype: str  # the activations' type
    dtype_bytes: float
    weight_dtype: str  # attention, dense-MLP and shared-expert weights
    weight_bytes: float  # bytes per element, scales included
    expert_weight_dtype: str  # the routed experts' weights
    expert_weight_bytes: float  # bytes per element, scales included
    moe_layers: int  # layers with a MoE block


class PlanHardware(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The hardware profile as read (:class:`servescope.plan.hardware.HardwareProfile`); bandwidths in GB/s. The
    kernel floors and, from ``p2p`` on, the switches the engine's all-reduce choice reads are ``null`` in plans
    written before them."""

    name: str
    gpu: str
    quality: str  # where the numbers come from (datasheet, measured)
    source: str  # the document they were written from
    match: list[str]  # device-name substrings the profile describes
    memory_gb: float  # memory per GPU, 10⁹ bytes
    hbm_gbps: float
    nvlink_gbps: float  # NVLink per GPU, bidirectional total; 0 without NVLink
    pcie_gbps: float  # PCIe per GPU, bidirectional total
    dense_tflops: dict[str, float]  # dense tensor-core TFLOP/s by dtype
    interconnect: str  # nvlink or pcie: the path collectives take
    p2p_gbps: float  # per-direction GPU-to-GPU bandwidth
    p2p_origin: str
    base_us: float | None  # the α-β estimate's terms (null: plan's default for the kind)
    hop_us: float | None
    kernel_floor_us: dict[str, float] | None = None  # one small kernel by kind, µs
    kernel_floor_source: str | None = None
    other_floor_by_batch_us: dict[int, float] | None = None  # batch -> a decoder layer's small kernels, µs
    p2p: bool | None = None
    nvlink_multicast: bool | None = None
    compute_capability: str | None = None
    platform: str | None = None


class Factor(msgspec.Struct, kw_only=True, frozen=True):
    """One factor of the step model: its value (a number, or ``routing``'s word) and its origin (``assumed``,
    ``calibrated``)."""

    value: float | str
    origin: str


class CurveUsed(msgspec.Struct, kw_only=True, frozen=True):
    """A collective curve document the plan read: its path, origin, and the device, GPUs and interconnect it was
    measured on."""

    path: str
    origin: str
    device: str
    world_size: int
    interconnect: str


class PlanCalibration(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What ``--calibrate`` fitted (:class:`servescope.plan.calibrate.Calibration`): from which capture, how, and the
    per-part times (ms per step) behind it. ``mode``, ``routing``, ``points`` and ``comm_points`` are ``null`` in
    plans written before them."""

    path: str  # the capture
    rank: int  # the rank whose decode phase was fitted
    tp: int
    batch: int
    context: int
    mode: str | None = None  # which fitting rule applied
    measured_ms: dict[str, float]  # the capture's parts per step (step too)
    modelled_ms: dict[str, float]  # the model's parts at the capture's batch, efficiency 1 and no fixed times
    fitted: dict[str, float]  # the factors replaced, by name
    routing: str | None = None  # how the capture's tokens picked their experts
    points: list[CalibrationPoint] | None = None  # per batch group the fit used
    comm_points: list[CapturedPoint] | None = None  # the capture's collectives as per-call points
    notes: list[str]  # what was kept as assumed, and why


class CalibrationPoint(msgspec.Struct, kw_only=True, frozen=True):
    """One batch size of the capture's decode steps that the fit used: its steps and their mean parts (ms)."""

    batch: int
    steps: int
    measured_ms: dict[str, float]


class CapturedPoint(msgspec.Struct, kw_only=True, frozen=True):
    """A collective of the capture as per-call times (µs) at its message sizes (bytes) over ``group`` GPUs
    (:class:`servescope.plan.paths.Point`)."""

    op: str
    impl: str
    profiles: list[str]
    group: int
    bytes: list[int]
    us: list[float]
    origin: str
    source: str
    stands_for: str


class PlanLayout(msgspec.Struct, kw_only=True, frozen=True):
    """One layout: how it splits the model, whether it fits (``reason`` says why or why not), its memory per GPU
    (the fullest GPU) and its KV capacity, and its point at each batch.

    Attributes:
        kind: ``tp``, ``tp_ep``, ``dp_ep``, ``pp``, ``tp_pp``.
        memory_origin: where the memory figures come from.
        kv_tokens_per_gpu, kv_capacity_tokens: KV-cache tokens one GPU holds, and the layout in all.
    """

    name: str
    kind: str
    tp: int
    ep: int
    pp: int
    dp: int
    gpus: int
    feasible: bool
    reason: str
    memory_gib_per_gpu: LayoutMemoryGib
    memory_origin: list[str]
    kv_tokens_per_gpu: int
    kv_capacity_tokens: int
    points: list[PlanPoint]


class LayoutMemoryGib(msgspec.Struct, kw_only=True, frozen=True):
    """Memory of one GPU under the layout, GiB.

    Attributes:
        weights: the weights on the most loaded GPU of the layout.
        kv_cache: what is left for the KV cache: ``usable`` less those weights.
        usable: the GPU's memory times the share the engine may use (``Factors.memory_utilization``), less the
            reserve for activations, graphs and buffers (``Factors.reserve_gib``).
    """

    weights: float
    kv_cache: float
    usable: float


class PlanPoint(msgspec.Struct, kw_only=True, frozen=True):
    """One layout at one batch: the predicted decode step and its parts.

    Attributes:
        tokens_per_s: ``batch`` tokens a step; ``null`` for a step of 0 ms.
        parts_ms: ``weights``, ``attention``, ``collectives``, ``other`` (``collectives`` is the integer 0 where the
            layout runs none, as written).
        origins: per part, where its figures come from (``datasheet``, ``assumed``, ``calibrated``, ``measured
            curve``, ``published curve``, …).
        collectives_per_step: per op, the step's collectives of that kind (ops in a fixed order).
        compute_bound: whether GEMM FLOPs, not weight reads, set the weights part.
        fits_kv: whether the KV cache holds ``batch × context`` tokens.
    """

    batch: int
    step_ms: float
    tokens_per_s: float | None
    parts_ms: dict[str, float | int]
    origins: dict[str, list[str]]
    collectives_per_step: dict[str, OpPerStep]
    weight_bytes_per_gpu: float
    kv_read_bytes_per_gpu: float
    compute_bound: bool
    fits_kv: bool
    step_ms_low: float | None = None  # every figure at the near / far side of its band (null before issue 38)
    step_ms_high: float | None = None
    tokens_per_s_low: float | None = None  # batch ÷ the step at the far / near side of its band
    tokens_per_s_high: float | None = None
    figures: list[FigureTerm] | None = None  # each figure's share and band


class OpPerStep(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One op's collectives in a step.

    Attributes:
        count: calls a step.
        bytes: their bytes in all (nccl-tests sizes).
        bytes_each: the calls by distinct message.
        group: GPUs in the op's group.
        ms: their time in a step.
        wait_ms: the part of ``ms`` that is the assumed wait for the last rank (absent in plans written before it).
        paths: per collective, the path it takes and its figure (absent in plans written before them).
    """

    count: int
    bytes: int
    bytes_each: list[MessageSize]
    group: int
    ms: float
    wait_ms: float | None = None
    paths: list[CollectivePath] | None = None


class MessageSize(msgspec.Struct, kw_only=True, frozen=True):
    """``count`` calls a step of ``bytes`` each, and what they move."""

    count: int
    bytes: int
    what: str


class CollectivePath(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One collective of a step as priced: ``count`` calls of ``op`` over ``group`` GPUs, each of ``bytes_each``
    (nccl-tests size), the path it takes and where its figure comes from."""

    op: str
    what: str  # what the op moves
    count: int
    bytes_each: int
    group: int
    impl: str  # the implementation (nccl, custom_1stage, …)
    path: str | None = None  # the implementation in a few words (null in plans written before it)
    why: str  # the rule that chose it
    origin: str  # where the figure comes from (in-situ, published point, calibrated, …)
    us_each: float
    wait_us_each: float  # the part of us_each that is the assumed wait for the last rank
    source: str  # the document or file behind the figure
    band: str | None = None  # the class of its band (plan/bands.py; null in plans written before it)
    low_us_each: float | None = None  # the call at the near and far side of its band
    high_us_each: float | None = None


class Crossover(msgspec.Struct, kw_only=True, frozen=True):
    """Two feasible layouts swap places: ``faster_below`` up to ``batch − 1``, ``faster_above`` from ``batch``
    (found between the requested batches ``between`` by bisection), with both step times at ``batch``."""

    layouts: list[str]
    batch: int
    between: list[int]
    faster_below: str
    faster_above: str
    step_ms_at_batch: dict[str, float]


class Recommendation(msgspec.Struct, kw_only=True, frozen=True):
    """The layout fastest at the most requested batches (``null``: none fits), with the reasons."""

    layout: str | None
    reasons: list[str]
    decided: bool | None = None  # the margin over the next layout exceeds the combined band at every batch it wins
    leading: str | None = None  # the layout fastest at the most batches, decided or not
    calls: list[BatchCall] | None = None
    measure: Measurement | None = None  # the one measurement that settles an undecided call


class EpVsTp(msgspec.Struct, kw_only=True, frozen=True):
    """Where EP and TP cross over batch: the fastest layout with expert parallelism against the tensor-parallel one.

    Attributes:
        ep_layouts: the feasible layouts with EP (``TP=8 EP=8``, ``DP=8 EP=8``); the fastest at each batch is
            EP's side.
        tp_layouts: the feasible layout splitting everything over all GPUs by TP (``TP=8``).
        searched: ``[first, last]`` batch searched (every power of two, then bisection to the integer batch).
        faster_first: the layout faster at the first batch searched.
        crossover_batch: the first batch at which the other side is faster; ``null``: none in the range.
        crossings: every change of the faster side found.
        at: the two sides one batch below and at the crossover (without one: at the first and last batch).
        kv_max_batch: per layout, the most requests its KV cache holds at the plan's context.
        sentence: the answer in one sentence, naming the batch.
        reasons: the reason in numbers: the collectives (count × µs a call), the other parts, the all-to-all's
            bound, the KV cache.
    """

    ep_layouts: list[str]
    tp_layouts: list[str]
    searched: list[int]
    faster_first: str
    crossover_batch: int | None
    crossings: list[EpTpCrossing]
    at: list[EpTpAt]
    kv_max_batch: dict[str, int]
    sentence: str
    reasons: list[str]
    crossover_band: list[int | None] | None = None  # the crossover with every figure at one side, then the other


class EpTpCrossing(msgspec.Struct, kw_only=True, frozen=True):
    """A batch where the faster of EP and TP changes: ``faster_below`` up to ``batch − 1``, ``faster_from`` at it."""

    batch: int
    faster_below: str  # the layout faster one batch below
    faster_from: str  # the layout faster at the batch


class EpTpAt(msgspec.Struct, kw_only=True, frozen=True):
    """The fastest EP and TP layouts at one batch.

    Attributes:
        ep: the fastest layout that fits and splits the experts across GPUs (``TP=8 EP=8``, ``DP=8 EP=8``).
        tp: the fastest layout that fits and splits every expert's matrices instead.
    """

    batch: int
    ep: EpTpSide
    tp: EpTpSide


class EpTpSide(msgspec.Struct, kw_only=True, frozen=True):
    """One side (the fastest EP or TP layout) at one batch: its step, parts and collectives.

    Attributes:
        layout: the layout's name (``TP=8 EP=8``).
        step_ms: its predicted decode step.
        parts_ms: ``weights``, ``attention``, ``collectives``, ``other``.
        origins: per part, where its figures come from (as the layout's point says).
        collectives: per collective of the step, the count and time a call behind the collectives part.
        all_to_all: its all-to-all as the PCIe model priced it; ``null`` where no all-to-all or another figure
            priced it.
    """

    layout: str
    step_ms: float
    parts_ms: dict[str, float]
    origins: dict[str, list[str]]
    collectives: list[EpTpCollective]
    all_to_all: PcieAllToAllTerms | None = None


class EpTpCollective(msgspec.Struct, kw_only=True, frozen=True):
    """``count`` calls of ``op`` over ``group`` GPUs in a step, each of ``bytes_each`` at ``us_each`` (of which
    ``wait_us_each`` the assumed wait), ``ms`` in all; ``origin`` and ``path`` as the point's collective says."""

    op: str
    what: str
    count: int
    group: int
    bytes_each: int
    us_each: float
    wait_us_each: float
    ms: float
    origin: str
    path: str


class PcieAllToAllTerms(msgspec.Struct, kw_only=True, frozen=True):
    """An all-to-all over PCIe GPUs as :mod:`servescope.plan.alltoall` prices it; µs, bytes as nccl-tests counts."""

    group: int
    senders: int  # the GPUs holding tokens to send
    bytes_each: int  # the per-rank send buffer
    link_bytes: float  # what one GPU pushes through its own link
    bridge_bytes: float  # what crosses the host bridge
    link_gbps: Figure  # the link's rate per direction
    link_efficiency: Figure  # the achieved share of it
    bridge_gbps: Figure  # the host bridge's aggregate rate
    latency_us: Figure  # one step's latency
    link_us: float  # the link's bound
    bridge_us: float  # the bridge's bound
    bound: str  # link or bridge, whichever is longer
    us: float  # the latency plus the longer bound
    assumption: str  # what the model assumes about the links, in words
    uplink_us: float | None = None  # behind PCIe switches: the busiest switch's uplink (null: no topology given)
    topology: str | None = None  # the topology read (plan --topology), in words
    p2p_off_factor: float | None = None  # without P2P: what staging through host memory multiplied the bounds by


class Figure(msgspec.Struct, kw_only=True, frozen=True):
    """One input of a model: its value and unit, origin (``datasheet``, ``published``, ``assumed``) and source."""

    value: float
    unit: str
    origin: str
    source: str
