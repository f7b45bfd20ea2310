"""install / start / stop / status / restart against a fake `systemctl` on PATH and recorded H200 NVML data."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gpu.fake_pynvml import load_recording, make_fake_pynvml
from servescope.cli import app
from servescope.deploy.lifecycle import install_unit, restart_service, service_status
from servescope.gpu import nvml
from servescope.gpu.inventory import wait_until_gpu_memory_free

from .conftest import FakeSystemctl

RECORDING = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h200-nvml"


def _use_recording(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(load_recording(RECORDING / name / "nvml.json")))
    monkeypatch.setattr(nvml, "_nvml", None)


def _used_mib(name: str) -> int:
    doc = load_recording(RECORDING / name / "nvml.json")
    call = next(c for c in doc["calls"] if c["fn"].startswith("nvmlDeviceGetMemoryInfo"))
    return round(call["return"]["fields"]["used"] / 2**20)


def test_install_copies_and_reloads(tmp_path: Path, systemctl: FakeSystemctl) -> None:
    unit = tmp_path / "svc.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    (tmp_path / "system").mkdir()
    target = install_unit(unit, directory=tmp_path / "system")
    assert target.read_text() == unit.read_text()
    assert systemctl.calls() == [["daemon-reload"]]


def test_restart_refuses_while_memory_is_held(monkeypatch: pytest.MonkeyPatch, systemctl: FakeSystemctl) -> None:
    systemctl.add_unit("svc.service")
    _use_recording(monkeypatch, "holding-10GiB")
    held = _used_mib("holding-10GiB")
    ready_called: list[bool] = []
    result = restart_service("svc", max_used_mib=1000, gpu_timeout_s=0, poll_s=0.1,
                             wait_ready=lambda: (ready_called.append(True) or True, "ready"))
    assert not result.started and ready_called == []
    assert systemctl.calls() == [["stop", "svc.service"]]
    assert f"GPU0 {held} MiB used" in result.detail


def test_restart_proceeds_when_memory_is_free(monkeypatch: pytest.MonkeyPatch, systemctl: FakeSystemctl) -> None:
    systemctl.add_unit("svc.service")
    _use_recording(monkeypatch, "idle")
    order: list[str] = []

    def gpu_wait(*args: float) -> object:
        order.append(f"gpu after {[c[0] for c in systemctl.calls()]}")
        return wait_until_gpu_memory_free(int(args[0]), args[1], args[2])

    def ready() -> tuple[bool, str]:
        order.append(f"ready after {[c[0] for c in systemctl.calls()]}")
        return True, "ready"

    result = restart_service("svc", max_used_mib=1000, gpu_timeout_s=0, gpu_wait=gpu_wait, wait_ready=ready)
    assert result.started and result.ready
    assert result.steps == ("stop", "gpu-wait-free", "start", "health-wait")
    assert systemctl.calls() == [["stop", "svc.service"], ["start", "svc.service"]]
    assert order == ["gpu after ['stop']", "ready after ['stop', 'start']"]
    assert service_status("svc").active_state == "active"


def test_cli_restart_exit_1_when_held(monkeypatch: pytest.MonkeyPatch, systemctl: FakeSystemctl) -> None:
    systemctl.add_unit("svc.service")
    _use_recording(monkeypatch, "holding-10GiB")
    result = CliRunner().invoke(app, ["service", "restart", "svc", "--gpu-timeout", "0", "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["started"] is False and doc["steps"] == ["stop", "gpu-wait-free"]
    assert ["start", "svc.service"] not in systemctl.calls()


def test_status_json_and_missing_unit(systemctl: FakeSystemctl) -> None:
    systemctl.add_unit("svc.service", MainPID="777", NRestarts="2")
    doc = json.loads(CliRunner().invoke(app, ["service", "status", "svc", "--json"]).stdout)
    assert (doc["main_pid"], doc["restarts"], doc["active_state"]) == (777, 2, "active")
    missing = CliRunner().invoke(app, ["service", "status", "nope"])
    assert missing.exit_code == 2 and "nope.service: no such unit" in missing.output


def test_start_stop_and_systemctl_failure(monkeypatch: pytest.MonkeyPatch, systemctl: FakeSystemctl) -> None:
    systemctl.add_unit("svc.service")
    assert CliRunner().invoke(app, ["service", "stop", "svc"]).exit_code == 0
    assert CliRunner().invoke(app, ["service", "start", "svc"]).exit_code == 0
    assert systemctl.calls() == [["stop", "svc.service"], ["start", "svc.service"]]
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "start")
    failed = CliRunner().invoke(app, ["service", "start", "svc"])
    assert failed.exit_code == 2 and "Access denied" in failed.output


def test_restart_until_ready_waits_for_the_unit_and_url(monkeypatch: pytest.MonkeyPatch,
                                                        systemctl: FakeSystemctl) -> None:
    """The function `service restart` calls: the restart, then health's wait on the URL and the unit."""
    from servescope.server import health
    from servescope.server.health import HealthRequest, restart_until_ready

    systemctl.add_unit("svc.service")
    _use_recording(monkeypatch, "idle")
    asked: list[HealthRequest] = []

    def check(request: HealthRequest) -> SimpleNamespace:
        asked.append(request)
        assert systemctl.calls()[-1] == ["start", "svc.service"]
        return SimpleNamespace(ready=True)

    monkeypatch.setattr(health, "check_health", check)
    result = restart_until_ready("svc", url="http://127.0.0.1:9", max_used_mib=1000, gpu_timeout_s=0,
                                 ready_timeout_s=5)
    assert (result.started, result.ready, result.detail) == (True, True, "ready: True")
    [request] = asked
    assert (request.url, request.wait, request.timeout_s, request.unit) == ("http://127.0.0.1:9", True, 5,
                                                                           "svc.service")
