"""One ``bench serve`` point spread over several worker processes, so the client is not the bottleneck.

One Python event loop parses SSE for a few hundred streams before it starts to lag (its lag timer says
so); past that, the point is split: ``concurrency`` streams (or the Poisson ``rate``: a sum of independent
Poisson processes is one at the summed rate) and the request count are shared out over ``workers``
processes, each with its own event loop and HTTP client. Workers are started and connected first and all
begin at one signal, so their start-up is not part of the point. Samples come back whole; their
``perf_counter`` stamps share the machine's monotonic clock, so the parent summarises them as one point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import multiprocessing as mp
import queue
from collections.abc import Callable
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from servescope.core.errors import InputError
from servescope.server.streams import PointJob, PointRun, run_point_here

__all__ = ["STREAMS_PER_WORKER", "auto_workers", "run_point_in_workers", "split_job"]

#: Streams one event loop is given before another process is added (``--workers 0``, the default).
STREAMS_PER_WORKER = 256
_START_TIMEOUT_S = 60.0
_POLL_S = 0.2


def auto_workers(streams: int, cpus: int) -> int:
    """Worker processes for ``streams`` concurrent streams: one per 256, at most one per CPU."""
    return max(1, min(cpus, math.ceil(streams / STREAMS_PER_WORKER)))


def _share(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def split_job(job: PointJob, workers: int) -> list[PointJob]:
    """``job`` cut into ``workers`` jobs whose streams, requests and rates add up to the whole."""
    jobs = []
    for i in range(workers):
        jobs.append(dataclasses.replace(
            job,
            concurrency=_share(job.concurrency, workers, i) if job.concurrency is not None else None,
            rate=job.rate / workers if job.rate is not None else None,
            max_concurrency=max(1, _share(job.max_concurrency, workers, i)) if job.max_concurrency else None,
            requests=_share(job.requests, workers, i),
            first_prompt=job.first_prompt + i * max(1, len(job.prompts) // workers),
            seed=job.seed * 1009 + i,
        ))
    return [j for j in jobs if j.requests > 0 and (j.concurrency is None or j.concurrency > 0)]


def _worker_main(index: int, job: PointJob, go: MpEvent, out: Any) -> None:
    """A worker process: say it is ready, wait for the start signal, run its job, send the run back."""
    try:
        out.put(("ready", index, None))
        if not go.wait(_START_TIMEOUT_S):
            return
        run = asyncio.run(run_point_here(job, tick=lambda: out.put(("tick", index, None))))
        out.put(("done", index, run))
    except BaseException as exc:  # noqa: BLE001  (anything a worker hits goes back as one line)
        out.put(("failed", index, f"{type(exc).__name__}: {exc}"))


def _merge(runs: list[PointRun]) -> PointRun:
    samples = [s for r in runs for s in r.samples]
    samples.sort(key=lambda s: s.sent_at)
    lags = [lag for r in runs for lag in r.lags_ms]
    down = next((r.down for r in runs if r.down is not None), None)
    return PointRun(samples=samples, lags_ms=lags, down=down)


def _receive(out: Any, procs: list[Any], timeout_s: float) -> tuple[str, int, Any]:
    """The next message from the workers; a worker that died without one is reported as failed."""
    waited = 0.0
    while True:
        try:
            message: tuple[str, int, Any] = out.get(timeout=_POLL_S)
            return message
        except queue.Empty:
            waited += _POLL_S
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                return ("failed", dead[0], f"worker process exited with code {procs[dead[0]].exitcode}")
            if waited >= timeout_s:
                return ("failed", -1, f"no word from the worker processes for {timeout_s:.0f} s")


def run_point_in_workers(job: PointJob, workers: int, *, tick: Callable[[], None] = lambda: None,
                         silence_timeout_s: float | None = None) -> PointRun:
    """Run ``job`` split over ``workers`` processes (blocking; call it from a thread in async code).

    Raises:
        InputError: a worker could not start or failed (its error in one line).
    """
    jobs = split_job(job, workers)
    ctx = mp.get_context("spawn")  # no fork: the parent holds an event loop and open sockets
    out = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_worker_main, args=(i, j, go, out), daemon=True) for i, j in enumerate(jobs)]
    silence = silence_timeout_s if silence_timeout_s is not None else max(job.timeout_s * 2, _START_TIMEOUT_S)
    runs: dict[int, PointRun] = {}
    try:
        for proc in procs:
            proc.start()
        ready = 0
        while ready < len(procs):
            kind, index, payload = _receive(out, procs, _START_TIMEOUT_S)
            if kind == "failed":
                raise InputError("bench serve worker", str(payload))
            ready += kind == "ready"
        go.set()
        while len(runs) < len(procs):
            kind, index, payload = _receive(out, procs, silence)
            if kind == "tick":
                tick()
            elif kind == "done":
                runs[index] = payload
            elif kind == "failed":
                raise InputError("bench serve worker", str(payload))
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        out.close()
    return _merge([runs[i] for i in sorted(runs)])
