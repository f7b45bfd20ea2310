"""The unit runs the servescope that rendered it, lint checks that every Exec* program is there, install leaves
nothing behind when a step fails, and import's comments name what the spec holds."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app

from .conftest import FakeSystemctl, fake_bin, spec_text, unit_commands, verify

CONSOLE_SCRIPT = Path(sys.executable).parent / "servescope"  # this venv's, as `pip install` wrote it


def _spec_without_servescope(bin_dir: Path) -> str:
    lines = spec_text(bin_dir).splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("servescope ="))


@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_render_writes_the_servescope_that_renders_and_systemd_accepts_it(tmp_path: Path, how: str) -> None:
    assert CONSOLE_SCRIPT.is_file(), "the test runs from a venv with servescope installed"
    bin_dir = fake_bin(tmp_path / "bin", "python3")  # no servescope here: the unit must name the real one
    spec = tmp_path / "spec.toml"
    spec.write_text(_spec_without_servescope(bin_dir))
    out = tmp_path / "units" / "vllm-test.service"
    head = [str(CONSOLE_SCRIPT)] if how == "console script" else [sys.executable, "-m", "servescope"]
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # not on PATH: found from the running process
    done = subprocess.run([*head, "service", "render", str(spec), "-o", str(out), "--mkdir"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    (pre,) = unit_commands(text, "ExecStartPre")
    (post,) = unit_commands(text, "ExecStartPost")
    assert pre[0] == post[0] == str(CONSOLE_SCRIPT)
    assert "/usr/local/bin/servescope" not in text
    checked = verify(out.parent, out.name)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    lint = CliRunner().invoke(app, ["service", "lint", str(out), "--topology", "pcie", "--json"])
    assert "missing-executable" not in lint.stdout


def test_a_spec_still_names_its_own_servescope(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope")
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(bin_dir))
    shown = CliRunner().invoke(app, ["service", "render", str(spec)])
    (pre,) = unit_commands(shown.stdout, "ExecStartPre")
    assert pre[0] == f"{bin_dir}/servescope"


UNIT = """[Unit]
Description=x

[Service]
Type=exec
ExecStartPre={pre}
ExecStart=/bin/sh -c 'exec sleep 1' --max-model-len 1
ExecStartPost=servescope-not-installed-here health http://127.0.0.1:1
ExecStop={stop}
TimeoutStartSec=3600
"""


def test_lint_flags_every_exec_program_this_host_lacks(tmp_path: Path) -> None:
    not_exec = tmp_path / "plain-file"
    not_exec.write_text("#!/bin/sh\n")
    unit = tmp_path / "u.service"
    unit.write_text(UNIT.format(pre="/usr/local/bin/servescope gpu wait-free", stop=f"-{not_exec}"))
    assert not Path("/usr/local/bin/servescope").exists()  # the old default, which systemd could not run here
    result = CliRunner().invoke(app, ["service", "lint", str(unit), "--topology", "pcie"])
    assert result.exit_code == 1
    missing = [line for line in result.stdout.splitlines() if "missing-executable" in line]
    assert [line.split()[0] for line in missing] == [f"{unit}:{n}" for n in (6, 8, 9)], result.stdout
    prose = " ".join(result.stdout.split())  # the finding's prose wraps at spaces under its key
    assert "ExecStartPre /usr/local/bin/servescope: no such file on this host" in prose
    assert "ExecStartPost servescope-not-installed-here: not found in systemd's PATH" in prose
    # a path longer than the line is folded inside itself (under xdist tmp_path gains "popen-gwN/")
    assert f"ExecStop{not_exec}:notanexecutablefile" in "".join(result.stdout.split())
    # /bin/sh is there: not flagged; and --no-host leaves the check out for a unit meant for another machine
    assert "ExecStart /bin/sh" not in result.stdout
    other = CliRunner().invoke(app, ["service", "lint", str(unit), "--topology", "pcie", "--no-host"])
    assert "missing-executable" not in other.stdout


def test_install_without_systemctl_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unit = tmp_path / "vllm.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    system = tmp_path / "system"
    system.mkdir()
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = CliRunner().invoke(app, ["service", "install", str(unit), "--dir", str(system)])
    assert result.exit_code != 0 and "systemctl not found" in result.output
    assert list(system.iterdir()) == []


def test_install_whose_reload_fails_puts_the_old_unit_back(tmp_path: Path, systemctl: FakeSystemctl,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system"
    system.mkdir()
    unit = tmp_path / "vllm.service"
    unit.write_text("[Service]\nExecStart=/bin/true --new\n")
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "daemon-reload")
    fresh = CliRunner().invoke(app, ["service", "install", str(unit), "--dir", str(system)])
    assert fresh.exit_code != 0 and "daemon-reload" in fresh.output
    assert list(system.iterdir()) == []
    old = system / "vllm.service"
    old.write_text("[Service]\nExecStart=/bin/true --old\n")
    old.chmod(0o640)
    again = CliRunner().invoke(app, ["service", "install", str(unit), "--dir", str(system)])
    assert again.exit_code != 0
    assert old.read_text() == "[Service]\nExecStart=/bin/true --old\n" and old.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in system.iterdir()) == ["vllm.service"]  # no temp file left either
    assert systemctl.calls() == [["daemon-reload"], ["daemon-reload"]]


def test_import_comments_name_the_guard_table_the_spec_has(tmp_path: Path) -> None:
    unit = tmp_path / "vllm-x.service"
    unit.write_text("[Service]\nExecStartPre=/bin/bash -c 'for i in $$(seq 1 30); do nvidia-smi; sleep 10; done'\n"
                    "ExecStart=/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m/M "
                    "--max-model-len 1024\n")
    out = tmp_path / "spec.toml"
    result = CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    comments = [line for line in text.splitlines() if "ExecStartPre" in line]
    assert comments == [f"# {unit}:2 ExecStartPre: the GPU memory wait: the [guard] table (servescope gpu "
                        "wait-free, which fails naming who holds the memory)"]
    spec = tomllib.loads(text)
    assert spec["guard"] == {"max_used_mib": 1000, "timeout_s": 600}
    rendered = CliRunner().invoke(app, ["service", "render", str(out)])
    (pre,) = unit_commands(rendered.stdout, "ExecStartPre")
    assert pre[1:] == ["gpu", "wait-free", "--max-used-mib", "1000", "--timeout", "600"]
