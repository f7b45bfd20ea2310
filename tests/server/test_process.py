"""Process state from /proc, systemd units via the real systemctl, and log tails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servescope.core.errors import InputError
from servescope.server.process import process_start_ticks, read_log_tail, read_process, read_unit


@pytest.mark.no_server
def test_running_process_is_alive() -> None:
    info = read_process(os.getpid())
    assert info.alive and info.state in ("R", "S") and info.pid == os.getpid()


@pytest.mark.no_server
def test_exited_unreaped_child_is_a_zombie_with_its_exit_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        deadline = time.monotonic() + 10
        while (info := read_process(proc.pid)).alive:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert info.state == "Z"
        assert info.exit_status == 3 << 8  # a wait status, as os.waitstatus_to_exitcode reads it
        assert os.waitstatus_to_exitcode(info.exit_status) == 3
    finally:
        proc.wait()
    assert read_process(proc.pid).alive is False


@pytest.mark.no_server
def test_reused_pid_counts_as_gone() -> None:
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    assert read_process(os.getpid(), start_ticks=ticks).alive
    assert not read_process(os.getpid(), start_ticks=ticks + 1).alive


@pytest.mark.no_server
def test_unit_without_systemctl_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError, match="systemctl not found: --unit needs systemd"):
        read_unit("vllm.service")


@pytest.mark.no_server
def test_unit_that_systemd_cannot_show_is_one_line() -> None:
    # On a systemd host: no such unit. In a container: systemd is not running. Without systemctl: that.
    # Each is one line.
    with pytest.raises(InputError) as info:
        read_unit("servescope-no-such-unit-4242.service")
    assert "\n" not in str(info.value) and str(info.value).startswith("--unit: ")


@pytest.mark.no_server
def test_log_tail_is_the_last_lines_without_colour(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"".join(f"\x1b[32mINFO\x1b[0m line {i}\r\n".encode() for i in range(100)) + b"\n\n")
    assert read_log_tail(log, lines=3) == ["INFO line 97", "INFO line 98", "INFO line 99"]
    assert read_log_tail(tmp_path / "missing.log") == []


@pytest.mark.no_server
def test_signal_constant_is_the_wait_status_of_a_kill() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    os.kill(proc.pid, signal.SIGKILL)
    try:
        deadline = time.monotonic() + 10
        while (info := read_process(proc.pid)).alive:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert info.exit_status is not None and os.waitstatus_to_exitcode(info.exit_status) == -signal.SIGKILL
    finally:
        proc.wait()
