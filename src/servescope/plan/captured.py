"""What a calibration capture measured: its decode parts per step and its collectives as per-call points.

The capture is an ``analyze --json`` (or ``profile --json``) document: :func:`read_capture` reads it,
:func:`capture_tp` gives its TP size, :func:`capture_context` its mean context (from its ``profile`` section) and
:func:`capture_routing` how its tokens picked their experts, :func:`production_host` the host's time without the
profiler (where the document carries the server's own step). :mod:`servescope.plan.calibrate` fits the step
model's factors to what this module reads.

**Its parts.** A category says what a kernel is *for*, not what its time follows: the MoE block's routing (softmax,
top-k, sort, index, masked_fill, the weighted sum) is ``moe``, a KV-cache write (``index_copy_``, vLLM's
``reshape_and_cache``) or an attention mask fill is ``attention``. Their time follows the tokens, not the weight or
KV bytes, so each part keeps only the calls that stream its bytes (``_streams``, per kernel row of the document):

- weights: a GEMM: every kernel of a category marked ``streams`` (``gemm``), and a ``moe`` or ``quantize``
  kernel whose name says it multiplies by a weight matrix (``GEMM_NAME``: fused_moe, grouped / CUTLASS GEMMs,
  Marlin, matmul_ogs, …);
- attention: a call longer than the hardware profile's ``kernel_floor_us.attention`` (one attention kernel
  over one cached token); a shorter one reads no KV cache worth the name (all of them without that floor).

The rest of those categories is *other*, like the norms and adds: its calls are counted in ``other_calls``
and its time in the other part. The document's kernel rows cover every phase (it has no per-phase kernel
table), so the streaming share of a category's time and calls is taken over all of them and applied to the
decode phase's category times and calls; a capture whose prefill holds much of a category's time skews the
time share (H200 MoE skeleton at batch 128, half its ``moe`` time in the one prefill step: the GEMMs' share
0.50 over all phases, 0.67 over the decode replays).

**Its collectives** (issue 24 item 3), as per-call points of origin ``calibrated``. ``plan --calibrate`` takes, from
the capture's decode phase on the rank it fits (the one that spent least time in collectives: its calls hold the
transfer and the launch, and no more wait for the last rank than the step itself holds), each ``comm.*`` category's
calls per step and mean time a call, and the message sizes they moved:

- from the document's record of that rank's decode phase (``PhaseStats.collectives``, made by ``analyze`` from the
  kernels its decode steps launched; the trace is not read again): NCCL kernels carry ``In msg nelems`` / ``Out msg
  nelems``, ``dtype`` and ``Group size`` in their args (PyTorch's profiler, ``record_param_comms``); the size is
  nccl-tests' (all-reduce: the buffer; all-gather: the gathered output), and the time at each size is the mean
  duration of the kernels of that size;
- where the kernels carry no size (vLLM's custom all-reduce, a CPU ``shm_allreduce``) or the document records none
  (schema version 1, said in a note naming the file): the model's own message at the capture's batch
  (:func:`servescope.plan.cost.collectives_per_step` of TP = the capture's ranks), at the category's mean time a
  call.

Each op becomes a :class:`~servescope.plan.paths.Point` over the group its kernels recorded (else the capture's
ranks), for the capture's hardware profile, on the implementation the engine ran: the kernel names say it
(``data/comm/vllm-0.26.toml`` ``[[kernel]]``: ``cross_device_reduce_1stage`` = custom one-shot, ``ncclDevKernel_*``
= NCCL, ``multimem`` = torch symmetric memory); where they do not, or say another than vLLM's rules pick for that
size, the rules' choice (and a note). :class:`~servescope.plan.collectives.CommCosts` prices every collective of the
same op, group size and implementation from it before any published figure, for every layout: a user's TP=8 trace
gives the TP=8 layout's all-reduce (and the TP=8 EP=8 layout's) their own measured time. Within its sizes the point
is interpolated, past its largest carried on by the curve's (else the α-β estimate's) shape, below its smallest held
(a one-size point) or extended (``paths.point_time_us``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from servescope.core.analysis import (
    AnalysisDoc,
    CollectiveStats,
    KernelRow,
    PhaseStats,
    RankAnalysis,
    StepReference,
    StepRow,
    decode_analysis,
)
from servescope.core.categories import CategoryTable, categories_of
from servescope.core.errors import InputError
from servescope.plan.cost import collectives_per_step
from servescope.plan.hardware import HardwareProfile
from servescope.plan.layouts import Layout
from servescope.plan.model import ModelArch
from servescope.plan.paths import IMPLS, Point, allreduce_path, engine_rules

__all__ = ["CALIBRATED", "GEMM_NAME", "ProductionHost", "Streaming", "batch_groups", "calls_per_part",
           "capture_context", "capture_routing", "capture_tp", "captured_points", "phase_parts", "production_host",
           "read_capture", "split_parts", "streaming_shares"]

# A category's part of the step is its role in the taxonomy (core.categories: gemm, moe and quantize are weights,
# attention is attention, comm.* are collectives). A kernel of a weights category marked `streams` (gemm) reads a
# weight matrix; in another weights category, a kernel that multiplies by a weight matrix, by its name (MoE GEMMs:
# fused_moe, CUTLASS / grouped GEMMs, Marlin, matmul_ogs; the rest of those categories is routing, sums and
# activation quantisation, whose time follows the tokens, not the weights).
GEMM_NAME = re.compile(r"gemm|gemv|nvjet|xmma|matmul|grouped_?mm|scaled_mm|fused_moe|marlin|machete", re.IGNORECASE)
CALIBRATED = "calibrated"
_RULES_FILE = "data/comm/vllm-0.26.toml"  # the [[kernel]] entries: an implementation by its kernels' names


def read_capture(path: str | Path) -> tuple[str, AnalysisDoc, Any]:
    """(source, decoded document, raw JSON) of the analysis at ``path``.

    Raises:
        InputError: unreadable or not an analysis document.
    """
    source, data = _source(path)
    return source, decode_analysis(data, source), json.loads(data)


def _source(path: str | Path) -> tuple[str, bytes]:
    source = str(path)
    try:
        return source, Path(path).read_bytes()
    except OSError as exc:
        raise InputError(source, exc.strerror or "cannot read") from None


def capture_tp(doc: AnalysisDoc) -> int:
    """The capture's TP size: its ranks, or the world size its traces report when that is more."""
    return max(len(doc.ranks), max((t.world_size or 1) for t in doc.traces) if doc.traces else 1)


def capture_context(raw: Any, default: int) -> tuple[int, str | None]:
    """The capture's mean context (prompt + half the output, from its ``profile`` section), else ``default`` and a
    note saying so."""
    prof = raw.get("profile") if isinstance(raw, dict) else None
    if isinstance(prof, dict) and isinstance(prof.get("input_tokens"), int):
        prompt: int = prof["input_tokens"]
        out = prof.get("output_tokens")
        return prompt + (out // 2 if isinstance(out, int) else 0), None
    return default, f"context {default} tokens (--context): the document has no profile settings"


def capture_routing(raw: Any, arch: ModelArch, batch: int, measured_us: float,
                    independent_us: float) -> tuple[str, str | None]:
    """The routing of the capture's workload (``Factors.routing``) and a note saying why, for a MoE model.

    "alike" when the document is a ``servescope profile`` run that sent one prompt at temperature 0 to all its
    requests (its ``profile`` section without ``"prompts": "distinct"``, as that command wrote it before each
    request got its own prompt: they are one sequence repeated), or when the capture's
    expert GEMMs at a batch above 1 took less time than reading the weights of the experts independent tokens
    would touch takes at the datasheet HBM rate (``independent_us``, efficiency 1): those bytes were not read,
    so the batch's tokens picked the same experts. Else "independent".
    """
    if not arch.moe_layers:
        return "independent", None
    tail = ("; the predictions are for that workload (B copies of one sequence: a MoE layer runs top_k experts "
            "at any batch), where requests of distinct prompts would touch E·(1−(1−k/E)^B) experts")
    profile = raw.get("profile") if isinstance(raw, dict) else None
    if isinstance(profile, dict) and profile.get("prompts", "shared") == "shared":
        return "alike", "routing alike: this servescope profile capture sent one prompt at temperature 0" + tail
    if batch > 1 and 0 < measured_us < independent_us:
        return "alike", (f"routing alike: the capture's expert GEMMs took {measured_us:.0f} µs a step, less than "
                         f"the {independent_us:.0f} µs the experts of {batch} independent tokens take to read at "
                         f"the datasheet HBM rate" + tail)
    return "independent", None


@dataclass(frozen=True)
class Streaming:
    """Per weight or attention category, the shares of its time and of its calls that stream bytes (the rest
    is small calls, priced as *other*); a category missing here streams wholly. ``categories``: each category's
    role, the part of the step it counts in. ``attention_floor_us``: the least duration of a streaming attention
    call, µs, the mean over the capture's attention kernels of each one's floor (``None`` when not measured).
    ``attention_rate``: the fraction of the datasheet HBM rate the streaming attention kernels read their KV at,
    their measured rates weighted by their time (``None`` unless every one has one)."""

    time: dict[str, float]
    calls: dict[str, float]
    categories: CategoryTable
    attention_floor_us: float | None = None
    attention_rate: float | None = None

    def role(self, name: str) -> str:
        return self.categories[name].role

    def part_us(self, name: str, us: float) -> float:
        return us * self.time.get(name, 1.0)

    def part_calls(self, name: str, calls: float) -> float:
        return calls * self.calls.get(name, 1.0)


def _streams(row: KernelRow, role: str, attention_floor_us: float | None, streams: bool) -> bool:
    """Whether a kernel of a weight or attention category streams what its part models (rules in the module
    doc): weights, a kernel of a category marked ``streams`` or a GEMM by its name; attention, a call longer than
    its kernel's floor."""
    if role == "attention":
        return attention_floor_us is None or row.total_us > attention_floor_us * row.count
    return streams or GEMM_NAME.search(row.name) is not None


def streaming_shares(doc: AnalysisDoc, rank: int, hw: HardwareProfile) -> Streaming:
    """The shares of :class:`Streaming` from the document's kernel rows of ``rank`` (all phases)."""
    categories = categories_of(doc)
    totals: dict[str, list[float]] = {}  # category -> [time, calls, streaming time, streaming calls]
    floor_calls = floor_us = 0.0  # the streaming attention calls, and their floors summed
    rates: list[tuple[float | None, float]] = []  # each streaming attention kernel's measured rate and its time
    for row in doc.kernels:
        role = categories[row.category].role
        if row.rank != rank or role not in ("weights", "attention"):
            continue
        t = totals.setdefault(row.category, [0.0, 0.0, 0.0, 0.0])
        t[0] += row.total_us
        t[1] += row.count
        floor = hw.attention_floor_us(row.name) if role == "attention" else None
        if _streams(row, role, floor, categories[row.category].streams):
            t[2] += row.total_us
            t[3] += row.count
            if floor is not None:
                floor_calls += row.count
                floor_us += floor * row.count
            if role == "attention":
                rates.append((hw.attention_rate(row.name), row.total_us))
    return Streaming(time={c: t[2] / t[0] for c, t in totals.items() if t[0] > 0},
                     calls={c: t[3] / t[1] for c, t in totals.items() if t[1] > 0}, categories=categories,
                     attention_floor_us=floor_us / floor_calls if floor_calls else hw.kernel_floor_us.get("attention"),
                     attention_rate=_time_weighted(rates))


def _time_weighted(rates: list[tuple[float | None, float]]) -> float | None:
    """The kernels' rates weighted by their time; ``None`` unless every one has a rate and they took time."""
    total = sum(us for _, us in rates)
    if total <= 0 or any(rate is None for rate, _ in rates):
        return None
    return sum((rate or 0.0) * us for rate, us in rates) / total


def split_parts(step_us: float, cats: dict[str, float], streaming: Streaming) -> dict[str, float]:
    """Measured parts (µs) of one step (or a phase's mean step) from its category times."""
    role = streaming.role
    weights = sum(streaming.part_us(name, us) for name, us in cats.items() if role(name) == "weights")
    attention = sum((streaming.part_us(name, us) for name, us in cats.items() if role(name) == "attention"), 0.0)
    comm = sum(us for name, us in cats.items() if role(name) == "collectives")
    return {"weights": weights, "attention": attention, "collectives": comm,
            "other": max(0.0, step_us - weights - attention - comm), "step": step_us}


def phase_parts(phase: PhaseStats, streaming: Streaming) -> dict[str, float]:
    """Measured parts (µs) of a phase's mean step."""
    return split_parts(phase.step_us.mean, {n: c.per_step_us for n, c in phase.categories.items()}, streaming)


def calls_per_part(phase: PhaseStats, streaming: Streaming) -> dict[str, float]:
    """Calls per step of each part; the small calls of weights and attention count as *other*."""
    out = {"weights": 0.0, "attention": 0.0, "other": 0.0}
    for name, c in phase.categories.items():
        role = streaming.role(name)
        if role == "collectives":
            continue
        part = role if role in ("weights", "attention") else "other"
        streamed = streaming.part_calls(name, c.calls_per_step) if part != "other" else 0.0
        out[part] += streamed
        out["other"] += c.calls_per_step - streamed
    return out


def batch_groups(steps: list[StepRow], streaming: Streaming, *, device_only: bool,
                 min_steps: int) -> list[tuple[int, int, dict[str, float]]]:
    """(batch, steps, mean measured parts in µs) per decode batch size with at least ``min_steps`` steps, by
    batch; other without the idle time when ``device_only``."""
    by_batch: dict[int, list[dict[str, float]]] = {}
    for s in steps:
        if s.phase == "decode" and s.decode_requests:
            span = s.busy_us if device_only else s.span_us
            by_batch.setdefault(s.decode_requests, []).append(split_parts(span, s.categories, streaming))
    out = []
    for batch, rows in sorted(by_batch.items()):
        if len(rows) >= min_steps:
            out.append((batch, len(rows), {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}))
    return out


@cache
def _impl_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(implementation, kernel-name pattern) of ``data/comm/vllm-0.26.toml``'s ``[[kernel]]`` entries, in order.

    Raises:
        InputError: an entry names an implementation not in :data:`~servescope.plan.paths.IMPLS`, or a bad pattern.
    """
    out = []
    for i, entry in enumerate(engine_rules().get("kernel", []), 1):
        impl = entry.get("impl")
        if impl not in IMPLS:
            raise InputError(_RULES_FILE, f"kernel {i}: impl {impl!r} is not one of {', '.join(IMPLS)}")
        try:
            out.append((impl, re.compile(entry["pattern"])))
        except (KeyError, re.error) as exc:
            raise InputError(_RULES_FILE, f"kernel {i}: bad pattern ({exc})") from None
    return tuple(out)


def _impl_of(name: str) -> str | None:
    return next((impl for impl, rx in _impl_patterns() if rx.search(name)), None)


def captured_points(doc: AnalysisDoc, rank: RankAnalysis, arch: ModelArch, hw: HardwareProfile,
                    env: dict[str, str], *, tp: int, batch: int, source: str) -> tuple[list[Point], list[str]]:
    """The capture's collectives as calibrated points, and a note per op saying what was taken (module doc)."""
    phase = rank.phases["decode"]
    if tp <= 1:
        return [], []
    modelled = {c.op: c for c in collectives_per_step(arch, Layout(kind="tp", tp=tp), batch)}
    points: list[Point] = []
    notes: list[str] = []
    if doc.schema_version < 2:
        notes.append(f"{source}: an analysis of schema version {doc.schema_version}, which records no collective "
                     f"message sizes: the model's are used (analyze its traces again to record them)")
    where = f"{source} (rank {rank.rank}, {phase.steps} decode steps at batch {batch})"
    table = categories_of(doc)
    for category, stats in sorted(phase.categories.items()):
        op = table[category].collective  # the collective its kernels run (taxonomy.toml); comm.other: none
        if op is None or stats.calls_per_step <= 0 or stats.mean_call_us <= 0:
            continue
        seen = phase.collectives.get(category, CollectiveStats())
        sized = sum(s.calls for s in seen.sizes)
        group = seen.group or tp
        if seen.sizes and sized >= 0.5 * stats.calls_per_step * phase.steps:
            sizes = [s.bytes for s in seen.sizes]
            times = [s.total_us / s.calls for s in seen.sizes]
            how = f"{sized} kernels in its decode steps, mean time at each message size of their args"
        elif op in modelled:
            sizes, times = [modelled[op].bytes_each], [stats.mean_call_us]
            how = (f"{stats.calls_per_step:.0f} a decode step at {stats.mean_call_us:.1f} µs a call; message size "
                   f"the model's at batch {batch} ({modelled[op].what}), the kernels carry none")
        else:
            notes.append(f"{category}: {stats.calls_per_step:.0f} calls a decode step measured, but TP={tp} runs no "
                         f"{op} in the model and the kernels carry no size: not used")
            continue
        named: Counter[str] = Counter()
        for name, calls in seen.kernels.items():  # the implementation most of its calls ran, by kernel name
            named.update({impl: calls} if (impl := _impl_of(name)) else {})
        impl = named.most_common(1)[0][0] if named else None
        if op == "all_reduce":
            rule = allreduce_path(sizes[len(sizes) // 2], group, hw, env).impl
            if impl is not None and impl != rule:
                notes.append(f"calibrated all_reduce: the capture ran {impl} where vLLM 0.26's rules pick {rule} "
                             f"for {sizes[len(sizes) // 2]:,} B on {group} GPUs of {hw.name}: its times priced as "
                             f"{rule}")
            impl = rule
        else:
            impl = "nccl"
        points.append(Point(op=op, impl=impl, profiles=(hw.name,), group=group, bytes=tuple(sizes),
                            us=tuple(times), origin=CALIBRATED, source=f"{where}: {how}"))
        shown = ", ".join(f"{t:.1f} µs at {b:,} B" for b, t in zip(sizes, times, strict=True))
        notes.append(f"calibrated {op} over {group} GPUs ({impl}): {shown}, from the capture ({how}); every "
                     f"layout's {op} over {group} GPUs on that path is priced from it")
    return points, notes


@dataclass(frozen=True, kw_only=True)
class ProductionHost:
    """The host's time a step without the profiler, from the server's own step measured beside the capture.

    Attributes:
        reference: the server's step without the profiler (``AnalysisDoc.unprofiled``: its median run, each run,
            where it came from).
        device_us: the capture's device work a step, µs.
        overlapped: async scheduling on: the host prepares the next step while the device runs this one.
        setting: where the scheduling came from (the deployment's evidence).
    """

    reference: StepReference
    device_us: float
    overlapped: bool
    setting: str

    @property
    def unprofiled_us(self) -> float:
        """The server's step without the profiler (the median run), µs."""
        return self.reference.step_us

    @property
    def serial_us(self) -> float:
        """The host's time added to every step: async off, the unprofiled step less the device's work."""
        return 0.0 if self.overlapped else max(0.0, self.unprofiled_us - self.device_us)

    @property
    def floor_us(self) -> float:
        """The step's floor: async on, the unprofiled step (the longer of host and device at the batch)."""
        return self.unprofiled_us if self.overlapped else 0.0

    def note(self, idle_us: float, step_us: float, *, timed_batches: bool = False) -> str:
        """What the plan carries of the host, and what the profiler had made of it (``timed_batches``: the server's
        step at other batches follows in a note of its own)."""
        head = (f"host time: without the profiler this server's step was {self.unprofiled_us / 1e3:.2f} ms, its device "
                f"work {self.device_us / 1e3:.2f} ms ({self.reference.source}; scheduling: {self.setting})")
        if len(self.reference.runs_us) > 1:
            head += (f"; its {len(self.reference.runs_us)} runs lay {self.reference.spread:.0%} of it apart, so the "
                     f"host's time is known no closer than that")
        if self.overlapped:
            gap_ms = max(0.0, self.unprofiled_us - self.device_us) / 1e3
            hidden = ("the host's time" if self.unprofiled_us > 1.05 * self.device_us
                      else f"the device's; the host's time is hidden under it, at most that: at a batch or layout "
                           f"whose device work is shorter, the step lies between that work plus {gap_ms:.2f} ms and "
                           f"{self.unprofiled_us / 1e3:.2f} ms, and the plan takes the longer")
            body = (f"async scheduling overlaps the host's preparation of a step with the device's work on the one "
                    f"before, so a step is the longer of the two: {self.unprofiled_us / 1e3:.2f} ms is {hidden}, "
                    f"held as every step's floor (host_step_us); the host's cycle under async scheduling moves with "
                    + ("the batch, and the steps timed at other batches below give it there" if timed_batches else
                       "the batch and one capture shows it at its own batch only, so a step at another batch is known "
                       "no closer than that cycle's movement (docs/measurements.md, async scheduling across batches; "
                       "`servescope profile --unprofiled-batches` times it)"))
        else:
            body = (f"the host's preparation runs before each replay: {self.serial_us / 1e3:.2f} ms a step, carried to "
                    f"every batch and layout as a fixed time")
        return (f"{head}: {body}; the capture's {idle_us / 1e3:.2f} ms of device idle in its {step_us / 1e3:.2f} ms "
                f"step is the profiler's (left out)")


def production_host(doc: AnalysisDoc, phase: PhaseStats, *, host_bound: bool, device: bool) -> ProductionHost | None:
    """The host's time without the profiler, where the capture carries the server's own step beside it
    (``servescope profile`` times the same batch without the profiler); ``None`` for a launch-bound, CPU or
    unreferenced capture (its idle stays the host's time). The profiler stretches the host's work, not the
    device's (the H200 captures: the same device work to 1%, steps 36–143% above the server's own)."""
    if doc.unprofiled is None or host_bound or not device or doc.unprofiled.step_us <= 0:
        return None
    busy = max(0.0, phase.busy_us_per_step)
    scheduling = doc.deployment.get("async_scheduling")
    overlapped = scheduling is not None and scheduling.value == "on"
    setting = (f"async {scheduling.value}, {scheduling.source}" if scheduling is not None
               else "not known, taken as serial")
    return ProductionHost(reference=doc.unprofiled, device_us=busy, overlapped=overlapped, setting=setting)
