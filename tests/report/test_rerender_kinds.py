"""``servescope report`` round-trips the six kinds test_rerender.py leaves out: health, settings, gpu snapshot,
service status, bench gemm and bench comm.

Each command runs in-process on a real input and saves its document in the same run where it can (``-o``;
bench comm's ``--json-out``), else a second run prints it (``--json``: settings and service status, whose
inputs do not change between the runs). ``report FILE`` must then print exactly the command's text, and
``report FILE --json`` the saved JSON. The inputs: a local HTTP server and a dead port with a crashed
process (health), a python process of our own and the test SSE server (settings), the recorded H200
``nvidia-smi`` outputs and NVML calls (gpu), the deploy tests' fake ``systemctl`` (systemd is not PID 1 here),
torch on the CPU (bench gemm) and two gloo ranks (bench comm).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.conftest import FakeSystemctl, systemctl  # noqa: F401 (systemctl: the deploy tests' fixture)
from gpu.fake_pynvml import load_recording, make_fake_pynvml
from gpu.gpu_inputs import RECORDING, fake_nvidia_smi
from httpd import serving
from server.sse import running_sse_server
from servescope.cli import app
from servescope.core.document import read_header
from servescope.gpu import nvml

runner = CliRunner(env={"COLUMNS": "120"})  # the command and report print on the same fixed width


def _run(args: list[object], *, code: int = 0) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result.stdout


def _assert_round_trip(saved: Path, text: str, schema: str) -> None:
    """``report`` prints ``text`` from ``saved`` (a ``schema`` document), and its ``--json`` is ``saved``."""
    assert read_header(saved.read_bytes(), str(saved))[0].schema == schema
    assert text.strip(), "the command printed nothing"
    assert _run(["report", saved]) == text
    assert json.loads(_run(["report", saved, "--json"])) == json.loads(saved.read_bytes())


# ------------------------------------------------------------------------------------------------------ health


class _OpenAIHandler(BaseHTTPRequestHandler):
    """What health asks of a vLLM server: /health 200, /v1/models, a non-streamed 1-token completion.

    The test SSE server streams every completion, so health's JSON completion cannot pass there."""

    def _answer(self, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._answer({"object": "list", "data": [{"id": "tiny-llama", "object": "model", "max_model_len": 256}]})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        self._answer({"id": "c", "object": "text_completion", "model": "tiny-llama",
                      "choices": [{"index": 0, "text": " a", "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}})

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def openai_server() -> Iterator[str]:
    with serving(_OpenAIHandler) as url:
        yield url


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_health_ready_round_trip(openai_server: str, tmp_path: Path) -> None:
    saved = tmp_path / "health.json"
    text = _run(["health", openai_server, "-o", saved])
    assert json.loads(saved.read_bytes())["phase"] == "ready" and "tiny-llama" in text
    _assert_round_trip(saved, text, "servescope.health")


def test_health_crashed_round_trip_with_process_and_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('INFO loading weights'); print('ERROR CUDA out of "
                                 "memory'); raise SystemExit(3)"], stdout=out, stderr=subprocess.STDOUT)
        proc.wait(timeout=30)
    saved = tmp_path / "health.json"
    text = _run(["health", f"http://127.0.0.1:{_dead_port()}", "--pid", proc.pid, "--log", log, "-o", saved],
                code=1)
    doc = json.loads(saved.read_bytes())
    assert doc["phase"] == "crashed" and doc["log_tail"] == ["INFO loading weights", "ERROR CUDA out of memory"]
    _assert_round_trip(saved, text, "servescope.health")


def test_an_output_that_cannot_be_written_is_one_line(openai_server: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``-o`` this round trip needs, on health and gpu list: a path under a file fails in one line, exit 2."""
    recorded = RECORDING / "holding-10GiB"
    fake_nvidia_smi(tmp_path, {"-q -x": recorded / "nvidia-smi-q.xml", "topo -m": recorded / "topo-m.txt"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "out.json"
    for args in (["health", openai_server], ["gpu", "list", "--prefer", "nvidia-smi"]):
        result = runner.invoke(app, [*args, "-o", str(target)])
        assert result.exit_code == 2 and result.stdout == "", result.output
        (line,) = result.output.strip().splitlines()
        # refused before anything runs, naming the option and why (tests/cli/test_outputs.py covers every option)
        assert line == f"servescope: error: -o {target}: {blocker} is not a folder" or \
            line == f"servescope: error: --output {target}: {blocker} is not a folder", line


# ---------------------------------------------------------------------------------------------------- settings


@pytest.fixture(scope="module")
def sse_server() -> Iterator[str]:
    with running_sse_server() as url:
        yield url


def test_settings_round_trip(sse_server: str, tmp_path: Path) -> None:
    """A process of ours with a vLLM command line and environment, its unit (which has drifted) and the SSE
    server: the text and ``--json`` are two runs over inputs that do not change."""
    port = sse_server.rsplit(":", 1)[1]
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "vllm", "serve", "tiny-llama", "--port", port,
            "--max-model-len", "256", "--api-key", "sk-never-shown"]
    env = {"PATH": os.environ["PATH"], "NCCL_PROTO": "LL", "VLLM_USE_V1": "1", "HF_TOKEN": "hf_never_shown",
           "OMP_NUM_THREADS": "4", "LANG": "C.UTF-8", "UNRELATED": "x"}
    unit = tmp_path / "vllm-tiny.service"
    unit.write_text(f"[Service]\nEnvironment=NCCL_PROTO=Simple\nExecStart={shlex.join(argv[:3])} vllm serve "
                    f"tiny-llama --port {port} --max-model-len 512\n", encoding="utf-8")
    proc = subprocess.Popen(argv, env=env)
    try:
        args = ["settings", "--pid", proc.pid, "--url", sse_server, "--unit-file", unit]
        text = _run(args)
        saved = tmp_path / "settings.json"
        saved.write_bytes(_run([*args, "--json"]).encode())
        every = tmp_path / "settings-all-env.json"  # the view recorded: report shows every variable again
        text_every = _run([*args, "--all-env"])
        every.write_bytes(_run([*args, "--all-env", "--json"]).encode())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    doc = json.loads(saved.read_bytes())
    assert doc["drift"] and "never_shown" not in text and "never-shown" not in text
    _assert_round_trip(saved, text, "servescope.settings")
    assert json.loads(every.read_bytes())["all_env"] is True and doc["all_env"] is False
    assert "UNRELATED" in text_every and "UNRELATED" not in text  # a variable only --all-env shows
    _assert_round_trip(every, text_every, "servescope.settings")


# --------------------------------------------------------------------------------------------------------- gpu


@pytest.mark.parametrize("source", ["nvidia-smi", "nvml"])
def test_gpu_snapshot_round_trip(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real H200 holding 10 GiB: its recorded ``nvidia-smi`` outputs on PATH, or its recorded NVML calls."""
    recorded = RECORDING / "holding-10GiB"
    if source == "nvidia-smi":
        fake_nvidia_smi(tmp_path, {"-q -x": recorded / "nvidia-smi-q.xml", "topo -m": recorded / "topo-m.txt"})
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    else:
        monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(load_recording(recorded / "nvml.json")))
        monkeypatch.setattr(nvml, "_nvml", None)
    saved = tmp_path / "gpu.json"
    text = _run(["gpu", "list", "--prefer", source, "-o", saved])
    doc = json.loads(saved.read_bytes())
    assert doc["source"] == source and doc["processes"] and "H200" in text
    _assert_round_trip(saved, text, "servescope.gpu")


# ---------------------------------------------------------------------------------------------- service status


def test_service_status_round_trip(systemctl: FakeSystemctl, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    systemctl.add_unit("vllm-kimi-k25-int4.service", MainPID="4242", NRestarts="3",
                       ExecMainStartTimestamp="Thu 2026-12-03 09:14:02 UTC")
    systemctl.add_unit("vllm-failed.service", ActiveState="failed", SubState="failed", Result="exit-code",
                       MainPID="0")
    for name in ("vllm-kimi-k25-int4", "vllm-failed"):
        text = _run(["service", "status", name])
        saved = tmp_path / f"{name}.json"
        saved.write_bytes(_run(["service", "status", name, "--json"]).encode())
        _assert_round_trip(saved, text, "servescope.service")
    assert json.loads(saved.read_bytes())["main_pid"] is None and "N/A" in text


# ------------------------------------------------------------------------------------------------------- bench


def test_bench_gemm_round_trip(tmp_path: Path) -> None:
    """A tiny Llama (real config.json keys) on the CPU, 2 samples per shape."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 256, "torch_dtype": "bfloat16"}))
    saved = tmp_path / "gemm.json"
    text = _run(["bench", "gemm", "--model", config, "--device", "cpu", "--batch", "1", "--iters", "2", "-o", saved])
    assert len(json.loads(saved.read_bytes())["timings"]) > 0
    _assert_round_trip(saved, text, "servescope.bench_gemm")


def test_bench_comm_round_trip(tmp_path: Path) -> None:
    """Two gloo ranks, one op, two sizes and a decode-size table (Llama-3-70B's hidden size): ``--json-out``
    keeps the run's document (``-o`` is the curve file ``plan --comm`` reads, another document)."""
    saved, curves = tmp_path / "comm.json", tmp_path / "curves.json"
    text = _run(["bench", "comm", "--backend", "gloo", "--gpus", "2", "--ops", "all_reduce", "--sizes", "1K,4K",
                 "--iters", "3", "--warmup", "1", "--model", "llama-3-70b", "--batch", "1,2", "-o", curves,
                 "--json-out", saved])
    doc = json.loads(saved.read_bytes())
    assert doc["best_at_decode"] and doc["output"] == str(curves)
    assert doc["curves"] == json.loads(curves.read_bytes())
    _assert_round_trip(saved, text, "servescope.bench_comm")
