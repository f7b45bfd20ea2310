"""Is an OpenAI-compatible server ready? Three checks, and a wait that tells *loading* from *dead*.

Ready means all of:

1. ``GET /health`` answers 200 (``curl -s -o /dev/null -w '%{http_code}' URL/health``);
2. ``GET /v1/models`` lists a model (its ``id`` and, on vLLM, ``max_model_len``);
3. a 1-token ``POST /v1/completions`` (``max_tokens: 1``) succeeds.

While vLLM loads a model, its port refuses connections: it binds the port at start but listens only once
the engine is up (``vllm/entrypoints/launchers/launcher.py``, vLLM 0.32). A refused connection alone
cannot tell *still loading* from *dead*; the process can, and so can GPU memory, which grows while the
weights load. A wait (:func:`check_health` of a :class:`HealthRequest` with ``wait``) therefore looks at all
three: refused + process alive = ``loading``; refused + process gone (or a zombie, or the unit failed) =
``crashed``, returned at once with the last lines of the log; ``/health`` 503 = ``engine dead``. Without a
process to watch, refused + GPU memory rising over the last minute = ``loading`` too (the memory probe is
passed in by the caller, :attr:`HealthRequest.gpu_memory`); each not-ready check names the memory in use and
how it moved.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from servescope import __version__
from servescope.core.aio import run_loop
from servescope.core.errors import InputError
from servescope.core.health import Check, HealthResult, ProcessInfo
from servescope.server.client import ApiKey, ServerClient, normalize_base_url
from servescope.server.errors import ServerFailed, ServerTimeout, ServerUnreachable
from servescope.server.process import (
    process_start_ticks,
    read_log_tail,
    read_process,
    read_unit,
    read_unit_log_tail,
)

if TYPE_CHECKING:
    from servescope.deploy.lifecycle import RestartResult

__all__ = ["CHECK_TIMEOUT_S", "WAIT_TIMEOUT_S", "GpuMemoryProbe", "HealthRequest", "ProgressCallback", "check_health",
           "restart_until_ready"]

ProgressCallback = Callable[[float, str, "str | None"], None]
"""Called after each poll with (elapsed_s, phase, newest log line or None)."""
GpuMemoryProbe = Callable[[], "int | None"]
"""GPU memory in use now, MiB, summed over the GPUs the server uses; None when it cannot be read."""
_MEMORY_WINDOW_S = 60.0
_MEMORY_RISE_MIB = 64  # less than this over the window is noise, not a model loading

CHECK_TIMEOUT_S = 10.0
"""Default seconds per request for a single check."""
WAIT_TIMEOUT_S = 1800.0
"""Default seconds to wait in all: a 1T-parameter model takes ~30 minutes to load."""
_PROMPT = "Hello"
_LOG_LINES = 20
_MIN_REQUEST_TIMEOUT_S = 1.0


@dataclass(frozen=True, kw_only=True)
class HealthRequest:
    """What ``servescope health`` asks of a server.

    Attributes:
        url: ``http(s)://HOST:PORT`` of an OpenAI-compatible server (vLLM, SGLang); a trailing ``/v1`` is fine.
        wait: poll until ready (or dead, or out of time); else one round of the three checks.
        timeout_s: with ``wait``, seconds to wait in all (0 polls once; default :data:`WAIT_TIMEOUT_S`); else
            seconds each request may take (default :data:`CHECK_TIMEOUT_S`).
        poll_s: seconds between polls.
        api_key: sent as a bearer token; see :func:`~servescope.server.client.resolve_api_key`.
        pid, unit: the server's process id (read from ``/proc/PID/stat``, a zombie counts as gone) or systemd
            unit (``systemctl show -p MainPID,ActiveState,SubState NAME``); with one, a refused connection is a
            ``loading`` or ``crashed`` result; without, an ``unreachable`` one.
        log_path: the server's log, whose last lines go into a not-ready result.
        request_timeout_s: while waiting, the longest any one request may take (never past the deadline, but
            >= 1 s).
        gpu_memory: returns the GPU memory in use (MiB) or None, sampled every poll: rising memory marks a
            refused port as ``loading`` even without ``pid``/``unit``.
    """

    url: str
    wait: bool = False
    timeout_s: float | None = None
    poll_s: float = 1.0
    api_key: ApiKey | str | None = field(default=None, repr=False)
    pid: int | None = None
    unit: str | None = None
    log_path: Path | str | None = None
    request_timeout_s: float = 30.0
    gpu_memory: GpuMemoryProbe | None = None


@dataclass
class _Watch:
    """What to watch beside the port: a pid (with its start time, against pid reuse), a unit, a log."""

    pid: int | None = None
    unit: str | None = None
    log_path: Path | None = None
    start_ticks: int | None = None
    secrets: tuple[str | None, ...] = ()
    last: ProcessInfo | None = field(default=None)
    gpu_memory: GpuMemoryProbe | None = None
    memory: deque[tuple[float, int]] = field(default_factory=deque)

    def sample_memory(self, now: float) -> None:
        """Read the GPU memory probe (when given) and keep the last minute of readings."""
        used = self.gpu_memory() if self.gpu_memory is not None else None
        if used is None:
            return
        self.memory.append((now, used))
        while self.memory and now - self.memory[0][0] > _MEMORY_WINDOW_S:
            self.memory.popleft()

    @property
    def memory_rising(self) -> bool:
        return len(self.memory) >= 2 and self.memory[-1][1] - self.memory[0][1] >= _MEMORY_RISE_MIB

    def memory_note(self) -> str | None:
        """``GPU memory 45312 MiB, +1280 MiB in the last 10 s`` (the window: up to a minute) or None."""
        if not self.memory:
            return None
        (t0, first), (t1, used) = self.memory[0], self.memory[-1]
        if len(self.memory) < 2:
            return f"GPU memory {used} MiB"
        return f"GPU memory {used} MiB, {used - first:+d} MiB in the last {t1 - t0:.0f} s"

    @property
    def knows_process(self) -> bool:
        return self.pid is not None or self.unit is not None

    def process(self) -> ProcessInfo | None:
        if self.unit is not None:
            self.last = read_unit(self.unit)
        elif self.pid is not None:
            self.last = read_process(self.pid, start_ticks=self.start_ticks)
        return self.last

    def log_tail(self, lines: int = _LOG_LINES) -> list[str]:
        if self.log_path is not None:
            return read_log_tail(self.log_path, lines=lines, secrets=self.secrets)
        if self.unit is not None:
            return read_unit_log_tail(self.unit, lines=lines, secrets=self.secrets)
        return []

    def newest_log_line(self) -> str | None:
        tail = self.log_tail(1)
        return tail[-1] if tail else None


@dataclass
class _Poll:
    phase: str
    checks: list[Check]
    model: str | None = None
    max_model_len: int | None = None
    final: bool = False  # waiting longer cannot help (crashed, engine dead)


def _as_key(api_key: ApiKey | str | None) -> ApiKey | None:
    if isinstance(api_key, str):
        return ApiKey(api_key, "--api-key") if api_key else None
    return api_key


def _skipped(*names: str, why: str) -> list[Check]:
    return [Check(name=name, ok=False, detail=f"not run: {why}") for name in names]


async def _probe(client: ServerClient, request_timeout_s: float) -> _Poll:
    """One round of the three checks. Raises ServerUnreachable / ServerTimeout when nothing answers."""
    status = await client.get_status("/health")
    if status == 503:
        return _Poll("engine dead", [Check(name="health", ok=False, detail="HTTP 503: the engine is dead "
                                           "(vLLM answers 503 once its engine core has failed)"),
                                     *_skipped("models", "completion", why="/health answered 503")], final=True)
    checks = [Check(name="health", ok=status == 200,
                    detail="HTTP 200" if status == 200 else f"HTTP {status} (want 200)")]
    try:
        listing = await client.get_json("/v1/models")
    except (ServerFailed, ServerTimeout) as exc:
        return _Poll("not ready", [*checks, Check(name="models", ok=False, detail=exc.problem),
                                   *_skipped("completion", why="no model listed")])
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        return _Poll("not ready", [*checks, Check(name="models", ok=False, detail="/v1/models lists no model"),
                                   *_skipped("completion", why="no model listed")])
    model_id = str(models[0]["id"])
    raw_len = models[0].get("max_model_len")
    max_len = raw_len if isinstance(raw_len, int) and not isinstance(raw_len, bool) else None
    others = f" (+{len(models) - 1} more)" if len(models) > 1 else ""
    checks.append(Check(name="models", ok=True, detail=f"{model_id}{others}, max_model_len "
                                                       f"{max_len if max_len is not None else 'N/A'}"))
    body = {"model": model_id, "prompt": _PROMPT, "max_tokens": 1, "temperature": 0.0}
    started = time.monotonic()
    try:
        answer = await client.post_json("/v1/completions", body, read_timeout_s=request_timeout_s)
    except (ServerFailed, ServerTimeout) as exc:
        checks.append(Check(name="completion", ok=False, detail=exc.problem))
        return _Poll("not ready", checks, model_id, max_len)
    took_s = time.monotonic() - started
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices:
        checks.append(Check(name="completion", ok=False, detail="the answer has no choices"))
        return _Poll("not ready", checks, model_id, max_len)
    usage = answer.get("usage") if isinstance(answer, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    checks.append(Check(name="completion", ok=True,
                        detail=f"{tokens if tokens is not None else 'N/A'} token in {took_s:.2f} s"))
    ready = all(c.ok for c in checks)
    return _Poll("ready" if ready else "not ready", checks, model_id, max_len)


def _unanswered(exc: ServerUnreachable | ServerTimeout, watch: _Watch) -> _Poll:
    """A poll where nothing answered: the process says loading, crashed, or (without one) unreachable."""
    why = exc.problem
    proc = watch.process()
    memory = watch.memory_note()
    if proc is None and watch.memory_rising:
        phase, final = "loading", False
        detail = f"{why}; {memory} (rising: a model is loading; give --pid or --unit to tell a crash at once)"
    elif proc is None:
        phase, final = "unreachable", False
        detail = f"{why} (give --pid or --unit to tell loading from dead)"
    elif proc.alive:
        phase, final = "loading", False
        detail = f"{why}; {proc.detail}"
    else:
        phase, final = "crashed", True
        detail = f"{why}; {proc.detail}"
    if memory is not None and proc is not None:
        detail = f"{detail}; {memory}"
    return _Poll(phase, [Check(name="health", ok=False, detail=detail),
                         *_skipped("models", "completion", why="/health did not answer")], final=final)


def _result(url: str, poll: _Poll, watch: _Watch, *, elapsed_s: float, waited: bool, timed_out: bool,
            api_key: ApiKey | None) -> HealthResult:
    ready = poll.phase == "ready"
    return HealthResult(
        servescope_version=__version__,
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        url=url, ready=ready, phase=poll.phase, model=poll.model, max_model_len=poll.max_model_len,
        elapsed_s=round(elapsed_s, 3), waited=waited, timed_out=timed_out and not ready, checks=poll.checks,
        process=watch.last, log_path=str(watch.log_path) if watch.log_path is not None else None,
        log_tail=[] if ready else watch.log_tail(),
        api_key_source=api_key.source if api_key is not None else None,
    )


def _make_watch(request: HealthRequest, api_key: ApiKey | None) -> _Watch:
    pid, unit, log_path = request.pid, request.unit, request.log_path
    if pid is not None and unit is not None:
        raise InputError("--pid/--unit", "give one of --pid and --unit, not both")
    if pid is not None and pid <= 0:
        raise InputError("--pid", f"not a process id: {pid}")
    if unit is not None:
        read_unit(unit)  # fail now, not at the first refused connection, when systemd cannot answer
    return _Watch(pid=pid, unit=unit, log_path=Path(log_path) if log_path is not None else None,
                  start_ticks=process_start_ticks(pid) if pid is not None else None,
                  secrets=(api_key.reveal() if api_key is not None else None,), gpu_memory=request.gpu_memory)


async def _check_once(request: HealthRequest) -> HealthResult:
    """One round of the three checks, no waiting."""
    timeout_s = CHECK_TIMEOUT_S if request.timeout_s is None else request.timeout_s
    if not timeout_s > 0:
        raise InputError("--timeout", f"a single check needs a timeout > 0 s (got {timeout_s:g})")
    key = _as_key(request.api_key)
    base = normalize_base_url(request.url)
    watch = _make_watch(request, key)
    started = time.monotonic()
    async with ServerClient(base, api_key=key, connect_timeout_s=min(timeout_s, 5.0),
                            read_timeout_s=timeout_s) as client:
        try:
            poll = await _probe(client, timeout_s)
            watch.process()
        except (ServerUnreachable, ServerTimeout) as exc:  # a finding (not ready), not bad input
            poll = _unanswered(exc, watch)
    return _result(base, poll, watch, elapsed_s=time.monotonic() - started, waited=False, timed_out=False,
                   api_key=key)


async def _wait_until_ready(request: HealthRequest, progress: ProgressCallback | None, clock: Callable[[], float],
                            sleep: Callable[[float], Awaitable[None]]) -> HealthResult:
    """Poll until ready, dead or out of time (see :func:`check_health`)."""
    timeout_s = WAIT_TIMEOUT_S if request.timeout_s is None else request.timeout_s
    if timeout_s < 0 or request.poll_s <= 0:
        raise InputError("--timeout", "timeout must be >= 0 and poll interval > 0 "
                                      f"(got {timeout_s}, {request.poll_s})")
    key = _as_key(request.api_key)
    base = normalize_base_url(request.url)
    watch = _make_watch(request, key)
    start = clock()
    deadline = start + timeout_s
    async with ServerClient(base, api_key=key, connect_timeout_s=min(request.request_timeout_s, 5.0),
                            read_timeout_s=request.request_timeout_s) as client:
        while True:
            left_s = deadline - clock()
            watch.sample_memory(clock())
            try:
                poll = await _probe(client, max(_MIN_REQUEST_TIMEOUT_S, min(request.request_timeout_s, left_s)))
                watch.process()
            except ServerUnreachable as exc:
                if not exc.refused:
                    raise  # an unknown host or a network error does not heal by waiting
                poll = _unanswered(exc, watch)
            except ServerTimeout as exc:
                poll = _unanswered(exc, watch)
            elapsed_s = clock() - start
            if progress is not None:
                notes = [n for n in (watch.memory_note(), watch.newest_log_line()) if n]
                progress(elapsed_s, poll.phase, "  ".join(notes) or None)
            timed_out = clock() >= deadline
            if poll.phase == "ready" or poll.final or timed_out:
                return _result(base, poll, watch, elapsed_s=elapsed_s, waited=True, timed_out=timed_out,
                               api_key=key)
            await sleep(max(0.0, min(request.poll_s, deadline - clock())))


def check_health(request: HealthRequest, *, progress: ProgressCallback | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> HealthResult:
    """Readiness of the server at ``request.url``: one round of the three checks, or with ``request.wait`` a poll
    until it is ready, it is dead, or ``request.timeout_s`` seconds have passed.

    A wait returns at once, not ready, when the process (``pid``) or unit is gone while the port refuses
    connections (``crashed``) or when ``/health`` answers 503 (``engine dead``). Without ``pid`` or ``unit`` a
    refused port reads ``unreachable`` and is polled until the timeout, since it cannot be told from a loading
    one. Not-ready results carry the last 20 lines of ``log_path`` (or the unit's journal), with secrets
    redacted.

    Args:
        progress: called after each poll of a wait with (elapsed_s, phase, GPU memory and newest log line, or
            None).
        clock, sleep: a monotonic clock and an async sleep for a wait (tests may inject their own).

    Raises:
        InputError: a malformed URL, a bad timeout or poll interval, ``pid`` and ``unit`` together, or ``unit``
            given where systemd cannot answer.
        ServerUnreachable: while waiting, the host cannot be resolved or another non-refusal network error.
        AuthRequired, EndpointNotFound, NotOpenAICompatible: the server cannot be checked as it is.

    Example:
        >>> result = check_health(HealthRequest(url="http://127.0.0.1:8000"))  # doctest: +SKIP
        >>> result.ready, result.model, result.max_model_len  # doctest: +SKIP
        (True, 'tiny-llama', 256)
        >>> r = check_health(HealthRequest(url="http://127.0.0.1:8000", wait=True, timeout_s=1800, pid=4242,
        ...                                log_path="/var/log/vllm.log"))  # doctest: +SKIP
        >>> r.phase  # doctest: +SKIP
        'ready'
    """
    if request.wait:
        return run_loop(_wait_until_ready(request, progress, clock, sleep))
    return run_loop(_check_once(request))


def restart_until_ready(name: str, *, url: str, max_used_mib: int, gpu_timeout_s: float,
                        ready_timeout_s: float) -> RestartResult:
    """``service restart``: :func:`~servescope.deploy.lifecycle.restart_service` (stop, wait for GPU memory below
    ``max_used_mib``, start), then the wait of ``health --wait`` on ``url`` and the unit, up to ``ready_timeout_s``.

    The wait is passed in here because deploy/ never imports server/ (server/ reads deploy/'s units).

    Raises:
        SystemctlError: systemctl failed. GpuUnavailable, GpuQueryError: GPU memory cannot be read.
    """
    from servescope.deploy.lifecycle import restart_service, unit_name

    def ready() -> tuple[bool, str]:
        health = check_health(HealthRequest(url=url, wait=True, timeout_s=ready_timeout_s, poll_s=2.0,
                                            unit=unit_name(name)))
        return health.ready, f"ready: {health.ready}"

    return restart_service(name, max_used_mib=max_used_mib, gpu_timeout_s=gpu_timeout_s, wait_ready=ready)
