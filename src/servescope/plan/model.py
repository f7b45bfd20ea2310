"""A model's architecture (from a HF ``config.json`` or a bundled preset) and the GEMMs of one decode step.

:func:`load_model_arch` reads Llama / Qwen2 / Mistral dense configs, Mixtral and Qwen3-MoE, DeepSeek-V3 and
Kimi-K2 (MLA + shared experts), and Kimi-K2.5 (the text model nested under ``text_config``); or a preset
name from ``data/models/*.toml``. :func:`gemm_shapes` lists the per-rank GEMMs of one decode step as vLLM
shards them under tensor parallelism.

This module needs only the standard library (``tools/bench_gemm_device.py`` imports it on a GPU machine
without our dependencies).

Example:
    >>> arch = load_model_arch("llama-3-70b")
    >>> [(s.name, s.n, s.k) for s in gemm_shapes(arch, tp=8, batch=1)][:2]
    [('attn.qkv', 1280, 8192), ('attn.o', 8192, 1024)]
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from servescope.core.errors import InputError
from servescope.core.files import read_json
from servescope.core.gemm import GemmShape
from servescope.plan.hf_cache import cache_dir, cached_config

__all__ = [
    "ModelArch",
    "active_experts",
    "arch_from_hf_config",
    "busiest_rank_experts",
    "gemm_shapes",
    "list_model_presets",
    "load_model_arch",
]

# vLLM pads the vocabulary to a multiple of 64 before splitting the lm_head over ranks (DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64
# Bytes per element of unquantized weights by HF ``torch_dtype``.
DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


@dataclass(frozen=True, kw_only=True)
class ModelArch:
    """The numbers of a decoder-only transformer that set its GEMM shapes and weight bytes.

    Attributes:
        name: preset name or config path.
        source: which public ``config.json`` the numbers follow (presets) or the file read.
        hidden: model width (``hidden_size``).
        layers: decoder layers.
        heads: query heads.
        kv_heads: key/value heads (GQA); equal to ``heads`` for MLA.
        head_dim: per-head width of q/k (MLA: ``qk_nope_head_dim + qk_rope_head_dim``).
        intermediate: dense MLP width (``intermediate_size``); 0 when every layer is MoE.
        vocab: vocabulary size.
        experts: routed experts per MoE layer; 0 for a dense model.
        top_k: experts per token.
        moe_intermediate: one routed expert's MLP width.
        shared_experts: always-on experts per MoE layer (their MLP is ``shared_experts * moe_intermediate`` wide).
        first_dense_layers: the first k layers have a dense MLP (DeepSeek's ``first_k_dense_replace``).
        dense_layer_ids: further dense-MLP layers (Qwen's ``mlp_only_layers``, ``decoder_sparse_step``).
        q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: MLA's widths;
            ``kv_lora_rank`` is ``None`` when attention is not MLA, ``q_lora_rank`` may be ``None`` in MLA.
        dtype: the unquantized type (HF ``torch_dtype``): embeddings, router, lm_head.
        dtype_bytes: bytes per element at ``dtype``.
        weight_dtype, weight_bytes: attention, dense-MLP and shared-expert weights (scales included).
        expert_weight_dtype, expert_weight_bytes: routed-expert weights, e.g. ``int4-g32``: 4 bits plus one
            bf16 scale per 32 weights, 0.5625 bytes.
    """

    name: str
    source: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    first_dense_layers: int = 0
    dense_layer_ids: tuple[int, ...] = ()
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    dtype: str = "bfloat16"
    dtype_bytes: float = 2.0
    weight_dtype: str = "bfloat16"
    weight_bytes: float = 2.0
    expert_weight_dtype: str = "bfloat16"
    expert_weight_bytes: float = 2.0

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""
        return self.kv_lora_rank is not None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has routed experts rather than a dense MLP."""
        return self.experts > 0 and layer >= self.first_dense_layers and layer not in self.dense_layer_ids

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts."""
        return sum(self.is_moe_layer(i) for i in range(self.layers))


def active_experts(experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts one MoE layer runs for ``batch`` tokens under uniform routing.

    Each token picks ``top_k`` distinct experts of ``experts``, so one expert stays idle with probability
    ``(1 - top_k/experts) ** batch``. Real routers are skewed, which leaves fewer experts with more tokens.
    """
    return experts * (1.0 - (1.0 - top_k / experts) ** batch)


def busiest_rank_experts(experts: int, top_k: int, batch: int, ranks: int) -> float:
    """Expected distinct experts active on the busiest of ``ranks`` EP ranks, each holding ``experts / ranks``.

    A decode step waits for its slowest rank. Under uniform routing each expert is active with probability
    ``p = active_experts / experts``; a rank's count is taken as Binomial(n = experts / ranks, p) and the ranks as
    independent, so the expected maximum is ``Σ_{m<n} 1 − F(m)^ranks`` (F the binomial CDF). One rank: ``n·p``.
    """
    n = -(-experts // ranks)
    p = active_experts(experts, top_k, batch) / experts
    if ranks <= 1 or p >= 1.0:
        return n * p
    cdf, total = 0.0, 0.0
    for m in range(n):
        cdf += math.comb(n, m) * p**m * (1.0 - p) ** (n - m)
        total += 1.0 - min(cdf, 1.0) ** ranks
    return total


def gemm_shapes(arch: ModelArch, *, tp: int, batch: int) -> list[GemmShape]:
    """The GEMMs of one decode step at ``batch`` requests (one token each) on one of ``tp`` ranks.

    Split as vLLM does: column-parallel layers (qkv, q_b, gate_up, lm_head) keep ``N / tp`` outputs,
    row-parallel ones (o, down) ``K / tp`` inputs; MLA's ``qkv_a`` (fused q_a + kv_a) and the MoE router are
    replicated; each routed expert's MLP is split like a dense one (TP MoE, not expert parallelism); MLA's
    ``kv_b`` runs absorbed in decode, as two per-head batched matmuls (``attn.kv_b.uk``: q_nope into the
    latent, ``attn.kv_b.uv``: latent to v). Under GQA with fewer KV heads than ranks each rank keeps one KV
    head (replicated), as vLLM does.

    Routed experts: ``routed_tokens = batch * top_k`` token-expert pairs per layer land on
    :func:`active_experts` distinct experts; each GEMM is one active expert at ``M = ceil(routed / active)``
    tokens and ``count`` is the rounded number of active experts times the MoE layers.

    Raises:
        ValueError: ``tp`` or ``batch`` below 1, or ``tp`` does not divide the heads or MLP widths (the
            message lists the sizes that do).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    _check_tp(arch, tp)
    dense_layers = arch.layers - arch.moe_layers
    moe_layers = arch.moe_layers
    heads_rank = arch.heads // tp
    out: list[GemmShape] = []

    def add(name: str, n: int, k: int, *, count: int, split: str, dtype: str, elem_bytes: float,
            m: int = batch, mean_tokens: float | None = None, routed: int | None = None,
            active: float | None = None, layers: int = 1) -> None:
        if count > 0:
            out.append(GemmShape(
                model=arch.name, name=name, m=m, n=n, k=k, count=count, split=split, tp=tp, batch=batch,
                weight_dtype=dtype, weight_bytes=n * k * elem_bytes,
                mean_tokens=float(batch) if mean_tokens is None else mean_tokens, routed_tokens=routed,
                active_experts=active, layers=layers))

    wd, wb, L = arch.weight_dtype, arch.weight_bytes, arch.layers
    if arch.is_mla:
        kv_lora, rope = _need(arch.kv_lora_rank), _need(arch.qk_rope_head_dim)
        nope, v_dim = _need(arch.qk_nope_head_dim), _need(arch.v_head_dim)
        if arch.q_lora_rank is not None:
            add("attn.qkv_a", arch.q_lora_rank + kv_lora + rope, arch.hidden, count=L, split="replicated",
                dtype=wd, elem_bytes=wb, layers=L)
            add("attn.q_b", heads_rank * (nope + rope), arch.q_lora_rank, count=L, split="column", dtype=wd,
                elem_bytes=wb, layers=L)
        else:
            add("attn.q", heads_rank * (nope + rope), arch.hidden, count=L, split="column", dtype=wd,
                elem_bytes=wb, layers=L)
            add("attn.kv_a", kv_lora + rope, arch.hidden, count=L, split="replicated", dtype=wd, elem_bytes=wb,
                layers=L)
        add("attn.kv_b.uk", kv_lora, nope, count=L * heads_rank, split="heads", dtype=wd, elem_bytes=wb, layers=L)
        add("attn.kv_b.uv", v_dim, kv_lora, count=L * heads_rank, split="heads", dtype=wd, elem_bytes=wb,
            layers=L)
        add("attn.o", arch.hidden, heads_rank * v_dim, count=L, split="row", dtype=wd, elem_bytes=wb, layers=L)
    else:
        kv_rank = max(1, arch.kv_heads // tp)
        add("attn.qkv", (heads_rank + 2 * kv_rank) * arch.head_dim, arch.hidden, count=L, split="column",
            dtype=wd, elem_bytes=wb, layers=L)
        add("attn.o", arch.hidden, heads_rank * arch.head_dim, count=L, split="row", dtype=wd, elem_bytes=wb,
            layers=L)

    inter_rank = arch.intermediate // tp
    add("mlp.gate_up", 2 * inter_rank, arch.hidden, count=dense_layers, split="column", dtype=wd, elem_bytes=wb,
        layers=dense_layers)
    add("mlp.down", arch.hidden, inter_rank, count=dense_layers, split="row", dtype=wd, elem_bytes=wb,
        layers=dense_layers)

    if moe_layers:
        add("moe.router", arch.experts, arch.hidden, count=moe_layers, split="replicated", dtype=arch.dtype,
            elem_bytes=arch.dtype_bytes, layers=moe_layers)
        routed = batch * arch.top_k
        active = active_experts(arch.experts, arch.top_k, batch)
        per_expert = routed / active
        n_active = max(1, round(active))
        moe_rank = arch.moe_intermediate // tp
        ed, eb = arch.expert_weight_dtype, arch.expert_weight_bytes
        for name, n, k, split in (("moe.experts.w13", 2 * moe_rank, arch.hidden, "column"),
                                  ("moe.experts.w2", arch.hidden, moe_rank, "row")):
            add(name, n, k, count=moe_layers * n_active, split=split, dtype=ed, elem_bytes=eb,
                m=math.ceil(per_expert - 1e-9), mean_tokens=per_expert, routed=routed, active=active,
                layers=moe_layers)
        shared_rank = arch.shared_experts * arch.moe_intermediate // tp
        if shared_rank:
            add("moe.shared.gate_up", 2 * shared_rank, arch.hidden, count=moe_layers, split="column", dtype=wd,
                elem_bytes=wb, layers=moe_layers)
            add("moe.shared.down", arch.hidden, shared_rank, count=moe_layers, split="row", dtype=wd,
                elem_bytes=wb, layers=moe_layers)

    vocab_padded = -(-arch.vocab // VOCAB_PADDING) * VOCAB_PADDING
    add("lm_head", -(-vocab_padded // tp), arch.hidden, count=1, split="column", dtype=arch.dtype,
        elem_bytes=arch.dtype_bytes)
    return out


def _need(value: int | None) -> int:
    if value is None:
        raise ValueError("an MLA model needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    return value


def _check_tp(arch: ModelArch, tp: int) -> None:
    widths = [arch.heads]
    if arch.layers - arch.moe_layers:
        widths.append(arch.intermediate)
    if arch.moe_layers:
        widths.append(arch.moe_intermediate)
    allowed = [d for d in range(1, arch.heads + 1) if all(w % d == 0 for w in widths)
               and (arch.is_mla or arch.kv_heads % d == 0 or d % arch.kv_heads == 0)]
    if tp not in allowed:
        raise ValueError(f"tp {tp} does not split {arch.name} evenly; allowed: {', '.join(map(str, allowed))}")


# ---------------------------------------------------------------------------------------------- loading

_PRESET_DIR = ("data", "models")
_FIELDS = {f.name: f for f in dataclasses.fields(ModelArch)}
# The TOML value types each annotation of ModelArch accepts (annotations are strings under __future__).
_PRESET_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "int | None": (int,), "float": (int, float), "tuple[int, ...]": (tuple,)}


def list_model_presets() -> list[str]:
    """Names of the bundled model presets (``data/models/*.toml``), sorted."""
    folder = files("servescope").joinpath(*_PRESET_DIR)
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_model_arch(source: str | Path) -> ModelArch:
    """The architecture in a HF ``config.json`` (or a folder holding one), a preset ``.toml``, a preset name, or a
    Hugging Face id whose config the hub cache holds (:mod:`servescope.plan.hf_cache`).

    Example:
        >>> load_model_arch("kimi-k2.5").experts
        384

    Raises:
        InputError: the file cannot be read or parsed, a field is missing or wrong, or no preset has the name
            (the message lists the presets).
    """
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".toml" and path.is_file():
        return _preset_from_text(path.read_text(encoding="utf-8"), str(path))
    if path.is_file() or path.suffix == ".json":
        return arch_from_hf_config(_json_object(path), name=str(source), source=str(path))
    name = str(source)
    resource = files("servescope").joinpath(*_PRESET_DIR, f"{name}.toml")
    if not resource.is_file():  # preset names are case-insensitive: Kimi-K2.5 is kimi-k2.5
        lower = {n.lower(): n for n in list_model_presets()}.get(name.lower())
        if lower is not None:
            resource = files("servescope").joinpath(*_PRESET_DIR, f"{lower}.toml")
    if not resource.is_file():
        if (cached := cached_config(name)) is not None:  # a Hugging Face id the hub cache holds
            return arch_from_hf_config(_json_object(cached), name=name, source=str(cached))
        raise InputError(name, f"no config.json there, none in the Hugging Face cache ({cache_dir()}) and no such "
                         f"preset; presets: {', '.join(list_model_presets())}")
    return _preset_from_text(resource.read_text(encoding="utf-8"), f"preset {name}")


def _preset_from_text(text: str, where: str) -> ModelArch:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(where, f"not TOML: {exc}") from None
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise InputError(where, f"unknown field {unknown[0]!r}; fields: {', '.join(_FIELDS)}")
    if "dense_layer_ids" in data:
        ids = data["dense_layer_ids"]
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise InputError(where, "dense_layer_ids: a list of layer numbers")
        data["dense_layer_ids"] = tuple(ids)
    for key, value in data.items():
        want = _PRESET_TYPES[str(_FIELDS[key].type)]
        if not isinstance(value, want) or isinstance(value, bool):
            raise InputError(where, f"{key}: expected {_FIELDS[key].type}, got {value!r}")
        if _FIELDS[key].type == "float" and isinstance(value, int):
            data[key] = float(value)
    for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
        if key not in data:
            raise InputError(where, f"missing field {key!r}")
    data.setdefault("name", where.removeprefix("preset "))
    data.setdefault("source", where)
    return _checked(ModelArch(**data), where)


_HF_DEFAULT_EXPERTS = {"qwen3_moe": 128, "qwen2_moe": 60}


def _json_object(path: Path) -> dict[str, Any]:
    config = read_json(path)
    if not isinstance(config, dict):
        raise InputError(str(path), "a config.json holds one JSON object")
    return config


def arch_from_hf_config(config: Mapping[str, Any], *, name: str, source: str) -> ModelArch:
    """The architecture described by a parsed HF ``config.json``.

    A multimodal config (Kimi-K2.5, Qwen-VL style) is read through its ``text_config``. Quantization comes from
    ``quantization_config`` (the text model's or the top level's): ``fp8`` with a weight block
    (DeepSeek-V3: every linear layer at one byte plus a float32 scale per block) or without (per-tensor scales, as
    vLLM's ``--quantization fp8`` quantizes a bf16 checkpoint when it loads: one byte), ``compressed-tensors`` integer
    groups (Kimi-K2-Thinking, K2.5: routed experts only when the config lists an ``ignore`` set), or
    GPTQ/AWQ-style ``bits`` / ``group_size``.

    Raises:
        InputError: ``source`` with the first missing or ill-typed field.
    """
    text = config.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    where = f"{source}: text_config" if cfg is not config else source

    def get_int(key: str, default: int | None = None, *, keys: tuple[str, ...] = ()) -> int:
        for k in (key, *keys):
            value = cfg.get(k)
            if value is not None:
                if type(value) is not int or value < 0:
                    raise InputError(where, f"{k}: expected a non-negative integer, got {value!r}")
                return value
        if default is None:
            raise InputError(where, f"missing field {key!r}")
        return default

    hidden = get_int("hidden_size", keys=("n_embd", "d_model"))
    layers = get_int("num_hidden_layers", keys=("n_layer",))
    heads = get_int("num_attention_heads", keys=("n_head",))
    vocab = get_int("vocab_size")
    if heads == 0 or layers == 0 or hidden == 0:
        raise InputError(where, "hidden_size, num_hidden_layers and num_attention_heads must be positive")
    kv_heads = get_int("num_key_value_heads", heads)

    # A config that leaves a field out gets its transformers class's default, as vLLM reads it: Qwen3MoeConfig's
    # num_experts is 128 (transformers/models/qwen3_moe/configuration_qwen3_moe.py; Qwen2MoeConfig: 60).
    experts = get_int("n_routed_experts", _HF_DEFAULT_EXPERTS.get(str(cfg.get("model_type", "")), 0),
                      keys=("num_experts", "num_local_experts"))
    top_k = get_int("num_experts_per_tok", 0) if experts else 0
    if experts and not 0 < top_k <= experts:
        raise InputError(where, f"num_experts_per_tok: expected 1..{experts}, got {top_k}")
    if "num_local_experts" in cfg and "moe_intermediate_size" not in cfg:  # Mixtral: every MLP is an expert
        moe_inter, intermediate = get_int("intermediate_size"), 0
    else:
        moe_inter = get_int("moe_intermediate_size") if experts else 0
        intermediate = get_int("intermediate_size", 0 if experts else None)
    shared = get_int("n_shared_experts", 0) if experts else 0
    if experts and not shared and get_int("shared_expert_intermediate_size", 0):
        # Qwen2-MoE: one shared expert of its own width (transformers' Qwen2MoeSparseMoeBlock.shared_expert), a
        # whole number of routed experts' widths in the published configs (Qwen1.5-MoE-A2.7B: 5632 = 4 x 1408);
        # counted as that many experts' width, rounded up where it is not
        shared = -(-get_int("shared_expert_intermediate_size") // moe_inter)

    dense_ids: set[int] = set()
    if experts:
        if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:  # DeepSeek: MoE where i >= k and i % freq == 0
            first_k, freq = get_int("first_k_dense_replace", 0), max(1, get_int("moe_layer_freq", 1))
            dense_ids = {i for i in range(layers) if i < first_k or i % freq}
        else:  # Qwen-MoE: dense where i in mlp_only_layers or (i + 1) % decoder_sparse_step
            step = max(1, get_int("decoder_sparse_step", 1))
            only = cfg.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(type(i) is int for i in only):
                raise InputError(where, f"mlp_only_layers: expected a list of layer numbers, got {only!r}")
            dense_ids = {i for i in range(layers) if i in only or (i + 1) % step}
        if dense_ids and intermediate == 0:
            raise InputError(where, "missing field 'intermediate_size' (the dense layers' MLP)")
    first_dense = 0
    while first_dense in dense_ids:
        first_dense += 1

    mla: dict[str, int | None] = {}
    if cfg.get("kv_lora_rank") is not None:
        mla = {"kv_lora_rank": get_int("kv_lora_rank"), "qk_nope_head_dim": get_int("qk_nope_head_dim"),
               "qk_rope_head_dim": get_int("qk_rope_head_dim"), "v_head_dim": get_int("v_head_dim"),
               "q_lora_rank": get_int("q_lora_rank") if cfg.get("q_lora_rank") is not None else None}
        head_dim = get_int("qk_nope_head_dim") + get_int("qk_rope_head_dim")
        kv_heads = heads
    else:
        head_dim = get_int("head_dim", hidden // heads)

    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise InputError(where, f"torch_dtype: expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    quant = cfg.get("quantization_config") or config.get("quantization_config")
    weights, expert_weights = _quantized(quant, dtype, where)

    arch = ModelArch(
        name=name, source=source, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=intermediate, vocab=vocab, experts=experts, top_k=top_k,
        moe_intermediate=moe_inter, shared_experts=shared, first_dense_layers=first_dense,
        dense_layer_ids=tuple(sorted(i for i in dense_ids if i >= first_dense)),
        dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype], weight_dtype=weights[0], weight_bytes=weights[1],
        expert_weight_dtype=expert_weights[0], expert_weight_bytes=expert_weights[1], **mla)
    return _checked(arch, where)


def _quantized(quant: Any, dtype: str, where: str) -> tuple[tuple[str, float], tuple[str, float]]:
    """(dtype label, bytes per element) of the dense linear weights and of the routed experts."""
    plain = (dtype, DTYPE_BYTES[dtype])
    if not quant:
        return plain, plain
    if not isinstance(quant, Mapping):
        raise InputError(where, "quantization_config: expected an object")
    method = quant.get("quant_method")
    if method == "fp8":
        if quant.get("weight_block_size") is None:  # per-tensor scales (vLLM's --quantization fp8 of a bf16
            return ("fp8", 1.0), ("fp8", 1.0)         # checkpoint, fp8.py Fp8LinearMethod): one float per matrix
        block = quant.get("weight_block_size")
        if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
            raise InputError(where, f"quantization_config.weight_block_size: expected [n, k], got {block!r}")
        fp8 = (f"fp8-b{block[0]}", 1.0 + 4.0 / (block[0] * block[1]))  # float32 scale_inv per block
        return fp8, fp8
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise InputError(where, "quantization_config.config_groups: expected a non-empty object")
        w = next(iter(groups.values())).get("weights") or {}
        bits, group = w.get("num_bits"), w.get("group_size")
        if type(bits) is not int or type(group) is not int or group <= 0:
            raise InputError(where, "quantization_config.config_groups: weights need num_bits and group_size")
        kind = "fp" if w.get("type") == "float" else "int"
        q = (f"{kind}{bits}-g{group}", bits / 8 + 2.0 / group)  # one bf16 scale per group (symmetric)
        # An ignore list names the layers left unquantized: on Kimi-K2-Thinking / K2.5 it is everything but
        # the routed experts.
        return (plain if quant.get("ignore") else q), q
    bits, group = quant.get("bits"), quant.get("group_size")
    if type(bits) is int and type(group) is int and group > 0:  # GPTQ / AWQ: scales and zeros per group
        q = (f"{method or 'int'}{bits}-g{group}", bits / 8 + (2.0 + bits / 8) / group)
        return q, q
    raise InputError(where, f"quantization_config: unsupported quant_method {method!r}")


def _checked(arch: ModelArch, where: str) -> ModelArch:
    for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"):
        if getattr(arch, key) <= 0:
            raise InputError(where, f"{key} must be positive, got {getattr(arch, key)}")
    if arch.layers - arch.moe_layers > 0 and arch.intermediate <= 0:
        raise InputError(where, "intermediate must be positive: the model has dense-MLP layers")
    if arch.experts:
        if not 0 < arch.top_k <= arch.experts:
            raise InputError(where, f"top_k must be 1..{arch.experts}, got {arch.top_k}")
        if arch.moe_intermediate <= 0:
            raise InputError(where, "moe_intermediate must be positive in a MoE model")
    if not arch.is_mla and arch.heads % arch.kv_heads:
        raise InputError(where, f"heads {arch.heads} is not a multiple of kv_heads {arch.kv_heads}")
    if arch.is_mla and None in (arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim):
        raise InputError(where, "MLA needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    return arch
