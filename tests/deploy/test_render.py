"""Rendered units: they pass a real `systemd-analyze verify`, and say what the spec says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.deploy.render import quote_word, render_units
from servescope.deploy.spec import parse_spec

from .conftest import fake_bin, spec_text, unit_commands, unit_env, verify


def _keys(text: str) -> dict[str, str]:
    return {k: v for k, _, v in (line.partition("=") for line in text.splitlines() if "=" in line
                                 and not line.startswith("#"))}


def test_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(spec_text(bin_dir))
    out = tmp_path / "units" / "vllm-test.service"
    result = CliRunner().invoke(app, ["service", "render", str(spec_path), "-o", str(out), "--mkdir"])
    assert result.exit_code == 0, result.output
    checked = verify(out.parent, out.name)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    # systemd-analyze only warns (exit 0) on a bad value; prove the check can fail on one
    out.write_text(out.read_text().replace("KillMode=control-group", "KillMode=sometimes"))
    assert "kill mode" in verify(out.parent, out.name).stderr


def test_render_stdout_equals_file(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(spec_text(bin_dir))
    shown = CliRunner().invoke(app, ["service", "render", str(spec_path)])
    CliRunner().invoke(app, ["service", "render", str(spec_path), "-o", str(tmp_path / "u.service")])
    assert shown.exit_code == 0
    assert shown.output == (tmp_path / "u.service").read_text() + "\n"


def test_exec_lines_round_trip_through_systemd_quoting(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    spec = parse_spec(spec_text(bin_dir), "spec.toml")
    (unit,) = render_units(spec)
    (start,) = unit_commands(unit.text, "ExecStart")
    template = '{% for m in messages %}{{ m["content"] }} $HOME "x"{% endfor %}'
    assert start == [f"{bin_dir}/python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
                     "moonshotai/Kimi-K2.5", "--tensor-parallel-size", "8", "--max-model-len", "131072",
                     "--port", "8011", "--trust-remote-code", "--chat-template", template]
    assert "$$HOME" in unit.text and "%%" in unit.text
    (pre,) = unit_commands(unit.text, "ExecStartPre")
    assert pre == [f"{bin_dir}/servescope", "gpu", "wait-free", "--max-used-mib", "1000", "--timeout", "600"]
    (post,) = unit_commands(unit.text, "ExecStartPost")
    assert post[:4] == [f"{bin_dir}/servescope", "health", "http://127.0.0.1:8011", "--wait"]
    assert "--pid $MAINPID" in unit.text  # systemd substitutes it: not escaped
    assert unit_env(unit.text) == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def test_timeouts_and_start_limit_can_trip() -> None:
    spec = parse_spec(spec_text(Path("/x")), "spec.toml")
    keys = _keys(render_units(spec)[0].text)
    start = int(keys["TimeoutStartSec"])
    assert start >= 600 + 1800  # guard wait + load, both inside TimeoutStartSec
    burst, delay, interval = int(keys["StartLimitBurst"]), int(keys["RestartSec"]), int(keys["StartLimitIntervalSec"])
    assert interval > burst * (start + delay)
    health_timeout = int(re.search(r"--timeout (\d+) --pid", keys["ExecStartPost"]).group(1))  # type: ignore[union-attr]
    assert 1800 <= health_timeout <= start - 600
    assert keys["Type"] == "exec" and keys["KillMode"] == "control-group" and keys["Restart"] == "on-failure"
    assert keys["EnvironmentFile"] == "-/etc/servescope/vllm-test.env"
    assert "nvidia-persistenced.service" in keys["After"] and "network-online.target" in keys["Wants"]
    assert {"KillSignal", "TimeoutStopSec", "LimitNOFILE"} <= set(keys)


@pytest.mark.parametrize("word", ["plain", "a b", 'q"uote', "back\\slash", "$VAR", "100%", "", "x;y"])
def test_quote_word_reads_back(word: str) -> None:
    import shlex
    (back,) = shlex.split(quote_word(word)) or [""]
    assert back.replace("$$", "$").replace("%%", "%") == word


def test_multinode_renders_ray_head_server_and_worker(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope", "ray")
    extra = f'\n[multinode]\nhead_address = "10.0.0.1"\nworkers = ["10.0.0.2"]\nray = "{bin_dir}/ray"\n'
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(spec_text(bin_dir) + extra)
    out = tmp_path / "units"
    out.mkdir()
    result = CliRunner().invoke(app, ["service", "render", str(spec_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["vllm-test-ray-head.service", "vllm-test-ray-worker.service", "vllm-test.service"]
    checked = verify(out, *names)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    head = unit_commands((out / names[0]).read_text(), "ExecStart")[0]
    worker = unit_commands((out / names[1]).read_text(), "ExecStart")[0]
    server_text = (out / names[2]).read_text()
    server = unit_commands(server_text, "ExecStart")[0]
    assert head[1:] == ["start", "--head", "--port", "6379", "--block"]
    assert worker[1:] == ["start", "--address", "10.0.0.1:6379", "--block"]
    assert server[-2:] == ["--distributed-executor-backend", "ray"]
    assert "vllm-test-ray-head.service" in _keys(server_text)["After"]


def test_secrets_are_checked_before_anything_else_runs(tmp_path: Path) -> None:
    """A spec whose env_file must set secrets renders a first ExecStartPre that fails naming the file; the
    ``-`` stays so systemd runs it (without it systemd refuses the start naming no file)."""
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope")
    text = spec_text(bin_dir, extra='secrets = ["VLLM_API_KEY", "HF_TOKEN"]')
    (unit,) = render_units(parse_spec(text, "spec.toml"))
    (plain,) = render_units(parse_spec(spec_text(bin_dir), "spec.toml"))
    assert len(unit_commands(plain.text, "ExecStartPre")) == 1          # without secrets: the guard alone
    check, guard = unit_commands(unit.text, "ExecStartPre")
    assert check[:2] == ["/bin/sh", "-c"] and check[3:] == ["sh", "/etc/servescope/vllm-test.env"]
    assert guard[1:3] == ["gpu", "wait-free"]
    assert "EnvironmentFile=-/etc/servescope/vllm-test.env" in unit.text
    env_file = tmp_path / "vllm-test.env"
    env_file.write_text("VLLM_API_KEY=sk-1\n")

    def run(env: dict[str, str]) -> tuple[int, str]:
        done = subprocess.run([*check[:3], "sh", str(env_file)], env={"PATH": "/usr/bin:/bin", **env},
                              capture_output=True, text=True, check=False)
        return done.returncode, done.stderr.strip()

    assert run({"VLLM_API_KEY": "sk-1", "HF_TOKEN": "hf_1"}) == (0, "")
    assert run({"VLLM_API_KEY": "sk-1"}) == (1, f"servescope: {env_file} does not set HF_TOKEN: not starting "
                                                "without it")
    env_file.unlink()
    assert run({}) == (1, f"servescope: {env_file} is missing (it must set VLLM_API_KEY): not starting without it")
    out = tmp_path / "units" / "vllm-test.service"
    out.parent.mkdir()
    out.write_text(unit.text)
    checked = verify(out.parent, out.name)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    linted = CliRunner().invoke(app, ["service", "lint", "--no-host", str(out), "--json"])
    assert "wait-loop-cannot-fail" not in linted.output
