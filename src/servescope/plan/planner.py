"""``servescope plan``: every layout of a model on N GPUs, at each batch, as one result document.

Example:
    >>> doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=8, batches=(1, 8, 32, 128)))
    >>> [layout.name for layout in doc.layouts]                          # doctest: +SKIP
    ['TP=8', 'TP=8 EP=8', 'DP=8 EP=8', 'PP=8', 'TP=2 PP=4', 'TP=4 PP=2']

The document (:class:`servescope.core.plan.PlanDoc`, schema ``servescope.plan`` version 1) holds the exact
inputs, every factor with its origin, per layout its memory and its point at each batch, the crossovers and the
choice, ``forced`` (the inputs used with ``--force`` although their provenance differs from the plan, one line
each, also first in ``notes``) and ``notes``; then ``ep_vs_tp`` (:mod:`servescope.plan.ep_vs_tp`: the batch at
which the fastest EP layout and the TP layout cross, with the reason in numbers; ``null`` for a dense model or
without a feasible layout on either side). A point's ``collectives_per_step.OP.bytes`` is the total over the step's
ops of that kind (nccl-tests sizes) and ``bytes_each`` lists each distinct message.
"""

from __future__ import annotations

import dataclasses
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from servescope import __version__
from servescope.core.analysis import StepReference
from servescope.core.errors import InputError
from servescope.core.plan import (
    CollectivePath,
    Crossover,
    CurveUsed,
    Factor,
    FigureTerm,
    InputFile,
    LayoutMemoryGib,
    MessageSize,
    OpPerStep,
    PlanCalibration,
    PlanDoc,
    PlanHardware,
    PlanInputs,
    PlanLayout,
    PlanModel,
    PlanPoint,
    Recommendation,
)
from servescope.plan.bands import band_of
from servescope.plan.calibrate import Calibration, apply_calibration, calibrate
from servescope.plan.captured import capture_tp, read_capture
from servescope.plan.collectives import ALL_OPS, PCIE_A2A_SOURCE, CommCosts, CurveSource, bundled_curves, user_curves
from servescope.plan.cost import LayoutMemory, PointCost, layout_memory, predict_point
from servescope.plan.decide import batch_calls, measurement
from servescope.plan.ep_a2a import a2a_what_if
from servescope.plan.ep_backend import ep_backend
from servescope.plan.ep_vs_tp import LAST, ep_vs_tp
from servescope.plan.factors import Factors, default_factors, wait_caveat
from servescope.plan.hardware import HardwareProfile, load_hardware
from servescope.plan.host_cycle import check_notes, corrections
from servescope.plan.inputs import check_input_file
from servescope.plan.layouts import Layout, candidate_layouts
from servescope.plan.model import ModelArch, load_model_arch
from servescope.plan.provenance import calibration_differences, curve_differences
from servescope.plan.topology import read_topology

__all__ = ["PlanRequest", "find_crossovers", "parse_batches", "recommend", "run_plan"]

MAX_BATCH = 1 << 20


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """The inputs of one plan: model and hardware (preset names or files), GPU count, batches, context.

    Attributes:
        model: model preset name or HF ``config.json`` path.
        hardware: hardware profile name or ``.toml`` path.
        gpus: GPUs to spread the model over.
        batches: running requests per step to predict.
        context: tokens in each request's KV cache (prompt + generated so far).
        comm: a ``bench comm`` curve file, used before bundled curves.
        calibrate: an ``analyze --json`` document of a capture to fit the step model to
            (:mod:`servescope.plan.calibrate`).
        graph: prefer collective curves timed inside CUDA graphs.
        force: use a curve or calibration whose provenance differs from the plan
            (:mod:`servescope.plan.provenance`) instead of refusing it; it is named in ``forced`` and ``notes``.
        env: the serving unit's environment (``NCCL_PROTO``, ``NCCL_ALGO``, ``NCCL_P2P_LEVEL``,
            ``VLLM_ALLREDUCE_USE_SYMM_MEM``, …): the all-reduce path and the NCCL curve variant
            (:mod:`servescope.plan.paths`); ``VLLM_ALL2ALL_BACKEND``: the all2all backend of a DP > 1 EP layout
            (:mod:`servescope.plan.ep_backend`).
        topology: an ``nvidia-smi topo -m`` file: which GPUs share a PCIe switch, for the all-to-all model
            (:mod:`servescope.plan.topology`).
    """

    model: str
    hardware: str
    gpus: int
    batches: tuple[int, ...] = (1, 8, 32, 128)
    context: int = 4096
    comm: str | None = None
    calibrate: str | None = None
    graph: bool = True
    force: bool = False
    env: dict[str, str] = field(default_factory=dict)
    topology: str | None = None


@dataclass
class _Evaluated:
    layout: Layout
    memory: LayoutMemory
    points: list[PointCost] = field(default_factory=list)


# A capture below this many requests shows little of the per-request cost; predictions far above it drift
# (H200 skeletons, docs/measurements.md "plan against measurement": from 1 or 4, batches 32..128 were off by up to 46%).
_FEW_REQUESTS = 16
_FAR_ABOVE = 4  # times the capture's batch


def _extrapolation_notes(captured: int, batches: Sequence[int]) -> list[str]:
    """A warning when a capture of few requests is asked for batches far above its own."""
    far = [b for b in batches if b > _FAR_ABOVE * captured]
    if captured >= _FEW_REQUESTS or not far:
        return []
    return [f"calibrated at batch {captured}: batches {', '.join(map(str, far))} are more than {_FAR_ABOVE}x "
            f"that, and a capture of under {_FEW_REQUESTS} requests shows little of the per-request cost (on "
            f"H200 skeletons such predictions were off by up to 46%); calibrate from a capture at or above the "
            f"batches you plan for"]


def parse_batches(text: str, option: str = "--batch") -> tuple[int, ...]:
    """Batch sizes from ``"1,8,32"``: sorted, distinct, each 1 … 2²⁰.

    Raises:
        InputError: ``option`` is not a comma-separated list of positive integers.
    """
    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise InputError(option, f"an empty value between commas: {text!r}")
    try:
        values = sorted({int(part) for part in parts})
    except ValueError:
        raise InputError(option, f"not a comma-separated list of integers: {text!r}") from None
    if not values or values[0] < 1 or values[-1] > MAX_BATCH:
        raise InputError(option, f"expected integers from 1 to {MAX_BATCH}, got {text!r}")
    return tuple(values)


def _timed_batches(arch: ModelArch, hw: HardwareProfile, comm: CommCosts, factors: Factors,
                   calibration: Calibration, reference: StepReference) -> tuple[list[str], Factors | None]:
    """The calibrated model for the captured layout at each batch the server was timed at, beside its own step; without
    async scheduling, the factors that make the plan's step there the server's own (else ``None``)."""
    layout = Layout(kind="tp", tp=calibration.tp)
    memory = layout_memory(arch, layout, hw, factors, context=calibration.context)
    batches = sorted({s.batch for s in reference.other_batches} | {b for b, _ in calibration.serial_timed})
    model = comm
    if calibration.host_steps:  # async: the timed steps are the floor, so set the model's device work beside them
        bare = dataclasses.replace(factors, host_steps=(), host_step_us=0.0)
        model = comm.with_factors(bare).with_calibrated(calibration.comm_points)
    points = {b: predict_point(arch, layout, hw, model, batch=b, context=calibration.context, memory=memory)
              for b in batches}
    for timed in reference.other_batches:  # the server's own step cannot beat reading its weights once
        read_us = points[timed.batch].weight_bytes / (hw.hbm_gbps * 1e3) if hw.hbm_gbps > 0 else 0.0
        if timed.step_us < read_us:
            raise InputError(calibration.path, f"the server's step at batch {timed.batch} ({timed.step_us:.0f} "
                             f"µs, timed without the profiler) is shorter than reading its weights once at the "
                             f"datasheet rate ({read_us:.0f} µs): not this model on this device")
    predicted = {b: p.step_ms for b, p in points.items()}
    serial = corrections(calibration.serial_timed, predicted)
    notes = check_notes(reference, predicted, layout=layout.name, context=calibration.context,
                        corrected=bool(serial), overlapped=bool(calibration.host_steps))
    if not serial:
        return notes, None
    return notes, dataclasses.replace(factors, step_corrections=serial,
                                      origins={**factors.origins, "step_corrections": "calibrated"})


def _file_info(path: str | None) -> InputFile | None:
    if path is None:
        return None
    p = Path(path)
    return InputFile(path=str(p), size_bytes=p.stat().st_size if p.is_file() else None)


def find_crossovers(names: Sequence[str], batches: Sequence[int],
                    step_ms: Callable[[int, int], float]) -> list[Crossover]:
    """Where two layouts swap places: the first batch at which the one slower below becomes faster.

    ``step_ms(i, batch)`` is layout ``i``'s step time. Between two requested batches whose order differs the
    exact integer batch is found by bisection on the model itself.
    """
    out: list[Crossover] = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            def diff(b: int, i: int = i, j: int = j) -> float:
                return step_ms(i, b) - step_ms(j, b)
            for lo, hi in zip(batches, batches[1:], strict=False):
                d_lo, d_hi = diff(lo), diff(hi)
                if d_lo == 0 or (d_lo < 0) == (d_hi < 0):
                    continue
                a, b = lo, hi  # invariant: sign(diff(a)) == sign(d_lo) != sign(diff(b))
                while b - a > 1:
                    mid = (a + b) // 2
                    if (diff(mid) < 0) == (d_lo < 0):
                        a = mid
                    else:
                        b = mid
                faster_below, faster_above = (names[i], names[j]) if d_lo < 0 else (names[j], names[i])
                out.append(Crossover(layouts=[names[i], names[j]], batch=b, between=[lo, hi],
                                     faster_below=faster_below, faster_above=faster_above,
                                     step_ms_at_batch={names[i]: step_ms(i, b), names[j]: step_ms(j, b)}))
    return sorted(out, key=lambda c: (c.batch, c.layouts))


def recommend(layouts: Sequence[PlanLayout], crossovers: Sequence[Crossover], gpus: int = 0) -> Recommendation:
    """The layout fastest at the most requested batches (ties: the larger batch), with the reasons; recommended only
    where at every such batch its margin over the next layout exceeds what the figures' bands can take from it
    (:mod:`servescope.plan.decide`), else ``layout`` is ``null``, ``leading`` names it and ``measure`` the
    measurement that settles the closest call."""
    feasible = [x for x in layouts if x.feasible]
    if not feasible:
        why = "; ".join(f"{x.name}: {x.reason}" for x in layouts) or "no layout splits the model"
        return Recommendation(layout=None, reasons=[f"no layout fits: {why}"])
    batches = [p.batch for p in feasible[0].points]
    wins: dict[str, list[int]] = {}
    best_at: dict[int, tuple[str, float]] = {}
    for k, b in enumerate(batches):
        options = [(x.points[k].step_ms, x.name) for x in feasible if x.points[k].fits_kv]
        if options:
            ms, name = min(options)
            best_at[b] = (name, ms)
            wins.setdefault(name, []).append(b)
    if not wins:
        return Recommendation(layout=None, reasons=["no layout's KV cache holds any requested batch at this context"])
    chosen = max(wins, key=lambda n: (len(wins[n]), max(wins[n])))
    x = next(x for x in feasible if x.name == chosen)
    reasons = [f"fastest at batch {', '.join(map(str, wins[chosen]))} of {', '.join(map(str, batches))}"]
    held = [b for b in batches if b not in best_at]
    if held:
        most = max(x.kv_capacity_tokens for x in feasible)
        reasons.append(f"at batch {', '.join(map(str, held))} no layout's KV cache holds batch × context "
                       f"(the most any holds: {most:,} tokens)")
    for b, (name, ms) in best_at.items():
        if name != chosen:
            own = next(p for p in x.points if p.batch == b)
            if own.fits_kv:
                reasons.append(f"at batch {b} {name} is faster: {ms:.2f} ms vs {own.step_ms:.2f} ms per step")
            else:
                reasons.append(f"at batch {b} its KV cache cannot hold batch × context; {name} can "
                               f"({ms:.2f} ms per step)")
    for c in crossovers:
        if chosen in c.layouts:
            reasons.append(f"crossover with {next(n for n in c.layouts if n != chosen)} at batch {c.batch}: "
                           f"{c.faster_below} below, {c.faster_above} from there on")
    mem = x.memory_gib_per_gpu
    reasons.append(f"memory per GPU: weights {mem.weights:.1f} GiB, KV cache {mem.kv_cache:.1f} GiB "
                   f"({x.kv_tokens_per_gpu:,} tokens per GPU, {x.kv_capacity_tokens:,} in all)")
    last = x.points[-1]
    share = last.parts_ms["collectives"] / last.step_ms if last.step_ms else 0.0
    reasons.append(f"at batch {last.batch} collectives are {share:.0%} of its step "
                   f"({', '.join(last.origins['collectives']) or 'none'})")
    marked = sorted({o for p in x.points for v in p.origins.values() for o in v})
    reasons.append(f"figures from: {', '.join(marked)}")
    calls, compared = batch_calls(layouts)
    claimed = [call for call in calls if call.fastest == chosen and call.next is not None]
    close = [call for call in claimed if not call.decided]
    for n, call in enumerate(claimed):
        assert call.margin_ms is not None and call.band_ms is not None
        verdict = "decided" if call.decided else "too close to call on these figures"
        top = f" (most: {call.deciding.split(',')[0]}, {call.deciding_ms:.2f} ms)" if call.deciding else ""
        reasons.insert(1 + n, f"batch {call.batch}: {call.margin_ms:.2f} ms ahead of {call.next}; the bands can "
                       f"take {call.band_ms:.2f} ms{top}: {verdict}")
    measure = None
    if close:
        worst = min(close, key=lambda call: (call.margin_ms or 0.0) - (call.band_ms or 0.0))
        measure = measurement(compared[worst.batch], gpus, [compared[call.batch] for call in close])
    return Recommendation(layout=None if close else chosen, reasons=reasons, decided=not close, leading=chosen,
                          calls=calls, measure=measure)


def _point(p: PointCost) -> PlanPoint:
    """One layout's point as the document records it: per op (in ``ALL_OPS`` order) its calls, messages and paths."""
    messages: dict[str, list[MessageSize]] = {}
    paths: dict[str, list[CollectivePath]] = {}
    group: dict[str, int] = {}
    for c in p.collectives:
        messages.setdefault(c.op, []).append(MessageSize(count=c.count, bytes=c.bytes_each, what=c.what))
        group.setdefault(c.op, c.group)
    for path in p.collective_paths:
        paths.setdefault(path.op, []).append(path)
    per_op = {op: OpPerStep(count=sum(m.count for m in messages[op]),
                            bytes=sum(m.count * m.bytes for m in messages[op]), bytes_each=messages[op],
                            group=group[op], ms=p.collective_ms.get(op, 0.0),
                            wait_ms=p.collective_wait_ms.get(op, 0.0), paths=paths.get(op, []))
              for op in ALL_OPS if op in messages}
    step = p.step_ms
    low, high = band_of(step, p.terms)
    figures = [FigureTerm(figure=t.figure, band=t.band, ms=t.ms, lo_ms=t.lo_ms, hi_ms=t.hi_ms, op=t.op or None,
                          group=t.group or None, bytes=list(t.bytes) or None, calls=t.calls or None) for t in p.terms]
    return PlanPoint(batch=p.batch, step_ms=step, tokens_per_s=p.batch / step * 1e3 if step else None,
                     parts_ms=p.parts_ms, origins=p.origins, collectives_per_step=per_op,
                     weight_bytes_per_gpu=p.weight_bytes, kv_read_bytes_per_gpu=p.kv_read_bytes,
                     compute_bound=p.compute_bound, fits_kv=p.fits_kv, step_ms_low=low, step_ms_high=high,
                     tokens_per_s_low=p.batch / high * 1e3 if high else None,
                     tokens_per_s_high=p.batch / low * 1e3 if low else None, figures=figures)


def _layout(layout: Layout, memory: LayoutMemory, points: list[PointCost], memory_origin: list[str]) -> PlanLayout:
    return PlanLayout(name=layout.name, kind=layout.kind, tp=layout.tp, ep=layout.ep, pp=layout.pp, dp=layout.dp,
                      gpus=layout.gpus, feasible=memory.feasible, reason=memory.reason,
                      memory_gib_per_gpu=LayoutMemoryGib(weights=memory.weights_gib, kv_cache=memory.kv_cache_gib,
                                                         usable=memory.usable_gib),
                      memory_origin=memory_origin, kv_tokens_per_gpu=memory.kv_tokens_per_gpu,
                      kv_capacity_tokens=memory.kv_capacity_tokens, points=[_point(p) for p in points])


def run_plan(request: PlanRequest) -> PlanDoc:
    """The plan document for ``request`` (:class:`~servescope.core.plan.PlanDoc`).

    Raises:
        InputError: unknown model or hardware, a bad curve or analysis file, ``gpus`` below 1, a batch
            below 1 or a negative context.
    """
    for flag, given in (("--comm", request.comm), ("--calibrate", request.calibrate), ("--topology", request.topology)):
        check_input_file(given, flag)
    if request.gpus < 1:
        raise InputError("--gpus", f"expected 1 or more, got {request.gpus}")
    if request.context < 1:
        raise InputError("--context", f"expected 1 or more tokens a request, got {request.context}")
    if not request.batches or min(request.batches) < 1:
        raise InputError("--batch", f"expected positive batch sizes, got {list(request.batches)}")
    try:  # a bad value says which option it came from
        arch = load_model_arch(request.model)
    except InputError as exc:
        raise InputError("--model", str(exc)) from None
    try:
        hw = load_hardware(request.hardware)
    except InputError as exc:
        raise InputError("--hardware", str(exc)) from None
    factors = default_factors()
    forced: list[str] = []

    def admit(path: str, flag: str, diffs: list[str]) -> None:
        if not diffs:
            return
        if not request.force:
            raise InputError(path, f"{flag} from another setup: {'; '.join(diffs)} (--force uses it anyway)")
        forced.append(f"forced: {flag} {path} differs from the plan: {'; '.join(diffs)}")

    sources: list[CurveSource] = []
    if request.comm is not None:
        user = user_curves(request.comm)
        admit(user.path, "--comm", curve_differences(user.doc, hw))
        sources.append(user)
    sources += bundled_curves(hw)
    notes: list[str] = []
    layouts, skipped = candidate_layouts(arch, request.gpus)
    for s in sources:
        if s.doc.interconnect not in (hw.interconnect, "unknown"):
            notes.append(f"{s.path}: measured over {s.doc.interconnect}, the profile says {hw.interconnect}")
    if not layouts:
        raise InputError("--gpus", f"no layout splits {arch.name} over {request.gpus} GPUs: "
                         f"{'; '.join(skipped[:3])}{'; …' if len(skipped) > 3 else ''}")
    topology = read_topology(request.topology, request.gpus) if request.topology is not None else None
    if topology is not None and topology.p2p_ok(request.gpus) is False and hw.p2p:
        hw = dataclasses.replace(hw, p2p=False)  # the box's own statuses over the profile's
    comm = CommCosts(hw, factors, sources, graph=request.graph, env=request.env,
                     user_path=sources[0].path if request.comm is not None else None, topology=topology)
    if topology is not None:
        notes.append(f"topology {topology.summary(request.gpus)}")
    notes += comm.nccl_env.notes
    if arch.experts:
        backend = ep_backend(request.env)
        unmet = backend.unmet(hw.interconnect) if request.gpus > 1 else None
        notes += [*backend.notes, *([unmet] if unmet else [])]
    calibration = None
    if request.calibrate is not None:
        source, capture, raw = read_capture(request.calibrate)
        diffs, unchecked = calibration_differences(capture, raw, arch, hw, tp=capture_tp(capture),
                                                   planned_tp={x.tp for x in layouts}, gpus=request.gpus,
                                                   beside=Path(request.calibrate).parent)
        admit(source, "--calibrate", diffs)
        if unchecked:
            notes.append(f"{source}: not checked against the plan: {', '.join(unchecked)}")
        calibration = calibrate(request.calibrate, arch, hw, comm, context=request.context)
        factors = apply_calibration(factors, calibration)
        comm = comm.with_factors(factors).with_calibrated(calibration.comm_points)
        notes += calibration.notes
        notes += _extrapolation_notes(calibration.batch, request.batches)
        if capture.unprofiled is not None and capture.unprofiled.other_batches:
            checked, corrected = _timed_batches(arch, hw, comm, factors, calibration, capture.unprofiled)
            notes += checked
            if corrected is not None:
                factors = corrected
                comm = comm.with_factors(factors).with_calibrated(calibration.comm_points)
    evaluated = []
    for layout in layouts:
        memory = layout_memory(arch, layout, hw, factors, context=request.context)
        ev = _Evaluated(layout=layout, memory=memory)
        ev.points = [predict_point(arch, layout, hw, comm, batch=b, context=request.context, memory=memory)
                     for b in request.batches]
        evaluated.append(ev)
    estimated: dict[int, list[str]] = {}  # group size -> ops priced by the α-β estimate
    modelled: dict[int, list[str]] = {}  # group size -> ops priced by the PCIe all-to-all model
    for ev in evaluated:
        for p in ev.points:
            for path in p.collective_paths:
                ops = estimated.setdefault(path.group, [])
                if path.source == "α-β estimate" and path.op not in ops:
                    ops.append(path.op)
                if path.source.startswith(PCIE_A2A_SOURCE) and path.op not in modelled.get(path.group, []):
                    modelled.setdefault(path.group, []).append(path.op)
    for g in sorted(set(estimated) | set(modelled)):
        ops, by_model = estimated.get(g, []), modelled.get(g, [])
        if ops or by_model:
            priced = [f"{', '.join(ops)} priced by the α-β estimate" if ops else "",
                      f"{', '.join(by_model)} by the PCIe all-to-all model" if by_model else ""]
            notes.append(f"no collective curve for {g} GPUs: {'; '.join(x for x in priced if x)} (assumed); "
                         f"`servescope bench comm --gpus {g}` measures one")
    if any(path.wait_us_each > 0 for ev in evaluated for pt in ev.points for path in pt.collective_paths):
        caveat = wait_caveat(hw.interconnect)
        if caveat:
            notes.append(caveat)
    planned = [_layout(ev.layout, ev.memory, ev.points, sorted({hw.quality, "assumed"})) for ev in evaluated]
    feasible = [ev for ev in evaluated if ev.memory.feasible]
    if not feasible:
        why = "; ".join(f"{ev.layout.name}: {ev.memory.reason}" for ev in evaluated[:3])
        # the weights fit somewhere but no KV cache holds one request: the context is what is too large
        fits_weights = [ev for ev in evaluated if ev.memory.kv_tokens_per_gpu > 0]
        if fits_weights:
            most = max(ev.memory.kv_tokens_per_gpu for ev in fits_weights)
            raise InputError("--context", f"{request.context:,} tokens a request: no layout of {arch.name} on "
                             f"{request.gpus} × {hw.gpu or hw.name} holds one request's KV cache (the most any "
                             f"holds: {most:,} tokens a GPU)")
        raise InputError("--gpus", f"no layout of {arch.name} fits on {request.gpus} × {hw.gpu or hw.name} at "
                         f"context {request.context:,}: {why}{'; …' if len(evaluated) > 3 else ''}")

    def step_at(i: int, batch: int) -> float:
        ev = feasible[i]
        return predict_point(arch, ev.layout, hw, comm, batch=batch, context=request.context,
                             memory=ev.memory).step_ms

    crossovers = find_crossovers([ev.layout.name for ev in feasible], request.batches, step_at)

    def predict(layout: Layout, memory: LayoutMemory, batch: int) -> PointCost:
        return predict_point(arch, layout, hw, comm, batch=batch, context=request.context, memory=memory)

    versus = ep_vs_tp([(ev.layout, ev.memory) for ev in feasible if ev.layout.ep > 1],
                      [(ev.layout, ev.memory) for ev in feasible if ev.layout.kind == "tp" and ev.layout.tp > 1],
                      predict, comm, context=request.context, last=max(LAST, *request.batches))
    tp_ep = [(ev.layout, ev.memory) for ev in feasible if ev.layout.kind != "dp_ep" and ev.layout.ep > 1
             and ev.layout.pp == 1]
    tp_all = [(ev.layout, ev.memory) for ev in feasible if ev.layout.kind == "tp" and ev.layout.ep == 1
              and ev.layout.tp == request.gpus]
    what_if = a2a_what_if(arch, tp_ep[0], tp_all[0], predict, comm, request.batches) if tp_ep and tp_all else None
    return PlanDoc(
        servescope_version=__version__, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        platform={"python": sys.version.split()[0], "system": platform.platform()},
        inputs=PlanInputs(model=request.model, hardware=request.hardware, gpus=request.gpus,
                          batches=list(request.batches), context=request.context, comm=_file_info(request.comm),
                          calibrate=_file_info(request.calibrate), graph=request.graph, env=dict(request.env),
                          topology=_file_info(request.topology)),
        model=msgspec.convert(arch, PlanModel, from_attributes=True),
        hardware=msgspec.convert(hw, PlanHardware, from_attributes=True), gpus=request.gpus,
        context=request.context, batches=list(request.batches),
        factors={name: Factor(value=f["value"], origin=f["origin"]) for name, f in factors.table().items()},
        curves=[CurveUsed(path=s.path, origin=s.origin, device=s.doc.device, world_size=s.doc.world_size,
                          interconnect=s.doc.interconnect) for s in sources],
        calibration=msgspec.convert(calibration, PlanCalibration, from_attributes=True) if calibration else None,
        layouts=planned, skipped=skipped, crossovers=crossovers,
        recommendation=recommend(planned, crossovers, request.gpus),
        forced=forced, notes=forced + notes, ep_vs_tp=versus, ep_all_to_all=what_if)
