"""Predicted decode step time (ms) of one layout at one batch, and memory per GPU, from bytes and counts.

A *step* gives every one of ``batch`` running requests one more token; its time is the time per output
token a request sees. Four parts, added without overlap:

- **weights**: ``weights_fixed_us`` (the GEMMs' per-call floors; 0 until calibrated) + weight bytes one GPU
  reads on a token's path ÷ (HBM GB/s × ``hbm_efficiency``), or the GEMM FLOPs ÷ (dense TFLOP/s ×
  ``tflops_efficiency``) when that is longer. Routed experts count only the
  expected active ones (:func:`servescope.plan.model.active_experts` of the tokens the MoE layer sees, or of
  one token when ``routing`` is "alike": B copies of one sequence pick the same experts); under EP those of the
  busiest rank (:func:`servescope.plan.model.busiest_rank_experts`).
- **attention**: ``attention_fixed_us`` (kernel floors; 0 until calibrated) + KV-cache bytes read = requests
  per attention rank × (context + ``attention_request_tokens``) × KV bytes per token per layer (MLA:
  ``kv_lora_rank + qk_rope_head_dim`` elements) × layers ÷ (HBM GB/s × ``attention_efficiency``). The request
  tokens (assumed in ``data/plan.toml``, or calibrated) price the kernel's own work per request as the KV it
  could have read meanwhile, so that it scales with the KV heads a GPU holds and not with the context.
- **collectives**: Σ count × time of one op (curve or α-β, :mod:`servescope.plan.collectives`).
- **other**: ``(us_per_step + us_per_layer × layers) × other_scale + other_calls × floor(requests) +
  us_per_request × requests`` (requests per attention rank; ``floor`` = the hardware profile's measured
  duration of one small kernel at that batch, :meth:`~servescope.plan.hardware.HardwareProfile.other_floor_us`;
  ``other_calls`` is 0 until calibrated); when a launch-bound capture calibrated ``host_step_us`` (the
  host's time to launch a step), other grows so that the step is never shorter than it: the device waits
  for the host.

Collectives per step, counted along one token's path (``T`` = tokens per microbatch, ``h`` = hidden ×
activation bytes):

- TP > 1: 2 all_reduce per layer of ``T·h`` bytes (after attention's o-projection and after the MLP/MoE),
  1 all_reduce of ``T·h`` for the vocab-parallel embedding, 1 all_gather of the logits (``T × padded
  vocab × activation bytes``, gathered size).
- TP + EP (DP = 1), as vLLM 0.26 runs it (:mod:`servescope.plan.ep_backend`): the same collectives as TP. No
  all2all backend runs; every rank sees every token and the MoE output (routed + shared) is all-reduced over TP.
- DP attention + EP, by the all2all backend: the default ``allgather_reducescatter`` has per MoE layer 1 all_gather
  of every rank's ``ceil(B/dp)`` tokens (``dp × ceil(B/dp) × (h + top_k × 8)`` bytes gathered: hidden vectors,
  top-k weights and ids) and 1 reduce_scatter of their outputs (``dp × ceil(B/dp) × h``); an all-to-all backend
  (DeepEP, …) a dispatch and a combine all_to_all of ``ceil(B/dp) × top_k × h`` (per-rank send buffer), whose
  ``senders`` are the ranks holding tokens, ``ceil(B / ceil(B/dp))`` (between PCIe GPUs the host bridge carries
  only theirs: :mod:`servescope.plan.alltoall`). Dense layers, embedding and lm_head are whole on every GPU.
- PP: ``pp − 1`` send_recv of ``T·h`` per step (stage boundaries on the path).

PP: the batch runs as ``pp`` microbatches of ``T = ceil(B/pp)``; a token passes every stage, so the step is
the path through all layers at microbatch ``T`` plus the sends (stage imbalance and bubbles are not
modelled). Under EP the step waits for the rank with the most active experts
(:func:`~servescope.plan.model.busiest_rank_experts`); the tokens a rank computes are taken at the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servescope.core.plan import CollectivePath
from servescope.plan.bands import Term, merge, part_term, term_for
from servescope.plan.collectives import CommCosts
from servescope.plan.ep_backend import EpBackend, ep_backend
from servescope.plan.factors import Factors
from servescope.plan.hardware import HardwareProfile
from servescope.plan.layouts import Layout
from servescope.plan.model import VOCAB_PADDING, ModelArch, active_experts, busiest_rank_experts
from servescope.plan.weights import kv_bytes_per_token_layer, rank_weights, stage_layers

__all__ = ["GIB", "Collective", "LayoutMemory", "PointCost", "collectives_per_step", "layout_memory",
           "predict_point"]

GIB = float(1 << 30)


@dataclass(frozen=True, kw_only=True)
class Collective:
    """``count`` ops of kind ``op`` per step over ``group`` GPUs, each of ``bytes_each`` (nccl-tests size);
    ``senders``: the GPUs of an all_to_all that hold tokens (``None``: all); ``why``: the engine rule that runs it
    (an EP layout's MoE collectives: the all2all backend, or none at DP = 1)."""

    op: str
    count: int
    bytes_each: int
    group: int
    what: str
    senders: int | None = None
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class PointCost:
    """One layout at one batch: the step time, its parts (ms), collectives, and where the figures came from.

    Attributes:
        batch: running requests.
        step_ms: predicted time of one decode step.
        parts_ms: ``weights``, ``attention``, ``collectives``, ``other``.
        collectives: the collectives of one step.
        collective_ms: per op kind, the time of all its ops in a step.
        origins: per part, the origins of its inputs (``datasheet``, ``assumed``, ``calibrated``,
            ``measured curve``, ``published curve``).
        weight_bytes: weight bytes one GPU reads per step.
        kv_read_bytes: KV-cache bytes one GPU reads per step.
        compute_bound: whether GEMM FLOPs, not weight reads, set the weights part.
        fits_kv: whether the KV cache holds ``batch × context`` tokens.
        collective_wait_ms: per op kind, the part of ``collective_ms`` that is the assumed wait for the last
            rank (figures not measured in a real step).
        collective_paths: per collective of the step, the path it takes and its figure (``path``: the
            implementation in a few words, ``PathChoice.label``).
        terms: each figure's share of the step with its band (:mod:`servescope.plan.bands`).
    """

    batch: int
    step_ms: float
    parts_ms: dict[str, float]
    collectives: list[Collective]
    collective_ms: dict[str, float]
    origins: dict[str, list[str]]
    weight_bytes: float
    kv_read_bytes: float
    compute_bound: bool
    fits_kv: bool
    collective_wait_ms: dict[str, float] = field(default_factory=dict)
    collective_paths: list[CollectivePath] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LayoutMemory:
    """Memory per GPU of a layout (the fullest GPU): weights and what is left for the KV cache, GiB."""

    weights_gib: float
    kv_cache_gib: float
    usable_gib: float
    kv_tokens_per_gpu: int
    kv_capacity_tokens: int
    feasible: bool
    reason: str
    per_stage_weights_gib: list[float] = field(default_factory=list)


def _act_bytes(arch: ModelArch) -> int:
    return int(arch.hidden * arch.dtype_bytes)


def collectives_per_step(arch: ModelArch, layout: Layout, batch: int,
                         backend: EpBackend | None = None) -> list[Collective]:
    """The collectives one decode step of ``batch`` requests runs under ``layout`` (see the module doc);
    ``backend``: the all2all backend of a DP > 1 EP layout (default: vLLM's, :func:`ep_backend` of no env)."""
    out: list[Collective] = []
    tokens = math.ceil(batch / layout.pp)
    h = _act_bytes(arch)
    dense_layers, moe_layers = arch.layers - arch.moe_layers, arch.moe_layers
    b = backend or ep_backend({})

    def add(op: str, count: int, nbytes: int, group: int, what: str, senders: int | None = None,
            why: str = "") -> None:
        if count > 0 and group > 1:
            out.append(Collective(op=op, count=count, bytes_each=nbytes, group=group, what=what, senders=senders,
                                  why=why))

    if layout.kind == "dp_ep":
        per_rank = math.ceil(batch / layout.dp)
        why = f"all2all backend {b.name}: {b.why}; {b.how}"
        if b.dispatch == "all_gather":
            gathered = per_rank * layout.dp  # every rank padded to the largest
            add("all_gather", moe_layers, gathered * (h + arch.top_k * b.extra_bytes_per_routed), layout.ep,
                f"MoE dispatch ({b.name}): every rank's tokens, top-k weights and ids to every rank", why=why)
            add("reduce_scatter", moe_layers, gathered * h, layout.ep,
                f"MoE combine ({b.name}): expert outputs summed back to each token's rank", why=why)
        else:
            add("all_to_all", 2 * moe_layers, per_rank * arch.top_k * h, layout.ep,
                f"MoE dispatch + combine ({b.name})", math.ceil(batch / per_rank), why=why)
        return out
    tp = layout.tp
    if layout.ep > 1:
        add("all_reduce", arch.layers + dense_layers + 1, tokens * h, tp,
            "attention out per layer, dense MLP down, embedding")
        add("all_reduce", moe_layers, tokens * h, tp, "MoE output (routed + shared) per MoE layer", why=b.dp1_why)
    else:
        add("all_reduce", 2 * arch.layers + 1, tokens * h, tp, "attention out + MLP/MoE down per layer, embedding")
    vocab = -(-arch.vocab // VOCAB_PADDING) * VOCAB_PADDING
    add("all_gather", 1, int(tokens * vocab * arch.dtype_bytes), tp, "logits")
    add("send_recv", layout.pp - 1, tokens * h, 2, "pipeline stage boundaries")
    return out


def layout_memory(arch: ModelArch, layout: Layout, hw: HardwareProfile, factors: Factors, *,
                  context: int) -> LayoutMemory:
    """Weights and KV-cache room per GPU, and whether one request of ``context`` tokens fits."""
    w = rank_weights(arch, layout)
    usable = hw.memory_gb * 1e9 * factors.memory_utilization - factors.reserve_gib * GIB
    kv_layer = kv_bytes_per_token_layer(arch, layout.tp, factors.kv_bytes)
    stages = stage_layers(arch, layout.pp)
    per_stage: list[float] = []
    tokens_per_gpu: int | None = None
    tight_free = usable
    for i, layers in enumerate(stages):
        weights = sum(w.attention + (w.router + w.shared + w.experts_held * w.expert if arch.is_moe_layer(j)
                                     else w.dense_mlp) for j in layers)
        weights += (w.embedding if i == 0 else 0.0) + (w.lm_head if i == len(stages) - 1 else 0.0)
        per_stage.append(weights)
        free = usable - weights
        tokens = max(0, int(free // (kv_layer * len(layers)))) if layers else 0
        if tokens_per_gpu is None or tokens < tokens_per_gpu:
            tokens_per_gpu, tight_free = tokens, free
    tokens_per_gpu = tokens_per_gpu or 0
    heaviest = max(per_stage)
    capacity = tokens_per_gpu * layout.dp
    if tight_free <= 0:
        feasible, reason = False, (f"weights {heaviest / GIB:.1f} GiB per GPU exceed the usable "
                                   f"{usable / GIB:.1f} GiB")
    elif tokens_per_gpu < context:
        feasible, reason = False, (f"KV cache holds {tokens_per_gpu} tokens per GPU, fewer than one request's "
                                   f"{context}")
    else:
        feasible, reason = True, f"weights {heaviest / GIB:.1f} of {usable / GIB:.1f} GiB usable per GPU"
    return LayoutMemory(weights_gib=heaviest / GIB, kv_cache_gib=max(0.0, tight_free) / GIB,
                        usable_gib=usable / GIB, kv_tokens_per_gpu=tokens_per_gpu, kv_capacity_tokens=capacity,
                        feasible=feasible, reason=reason, per_stage_weights_gib=[s / GIB for s in per_stage])


def predict_point(arch: ModelArch, layout: Layout, hw: HardwareProfile, comm: CommCosts, *, batch: int,
                  context: int, memory: LayoutMemory) -> PointCost:
    """The predicted decode step of ``batch`` requests at ``context`` tokens each under ``layout``.

    Raises:
        ValueError: ``batch`` below 1 or ``context`` below 0.
    """
    if batch < 1 or context < 0:
        raise ValueError(f"batch must be >= 1 and context >= 0, got {batch} and {context}")
    f = comm.factors
    w = rank_weights(arch, layout)
    tokens = math.ceil(batch / layout.pp)  # per microbatch, on the path
    attn_requests = math.ceil(batch / layout.dp) if layout.kind == "dp_ep" else tokens
    moe_tokens = batch if layout.kind == "dp_ep" else tokens  # tokens one MoE layer sees over its EP group
    dense_layers, moe_layers = arch.layers - arch.moe_layers, arch.moe_layers

    # Weight bytes read, and GEMM FLOPs, on a token's path through every layer.
    read = w.attention * arch.layers + w.dense_mlp * dense_layers + w.lm_head
    flops = 2 * attn_requests * (w.attention_params * arch.layers + w.dense_params * dense_layers + w.head_params)
    if moe_layers:
        # Alike requests (one sequence repeated) route every token to the same top_k experts.
        routed_tokens = 1 if f.routing == "alike" else moe_tokens
        local_active = (busiest_rank_experts(arch.experts, arch.top_k, routed_tokens, layout.ep) if layout.ep > 1
                        else active_experts(arch.experts, arch.top_k, routed_tokens))
        read += moe_layers * (w.router + w.shared + min(float(w.experts_held), local_active) * w.expert)
        pairs = moe_tokens * arch.top_k / layout.ep  # token-expert pairs this GPU computes
        # the shared expert: its TP slice on every token the rank's attention holds (whole under DP attention)
        flops += 2 * moe_layers * (attn_requests * (w.router_params + w.shared_params) + pairs * w.expert_params)
    bytes_us = read / (hw.hbm_gbps * 1e3 * f.hbm_efficiency)
    rate = hw.tflops_for(arch.expert_weight_dtype if moe_layers else arch.weight_dtype)
    flops_us = flops / (rate * 1e6 * f.tflops_efficiency) if rate else 0.0
    weights_us = f.weights_fixed_us + max(bytes_us, flops_us)

    kv_token = kv_bytes_per_token_layer(arch, layout.tp, f.kv_bytes) * arch.layers  # one token, every layer
    kv_read = attn_requests * context * kv_token
    kv_priced = kv_read + attn_requests * f.attention_request_tokens * kv_token  # the kernel's per-request work
    attention_us = f.attention_fixed_us + kv_priced / (hw.hbm_gbps * 1e3 * f.attention_efficiency)

    colls = collectives_per_step(arch, layout, batch, ep_backend(comm.env))
    coll_ms: dict[str, float] = {}
    coll_origins: list[str] = []
    wait_ms: dict[str, float] = {}
    paths: list[CollectivePath] = []
    terms: list[Term] = []
    calibrated_scale = f.origins.get("collective_scale") == "calibrated"
    for c in colls:
        priced = comm.price(c.op, c.group, c.bytes_each, senders=c.senders)
        why = f"{c.why}; {priced.why}" if c.why else priced.why
        band = "calibrated" if calibrated_scale else priced.band
        figure = (f"{c.op} over {c.group} GPUs, {priced.path or priced.impl}: {priced.origin}, "
                  f"{_short(priced.source)}")
        term = term_for(figure, band, c.count * priced.us / 1e3, doublings=priced.doublings, op=c.op, group=c.group,
                        nbytes=c.bytes_each, calls=c.count)
        terms.append(term)
        coll_ms[c.op] = coll_ms.get(c.op, 0.0) + c.count * priced.us / 1e3
        wait_ms[c.op] = wait_ms.get(c.op, 0.0) + c.count * priced.wait_us / 1e3
        paths.append(CollectivePath(op=c.op, what=c.what, count=c.count, bytes_each=c.bytes_each, group=c.group,
                                    impl=priced.impl, path=priced.path, why=why, origin=priced.origin,
                                    us_each=priced.us, wait_us_each=priced.wait_us, source=priced.source,
                                    band=term.band, low_us_each=priced.us * (1 - term.lo_ms / max(term.ms, 1e-12)),
                                    high_us_each=priced.us * (1 + term.hi_ms / max(term.ms, 1e-12))))
        if priced.origin not in coll_origins:
            coll_origins.append(priced.origin)
    if colls and f.origins.get("collective_scale") == "calibrated":
        coll_origins.append("calibrated")
    other_us = (f.us_per_step + f.us_per_layer * arch.layers) * f.other_scale + f.us_per_request * attn_requests
    if f.other_calls:
        other_us += f.other_calls * (hw.other_floor_us(attn_requests) or 0.0)

    device_us = weights_us + attention_us + sum(coll_ms.values()) * 1e3 + other_us
    # the server's own steps at the timed batches, where the host's time adds to the device's
    other_us = max(0.0, other_us + f.step_correction_us(attn_requests))
    # a launch-bound or async step: the device idles until the host is done
    other_us += max(0.0, f.host_floor_us(attn_requests) - device_us)
    parts = {"weights": weights_us / 1e3, "attention": attention_us / 1e3,
             "collectives": sum(coll_ms.values()), "other": other_us / 1e3}

    def marks(*names: str) -> list[str]:
        return sorted({f.origins.get(n, "assumed") for n in names})

    origins = {
        "weights": sorted({hw.quality, *marks("hbm_efficiency", "tflops_efficiency", "weights_fixed_us")}),
        "attention": sorted({hw.quality, *marks("attention_efficiency", "kv_bytes", "attention_fixed_us",
                                                          "attention_request_tokens")}),
        "collectives": coll_origins,
        "other": marks("us_per_layer", "us_per_step", "other_scale", "us_per_request", "host_step_us",
                       "other_calls", *(("host_steps",) if f.host_steps else ()),
                       *(("step_corrections",) if f.step_corrections else ())),
    }
    per_gpu_requests = math.ceil(batch / layout.dp) if layout.kind == "dp_ep" else batch
    cal = {k for k, v in f.origins.items() if v == "calibrated"}
    terms = [part_term("weights", parts["weights"], calibrated="hbm_efficiency" in cal),
             part_term("attention", parts["attention"], calibrated="attention_efficiency" in cal),
             *merge(terms),
             part_term("other", parts["other"], calibrated=bool(cal & {"other_scale", "us_per_request", "host_step_us",
                                                                         "host_steps", "step_corrections"}))]
    return PointCost(
        batch=batch, step_ms=sum(parts.values()), parts_ms=parts, collectives=colls, collective_ms=coll_ms,
        origins=origins, weight_bytes=read, kv_read_bytes=kv_read, compute_bound=flops_us > bytes_us,
        fits_kv=per_gpu_requests * context <= memory.kv_tokens_per_gpu, collective_wait_ms=wait_ms,
        collective_paths=paths, terms=terms)


def _short(source: str) -> str:
    """A figure's source in a few words (the document, a pull request), for its name."""
    head = source.split("; ")[0].split(" (")[0].split(": ")[0].split(", ")[0]
    return head if len(head) <= 70 else head[:67] + "…"
