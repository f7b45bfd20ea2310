"""``profile``: a live vLLM server's torch-profiler capture of B concurrent requests, as complete trace files.

``POST /start_profile``, exactly ``batch`` concurrent streamed completions of ``output_tokens`` tokens
(``ignore_eos``, each with its own prompt of ``input_tokens`` tokens by the server's tokenizer, as ``bench
serve`` makes them, so that no prefill is served from a prefix cache), ``POST /stop_profile``, then wait until
the trace files that appeared or changed since the start are complete.
vLLM 0.32 answers ``/stop_profile`` (an empty 200) before the files are written, so completeness is judged
here: every file's size unchanged over a short window and its gzip stream valid to the end, one file per
rank (``world_size`` from the rank traces' ``distributedInfo``) plus the front end (``*.async_llm.*``).

Shell twin::

    curl -X POST http://HOST:PORT/start_profile; ...requests...; curl -X POST http://HOST:PORT/stop_profile
"""

from __future__ import annotations

import asyncio
import gzip
import re
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from servescope.core.aio import run_loop
from servescope.core.engines import engines
from servescope.core.errors import InputError
from servescope.server.batches import PromptSupply, send, timed_batch, timed_runs
from servescope.server.client import ApiKey, ServerClient
from servescope.server.earlier import earlier_profile_note
from servescope.server.errors import EndpointNotFound, NotOpenAICompatible, ServerError
from servescope.server.process import is_local_url, local_server, serving_engine
from servescope.server.prompts import make_prompts, run_seed
from servescope.server.timing import ServerTiming, median_run, step_reference

if TYPE_CHECKING:
    from servescope.core.analysis import AnalysisDoc
    from servescope.core.settings import ProcessRecord
    from servescope.trace.rules.deployment import DeploymentInput

__all__ = [
    "ProfileCapture",
    "ProfileRequest",
    "ProfileResult",
    "capture_profile",
    "discover_trace_dir",
    "profile_server",
    "wait_for_traces",
]

TRACE_SUFFIX = ".pt.trace.json.gz"
FRONTEND_MARK = ".async_llm."
PROFILER_FLAGS = ("--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=DIR "
                  "(older vLLM: env VLLM_TORCH_PROFILER_DIR=DIR)")
_WORLD_RE = re.compile(rb'"world_size"\s*:\s*(\d+)')
_VERSION_PATH = "/version"  # its answer's engine: version_path in data/engines.toml


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """One profiling run against a server at ``url``."""

    url: str
    batch: int
    output_tokens: int
    input_tokens: int = 32
    trace_dir: Path | None = None
    api_key: ApiKey | None = None
    model: str | None = None
    trace_timeout_s: float = 120.0
    stable_s: float = 2.0
    request_timeout_s: float = 300.0
    warmup: bool = True  # one unprofiled batch first, so the profiled one runs in lockstep on a warm server
    # The same batch this many times more without the profiler, the server's own /metrics around each: how much
    # the profiler stretches the steps it records (vLLM's records python stacks by default). The median run is the
    # production step; the others show how much that step moves on its own (0: none).
    unprofiled_runs: int = 3
    # Other batches timed the same way (``unprofiled_runs`` runs each, after the capture's own batch): the server's
    # step across batches, which one capture cannot tell under async scheduling (the host's cycle moves with it).
    unprofiled_batches: tuple[int, ...] = ()
    # The same batch this many times once the window's traces are written: a server stays slower after its first
    # profile (on the lent H100, 0.16-0.36 ms a step), and these runs measure by how much.
    after_runs: int = 3
    # A local --trace-dir not there yet: vLLM creates its torch_profiler_dir on the first /start_profile, so
    # wait this long after it for the directory to appear.
    dir_timeout_s: float = 30.0


@dataclass(frozen=True, kw_only=True)
class ProfileCapture:
    """What a run produced: the new trace files (ranks then front end) and what the server reported."""

    url: str
    model: str
    trace_dir: Path
    trace_files: list[Path]
    batch: int
    output_tokens: int
    input_tokens: int
    prompt_source: str  # how the prompts were made (one per request): prompts.make_prompts' source
    usage: list[dict[str, int]] = field(default_factory=list)  # per request, as the server reported it
    requests_s: float = 0.0
    traces_wait_s: float = 0.0
    # The server's own token latencies (/metrics histograms) over the profiled batch and over the same batch
    # run without the profiler (None: not run, or the server exposes no such histogram): the median run, and
    # every run in order.
    profiled_server: ServerTiming | None = None
    unprofiled_server: ServerTiming | None = None
    unprofiled_runs: list[ServerTiming] = field(default_factory=list)
    unprofiled_by_batch: dict[int, list[ServerTiming]] = field(default_factory=dict)  # other batches: their runs
    after_runs: list[ServerTiming] = field(default_factory=list)  # the same batch after the window, in order
    profiled_before: str | None = None  # the server was profiled before this run (server.earlier), in a sentence
    process: ProcessRecord | None = None  # the process serving the port on this machine, read once (not recorded)
    server_version: str | None = None  # /version's answer (vLLM), when it gave one

    def record(self) -> dict[str, Any]:
        """The run's settings and what the server reported: the ``profile`` object of the JSON document.

        ``prompts``: "distinct", one prompt per request (documents written before it was recorded sent one
        prompt to every request). ``profiled_server`` / ``unprofiled_server``: the server's inter-token
        latency and TPOT means over the profiled batch and over the same batch without the profiler (the median
        of ``unprofiled_runs``, each run's own means in order). ``unprofiled_batches``: the same at each other
        batch timed (``--unprofiled-batches``), present only where some were. ``after_profile_server`` /
        ``after_profile_runs``: the same batch once the window's traces were written (``--after-runs``)."""
        out: dict[str, Any] = {
            "url": self.url, "model": self.model, "batch": self.batch, "output_tokens": self.output_tokens,
            "input_tokens": self.input_tokens, "prompt_source": self.prompt_source, "prompts": "distinct",
            "usage": self.usage, "requests_s": round(self.requests_s, 3),
            "traces_wait_s": round(self.traces_wait_s, 3)}
        for key in ("profiled_server", "unprofiled_server"):
            timing = getattr(self, key)
            out[key] = None if timing is None else timing.record()
        out["unprofiled_runs"] = [run.record() for run in self.unprofiled_runs]
        if self.profiled_before:
            out["profiled_before"] = self.profiled_before
        if self.after_runs:
            median = median_run(self.after_runs)
            out["after_profile_server"] = None if median is None else median.record()
            out["after_profile_runs"] = [run.record() for run in self.after_runs]
        if self.unprofiled_by_batch:
            out["unprofiled_batches"] = [
                {"batch": b, "itl_ms": None if (m := median_run(runs)) is None else m.record()["itl_ms"],
                 "runs": [run.record() for run in runs]} for b, runs in sorted(self.unprofiled_by_batch.items())]
        return out


@dataclass(frozen=True, kw_only=True)
class ProfileResult:
    """What ``servescope profile`` found: the capture and the analysis of exactly its trace files."""

    capture: ProfileCapture
    analysis: AnalysisDoc


def discover_trace_dir(url: str, *, proc: Path = Path("/proc")) -> Path | None:
    """The profiler dir of the local engine process serving ``url``'s port, from its cmdline or env (the flags and
    variable of its entry in ``data/engines.toml``); else None.

    Shell twin: ``tr '\\0' ' ' < /proc/PID/cmdline`` of the process started with ``--port PORT``.
    """
    port = urlsplit(url).port
    if port is None or not is_local_url(url):
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        server = serving_engine(argv, port)
        if server is None:
            continue
        for i, arg in enumerate(argv):
            for flag in server.profiler_dir_flags:
                if arg.startswith(flag + "="):
                    return Path(arg.split("=", 1)[1])
                if arg == flag and i + 1 < len(argv):
                    return Path(argv[i + 1])
        try:
            env = (entry / "environ").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        for item in env:
            if server.profiler_dir_env and item.startswith(server.profiler_dir_env + "="):
                return Path(item.split("=", 1)[1])
    return None


def _snapshot(trace_dir: Path) -> dict[Path, tuple[int, int]]:
    if not trace_dir.is_dir():
        return {}
    return {p: (s.st_size, s.st_mtime_ns) for p in trace_dir.rglob(f"*{TRACE_SUFFIX}") if (s := p.stat())}


def _complete(path: Path) -> bytes | None:
    """The decompressed trace when ``path`` is a whole gzip stream ending a JSON object; else None."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error):
        return None
    return data if data.rstrip().endswith(b"}") else None


def wait_for_traces(trace_dir: Path, before: dict[Path, tuple[int, int]], *, timeout_s: float,
                    stable_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> list[Path]:
    """The trace files new or changed since ``before``, once all ranks and the front end are complete.

    Raises:
        InputError: not complete within ``timeout_s``; the message lists what arrived.
    """
    deadline = time.monotonic() + timeout_s
    last: dict[Path, int] = {}
    state = "no new trace files"
    while True:
        now = {p: v for p, v in _snapshot(trace_dir).items() if before.get(p) != v}
        sizes = {p: v[0] for p, v in now.items()}
        if sizes and sizes == last:
            state, done = _judge(sorted(sizes))
            if done:
                return _ordered(sorted(sizes))
        last = sizes
        if time.monotonic() >= deadline:
            arrived = ", ".join(f"{p.name} ({s} B)" for p, s in sorted(sizes.items())) or "none"
            raise InputError(str(trace_dir), f"trace files not complete after {timeout_s:g} s ({state}); "
                                             f"arrived: {arrived}")
        sleep(stable_s)


def _judge(files: list[Path]) -> tuple[str, bool]:
    ranks = [p for p in files if FRONTEND_MARK not in p.name]
    frontends = [p for p in files if FRONTEND_MARK in p.name]
    world: int | None = None
    for path in files:
        data = _complete(path)
        if data is None:
            return f"{path.name} is not a complete gzip JSON yet", False
        if path in ranks and (m := _WORLD_RE.search(data)):
            world = max(world or 0, int(m.group(1)))
    if not ranks:
        return "no rank trace yet", False
    if world is not None and len(ranks) < world:
        return f"{len(ranks)} of {world} rank traces", False
    if not frontends:
        return "no front-end (*.async_llm.*) trace yet", False
    return "complete", True


def _ordered(files: list[Path]) -> list[Path]:
    return [p for p in files if FRONTEND_MARK not in p.name] + [p for p in files if FRONTEND_MARK in p.name]


async def _post_empty(client: ServerClient, path: str) -> None:
    """POST ``path``; vLLM answers an empty 200, which the JSON client reports as not-JSON (fine here)."""
    try:
        await client.post_json(path, {}, read_timeout_s=120.0)
    except NotOpenAICompatible:
        pass


async def _wait_for_dir(trace_dir: Path, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for the server to create ``trace_dir`` (after /start_profile).

    Raises:
        InputError: it did not appear in time.
    """
    deadline = time.monotonic() + timeout_s
    while not trace_dir.is_dir():
        if time.monotonic() >= deadline:
            raise InputError(str(trace_dir), f"trace directory does not exist here: the server did not create "
                                             f"it within {timeout_s:g} s of /start_profile (is it the server's "
                                             f"torch_profiler_dir?)")
        await asyncio.sleep(0.1)


def _quiet(_: str) -> None:
    return None


async def _server_version(client: ServerClient) -> str | None:
    """vLLM's ``/version`` (``{"version": "0.26.0"}``), or None where the server answers otherwise."""
    try:
        answer = await client.get_json(_VERSION_PATH)
    except ServerError:
        return None
    return str(answer["version"]) if isinstance(answer, dict) and isinstance(answer.get("version"), str) else None


async def _run(request: ProfileRequest, trace_dir: Path,
               say: Callable[[str], None] = _quiet) -> ProfileCapture:
    async with ServerClient(request.url, api_key=request.api_key, read_timeout_s=request.request_timeout_s,
                            max_connections=max(request.batch, *request.unprofiled_batches, 8)) as client:
        model = request.model
        if model is None:
            listed = await client.get_json("/v1/models")
            data = listed.get("data") if isinstance(listed, dict) else None
            if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                raise InputError(client.url_of("/v1/models"), "lists no model; pass --model")
            model = str(data[0]["id"])
        # the warm-up's prompts differ from the profiled ones: a prefix cache must not hold those before the window
        server_version = await _server_version(client)
        # a set of prompts for the profiled batch, the warm-up and each unprofiled run (no set is served from a
        # prefix cache another filled, nor one an earlier profile of the same server filled: a seed of its own)
        b, wanted, after = request.batch, max(0, request.unprofiled_runs), max(0, request.after_runs)
        others = sorted(set(request.unprofiled_batches) - {b}) if wanted else []
        made, source = await make_prompts(client, model, tokens=request.input_tokens,
                                          count=(2 + wanted + after) * b + wanted * sum(others),
                                          seed=run_seed())
        supply = PromptSupply(made)
        profiled_prompts, warmup_prompts = supply.take(b), supply.take(b)
        body = {"model": model, "max_tokens": request.output_tokens, "min_tokens": request.output_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
        if request.warmup:
            short = {**body, "max_tokens": 2, "min_tokens": 2}
            await asyncio.gather(*(send(client, {**short, "prompt": p}) for p in warmup_prompts))
        runs = await timed_runs(client, body, supply, batch=b, runs=wanted)
        unprofiled = median_run(runs)
        by_batch: dict[int, list[ServerTiming]] = {}
        for other in others:
            say(f"timing {wanted} run(s) of {other} request(s) without the profiler")
            if timed := await timed_runs(client, body, supply, batch=other, runs=wanted):
                by_batch[other] = timed
        before = _snapshot(trace_dir)
        server = local_server(request.url)
        earlier = earlier_profile_note(before, server.start_time if server else None)
        if not trace_dir.is_dir():
            say(f"{trace_dir} is not there yet: waiting up to {request.dir_timeout_s:g} s after /start_profile "
                f"for the server to create it (vLLM creates its profiler directory on the first one)")
        try:
            await _post_empty(client, "/start_profile")
        except EndpointNotFound:
            raise InputError(client.url_of("/start_profile"),
                             f"HTTP 404: profiling is off on this server; restart it with {PROFILER_FLAGS}") from None
        try:
            await _wait_for_dir(trace_dir, request.dir_timeout_s)
        except InputError:
            await _post_empty(client, "/stop_profile")
            raise
        started = time.monotonic()
        try:
            usage, profiled, _ = await timed_batch(client, body, profiled_prompts)
        finally:
            requests_s = time.monotonic() - started
            await _post_empty(client, "/stop_profile")
        waited = time.monotonic()
        files = await asyncio.to_thread(wait_for_traces, trace_dir, before, timeout_s=request.trace_timeout_s,
                                        stable_s=request.stable_s)
        traces_wait_s = time.monotonic() - waited
        # the same batch once the traces are written: what the profile left behind in the server
        after_runs = await timed_runs(client, body, supply, batch=b, runs=after)
    return ProfileCapture(url=client.base_url, model=model, trace_dir=trace_dir, trace_files=files,
                          batch=request.batch, output_tokens=request.output_tokens,
                          input_tokens=request.input_tokens, prompt_source=source, usage=list(usage),
                          requests_s=requests_s, traces_wait_s=traces_wait_s, after_runs=after_runs,
                          profiled_server=profiled, unprofiled_server=unprofiled, unprofiled_runs=runs,
                          unprofiled_by_batch=by_batch, profiled_before=earlier, process=server,
                          server_version=server_version)


def _refused_first(url: str) -> None:
    """A port that refuses is the first thing to say (before any question about the trace directory)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return  # the client names a bad URL itself
    if not parts.hostname:
        return
    try:
        with socket.create_connection((parts.hostname, port), timeout=3.0):
            pass
    except ConnectionRefusedError:
        raise InputError(url, f"connection refused: nothing listens on {parts.hostname}:{port} "
                              "(is the server running, or still loading?)") from None
    except OSError:
        return  # unresolvable or slow: the HTTP client says so in its own words


def _check(request: ProfileRequest) -> Path:
    if request.batch < 1:
        raise InputError("--batch", "must be at least 1")
    if request.output_tokens < 1:
        raise InputError("--output-tokens", "must be at least 1")
    if request.input_tokens < 1:
        raise InputError("--input-tokens", "must be at least 1")
    if any(other < 1 for other in request.unprofiled_batches):
        raise InputError("--unprofiled-batches", "every batch must be at least 1")
    _refused_first(request.url)
    local = is_local_url(request.url)
    trace_dir = request.trace_dir
    if trace_dir is None:
        trace_dir = discover_trace_dir(request.url)
        if trace_dir is None:
            where = "" if local else " (the server is not on this machine, so its traces are not here either)"
            raise InputError(request.url, f"cannot tell the server's profiler directory{where}; "
                                          "pass --trace-dir DIR (the server's torch_profiler_dir)")
    if not trace_dir.is_dir() and (not local or trace_dir.exists()):
        where = (f"; the server at {request.url} is not on this machine" if not local
                 else " (a file, not a directory)")
        raise InputError(str(trace_dir), f"trace directory does not exist here{where}")
    return trace_dir  # local and not there yet: _run waits for the server to create it


def capture_profile(request: ProfileRequest, *, say: Callable[[str], None] = _quiet) -> ProfileCapture:
    """Profile ``batch`` × ``output_tokens`` on the server and return its complete new trace files.

    Raises:
        InputError: bad options, an unreachable or non-OpenAI server, profiling off (404, naming the
            flags to add), no trace directory here (a local one not there yet is waited for after
            /start_profile, ``request.dir_timeout_s``, told through ``say``), or traces not complete in time.

    Example:
        >>> capture_profile(ProfileRequest(url="http://127.0.0.1:8000", batch=4, output_tokens=32,
        ...                                trace_dir=Path("/tmp/traces")))  # doctest: +SKIP
    """
    trace_dir = _check(request)
    capture = run_loop(_run(request, trace_dir, say))
    if not capture.trace_files:
        raise InputError(str(trace_dir), "no new trace files")
    return capture


def profile_server(request: ProfileRequest, *, say: Callable[[str], None] = _quiet) -> ProfileResult:
    """Capture the server's decode steps (:func:`capture_profile`) and analyze exactly the new trace files; the
    analysis holds the next steps for the server's command line (so that -o, --json and ``report`` say them too).

    Raises:
        InputError: as :func:`capture_profile`, or a trace file the analysis cannot read.

    Example:
        >>> result = profile_server(ProfileRequest(url="http://127.0.0.1:8000", batch=4,
        ...                                        output_tokens=32))  # doctest: +SKIP
        >>> result.analysis.ranks[0].phases["decode"].steps                    # doctest: +SKIP
    """
    import msgspec

    from servescope.core.next_steps import analysis_next_steps
    from servescope.trace.analyze import AnalyzeRequest, analyze

    capture = capture_profile(request, say=say)
    reference = step_reference(capture.unprofiled_server, capture.unprofiled_runs, capture.unprofiled_by_batch,
                               caveat=capture.profiled_before)
    doc = analyze(AnalyzeRequest(paths=capture.trace_files, reference=reference,
                                 settings=live_deployment(capture.url, capture.server_version, capture.process)))
    steps = analysis_next_steps(doc, argv=capture.process.argv if capture.process else ())
    return ProfileResult(capture=capture, analysis=msgspec.structs.replace(doc, next_steps=steps) if steps else doc)


def live_deployment(url: str, version: str | None, record: ProcessRecord | None) -> list[DeploymentInput]:
    """What the serving process tells of its deployment: its command line and environment (``record``, its
    ``/proc`` when it runs here) and its version (``/version``); empty when neither is known."""
    from servescope.trace.rules.deployment import DeploymentInput

    if record is None and version is None:
        return []
    where = f"pid {record.pid}, /proc/{record.pid}/cmdline and environ" if record else url
    return [DeploymentInput(source="server", where=where + (f", /version {version}" if version else ""),
                            argv=list(record.argv) if record else [], env=dict(record.env) if record else {},
                            version=version,  # the engine whose server answers /version (data/engines.toml)
                            engine=next((e.id for e in engines() if e.version_path == _VERSION_PATH), None)
                            if version else None)]
