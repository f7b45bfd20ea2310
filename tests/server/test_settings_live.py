"""settings against the session's real vLLM server: its real /proc cmdline and environ, /version, /v1/models,
/metrics info gauges; drift after the test edits a unit file; the API key never shown."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from servescope.cli import app

from .conftest import LiveServer, capture_tool

runner = CliRunner()
HF_TOKEN = "hf_liveSettingsSecret42"


def _settings(*args: str) -> tuple[str, dict[str, Any]]:
    text = runner.invoke(app, ["settings", *args])
    assert text.exit_code == 0, text.output
    as_json = runner.invoke(app, ["settings", *args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    return text.stdout, json.loads(as_json.stdout)


def _group(doc: dict[str, Any], group_id: str) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for g in doc["groups"] if g["id"] == group_id for s in g["settings"]}


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_settings_of_the_live_server(ready_server: LiveServer, vllm_python: Path) -> None:
    argv = ready_server.handle.argv
    text, doc = _settings("--pid", str(ready_server.pid))
    assert ready_server.api_key not in text and ready_server.api_key not in json.dumps(doc)
    assert doc["engine"] == "vllm" and doc["url"] == ready_server.url  # found from --host/--port
    memory, model = _group(doc, "memory"), _group(doc, "model")
    assert memory["--max-model-len"]["value"] == str(ready_server.max_model_len)
    assert memory["--gpu-memory-utilization"]["value"] == _flag(argv, "--gpu-memory-utilization")
    assert model["--served-model-name"]["value"] == ready_server.model
    assert _group(doc, "engine")["--api-key"]["value"] == "***"
    env = {**_group(doc, "vllm_env"), **_group(doc, "other")}
    for name, value in ready_server.handle.env.items():  # what the fixture added to the server's environment
        assert env[name]["value"] == value and env[name]["origin"] == f"/proc/{ready_server.pid}/environ"

    server = _group(doc, "server")
    version = subprocess.run([str(vllm_python), "-c", "import vllm; print(vllm.__version__)"], check=True,
                             capture_output=True, text=True, timeout=120).stdout.strip()
    assert server["/version version"]["value"] == version
    # /v1/models needs the key: settings asked with the process's own --api-key.
    assert server[f"/v1/models[{ready_server.model}].max_model_len"]["value"] == str(ready_server.max_model_len)
    assert server["/metrics vllm:cache_config_info.gpu_memory_utilization"]["value"] == \
        _flag(argv, "--gpu-memory-utilization")
    assert [d for d in doc["drift"] if d["kind"] == "server"] == []
    assert f"/v1/models[{ready_server.model}].max_model_len" in text


def test_drift_after_the_unit_is_edited(ready_server: LiveServer, tmp_path: Path) -> None:
    argv = ready_server.handle.argv
    env_lines = "\n".join(f"Environment={k}={v}" for k, v in ready_server.handle.env.items())
    env_lines += f"\nEnvironment=HF_TOKEN={HF_TOKEN}"  # a secret the unit sets; the server does not have it
    unit = tmp_path / "vllm-tiny.service"
    unit.write_text(f"[Unit]\nDescription=tiny\n\n[Service]\nType=simple\n{env_lines}\n"
                    f"ExecStart={shlex.join(argv)}\nRestart=on-failure\n")
    os.utime(unit, (time.time() - 3600, time.time() - 3600))  # written long before the server started
    before = _settings("--unit-file", str(unit), "--pid", str(ready_server.pid))[1]
    assert [d for d in before["drift"] if d["kind"] in ("arg", "unit_changed")] == []

    edited = unit.read_text().replace(f"--max-model-len {ready_server.max_model_len}", "--max-model-len 512")
    edited = edited.replace("Restart=on-failure", "Restart=on-failure\nEnvironment=NCCL_PROTO=LL")
    unit.write_text(edited)  # now: after the server started
    text, doc = _settings("--unit-file", str(unit), "--pid", str(ready_server.pid))
    drift = {(d["kind"], d["key"]): d for d in doc["drift"]}
    assert drift[("arg", "--max-model-len")]["values"] == {"unit": "512", "process": str(ready_server.max_model_len)}
    assert drift[("env", "NCCL_PROTO")]["values"] == {"unit": "LL", "process": None}
    assert ("unit_changed", str(unit)) in drift
    assert drift[("env", "HF_TOKEN")]["values"] == {"unit": "***", "process": None}
    assert ("arg", "--api-key") not in drift
    for kind, key in drift:
        # the kind then the key; a key longer than the 80-column row (this unit's path) stacks the columns and
        # folds, so the check is on the text without its whitespace
        assert f"{kind}{key}" in "".join(text.split()), (kind, key, text[-1500:])
    for secret in (ready_server.api_key, HF_TOKEN):
        assert secret not in text and secret not in json.dumps(doc)


def test_process_flags_against_what_the_server_reports(ready_server: LiveServer, tmp_path: Path) -> None:
    # A process claiming other settings for the same server: its flags against the server's own report.
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    script.chmod(0o755)
    flags = ["--max-model-len", "512", "--served-model-name", "other-name", "--gpu-memory-utilization", "0.5",
             "--port", str(ready_server.handle.port), "--api-key", ready_server.api_key]
    proc = subprocess.Popen([str(script), "serve", "x", *flags], env={"PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1:2] != [str(script).encode()]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        text, doc = _settings("--pid", str(proc.pid), "--url", ready_server.url)
    finally:
        proc.kill()
        proc.wait()
    drift = {d["key"]: d["values"] for d in doc["drift"] if d["kind"] == "server"}
    assert drift["--max-model-len"] == {"process": "512", "server": str(ready_server.max_model_len)}
    assert drift["--served-model-name"] == {"process": "other-name", "server": ready_server.model}
    assert drift["--gpu-memory-utilization"] == {"process": "0.5",
                                                 "server": _flag(ready_server.handle.argv, "--gpu-memory-utilization")}
    assert ready_server.api_key not in text and ready_server.api_key not in json.dumps(doc)
    assert capture_tool.HOST in doc["url"]
