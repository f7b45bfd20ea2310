"""Step-model factors fitted to a real capture: per part, a fixed time per step and a cost per request.

The capture is an ``analyze --json`` (or ``profile --json``) document of a TP run of the same model. From its
decode phase, on the rank that spent least time in collectives (the others' collective time includes
waiting for the slowest rank), the measured parts per step are: *weights* = the GEMMs of ``gemm`` + ``moe`` +
``quantize``; *attention* = the KV-reading calls of ``attention``; *collectives* = every ``comm.*`` category;
*other* = the step span minus those three (so it holds the host's gaps between kernels too). What a capture shows
(its parts per step, the calls that stream bytes, its batch groups, context and routing) is read by
:mod:`servescope.plan.captured`; this module holds the rules that fit the factors to it.

The step model (:mod:`servescope.plan.cost`) writes each of weights, attention and other as
``fixed + slope × X(batch)``:

- weights: ``X`` = the model's weight-read time at HBM efficiency 1 (MoE: the experts a batch touches), so
  ``slope = 1 / hbm_efficiency`` and ``fixed = weights_fixed_us`` (the GEMMs' per-call floors);
- attention: ``X`` = the model's KV-read time at efficiency 1 (∝ batch × context), ``fixed =
  attention_fixed_us``; the fitted slope is split (:func:`split_attention`) into the rate the KV is read at
  (``attention_efficiency``) and the kernel's work per request as ``attention_request_tokens``, which a plan at
  another context does not scale: from a capture at a short context (up to the assumed request tokens) the
  bytes at the assumed stream rate and the rest as request tokens, from a longer one the request tokens as
  assumed and the rate fitted. Where this section says "slope" of attention below, it is this pair;
- other: ``X`` = running requests, ``slope = us_per_request``, ``fixed = (us_per_step + us_per_layer ×
  layers) × other_scale``, plus, when the hardware profile has measured kernel floors, ``other_calls`` =
  the capture's "other" kernels per step (the small calls of weights and attention included), each at the
  profile's floor *at the predicted batch*
  (``HardwareProfile.other_floor_us``: a decoder layer's norms, rotary, residual adds and SiLU, timed at
  several batch sizes by ``tools/bench_kernel_floor.py``). Those kernels move activation-sized bytes, far
  below what HBM moves in a floor's time, so their time follows the floor curve and not the request count;
  the fits below see other *less* ``other_calls × floor(batch)`` (written *other′*);
- collectives: the capture's own per-call times at its message sizes and group size (``Calibration.comm_points``,
  origin ``calibrated``, :mod:`servescope.plan.captured`), used for every layout's collectives of the same op,
  group size and path; only a capture whose collectives give no point (none it could size) still fits
  ``collective_scale = measured / modelled`` (curve or α-β times at the capture's sizes).

Two unknowns per part cannot come from one number, so what is fitted depends on what the capture shows
(``Calibration.mode``):

1. ``steps at several batches``: the capture's own decode steps ran at two or more batch sizes (a staggered
   workload: requests arrive and finish at different steps), each with at least ``MIN_GROUP_STEPS`` steps.
   Fixed time and slope of each part (other′ for other) are fitted by least squares over those batch
   groups (weighted by their step counts). A part whose ``X`` does not change between the groups (a dense
   model's weights), or whose fitted slope or fixed time comes out negative, falls back to rule 2 for it.
2. ``one batch of 1``: one request per step cannot tell per-step from per-request costs. The slopes stay as
   assumed (``hbm_efficiency``, ``attention_efficiency`` and ``attention_request_tokens``, ``us_per_request``
   from ``data/plan.toml``) and
   the fixed times are fitted: ``fixed = measured − slope × X`` (other′ for other), for weights and attention
   held at least at their calls' measured kernel floor (``kernel_floor_us.gemm``, ``.attention``) and at most at
   what leaves the bytes their datasheet time; where a bound holds, the slope is what remains (:func:`one_batch`).
   On MoE the floors matter: the experts read grow from 8 at one request to ~82 at 16, and without the floor a
   batch-16 fit read the GEMMs' per-call floors as a low efficiency (the real vLLM 0.26 steady captures of
   ``tests/data/h200-vllm/steady``: the device's part of batch 1 predicted −30%, now within 4.2%).
   A batch-dependent cost the model does not know (an engine that copies its whole KV cache every step,
   per-request host work) is then missed at larger batches; calibrate from a capture at a batch above 1 to see it.
3. ``one batch above 1``: the fixed times of attention and other come from data, the slopes are fitted from
   the rest. Fixed attention = the hardware profile's measured ``kernel_floor_us.attention`` × the
   capture's streaming attention calls per step; fixed other′ = the capture's idle time per step (the gaps
   between the kernels of a step and around it, which do not grow with the batch), the small kernels being in
   ``other_calls`` already. Weights keep rule 2 (with its bounds): their bytes follow from the config and
   their slope from the HBM rate. A profile without floors gives fixed attention
   0 and fixed other = the idle time (noted). If a part's measured time is at or below its floors, rule 2
   applies to it.

A GPU capture whose device idles more than half of each step, and whose forward is not a graph replay
(``graph_replay_share`` below ``GRAPH_REPLAYED``), is *launch-bound* (eager PyTorch: the host launches one
kernel at a time, and the device idles between them). Its idle time is left out of *other* before the rules
above, and ``host_step_us`` = its step: the model's step never gets shorter than the host's time to launch
it, and a batch whose device work outgrows it is device-bound again.

A capture whose forward replays a CUDA graph is never launch-bound, however long its device idles: the step
is the host's input preparation (the device idle but for a few small copies) *followed by* the replay, whose
kernels run back to back, so its idle time is a fixed cost per step *added to* the device's work, not a floor
the device's work hides under; it stays in *other* (its fixed time), as on any device-bound capture. On the
real vLLM 0.26 captures of ``tests/data/h200-vllm`` the replay starts 1.6–2.6 ms into every step, after the
same host work at every batch (dense 103 CPU ops and 23 runtime calls, MoE 145 and 32), and the step's device
work ends with it: the dense steps (device busy longer than idle) and the MoE ones (shorter) are the one
mechanism, and a threshold on idle > busy had put them under two.

A capture that carries the server's own step without the profiler (``AnalysisDoc.unprofiled``: ``servescope
profile`` times the same batch unprofiled) gives the host's time as it is in production
(:func:`~servescope.plan.captured.production_host`), and the profiled idle (the profiler stretches the host's
work, not the device's) leaves the fit: with async scheduling on (the deployment's evidence, vLLM 0.26's default)
the host prepares a step while the device runs the one before, so the step is the longer of the two and the
unprofiled step is its floor (``host_step_us``, as for a launch-bound capture); off or unknown, the host's time is
serial, the unprofiled step less the device's work, a fixed time of every step. On the steady H200 pairs, the
other batch's own unprofiled step within 10% on 17 of 20 directions, against 6 of 20 with the profiled idle carried.

(A CPU trace has no separate host: its idle time is the engine's own Python work between operators, and it
stays in *other* like any other time.)

A MoE capture's weights are fitted with the experts its workload touched (``Calibration.routing``, rules in
:func:`~servescope.plan.captured.capture_routing`): "alike" when its requests are one sequence repeated (a
``servescope profile`` document from before each request got its own prompt: one prompt at temperature 0 to all; or
expert GEMMs at a batch above 1 faster than the independent tokens' experts could be read at the datasheet HBM
rate), so every token picks the same ``top_k`` experts; else "independent" (E·(1−(1−k/E)^B) experts). The
predictions keep the capture's routing, and a note says so. (The real vLLM MoE captures of ``tests/data/h200-vllm``
ran 8 experts at 1, 16 and 64 requests; read as 82 and 126 experts, calibrated at 16 the planner fitted an HBM
efficiency of 2.9, and from batch 1 it predicted 16 and 64 at +52% and +90% once the host time was no longer a
floor.)

**Physics.** A fit is refused (``InputError``, one line with the numbers; ``--force`` does not pass it) when no real
run of this model on this device could have given it: the capture's decode step shorter than reading the weights
one GPU holds on a token's path once at the datasheet HBM rate; a fitted ``hbm_efficiency`` or
``attention_efficiency`` above 1 (the part ran faster than the datasheet allows); a negative fixed time,
per-request cost, scale or call count; a collective scale of 0 or less. Before 2026-12-05 such fits were used
(a Qwen3-30B-A3B capture gave a 70B model ``hbm_efficiency`` 40 and 0.09 ms of weight reads a step).

No number from a capture at another batch enters the fit; the hardware profile's floors come from
``tools/bench_kernel_floor.py``, a separate benchmark on the same kind of GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from servescope.core.analysis import RankAnalysis
from servescope.core.categories import categories_of
from servescope.core.errors import InputError
from servescope.core.plan import CalibrationPoint
from servescope.plan.captured import (
    batch_groups,
    calls_per_part,
    capture_context,
    capture_routing,
    capture_tp,
    captured_points,
    phase_parts,
    production_host,
    read_capture,
    streaming_shares,
)
from servescope.plan.collectives import CommCosts
from servescope.plan.cost import PointCost, layout_memory, predict_point
from servescope.plan.factors import Factors
from servescope.plan.hardware import HardwareProfile
from servescope.plan.host_cycle import host_steps, steps_note, timed_steps
from servescope.plan.layouts import Layout
from servescope.plan.model import ModelArch
from servescope.plan.paths import Point

__all__ = ["GRAPH_REPLAYED", "MIN_GROUP_STEPS", "Calibration", "apply_calibration", "calibrate", "split_attention"]

MIN_GROUP_STEPS = 3  # decode steps a batch size needs before the per-step fit uses it
MODES = ("steps at several batches", "one batch of 1", "one batch above 1")
# Share of the device's work launched by graph replays above which a capture's idle time is host preparation
# serial with the replay (module doc), not launch-bound idling between eager kernels (0.92-0.95 in the real
# vLLM graph captures of tests/data/h200-vllm, 0 in their --enforce-eager twins).
GRAPH_REPLAYED = 0.5


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What was fitted, from which capture, how, and the per-part times (ms per step) behind it.

    Attributes:
        path, rank, tp, batch, context: the capture, the rank used, its TP size, decode batch and context.
        mode: which rule of the module doc fitted the factors.
        measured_ms: the capture's parts per step (``step`` too).
        modelled_ms: the model's parts at the capture's batch, efficiency 1 and no fixed times.
        fitted: the factors replaced, by name.
        routing: how the capture's tokens picked their experts (``Factors.routing``, "independent" for a
            dense model); the predictions keep it (they are for the capture's workload at other batches).
        points: per batch group the fit used, its steps and their mean parts.
        comm_points: the capture's collectives as per-call points (origin ``calibrated``).
        notes: what was kept as assumed, and why.
        host_steps: the async step's floor at the batches the server was timed at (``Factors.host_steps``).
        serial_timed: without async scheduling, the server's steps at the batches timed (the planner makes them
            ``Factors.step_corrections``).
    """

    path: str
    rank: int
    tp: int
    batch: int
    context: int
    mode: str
    measured_ms: dict[str, float]
    modelled_ms: dict[str, float]
    fitted: dict[str, float]
    routing: str = "independent"
    points: list[CalibrationPoint] = field(default_factory=list)
    comm_points: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host_steps: tuple[tuple[int, float], ...] = ()
    serial_timed: tuple[tuple[int, float], ...] = ()


def calibrate(path: str | Path, arch: ModelArch, hw: HardwareProfile, comm: CommCosts, *,
              context: int) -> Calibration:
    """Factors fitted to the decode phase of the capture at ``path`` (rules in the module doc).

    Raises:
        InputError: the file is unreadable, not an analysis document, has no decode phase, no batch size,
            or its TP size does not split the model.
    """
    source, doc, raw = read_capture(path)
    ranks = [r for r in doc.ranks if "decode" in r.phases and r.phases["decode"].steps > 0]
    if not ranks:
        raise InputError(source, "no decode steps to calibrate from (capture a decode workload)")
    tp = capture_tp(doc)

    categories = categories_of(doc)

    def comm_us(r: RankAnalysis) -> float:
        cats = r.phases["decode"].categories
        return sum(c.per_step_us for n, c in cats.items() if categories[n].role == "collectives")

    rank = min(ranks, key=lambda r: (comm_us(r), r.rank))
    phase = rank.phases["decode"]
    if not phase.tokens_per_step:
        raise InputError(source, "decode steps carry no token counts; the batch size is unknown")
    batch = max(1, round(phase.tokens_per_step))
    ctx, note = capture_context(raw, context)
    notes = [note] if note else []
    layout = Layout(kind="tp", tp=tp)
    if tp > 1 and (arch.heads % tp or arch.hidden % tp):
        raise InputError(source, f"the capture has {tp} ranks, which do not split {arch.name}")
    f = comm.factors
    streaming = streaming_shares(doc, rank.rank, hw)
    measured = phase_parts(phase, streaming)

    def unit_comm(routing: str) -> CommCosts:  # efficiency 1, no fixed times, the capture's routing
        return comm.with_factors(f.replaced("unit", hbm_efficiency=1.0, attention_efficiency=1.0,
                                            collective_scale=1.0, other_scale=1.0, us_per_request=0.0,
                                            weights_fixed_us=0.0, attention_fixed_us=0.0,
                                            attention_request_tokens=0.0, routing=routing))

    memory = layout_memory(arch, layout, hw, f, context=ctx)
    routing, why = capture_routing(raw, arch, batch, measured["weights"],
                                    predict_point(arch, layout, hw, unit_comm("independent"), batch=batch,
                                                  context=ctx, memory=memory).parts_ms["weights"] * 1e3)
    if why:
        notes.append(why)
    unit = unit_comm(routing)

    def modelled(b: int) -> dict[str, float]:  # µs at efficiency 1, no fixed times; other = requests
        parts = predict_point(arch, layout, hw, unit, batch=b, context=ctx, memory=memory).parts_ms
        return {"weights": parts["weights"] * 1e3, "attention": parts["attention"] * 1e3,
                "collectives": parts["collectives"] * 1e3, "other": float(b)}

    small = [f"{name} {c.calls_per_step - streaming.part_calls(name, c.calls_per_step):.0f} a step "
             f"({1 - streaming.time.get(name, 1.0):.0%} of its time)" for name, c in sorted(phase.categories.items())
             if streaming.part_calls(name, c.calls_per_step) < c.calls_per_step]
    if small:
        notes.append(f"small calls priced as other (they stream no weight or KV bytes): {', '.join(small)}")
    if streaming.attention_rate is not None and 0 < ctx <= f.attention_request_tokens:  # longer: the fit reads its own
        notes.append(f"attention: its kernels read the KV cache at {streaming.attention_rate:.2f} of the datasheet "
                     f"HBM rate, measured on the engine's own kernel at a long context ({hw.name} profile, "
                     f"attention_kernel_rate), in place of the assumed {f.attention_efficiency:.2f}")
    own_floor, plain = streaming.attention_floor_us, hw.kernel_floor_us.get("attention")
    if own_floor is not None and own_floor != plain:
        notes.append(f"attention: its kernels' floor is {own_floor:.2f} µs a call, measured on the engine's own "
                     f"kernel ({hw.name} profile, attention_kernel_floor_us)"
                     + (f", not the plain PyTorch attention's {plain:.2f} µs" if plain is not None else ""))
    # A GPU capture whose device idles most of the step is launch-bound (eager PyTorch): its step is the host's
    # time, and only the device's work is fitted to the parts (host_step_us holds the step).
    # A graph replay's idle is the host's preparation before it, serial with the replay: a fixed cost, not a floor.
    host_bound = (rank.work_kind == "device" and phase.idle_us_per_step > phase.busy_us_per_step
                  and rank.graph_replay_share < GRAPH_REPLAYED)
    idle = max(0.0, phase.idle_us_per_step)
    host = production_host(doc, phase, host_bound=host_bound, device=rank.work_kind == "device")
    if host_bound or host is not None:  # the profiled idle leaves; a production host time takes its place
        measured["other"] = max(0.0, measured["other"] - idle + (host.serial_us if host is not None else 0.0))
    at_batch = modelled(batch)
    calls = calls_per_part(phase, streaming)
    base_other = f.us_per_step + f.us_per_layer * arch.layers
    floors = hw.kernel_floor_us
    if floors and hw.kernel_floor_origin == "assumed":
        notes.append(f"kernel floors: assumed, not measured on this card ({hw.kernel_floor_source})")

    def small_kernels(b: int) -> float:  # µs of the capture's small "other" kernels at the floor of batch b
        return calls["other"] * (hw.other_floor_us(b) or 0.0)

    measured_other = measured["other"]
    measured["other"] = max(0.0, measured_other - small_kernels(batch))
    # Attention's assumed slope over its bytes: the assumed stream rate, and its work per request as the assumed
    # request tokens (split_attention turns a fitted slope back into the two).
    stream = streaming.attention_rate or f.attention_efficiency  # the KV's read rate: the kernel's own, or assumed
    prior = {"weights": 1.0 / f.hbm_efficiency,
             "attention": (1.0 + f.attention_request_tokens / ctx if ctx > 0 else 1.0) / stream,
             "other": f.us_per_request}
    fits: dict[str, tuple[float, float]] = {}  # part -> (fixed µs, slope)

    part_floor = {"weights": calls["weights"] * floors.get("gemm", 0.0),
                  "attention": calls["attention"] * (streaming.attention_floor_us or 0.0), "other": 0.0}

    def by_rule_2(part: str) -> tuple[float, float]:
        return one_batch(measured[part], at_batch[part], prior[part], part_floor[part],
                         least_slope=0.0 if part == "other" else 1.0)

    groups = batch_groups(rank.steps, streaming, device_only=host_bound or host is not None,
                          min_steps=MIN_GROUP_STEPS)
    points: list[CalibrationPoint] = []
    if len(groups) >= 2:
        mode = MODES[0]
        xs = {b: modelled(b) for b, _, _ in groups}
        for b, n, parts in groups:
            points.append(CalibrationPoint(batch=b, steps=n, measured_ms={k: v / 1e3 for k, v in parts.items()}))
            parts["other"] = max(0.0, parts["other"] - small_kernels(b))
        if host is not None:  # the steps' device work; the production host time is a fixed time of each
            for _, _, parts in groups:
                parts["other"] += host.serial_us
        for part in ("weights", "attention", "other"):
            line = _line([(xs[b][part], parts[part], float(n)) for b, n, parts in groups])
            fits[part] = line if line is not None else by_rule_2(part)
            if line is None:
                notes.append(f"{part}: no fixed time and slope from the batch groups; fixed time fitted at "
                             f"batch {batch}, slope as assumed")
    elif batch == 1:
        mode = MODES[1]
        fits = {part: by_rule_2(part) for part in ("weights", "attention", "other")}
        notes.append("calibrated at batch 1: the per-request costs are as assumed (the capture cannot show "
                     "them); a capture at a larger batch fits them")
    else:
        mode = MODES[2]
        for kind in ("attention", "other"):
            if kind not in floors:
                notes.append(f"the hardware profile has no kernel_floor_us.{kind}: fixed {kind} time taken as "
                             f"{'the idle time' if kind == 'other' else '0'}")
        fixed0 = {"attention": part_floor["attention"],
                  "other": 0.0 if host_bound else host.serial_us if host is not None else idle}
        fits["weights"] = by_rule_2("weights")
        for part in ("attention", "other"):
            m, x = measured[part], at_batch[part]
            if m > fixed0[part] and x > 0:
                fits[part] = (fixed0[part], (m - fixed0[part]) / x)
            else:
                fits[part] = by_rule_2(part)
                notes.append(f"{part}: the capture's time is within its kernel floors; fixed time fitted, "
                             f"slope as assumed")
    fitted: dict[str, float] = {}
    for part, name, fixed_name in (("weights", "hbm_efficiency", "weights_fixed_us"),
                                   ("attention", "attention_efficiency", "attention_fixed_us")):
        fixed, slope = fits[part]
        fitted[fixed_name] = fixed
        if slope > 0 and part == "attention":
            efficiency, tokens = split_attention(slope, stream, ctx, f.attention_request_tokens)
            fitted[name], fitted["attention_request_tokens"] = efficiency, tokens
            if mode != MODES[1] and ctx > 0:  # batch 1: both as assumed (its note)
                rate = f"its KV read at {efficiency:.2f} of the datasheet HBM rate"
                if tokens == f.attention_request_tokens:
                    fitted_part = f"{rate}, its work per request as assumed ({tokens:.0f} tokens)"
                else:
                    us = tokens * at_batch["attention"] / batch / ctx / efficiency
                    fitted_part = (f"{tokens:.0f} tokens a request beyond its context ({us:.2f} µs a request: the "
                                   f"kernel's own work per request), {rate}")
                notes.append(f"attention, fitted at the capture's {ctx} tokens a request: {fitted_part}; a plan at "
                             f"another context scales the bytes, not the work per request")
        elif slope > 0:
            fitted[name] = 1.0 / slope
        elif measured[part] > 0:
            notes.append(f"{name}: kept as assumed (the model has no {part} bytes)")
    fixed, slope = fits["other"]
    if base_other > 0:
        fitted["other_scale"] = fixed / base_other
    fitted["us_per_request"] = slope
    if hw.other_floor_us(1) is not None:
        fitted["other_calls"] = calls["other"]
    m, p = measured["collectives"], at_batch["collectives"]
    comm_points, comm_notes = captured_points(doc, rank, arch, hw, comm.env, tp=tp, batch=batch, source=source)
    notes += comm_notes
    if comm_points:  # the capture's own per-call times price its collectives; no scale on the others
        notes.append("collective_scale: kept as assumed (the capture's collectives are priced from its own calls)")
    elif m > 0 and p > 0:
        fitted["collective_scale"] = m / p
    else:
        notes.append(f"collective_scale: kept as assumed (the {'capture' if m <= 0 else 'model'} has no "
                     f"collectives)")
    steps = host_steps(host, batch)
    if host is not None:
        notes.append(host.note(idle, phase.step_us.mean, timed_batches=bool(steps)))
        if host.floor_us:
            fitted["host_step_us"] = host.floor_us
        if steps:
            notes.append(steps_note(steps))
    elif not host_bound and rank.work_kind == "device" and idle >= 0.1 * phase.step_us.mean:
        unprofiled = ""
        if doc.unprofiled is not None:  # the gauge of what the window's host time was worth
            unprofiled = (f"; without the profiler this server's step was {doc.unprofiled.step_us / 1e3:.2f} ms "
                          f"({doc.unprofiled.source})")
        notes.append(f"host time: {idle / 1e3:.2f} ms of the capture's {phase.step_us.mean / 1e3:.2f} ms step is the "
                     f"device idle (the host's preparation before the replay), carried to every batch and layout as "
                     f"a fixed time; it is the host's speed in the captured window (two windows of one vLLM server "
                     f"under its profiler: the same device work, host times up to 1.9x apart){unprofiled}")
    if host_bound:
        fitted["host_step_us"] = phase.step_us.mean
        notes.append(f"launch-bound capture: the device idled {phase.idle_us_per_step:.0f} of "
                     f"{phase.step_us.mean:.0f} µs per step; the step is held at least that long (host_step_us)")
    measured["other"] = measured_other
    _check_physics(source, hw, fitted, step_us=phase.step_us.mean,
                   floor=predict_point(arch, layout, hw, unit, batch=batch, context=ctx, memory=memory),
                   measured_us=measured)
    return Calibration(path=source, rank=rank.rank, tp=tp, batch=batch, context=ctx, mode=mode,
                       measured_ms={k: v / 1e3 for k, v in measured.items()},
                       modelled_ms={**{k: at_batch[k] / 1e3 for k in ("weights", "attention", "collectives")},
                                    "other": base_other / 1e3}, fitted=fitted, routing=routing,
                       points=points, comm_points=comm_points, notes=notes, host_steps=steps,
                       serial_timed=() if steps else timed_steps(host, batch))


def split_attention(slope: float, stream_efficiency: float, context: int,
                    request_tokens: float) -> tuple[float, float]:
    """(``attention_efficiency``, ``attention_request_tokens``) of a fitted attention slope (µs per µs of KV
    read at the datasheet rate, at ``context`` tokens a request), given the assumed ones.

    One capture at one context cannot tell the kernel's work per request from the rate it reads its KV at: it fits
    the term that dominates its time and keeps the other as assumed. At a context no longer than the assumed
    request tokens (a short one: a decode kernel spends most of its time on each request's query and the combine
    of its splits), the bytes are read at the assumed ``stream_efficiency`` and the rest is request tokens,
    ``context × (slope × stream_efficiency − 1)``; a slope at or below the stream rate's is the efficiency itself.
    At a longer context the bytes dominate: the request tokens stay as assumed and the efficiency is fitted,
    ``(context + request_tokens) / (context × slope)`` (at most 1: beyond it, the rest is request tokens at the
    datasheet rate). Held as an efficiency, a short capture's per-request work would grow with the context; held as
    request tokens, a long capture's slow reading would not. At the capture's context every split gives its time.
    """
    if context <= 0:
        return 1.0 / slope, 0.0
    if context > request_tokens:
        efficiency = (context + request_tokens) / (context * slope)
        if efficiency <= 1.0:
            return efficiency, request_tokens
        return (1.0, context * (slope - 1.0)) if slope >= 1.0 else (1.0 / slope, 0.0)
    if slope * stream_efficiency <= 1.0 + 1e-9:
        return 1.0 / slope, 0.0
    return stream_efficiency, context * (slope * stream_efficiency - 1.0)


def one_batch(measured: float, x: float, assumed_slope: float, floor: float, *,
              least_slope: float = 1.0) -> tuple[float, float]:
    """(fixed µs, slope) of a part from its time at one batch: its ``x`` at the assumed slope, the rest fixed, the
    fixed time held at least at the part's calls at their measured kernel floor and at most at what leaves ``x``
    the least slope physics allows (1 for bytes at the datasheet rate, 0 for requests); where a bound holds, the
    slope is what remains. A part faster than that keeps no fixed time (the physics guard refuses its slope)."""
    if x <= 0:
        return max(0.0, measured), assumed_slope
    most = measured - least_slope * x
    if most < 0:
        return 0.0, measured / x
    fixed = max(measured - assumed_slope * x, floor)
    if fixed >= most:
        return most, least_slope
    return fixed, (measured - fixed) / x


def _line(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Weighted least-squares (fixed, slope) of ``m = fixed + slope × x`` over (x, m, weight); ``None`` when
    the x do not vary by 1% or the fit gives a negative term."""
    total = sum(w for _, _, w in points)
    mx = sum(x * w for x, _, w in points) / total
    my = sum(m * w for _, m, w in points) / total
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    xs = [x for x, _, _ in points]
    if max(xs) <= 0 or (max(xs) - min(xs)) < 0.01 * max(xs) or sxx <= 0:
        return None
    slope = sum(w * (x - mx) * (m - my) for x, m, w in points) / sxx
    fixed = my - slope * mx
    return (fixed, slope) if slope > 0 and fixed >= 0 else None


def _check_physics(source: str, hw: HardwareProfile, fitted: dict[str, float], *, step_us: float,
                   floor: PointCost, measured_us: dict[str, float]) -> None:
    """Refuse a fit that no real run of this model on this device can give (module doc, "Physics").

    Raises:
        InputError: one line naming the first impossibility and its numbers.
    """
    read_us = floor.weight_bytes / (hw.hbm_gbps * 1e3)
    if hw.hbm_gbps > 0 and step_us < read_us:
        raise InputError(source, f"the capture's decode step ({step_us:.0f} µs) is shorter than reading its "
                         f"weights once at the datasheet rate ({floor.weight_bytes / 1e9:.2f} GB per GPU at "
                         f"{hw.hbm_gbps:.0f} GB/s = {read_us:.0f} µs): not this model on this device")
    for name in ("hbm_efficiency", "attention_efficiency"):
        value = fitted.get(name)
        if value is not None and value > 1.0:
            part = "weights" if name == "hbm_efficiency" else "attention"
            why = ("not this model on this device" if part == "weights" else
                   "not this model on this device, or its requests shared a prompt prefix whose cached KV they read "
                   "together (vLLM's prefix caching): calibrate from a capture with distinct prompts")
            raise InputError(source, f"{name} {value:.2f} fitted: the capture's {part} "
                             f"({measured_us[part]:.0f} µs a step) ran faster than the datasheet's "
                             f"{hw.hbm_gbps:.0f} GB/s allows; {why}")
    for name in ("weights_fixed_us", "attention_fixed_us", "attention_request_tokens", "us_per_request",
                 "other_scale", "other_calls", "host_step_us"):
        value = fitted.get(name)
        if value is not None and value < 0:
            raise InputError(source, f"{name} {value:.2f} fitted: a negative time is not a cost")
    if fitted.get("collective_scale", 1.0) <= 0:
        raise InputError(source, f"collective_scale {fitted['collective_scale']:.3f} fitted: collectives take time")


def apply_calibration(factors: Factors, calibration: Calibration) -> Factors:
    """``factors`` with the fitted values (a MoE capture's routing, the timed batches' floors) in place, marked
    ``calibrated``."""
    routing = {"routing": calibration.routing} if calibration.routing != factors.routing else {}
    fitted = factors.replaced("calibrated", **calibration.fitted, **routing)
    if not calibration.host_steps:
        return fitted
    return dataclasses.replace(fitted, host_steps=calibration.host_steps,
                               origins={**fitted.origins, "host_steps": "calibrated"})
