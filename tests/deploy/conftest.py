"""Deploy test helpers: a real `systemd-analyze verify`, a real fake `systemctl`, the example unit and specs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracefiles import SHARED

EXAMPLE_UNIT = SHARED / "examples" / "vllm-kimi-k25-int4.service"  # ../shared: tests that read it are needs_shared
DATA = Path(__file__).resolve().parents[1] / "data" / "deploy"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"


def example_text() -> str:
    assert EXAMPLE_UNIT.is_file(), f"missing {EXAMPLE_UNIT}: CI lays ../shared beside the checkout"
    return EXAMPLE_UNIT.read_text(encoding="utf-8")


def fake_bin(folder: Path, *names: str) -> Path:
    """Executables that exit 0, so `systemd-analyze verify` finds every ExecStart program."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = folder / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return folder


def verify(unit_dir: Path, *names: str) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` over units in a temp dir (no man pages, no generators: works without PID 1)."""
    assert Path(SYSTEMD_ANALYZE).is_file(), "systemd-analyze missing: apt-get install systemd"
    return subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", "--generators=no",
                           *[str(unit_dir / n) for n in names]], capture_output=True, text=True, check=False)


def spec_text(bin_dir: Path, *, name: str = "vllm-test", extra: str = "") -> str:
    """A spec whose programs live in ``bin_dir`` (so verify can check they are executable)."""
    return textwrap.dedent(f"""\
        name = "{name}"
        engine = "vllm"
        model = "moonshotai/Kimi-K2.5"
        command = ["{bin_dir}/python3", "-m", "vllm.entrypoints.openai.api_server"]
        servescope = "{bin_dir}/servescope"
        gpus = [0, 1, 2, 3, 4, 5, 6, 7]
        env_file = "/etc/servescope/{name}.env"
        load_time_s = 1800
        {extra}
        [args]
        tensor-parallel-size = 8
        max-model-len = 131072
        port = 8011
        trust-remote-code = true
        chat-template = '{{% for m in messages %}}{{{{ m["content"] }}}} $HOME "x"{{% endfor %}}'

        [env]
        NCCL_PROTO = "LL"
        NCCL_ALGO = "Ring"
        """)


FAKE_SYSTEMCTL = r'''#!{python}
"""A fake systemctl: records argv (one JSON line each) and answers from a JSON state file like systemctl does."""
import json, os, sys
log, state_path = os.environ["FAKE_SYSTEMCTL_LOG"], os.environ["FAKE_SYSTEMCTL_STATE"]
with open(log, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
state = json.load(open(state_path)) if os.path.exists(state_path) else {{}}
cmd, args = sys.argv[1], sys.argv[2:]
fail = os.environ.get("FAKE_SYSTEMCTL_FAIL")
if fail == cmd:
    sys.stderr.write(f"Failed to {{cmd}} {{args[0] if args else ''}}: Access denied\n")
    sys.exit(1)
if cmd == "daemon-reload":
    sys.exit(0)
unit = args[0]
known = state.get(unit)
if cmd in ("start", "stop"):
    if known is None:
        sys.stderr.write(f"Failed to {{cmd}} {{unit}}: Unit {{unit}} not found.\n")
        sys.exit(5)
    known.update({{"ActiveState": "active", "SubState": "running", "MainPID": "4242"}} if cmd == "start"
                 else {{"ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}})
    json.dump(state, open(state_path, "w"))
    sys.exit(0)
if cmd == "show":
    props = args[args.index("-p") + 1].split(",")
    values = known or {{"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}}
    for p in props:
        print(f"{{p}}={{values.get(p, unit if p == 'Id' else '')}}")
    sys.exit(0)
sys.stderr.write(f"Unknown command verb {{cmd}}.\n")
sys.exit(1)
'''


class FakeSystemctl:
    """The fake's argv log and state."""

    def __init__(self, folder: Path) -> None:
        self.log = folder / "systemctl.log"
        self.state = folder / "state.json"

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def add_unit(self, name: str, **props: str) -> None:
        state = json.loads(self.state.read_text()) if self.state.exists() else {}
        state[name] = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": "1234",
                       "NRestarts": "0", "FragmentPath": f"/etc/systemd/system/{name}", **props}
        self.state.write_text(json.dumps(state))


@pytest.fixture
def systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSystemctl:
    """A `systemctl` executable first on PATH (systemd is not PID 1 here)."""
    folder = tmp_path / "fake-systemctl"
    folder.mkdir()
    exe = folder / "systemctl"
    exe.write_text(FAKE_SYSTEMCTL.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(folder / "systemctl.log"))
    monkeypatch.setenv("FAKE_SYSTEMCTL_STATE", str(folder / "state.json"))
    return FakeSystemctl(folder)


def unit_commands(text: str, key: str) -> list[list[str]]:
    """Every `key=` command of a unit as argv, split by an independent route: shlex, then `$$` → `$`."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith(f"{key}="):
            out.append([w.replace("$$", "$").replace("%%", "%") for w in shlex.split(line[len(key) + 1:].lstrip("-"))])
    return out


def unit_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line[len("Environment="):]):
                key, _, value = word.partition("=")
                env[key] = value
    return env
