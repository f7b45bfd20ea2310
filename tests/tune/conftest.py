"""Fixtures of the tune tests: a unit (file + drop-ins) whose server is a toy one, behind a stand-in systemctl.

systemd is not PID 1 here, so ``systemctl`` is tests/deploy's recording fake (the one the ``service`` tests use);
the unit's server is a real toy_server process the fixture runs, and ``systemd-analyze verify`` is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from children import default_signals
from deploy.conftest import FAKE_SYSTEMCTL, FakeSystemctl

from .toy import TOY, free_port

UNIT = "toy.service"
# tests/deploy's fake reads the unit as the first word after the verb (``show NAME -p ...``); health asks
# ``show -p ... NAME``, as systemctl takes it too
_FAKE = FAKE_SYSTEMCTL.replace(
    "unit = args[0]",
    "unit = next(a for i, a in enumerate(args) if a != '-p' and (i == 0 or args[i - 1] != '-p'))")
assert _FAKE != FAKE_SYSTEMCTL
OTHER_DROPIN = b"[Service]\nEnvironment=KEEP_ME=1\n"
OLD_DROPIN = b"# an earlier tune's kept change\n[Service]\nEnvironment=EARLIER=yes\n"


@dataclass
class ToyUnit:
    unit_file: Path
    dropin_dir: Path
    port: int
    env: dict[str, str]
    systemctl: FakeSystemctl

    def files(self) -> dict[str, tuple[bytes, int]]:
        """Every file of the unit and its drop-ins: bytes and mode."""
        paths = [self.unit_file, *sorted(self.dropin_dir.glob("*"))]
        return {p.name: (p.read_bytes(), p.stat().st_mode & 0o7777) for p in paths}


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"toy server on {port} not up")


@pytest.fixture
def toy_unit(tmp_path: Path) -> Iterator[ToyUnit]:
    port = free_port()
    units = tmp_path / "units"
    dropins = units / f"{UNIT}.d"
    dropins.mkdir(parents=True)
    unit_file = units / UNIT
    unit_file.write_text(f"[Unit]\nDescription=toy\n[Service]\nType=simple\nEnvironment=A=1\n"
                         f"ExecStart={sys.executable} {TOY} --port {port} --max-num-seqs 1\n"
                         "[Install]\nWantedBy=multi-user.target\n")
    (dropins / "10-env.conf").write_bytes(OTHER_DROPIN)
    (dropins / "zz-servescope-tune.conf").write_bytes(OLD_DROPIN)
    (dropins / "zz-servescope-tune.conf").chmod(0o640)
    fake = tmp_path / "fake-systemctl"
    fake.mkdir()
    (fake / "systemctl").write_text(_FAKE.format(python=sys.executable))
    (fake / "systemctl").chmod(0o755)
    env = {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "FAKE_SYSTEMCTL_LOG": str(fake / "systemctl.log"),
           "FAKE_SYSTEMCTL_STATE": str(fake / "state.json")}
    recorder = FakeSystemctl(fake)
    server = subprocess.Popen([sys.executable, str(TOY), "--port", str(port)], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=default_signals)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    recorder.add_unit(UNIT)
    try:
        wait_port(port)
        yield ToyUnit(unit_file, dropins, port, env, recorder)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.terminate()
        server.wait(timeout=10)
