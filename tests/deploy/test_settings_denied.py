"""settings --pid when the kernel withholds /proc/PID/environ: the error says what actually failed (issue 23:
as root it said "permission denied: run as root"). A real refusal by the kernel: root of a user namespace
(``unshare --user --map-root-user``) over a process outside it. Another user's process: test_settings.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from children import default_signals

SETTINGS = [sys.executable, "-m", "servescope", "settings", "--pid"]


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=default_signals)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_root_of_a_user_namespace_is_told_so_not_to_run_as_root(sleeper: int) -> None:
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) missing"
    if subprocess.run([unshare, "--user", "--map-root-user", "true"], check=False).returncode != 0:
        pytest.skip("this kernel does not let us make a user namespace")
    # the premise, checked by the kernel itself: root in that namespace cannot read the sleeper's environ
    probe = subprocess.run([unshare, "--user", "--map-root-user", "sh", "-c", f"id -u; cat /proc/{sleeper}/environ"],
                           capture_output=True, text=True, check=False)
    assert probe.stdout.strip() == "0" and "Permission denied" in probe.stderr
    line = _one_line_error(subprocess.run([unshare, "--user", "--map-root-user", *SETTINGS, str(sleeper)],
                                          capture_output=True, text=True, timeout=120, check=False))
    assert line.startswith(f"servescope: error: /proc/{sleeper}/environ: permission denied to root")
    assert "user namespace" in line and "run as root" not in line
