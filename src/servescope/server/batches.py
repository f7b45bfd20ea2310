"""Batches sent to a live server for `servescope profile`: each request streamed with its usage, and batches timed
by the server's own ``/metrics`` histograms (before the profiled window, at other batches, and after it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from servescope.server.client import ServerClient
from servescope.server.metrics import scrape_metrics
from servescope.server.timing import ServerTiming, server_timing

__all__ = ["PromptSupply", "send", "timed_batch", "timed_runs"]


@dataclass
class PromptSupply:
    """Distinct prompts handed out in order, each once: no batch is served from a prefix cache another filled."""

    prompts: list[str]
    taken: int = 0

    def take(self, count: int) -> list[str]:
        """The next ``count`` prompts (fewer only where the supply was sized short)."""
        out = self.prompts[self.taken:self.taken + count]
        self.taken += count
        return out


async def send(client: ServerClient, body: dict[str, Any]) -> dict[str, int]:
    """Stream one completion; the usage the server reported at its end."""
    usage: dict[str, int] = {}
    async for chunk in client.stream_completion(body):
        if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
            usage = {k: int(v) for k, v in chunk["usage"].items() if isinstance(v, int)}
    return usage


async def timed_batch(client: ServerClient, body: dict[str, Any],
                      prompts: list[str]) -> tuple[list[dict[str, int]], ServerTiming | None, float]:
    """Run one batch (one request per prompt, all at once) with ``/metrics`` scraped before and after: each
    request's usage, the server's own means over it, and its wall time."""
    before = await scrape_metrics(client)
    started = time.monotonic()
    usage = await asyncio.gather(*(send(client, {**body, "prompt": p}) for p in prompts))
    seconds = time.monotonic() - started
    return list(usage), server_timing(before, await scrape_metrics(client), seconds), seconds


async def timed_runs(client: ServerClient, body: dict[str, Any], supply: PromptSupply, *, batch: int,
                     runs: int) -> list[ServerTiming]:
    """``runs`` batches of ``batch`` fresh prompts one after another, each timed by the server (runs it kept no
    histogram for are left out)."""
    timings = []
    for _ in range(runs):
        _, timing, _ = await timed_batch(client, body, supply.take(batch))
        if timing is not None:
            timings.append(timing)
    return timings
