"""The GEMM benchmark document: the GEMMs of a decode step, their measured times and the ceilings beside them.

``servescope.plan.model.gemm_shapes`` fills :class:`GemmShape`; ``servescope.bench.gemm.run_gemm_bench``
writes a :class:`GemmBenchDoc`. Times are seconds (``_s``), rates TFLOP/s (``tflops``) and GB/s (``gbps``,
1e9 bytes/s), fractions 0..1; ``None`` means *not available* and is written as ``null``.

These are frozen stdlib dataclasses rather than ``msgspec.Struct`` (as ``core.analysis`` uses) on purpose:
this module, ``plan.model`` and ``bench.gemm`` must import on a GPU machine that has Python and torch but
none of our dependencies (``tools/bench_gemm_device.py`` runs there). msgspec still decodes these types with
full validation (:func:`load_gemm_doc`); it is imported only there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from servescope.core.errors import InputError

__all__ = [
    "GEMM_SCHEMA_VERSION",
    "CopyCeiling",
    "Datasheet",
    "GemmBenchDoc",
    "GemmBenchOptions",
    "GemmShape",
    "GemmTiming",
    "MatmulCeiling",
    "SampleTimes",
    "gemm_doc_to_json",
    "load_gemm_doc",
]

GEMM_SCHEMA_VERSION = 1

#: A measured timing's samples: seconds per call of each timed sample, in the order taken (``median_s`` beside it
#: is their median). :class:`GemmTiming`, :class:`CopyCeiling` and :class:`MatmulCeiling` are each timed so.
SampleTimes: TypeAlias = tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class GemmShape:
    """One GEMM of one decode step on one tensor-parallel rank: ``C[M, N] = A[M, K] @ W[N, K]ᵀ``.

    Attributes:
        model: the model's name (preset name or config path).
        name: the layer, e.g. ``attn.qkv``, ``mlp.down``, ``moe.experts.w13``, ``lm_head``.
        m: tokens (rows of A); the batch for every GEMM but a routed expert's.
        n: output features on this rank (column-parallel layers: the full width / ``tp``).
        k: input features on this rank (row-parallel layers: the full width / ``tp``).
        count: instances per decode step on this rank (layers, times active experts or heads where per-expert
            or per-head).
        split: how vLLM shards the weight over TP: ``column``, ``row``, ``replicated`` or ``heads`` (a batched
            per-head matmul: MLA's absorbed ``kv_b``; ``count`` holds the heads on this rank).
        tp: tensor-parallel size.
        batch: decode requests in the step (one token each).
        weight_dtype: the model's storage type of this weight (``bfloat16``, ``int4-g32``, ``fp8-b128``).
        weight_bytes: bytes of one instance's weight at ``weight_dtype``, scales included.
        mean_tokens: tokens one instance sees on average: ``batch``, or for a routed expert
            ``routed_tokens / active_experts``; ``m`` is this rounded up.
        routed_tokens: token-expert pairs per MoE layer, ``batch * top_k`` (routed experts only).
        active_experts: expected distinct experts hit per MoE layer under uniform routing,
            ``E * (1 - (1 - top_k/E) ** batch)`` (routed experts only).
        layers: layers this GEMM occurs in.
    """

    model: str
    name: str
    m: int
    n: int
    k: int
    count: int
    split: str
    tp: int
    batch: int
    weight_dtype: str
    weight_bytes: float
    mean_tokens: float
    routed_tokens: int | None = None
    active_experts: float | None = None
    layers: int = 1

    @property
    def flops(self) -> int:
        """Floating-point operations of one instance: ``2·M·N·K``."""
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True, kw_only=True)
class Datasheet:
    """A GPU's vendor figures (not measured), from ``data/hardware/<name>.toml``.

    Attributes:
        name: the profile's file stem (``h200``).
        gpu: the product it describes.
        dtype: the type ``dense_tflops`` is for.
        dense_tflops: dense (no sparsity) tensor-core TFLOP/s at ``dtype``; ``None`` if the sheet has none.
        hbm_gbps: memory bandwidth, GB/s.
        memory_gb: memory capacity, GB.
        quality: always ``datasheet``: a vendor's peak, not a measurement.
        source: where the figures come from.
    """

    name: str
    gpu: str
    dtype: str
    dense_tflops: float | None
    hbm_gbps: float
    memory_gb: float
    quality: str
    source: str


@dataclass(frozen=True, kw_only=True)
class GemmTiming:
    """One distinct ``(M, N, K)`` timed at the bench dtype.

    Attributes:
        m, n, k: the shape.
        names: ``model:name`` of every requested GEMM with this shape.
        calls_per_sample: back-to-back calls in one timed sample (each on its own weight copy, see
            ``GemmBenchOptions.cold_bytes``).
        times_s: per-call time of each sample (sample time / ``calls_per_sample``).
        median_s: the median of ``times_s``.
        bytes_moved: bytes of A, W and C at the bench dtype.
        tflops: ``2·M·N·K / median_s / 1e12``.
        gbps: ``bytes_moved / median_s / 1e9``.
        frac_ceiling_tflops, frac_ceiling_gbps: of the measured ceilings in the same document; ``None`` when some
            GEMM of the run beat that ceiling (it is then no ceiling on this device; the document's ``notes`` say so).
        frac_datasheet_tflops, frac_datasheet_gbps: of the datasheet, ``None`` without one.
    """

    m: int
    n: int
    k: int
    names: tuple[str, ...]
    calls_per_sample: int
    times_s: SampleTimes
    median_s: float
    bytes_moved: int
    tflops: float
    gbps: float
    frac_ceiling_tflops: float | None
    frac_ceiling_gbps: float | None
    frac_datasheet_tflops: float | None
    frac_datasheet_gbps: float | None


@dataclass(frozen=True, kw_only=True)
class CopyCeiling:
    """Measured memory ceiling: one device-to-device copy of ``bytes_copied`` bytes.

    ``gbps`` counts the read and the write: ``2 · bytes_copied / median_s / 1e9``.
    """

    bytes_copied: int
    times_s: SampleTimes
    median_s: float
    gbps: float


@dataclass(frozen=True, kw_only=True)
class MatmulCeiling:
    """Measured compute ceiling: one ``size``³ matmul at ``dtype``; ``tflops = 2·size³ / median_s / 1e12``."""

    size: int
    dtype: str
    times_s: SampleTimes
    median_s: float
    tflops: float


@dataclass(frozen=True, kw_only=True)
class GemmBenchOptions:
    """Every knob that changes a number in a GEMM benchmark, as used (``auto`` resolved).

    Attributes:
        device: the torch device the bench ran on (``cuda:0``, ``cpu``).
        dtype: A, W and C's torch dtype.
        iters: timed samples per shape (and per ceiling).
        warmup: untimed samples before them.
        cold_bytes: weight copies per shape span at least this many bytes, and a sample cycles through them,
            so the weights come from memory as in a real step (each layer's weights differ) rather than from
            L2; 0 reuses one copy.
        copy_bytes: size of the copy ceiling's buffer.
        matmul_size: the matmul ceiling's M = N = K.
        hardware: the datasheet profile compared against, ``None`` for none.
        seed: torch's seed for the random operands.
    """

    device: str
    dtype: str
    iters: int
    warmup: int
    cold_bytes: int
    copy_bytes: int
    matmul_size: int
    hardware: str | None
    seed: int


@dataclass(frozen=True, kw_only=True)
class GemmBenchDoc:
    """A GEMM benchmark result: what ran where, the shapes asked for, their timings and the ceilings.

    Attributes:
        schema: :data:`GEMM_SCHEMA_VERSION`.
        kind: always ``gemm_bench``.
        tool_version: servescope's version.
        date: UTC ISO-8601 wall-clock time the run started (a label, never a duration).
        device_name: ``torch.cuda.get_device_name`` or the CPU's ``platform.processor()``.
        torch_version, cuda_version: torch's own; ``cuda_version`` is ``None`` on a CPU build.
        python, platform: interpreter and OS.
        options: the recorded knobs.
        shapes: the GEMMs asked for, in order.
        timings: one per distinct ``(M, N, K)``, in first-asked order.
        copy_ceiling, matmul_ceiling: the measured ceilings.
        datasheet: the vendor figures compared against, or ``None``.
        notes: what the run could not measure (a ceiling some GEMM beat), one sentence each.
    """

    schema: int
    kind: str
    tool_version: str
    date: str
    device_name: str
    torch_version: str
    cuda_version: str | None
    python: str
    platform: str
    options: GemmBenchOptions
    shapes: tuple[GemmShape, ...]
    timings: tuple[GemmTiming, ...]
    copy_ceiling: CopyCeiling
    matmul_ceiling: MatmulCeiling
    datasheet: Datasheet | None
    notes: tuple[str, ...] = ()


def gemm_doc_to_json(doc: GemmBenchDoc) -> str:
    """The document as indented JSON text (stdlib ``json``, so it works without msgspec)."""
    return json.dumps(dataclasses.asdict(doc), indent=1) + "\n"


def load_gemm_doc(path: str | Path) -> GemmBenchDoc:
    """A saved GEMM benchmark document, validated field by field.

    Raises:
        InputError: the file cannot be read, is not JSON, or does not match the schema.
    """
    import msgspec  # here only: the rest of this module must import without our dependencies

    source = Path(path)
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise InputError(str(source), exc.strerror or "cannot read") from None
    try:
        doc = msgspec.json.decode(data, type=GemmBenchDoc)
    except msgspec.DecodeError as exc:
        raise InputError(str(source), f"not a GEMM benchmark document: {exc}") from None
    if doc.kind != "gemm_bench" or doc.schema != GEMM_SCHEMA_VERSION:
        raise InputError(str(source), f"kind {doc.kind!r} schema {doc.schema}, expected gemm_bench schema "
                                      f"{GEMM_SCHEMA_VERSION}")
    return doc
