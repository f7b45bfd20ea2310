"""plan.model: presets, HF config.json parsing, and the per-rank decode GEMMs checked by hand arithmetic.

Independent routes: shapes are written out from vLLM's sharding rules by hand; whole-model parameter counts
are compared with the model cards' published totals (Llama-3-70B 70.55 B; DeepSeek-V3 671 B total, 37 B
active; Qwen3-235B-A22B 235 B / 22 B; Kimi-K2 32 B active); the MoE token assumption against a Monte Carlo
of uniform top-k routing.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import InputError
from servescope.core.gemm import GemmShape
from servescope.plan.model import (
    ModelArch,
    active_experts,
    arch_from_hf_config,
    gemm_shapes,
    list_model_presets,
    load_model_arch,
)

# --------------------------------------------------------------------------- real-format config.json files

LLAMA_3_70B: dict[str, Any] = {  # meta-llama/Meta-Llama-3-70B config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 8192,
    "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}

QWEN3_235B: dict[str, Any] = {  # Qwen/Qwen3-235B-A22B config.json
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 94, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 1536, "norm_topk_prob": True,
    "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
    "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

# What transformers 5 writes for a Qwen3MoeConfig: the experts as num_local_experts, "dtype" not "torch_dtype".
QWEN3_MOE_TRANSFORMERS5: dict[str, Any] = {
    "transformers_version": "5.19.0", "architectures": None, "dtype": None, "vocab_size": 32000,
    "hidden_size": 2048, "intermediate_size": 3072, "num_hidden_layers": 4, "num_attention_heads": 16,
    "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "tie_word_embeddings": False, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_local_experts": 64,
    "norm_topk_prob": False, "mlp_only_layers": [], "model_type": "qwen3_moe",
}

DEEPSEEK_V3: dict[str, Any] = {  # deepseek-ai/DeepSeek-V3 config.json (auto_map dropped)
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
                                            "mscale": 1.0, "mscale_all_dim": 1.0,
                                            "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}

KIMI_TEXT = {**{k: v for k, v in DEEPSEEK_V3.items() if k != "quantization_config"},
             "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384, "first_k_dense_replace": 1,
             "n_group": 1, "topk_group": 1, "vocab_size": 163840, "routed_scaling_factor": 2.827,
             "rope_theta": 50000.0, "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0,
                                                     "mscale": 1.0, "mscale_all_dim": 1.0,
                                                     "original_max_position_embeddings": 4096, "type": "yarn"}}
KIMI_K25: dict[str, Any] = {  # moonshotai/Kimi-K2.5 config.json: the text model under text_config
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "media_placeholder_token_id": 163605, "pad_token_id": 163839, "use_unified_vision_chunk": True,
    "vision_config": {"model_type": "moonvit3d", "hidden_size": 1152, "num_hidden_layers": 27,
                      "num_attention_heads": 16, "patch_size": 14},
    "text_config": {
        **KIMI_TEXT,
        "quantization_config": {
            "config_groups": {"group_0": {"input_activations": None, "output_activations": None,
                                          "targets": ["Linear"],
                                          "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                                      "group_size": 32, "num_bits": 4, "observer": "minmax",
                                                      "observer_kwargs": {}, "strategy": "group",
                                                      "symmetric": True, "type": "int"}}},
            "format": "pack-quantized", "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        },
    },
}


def write_config(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def by_name(shapes: list[GemmShape]) -> dict[str, GemmShape]:
    out = {s.name: s for s in shapes}
    assert len(out) == len(shapes), "one shape per name"
    return out


def weight_elements(shapes: list[GemmShape]) -> int:
    return sum(s.count * s.n * s.k for s in shapes)


# ------------------------------------------------------------------------------------------------ presets


def test_presets_are_bundled_and_name_their_source() -> None:
    assert list_model_presets() == ["deepseek-v3", "kimi-k2.5", "llama-3-70b", "qwen3-235b-a22b"]
    for name in list_model_presets():
        arch = load_model_arch(name)
        assert arch.name == name
        assert "config.json" in arch.source


@pytest.mark.parametrize(("preset", "config"), [("llama-3-70b", LLAMA_3_70B), ("qwen3-235b-a22b", QWEN3_235B),
                                                ("deepseek-v3", DEEPSEEK_V3), ("kimi-k2.5", KIMI_K25)])
def test_preset_matches_the_parsed_public_config(tmp_path: Path, preset: str, config: dict[str, Any]) -> None:
    parsed = load_model_arch(write_config(tmp_path, config))
    bundled = load_model_arch(preset)
    assert {**vars(parsed), "name": "", "source": ""} == {**vars(bundled), "name": "", "source": ""}


def test_kimi_k25_preset_numbers() -> None:
    a = load_model_arch("kimi-k2.5")
    assert (a.hidden, a.layers, a.first_dense_layers, a.moe_layers) == (7168, 61, 1, 60)
    assert (a.experts, a.top_k, a.shared_experts, a.moe_intermediate) == (384, 8, 1, 2048)
    assert (a.heads, a.kv_lora_rank, a.qk_rope_head_dim, a.q_lora_rank, a.qk_nope_head_dim, a.v_head_dim) == (
        64, 512, 64, 1536, 128, 128)
    assert a.vocab == 163840
    assert (a.expert_weight_dtype, a.expert_weight_bytes) == ("int4-g32", 0.5 + 2 / 32)
    assert (a.weight_dtype, a.weight_bytes) == ("bfloat16", 2.0)


# ------------------------------------------------------------------------------------ shapes by hand


def test_llama_70b_tp8_decode_shapes_by_hand() -> None:
    shapes = by_name(gemm_shapes(load_model_arch("llama-3-70b"), tp=8, batch=16))
    h, tp, hd = 8192, 8, 128
    expected = {  # name: (M, N, K, count, split)
        "attn.qkv": (16, (64 // tp + 2 * 8 // tp) * hd, h, 80, "column"),  # (8 q + 1 k + 1 v heads) x 128 = 1280
        "attn.o": (16, h, 64 * hd // tp, 80, "row"),                         # K = 1024
        "mlp.gate_up": (16, 2 * 28672 // tp, h, 80, "column"),              # N = 7168
        "mlp.down": (16, h, 28672 // tp, 80, "row"),                        # K = 3584
        "lm_head": (16, 128256 // tp, h, 1, "column"),                      # N = 16032
    }
    assert {n: (s.m, s.n, s.k, s.count, s.split) for n, s in shapes.items()} == expected
    assert shapes["attn.qkv"].n == 1280 and shapes["attn.o"].k == 1024
    assert shapes["mlp.gate_up"].weight_bytes == 7168 * 8192 * 2
    assert all(s.tp == 8 and s.batch == 16 and s.routed_tokens is None for s in shapes.values())


def test_llama_70b_weights_add_up_to_the_published_parameter_count() -> None:
    arch = load_model_arch("llama-3-70b")
    published = 70_553_706_496  # Meta-Llama-3-70B safetensors total
    embed, norms = 128256 * 8192, (2 * 80 + 1) * 8192
    assert weight_elements(gemm_shapes(arch, tp=1, batch=1)) == published - embed - norms
    # one rank of eight holds an eighth of every split layer
    assert weight_elements(gemm_shapes(arch, tp=8, batch=1)) * 8 == published - embed - norms


def test_qwen3_tp8_replicates_the_four_kv_heads() -> None:
    shapes = by_name(gemm_shapes(load_model_arch("qwen3-235b-a22b"), tp=8, batch=1))
    assert shapes["attn.qkv"].n == (64 // 8 + 2 * 1) * 128  # 4 KV heads over 8 ranks: one (replicated) each
    assert shapes["attn.o"].k == 64 * 128 // 8
    assert (shapes["moe.router"].n, shapes["moe.router"].k, shapes["moe.router"].split) == (128, 4096, "replicated")
    assert (shapes["moe.experts.w13"].n, shapes["moe.experts.w2"].k) == (2 * 1536 // 8, 1536 // 8)
    assert "mlp.gate_up" not in shapes and "moe.shared.gate_up" not in shapes
    assert shapes["lm_head"].n == 151936 // 8


@pytest.mark.parametrize(("preset", "total", "active", "rel"), [
    ("deepseek-v3", 671e9, 37e9, 0.002), ("qwen3-235b-a22b", 235e9, 22e9, 0.002), ("kimi-k2.5", 1e12, 32e9, 0.03)])
def test_moe_weights_match_published_totals(preset: str, total: float, active: float, rel: float) -> None:
    """Totals to the published precision (Kimi's "1T" is a round figure); active counts, published to the
    nearest billion with or without embeddings, within 3%."""
    arch = load_model_arch(preset)
    embed = arch.vocab * arch.hidden
    one_token = weight_elements(gemm_shapes(arch, tp=1, batch=1)) + embed  # top_k experts run
    assert one_token == pytest.approx(active, rel=0.03)
    # a batch that hits every expert
    assert weight_elements(gemm_shapes(arch, tp=1, batch=100_000)) + embed == pytest.approx(total, rel=rel)


def test_kimi_k25_mla_shapes_tp8_by_hand() -> None:
    shapes = by_name(gemm_shapes(load_model_arch("kimi-k2.5"), tp=8, batch=4))
    heads = 64 // 8
    assert (shapes["attn.qkv_a"].n, shapes["attn.qkv_a"].k) == (1536 + 512 + 64, 7168)  # fused q_a + kv_a
    assert shapes["attn.qkv_a"].split == "replicated"
    assert (shapes["attn.q_b"].n, shapes["attn.q_b"].k) == (heads * (128 + 64), 1536)
    assert (shapes["attn.kv_b.uk"].n, shapes["attn.kv_b.uk"].k, shapes["attn.kv_b.uk"].count) == (512, 128, 61 * heads)
    assert (shapes["attn.kv_b.uv"].n, shapes["attn.kv_b.uv"].k) == (128, 512)
    assert (shapes["attn.o"].n, shapes["attn.o"].k) == (7168, heads * 128)
    assert (shapes["mlp.gate_up"].n, shapes["mlp.gate_up"].count) == (2 * 18432 // 8, 1)
    assert (shapes["moe.shared.gate_up"].n, shapes["moe.shared.down"].k) == (2 * 2048 // 8, 2048 // 8)
    assert shapes["moe.shared.gate_up"].count == 60
    w13 = shapes["moe.experts.w13"]
    assert (w13.n, w13.k, w13.weight_dtype) == (2 * 2048 // 8, 7168, "int4-g32")
    assert w13.weight_bytes == 512 * 7168 * 0.5625
    assert shapes["attn.q_b"].weight_bytes == heads * 192 * 1536 * 2
    assert shapes["lm_head"].n == 163840 // 8


def test_moe_token_assumption() -> None:
    arch = load_model_arch("qwen3-235b-a22b")
    one = by_name(gemm_shapes(arch, tp=8, batch=1))["moe.experts.w13"]
    assert (one.m, one.routed_tokens, one.count) == (1, 8, 94 * 8)
    assert one.active_experts == pytest.approx(8.0)

    # batch 64: 512 token-expert pairs; expected distinct experts from a Monte Carlo of uniform top-8 routing
    rng = random.Random(0)
    trials = [len({e for _ in range(64) for e in rng.sample(range(128), 8)}) for _ in range(2000)]
    simulated = sum(trials) / len(trials)
    w13 = by_name(gemm_shapes(arch, tp=8, batch=64))["moe.experts.w13"]
    assert w13.routed_tokens == 64 * 8
    active = w13.active_experts
    assert active is not None
    assert active == pytest.approx(simulated, rel=0.01)
    assert w13.mean_tokens == pytest.approx(512 / active)
    assert w13.m == math.ceil(512 / active)
    assert w13.count == 94 * round(active)
    assert active_experts(128, 8, 100_000) == pytest.approx(128)


def test_tp_that_does_not_split_lists_the_sizes_that_do() -> None:
    with pytest.raises(ValueError, match="allowed: 1, 2, 4, 8, 16"):
        gemm_shapes(load_model_arch("llama-3-70b"), tp=3, batch=1)
    with pytest.raises(ValueError, match="batch"):
        gemm_shapes(load_model_arch("llama-3-70b"), tp=8, batch=0)


# ----------------------------------------------------------------------------------------------- parsing


def test_qwen3_moe_as_transformers5_writes_it(tmp_path: Path) -> None:
    arch = load_model_arch(write_config(tmp_path, QWEN3_MOE_TRANSFORMERS5))
    assert (arch.experts, arch.top_k, arch.moe_intermediate, arch.moe_layers) == (64, 8, 768, 4)
    assert (arch.head_dim, arch.kv_heads, arch.dtype) == (128, 4, "bfloat16")


def test_qwen_sparse_step_and_mlp_only_layers(tmp_path: Path) -> None:
    config = {**QWEN3_235B, "num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    arch = load_model_arch(write_config(tmp_path, config))
    # MoE where (i + 1) % 2 == 0 and i not in [3]: layers 1, 5, 7
    assert [i for i in range(8) if arch.is_moe_layer(i)] == [1, 5, 7]
    shapes = by_name(gemm_shapes(arch, tp=8, batch=1))
    assert shapes["mlp.gate_up"].count == 5 and shapes["mlp.gate_up"].n == 2 * 12288 // 8
    assert shapes["moe.experts.w13"].count == 3 * 8


def test_deepseek_fp8_blocks_and_folder_source(tmp_path: Path) -> None:
    write_config(tmp_path, DEEPSEEK_V3)
    arch = load_model_arch(tmp_path)  # a folder holding config.json
    assert (arch.first_dense_layers, arch.moe_layers, arch.shared_experts) == (3, 58, 1)
    assert (arch.weight_dtype, arch.weight_bytes) == ("fp8-b128", 1 + 4 / 128**2)
    assert arch.expert_weight_bytes == arch.weight_bytes
    assert by_name(gemm_shapes(arch, tp=8, batch=1))["lm_head"].weight_dtype == "bfloat16"


def test_kimi_k25_reads_text_config(tmp_path: Path) -> None:
    arch = load_model_arch(write_config(tmp_path, KIMI_K25))
    assert (arch.hidden, arch.experts, arch.heads, arch.is_mla) == (7168, 384, 64, True)
    assert (arch.weight_dtype, arch.expert_weight_dtype) == ("bfloat16", "int4-g32")


def test_a_user_preset_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nsource = "hand"\nhidden = 1024\nlayers = 2\nheads = 8\nkv_heads = 8\n'
                    'head_dim = 128\nintermediate = 4096\nvocab = 1000\nweight_bytes = 1\n', encoding="utf-8")
    arch = load_model_arch(path)
    assert arch == ModelArch(name="mine", source="hand", hidden=1024, layers=2, heads=8, kv_heads=8, head_dim=128,
                             intermediate=4096, vocab=1000, weight_bytes=1.0)


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("text", "problem"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "one JSON object"),
    (json.dumps({k: v for k, v in LLAMA_3_70B.items() if k != "hidden_size"}), "missing field 'hidden_size'"),
    (json.dumps({**LLAMA_3_70B, "num_hidden_layers": "80"}), "num_hidden_layers: expected a non-negative integer"),
    (json.dumps({**LLAMA_3_70B, "num_key_value_heads": 7}), "not a multiple of kv_heads"),
    (json.dumps({**LLAMA_3_70B, "torch_dtype": "int3"}), "torch_dtype: expected one of"),
    (json.dumps({k: v for k, v in LLAMA_3_70B.items() if k != "intermediate_size"}), "intermediate_size"),
    (json.dumps({**QWEN3_235B, "num_experts_per_tok": 200}), "num_experts_per_tok: expected 1..128"),
    (json.dumps({**QWEN3_235B, "mlp_only_layers": "3"}), "mlp_only_layers"),
    (json.dumps({**DEEPSEEK_V3, "qk_rope_head_dim": None}), "missing field 'qk_rope_head_dim'"),
    (json.dumps({**DEEPSEEK_V3, "quantization_config": {"quant_method": "magic"}}), "unsupported quant_method"),
    (json.dumps({**KIMI_K25, "text_config": {**KIMI_TEXT, "vocab_size": None}}),
     "text_config: missing field 'vocab_size'"),
])
def test_bad_config_names_the_file_and_field(written: Callable[..., Path], text: str, problem: str) -> None:
    path = written(text, "config.json")
    with pytest.raises(InputError) as info:
        load_model_arch(path)
    assert info.value.source.startswith(str(path))
    assert problem in str(info.value)


def test_missing_file_and_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="No such file"):
        load_model_arch(tmp_path / "absent.json")
    with pytest.raises(InputError, match="presets: deepseek-v3, kimi-k2.5, llama-3-70b, qwen3-235b-a22b"):
        load_model_arch("llama-4-maverick")


@pytest.mark.parametrize(("text", "problem"), [
    ("hidden = ", "not TOML"),
    ("hiden = 1", "unknown field 'hiden'"),
    ('hidden = "big"', "hidden: expected int"),
    ("hidden = true", "hidden: expected int"),
    ("hidden = 1024", "missing field 'layers'"),
])
def test_bad_preset_file(written: Callable[..., Path], text: str, problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        load_model_arch(written(text))


QWEN15_MOE_A27B: dict[str, Any] = {  # Qwen/Qwen1.5-MoE-A2.7B config.json (the fields the planner reads)
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 16, "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "decoder_sparse_step": 1, "mlp_only_layers": [],
}


def test_a_qwen2_moe_shared_expert_is_counted_at_its_own_width() -> None:
    """Qwen2-MoE gives its shared expert a width of its own (shared_expert_intermediate_size, no n_shared_experts):
    each MoE layer holds a 5632-wide gated MLP besides the 60 routed experts of 1408. Expected by hand: 3 matrices
    of hidden × width."""
    from servescope.plan.layouts import Layout
    from servescope.plan.weights import rank_weights

    arch = arch_from_hf_config(QWEN15_MOE_A27B, name="qwen1.5-moe-a2.7b", source="config.json")
    assert arch.shared_experts * arch.moe_intermediate == 5632
    weights = rank_weights(arch, Layout(kind="tp", tp=1))
    assert weights.shared_params == 3 * 2048 * 5632


# --------------------------------------------------------------------------- a Hugging Face id in the hub cache

EXAMPLE_PROVENANCE = (Path(__file__).resolve().parents[2] / "src" / "servescope" / "data" / "examples"
                      / "h200-vllm-moe-b16" / "provenance.json")


def _snapshot(cache: Path, repo_id: str, commit: str, config: dict[str, Any]) -> Path:
    """One revision laid out as the Hub documents its cache (huggingface.co/docs/hub/local-cache)."""
    folder = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder / "config.json"


def test_a_hugging_face_id_reads_the_config_the_hub_cache_holds(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The revision refs/main names wins over another snapshot; HF_HUB_CACHE before HF_HOME/hub; the CLI takes the
    id as --model. The config: the bundled example's real Qwen3-MoE shape (12 of its 48 layers)."""
    shape = json.loads(EXAMPLE_PROVENANCE.read_text(encoding="utf-8"))["model_shape"]
    repo = "Qwen/Qwen3-30B-A3B"
    cache = tmp_path / "home" / "hub"
    main = _snapshot(cache, repo, "c0ffee", shape)
    _snapshot(cache, repo, "older", {**shape, "num_hidden_layers": 48})
    (cache / "models--Qwen--Qwen3-30B-A3B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-30B-A3B" / "refs" / "main").write_text("c0ffee\n", encoding="utf-8")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    arch = load_model_arch(repo)
    assert arch.layers == shape["num_hidden_layers"] == 12 and arch.experts == 128 and arch.hidden == 2048
    assert arch.name == repo
    # without refs/main two snapshots leave it open: one line naming the cache, no guess
    (cache / "models--Qwen--Qwen3-30B-A3B" / "refs" / "main").unlink()
    with pytest.raises(InputError) as err:
        load_model_arch(repo)
    assert str(cache) in err.value.problem
    # HF_HUB_CACHE is the cache itself, ahead of HF_HOME
    other = tmp_path / "elsewhere"
    _snapshot(other, repo, "only", {**shape, "num_hidden_layers": 24})
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    assert load_model_arch(repo).layers == 24
    assert main.is_file()

    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "servescope", "plan", "--model", repo, "--hardware", "h200",
                             "--gpus", "1", "--batch", "1", "--json"], capture_output=True, text=True, check=False,
                            env={**os.environ, "HF_HUB_CACHE": str(other)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["layers"] == 24
