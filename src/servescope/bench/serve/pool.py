"""One ``bench serve`` point spread over several worker processes, so the client is not the bottleneck.

One Python event loop parsing SSE falls behind well before a server does: on an H200 (issue 14) one client
process lagged 29-72 ms (p99) at 128-256 streams and overstated TPOT by 5-26%; eight processes lagged
1-2 ms. So by default a point's streams are shared out, one process per :data:`STREAMS_PER_WORKER`
streams, at most one per CPU but one (left to this process, which scrapes ``/metrics``), at least one
(which then runs in this process): ``concurrency`` streams (or the Poisson ``rate``: a sum of independent
Poisson processes is one at the summed rate) and the request count are split over ``workers`` processes,
each with its own event loop, HTTP client and lag timer. Workers are started first and all begin at one
signal, so their start-up is not part of the point.

One clock: samples come back whole, stamped with ``time.perf_counter()``, which is the machine's
``CLOCK_MONOTONIC`` in every process (not a per-process counter). Each worker sends its clock with its
"ready" and the parent checks it lies between its own stamps from before the spawn and after the message;
a worker whose clock is not the parent's fails the point. The parent then summarises all samples as one
point: percentiles over every request and every lag tick, never averages of per-worker figures.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from servescope.bench.serve.streams import PointJob, PointRun, run_point_here
from servescope.core.aio import run_loop
from servescope.core.errors import InputError

__all__ = ["STREAMS_PER_WORKER", "auto_workers", "run_point_in_workers", "split_job"]

#: Streams one event loop is given before another process is added (``--workers 0``, the default). One
#: process held 8 streams within 0.5% of the engine's TPOT on the H200, 32 already +1.5..1.8%.
STREAMS_PER_WORKER = 16
_START_TIMEOUT_S = 60.0
_POLL_S = 0.2


def auto_workers(streams: int, cpus: int) -> int:
    """Worker processes for ``streams`` concurrent streams: one per :data:`STREAMS_PER_WORKER`, at most
    ``cpus - 1`` (one CPU is left to the parent, which scrapes the server), at least 1."""
    return max(1, min(cpus - 1, math.ceil(streams / STREAMS_PER_WORKER)))


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
        out.put(("ready", index, time.perf_counter()))
        if not go.wait(_START_TIMEOUT_S):
            return
        run = run_loop(run_point_here(job, tick=lambda: out.put(("tick", index, None))))
        out.put(("done", index, run))
    except BaseException as exc:  # noqa: BLE001  (anything a worker hits goes back as one line)
        out.put(("failed", index, f"{type(exc).__name__}: {exc}"))


def _check_clock(index: int, theirs: float, before: float, after: float) -> None:
    """A worker's ``perf_counter`` read between our own two reads: it is our clock (not merely a counter of its
    own, which would start near 0 in a fresh process)."""
    if not before <= theirs <= after:
        raise InputError("bench serve worker", f"worker {index}'s clock ({theirs:.6f} s) is not this process's "
                         f"({before:.6f}..{after:.6f} s): its timestamps cannot be merged")


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
        spawned = time.perf_counter()
        for proc in procs:
            proc.start()
        ready = 0
        while ready < len(procs):
            kind, index, payload = _receive(out, procs, _START_TIMEOUT_S)
            if kind == "failed":
                raise InputError("bench serve worker", str(payload))
            if kind == "ready":
                _check_clock(index, float(payload), spawned, time.perf_counter())
                ready += 1
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
