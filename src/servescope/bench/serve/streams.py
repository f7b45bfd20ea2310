"""The requests of one ``bench serve`` point, run in this process: streams, arrivals, event-loop lag.

A :class:`Point` sends streamed completions and keeps one :class:`Sample` per request. Two ways to drive
it: :func:`closed_loop` (``concurrency`` streams, each sending its next request when the last one ends)
and :func:`poisson` (arrivals at ``rate`` requests/s, optionally capped at ``max_concurrency`` in flight).
:func:`run_point_here` runs either beside a 1 ms lag timer; :mod:`.pool` runs it in several processes.

Sample times are ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux), so samples taken by worker processes
on the same machine share one time line with the parent's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servescope.server.client import ApiKey, ServerClient
from servescope.server.errors import ServerError
from servescope.server.prompts import PromptIds, SameLengthWords, fresh_text

__all__ = ["PointJob", "PointRun", "Sample", "closed_loop", "lag_ticker", "poisson", "run_point_here"]

LAG_TICK_S = 0.001


@dataclass
class Sample:
    """One request as the client saw it: offsets in seconds from its send, absolute perf_counter stamps."""

    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    sent_at: float = 0.0
    done_at: float = 0.0

    def tpot_ms(self) -> float | None:
        """``(E2E - TTFT) / (output tokens - 1)`` in ms; ``None`` for a request without two tokens."""
        if self.e2e_s is None or self.ttft_s is None or self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) * 1e3 / (self.output_tokens - 1)

    def gaps_ms(self) -> list[float]:
        """The gaps between successive text chunks (ms)."""
        return [(b - a) * 1e3 for a, b in zip(self.chunk_s, self.chunk_s[1:], strict=False)]


class Point:
    """The shared state of one running point: the client, the body, the server-down flag, the samples."""

    def __init__(self, client: ServerClient, body: dict[str, Any], prompts: list[str], *,
                 first_prompt: int = 0, ids: PromptIds | None = None, words: SameLengthWords | None = None,
                 seed: int = 0, run: int = 0) -> None:
        self.client = client
        self.body = body
        self.prompts = prompts
        self.ids = ids
        self.words = words
        self._rng = random.Random(f"{run}/{seed}")  # the run's own draws: no run repeats an earlier one's prompts
        self.samples: list[Sample] = []
        self.down: str | None = None
        self._probe = asyncio.Lock()
        self.next_prompt = first_prompt

    def prompt(self) -> str | list[int]:
        """The next request's prompt, of its own (no prefix shared with any request of this run or an earlier
        one): the server's token ids of the next pool prompt, or its text (``--prompts text``, or a server that gave
        no ids), with the first tokens (words) drawn from this run's own draws."""
        index = self.next_prompt
        self.next_prompt += 1
        if self.ids is not None:
            return self.ids.fresh(index, self._rng)
        text = self.prompts[index % len(self.prompts)]
        return self.words.fresh(text, self._rng) if self.words is not None else fresh_text(text, self._rng)

    async def one(self) -> Sample:
        sample = Sample(sent_at=time.perf_counter())
        body = {**self.body, "prompt": self.prompt()}
        try:
            async for chunk in self.client.stream_completion(body):
                now = time.perf_counter() - sample.sent_at
                if chunk.get("choices"):
                    if sample.ttft_s is None:
                        sample.ttft_s = now
                    sample.chunk_s.append(now)
                usage = chunk.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    sample.output_tokens = int(usage["completion_tokens"])
                    sample.prompt_tokens = usage.get("prompt_tokens")
            sample.e2e_s = time.perf_counter() - sample.sent_at
        except ServerError as exc:
            sample.error = exc.problem
            await self._check_alive()
        sample.done_at = time.perf_counter()
        self.samples.append(sample)
        return sample

    async def _check_alive(self) -> None:
        """After a failed request: is the server still there? If not, stop the point."""
        async with self._probe:
            if self.down is not None:
                return
            try:
                status = await self.client.get_status("/health")
            except ServerError as exc:
                self.down = f"{self.client.url_of('/health')}: {exc.problem}"
                return
            if status == 503:
                self.down = f"{self.client.url_of('/health')}: HTTP 503 (engine dead)"


async def closed_loop(point: Point, concurrency: int, requests: int, deadline: float | None,
                      tick: Callable[[], None]) -> None:
    """``concurrency`` streams until ``requests`` were sent, the deadline passed or the server died."""
    launched = 0

    async def worker() -> None:
        nonlocal launched
        while launched < requests and point.down is None and (deadline is None or time.perf_counter() < deadline):
            launched += 1
            await point.one()
            tick()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def poisson(point: Point, rate: float, requests: int, deadline: float | None, max_concurrency: int | None,
                  rng: random.Random, tick: Callable[[], None]) -> None:
    """Poisson arrivals at ``rate`` requests/s (exponential gaps drawn from ``rng``)."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    tasks: list[asyncio.Task[None]] = []

    async def fire() -> None:
        if gate is None:
            await point.one()
        else:
            async with gate:
                await point.one()
        tick()

    next_at = time.perf_counter()
    for _ in range(requests):
        if point.down is not None or (deadline is not None and next_at >= deadline):
            break
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(fire()))
        next_at += rng.expovariate(rate)
    await asyncio.gather(*tasks)


async def lag_ticker(lags: list[float], stop: asyncio.Event) -> None:
    """Append how late (ms) a 1 ms timer fires, until ``stop`` is set."""
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        lags.append(max(0.0, time.perf_counter() - before - LAG_TICK_S) * 1e3)


@dataclass(frozen=True)
class PointJob:
    """One process's share of a point; picklable, so a worker process can be given one.

    Exactly one of ``concurrency`` / ``rate``. ``duration_s`` counts from when the job starts.
    """

    url: str
    api_key: ApiKey | None
    timeout_s: float
    body: dict[str, Any]
    prompts: list[str]
    first_prompt: int
    concurrency: int | None
    rate: float | None
    requests: int
    duration_s: float | None
    max_concurrency: int | None
    seed: int
    ids: PromptIds | None = None
    words: SameLengthWords | None = None
    run: int = 0  # drawn once per session: the first tokens of its prompts differ from any earlier run's


@dataclass
class PointRun:
    """What one process measured: its samples, its event-loop lags (ms), and why it stopped early."""

    samples: list[Sample]
    lags_ms: list[float]
    down: str | None


async def run_point_here(job: PointJob, *, client: ServerClient | None = None,
                         tick: Callable[[], None] = lambda: None) -> PointRun:
    """Run ``job`` on this event loop (with ``client``, else a new one of its own), beside a lag timer."""
    if client is None:
        streams = max(job.concurrency or 0, job.max_concurrency or 0, 64 if job.rate else 0)
        async with ServerClient(job.url, api_key=job.api_key, read_timeout_s=job.timeout_s,
                                max_connections=streams + 8) as own:
            return await run_point_here(job, client=own, tick=tick)
    point = Point(client, job.body, job.prompts, first_prompt=job.first_prompt, ids=job.ids, words=job.words,
                  seed=job.seed, run=job.run)
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(lag_ticker(lags, stop))
    deadline = time.perf_counter() + job.duration_s if job.duration_s is not None else None
    try:
        if job.concurrency is not None:
            await closed_loop(point, job.concurrency, job.requests, deadline, tick)
        else:
            assert job.rate is not None
            await poisson(point, job.rate, job.requests, deadline, job.max_concurrency, random.Random(job.seed),
                          tick)
    finally:
        stop.set()
        await ticker
    return PointRun(samples=point.samples, lags_ms=lags, down=point.down)
