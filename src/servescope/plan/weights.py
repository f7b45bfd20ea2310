"""Weight bytes per GPU under a layout, and KV-cache bytes per token: plain parameter counting.

Counted: every linear layer (attention, dense MLP, routed and shared experts, router), the embedding and
the lm_head; not counted: norms and biases (< 0.01% of a large model). Splits follow vLLM: column- and
row-parallel layers divide by TP, MLA's ``q_a``/``kv_a`` projections and the router are replicated, GQA
keeps at least one KV head per rank, the embedding and lm_head are vocab-parallel over TP (the vocabulary
padded to a multiple of 64). Under EP a GPU holds ``experts / ep`` whole experts; the shared expert is a plain
MLP of the TP group, split over TP like a dense MLP (vLLM 0.26 model_executor/models/deepseek_v2.py:
``DeepseekV2MLP`` column- and row-parallel unless the MoE runs sequence parallel, which needs DP > 1). Under DP
attention (TP = 1) every GPU holds all of attention, the dense layers and the shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass

from servescope.plan.layouts import Layout
from servescope.plan.model import VOCAB_PADDING, ModelArch

__all__ = ["RankWeights", "kv_bytes_per_token_layer", "rank_weights", "stage_layers"]


@dataclass(frozen=True, kw_only=True)
class RankWeights:
    """Weight bytes held by one GPU, per piece (bytes, not parameters).

    Attributes:
        attention: one layer's attention projections.
        dense_mlp: one dense layer's MLP.
        router: one MoE layer's router (replicated).
        shared: one MoE layer's shared expert(s): a 1/tp slice (whole under DP attention).
        expert: one routed expert as this GPU holds it (a 1/moe_tp slice, or whole under EP).
        experts_held: routed experts per MoE layer on this GPU.
        embedding: the embedding (first stage).
        lm_head: the lm_head (last stage).
        attention_params, dense_params, shared_params, expert_params, head_params: the same pieces in
            parameters (for FLOPs).
    """

    attention: float
    dense_mlp: float
    router: float
    shared: float
    expert: float
    experts_held: int
    embedding: float
    lm_head: float
    attention_params: float
    dense_params: float
    router_params: float
    shared_params: float
    expert_params: float
    head_params: float


def _attention_params(arch: ModelArch, tp: int) -> float:
    """Parameters of one layer's attention on one of ``tp`` ranks."""
    h, heads = arch.hidden, arch.heads / tp
    if arch.is_mla:
        kv_lora, rope = arch.kv_lora_rank or 0, arch.qk_rope_head_dim or 0
        nope, v = arch.qk_nope_head_dim or 0, arch.v_head_dim or 0
        replicated = h * (kv_lora + rope)  # kv_a (with the rope key)
        if arch.q_lora_rank is not None:
            replicated += h * arch.q_lora_rank  # q_a
            q = arch.q_lora_rank * heads * (nope + rope)  # q_b
        else:
            q = h * heads * (nope + rope)
        return replicated + q + kv_lora * heads * (nope + v) + heads * v * h  # + kv_b + o
    kv_rank = max(1.0, arch.kv_heads / tp)
    return h * (heads + 2 * kv_rank) * arch.head_dim + heads * arch.head_dim * h


def rank_weights(arch: ModelArch, layout: Layout) -> RankWeights:
    """The weight pieces one GPU of ``layout`` holds (a stage's GPU holds its layers' share of them)."""
    tp = layout.tp  # attention, dense MLP and vocab split; 1 under DP attention
    attn = _attention_params(arch, tp)
    dense = 3 * arch.hidden * arch.intermediate / tp
    router = float(arch.hidden * arch.experts) if arch.experts else 0.0
    shared = 3 * arch.hidden * arch.shared_experts * arch.moe_intermediate / tp  # a TP-split MLP, EP or not
    expert = 3 * arch.hidden * arch.moe_intermediate / layout.moe_tp if arch.experts else 0.0
    held = -(-arch.experts // layout.ep) if arch.experts else 0
    vocab = -(-arch.vocab // VOCAB_PADDING) * VOCAB_PADDING
    head = vocab * arch.hidden / tp
    wb, eb, db = arch.weight_bytes, arch.expert_weight_bytes, arch.dtype_bytes
    return RankWeights(
        attention=attn * wb, dense_mlp=dense * wb, router=router * db, shared=shared * wb, expert=expert * eb,
        experts_held=held, embedding=head * db, lm_head=head * db, attention_params=attn, dense_params=dense,
        router_params=router, shared_params=shared, expert_params=expert, head_params=head)


def stage_layers(arch: ModelArch, pp: int) -> list[range]:
    """The decoder layers of each of ``pp`` stages: ``layers // pp`` each, the remainder on the last ones.

    vLLM's ``get_pp_indices`` does the same by default (``VLLM_PP_LAYER_PARTITION`` unset).
    """
    base, extra = divmod(arch.layers, pp)
    sizes = [base + (1 if i >= pp - extra else 0) for i in range(pp)]
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def kv_bytes_per_token_layer(arch: ModelArch, tp: int, kv_bytes: float) -> float:
    """KV-cache bytes one token adds per layer on one GPU of an attention group of ``tp`` ranks.

    MLA caches one latent per token, ``kv_lora_rank + qk_rope_head_dim`` elements, shared by all heads, so
    every TP rank holds all of it. GQA caches K and V for the rank's KV heads (at least one).
    """
    if arch.is_mla:
        return ((arch.kv_lora_rank or 0) + (arch.qk_rope_head_dim or 0)) * kv_bytes
    return 2 * max(1.0, arch.kv_heads / tp) * arch.head_dim * kv_bytes
