"""service import of the real example unit → spec → render keeps the engine argv and env; secrets move out."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app

from .conftest import example_text, fake_bin, unit_commands, unit_env, verify


def _engine_argv(argv: list[str]) -> list[str]:
    return argv[argv.index("vllm.entrypoints.openai.api_server") + 1:]


@pytest.mark.needs_shared
def test_import_then_render_keeps_args_and_env(tmp_path: Path) -> None:
    original = example_text()
    unit = tmp_path / "kimi.service"
    unit.write_text(original)
    spec = tmp_path / "kimi.toml"
    assert CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec)]).exit_code == 0
    rendered = tmp_path / "out" / "kimi.service"
    result = CliRunner().invoke(app, ["service", "render", str(spec), "-o", str(rendered), "--mkdir"])
    assert result.exit_code == 0, result.output
    new = rendered.read_text()
    assert _engine_argv(unit_commands(new, "ExecStart")[0]) == _engine_argv(unit_commands(original, "ExecStart")[0])
    assert unit_env(new) == unit_env(original)
    assert "seq 1 30" not in new and "gpu wait-free" in new


@pytest.mark.needs_shared
def test_secrets_move_to_an_environment_file(tmp_path: Path) -> None:
    text = example_text().replace("Environment=NCCL_ALGO=Ring", "Environment=NCCL_ALGO=Ring HF_TOKEN=hf_zzz")
    text = text.replace("--trust-remote-code", "--trust-remote-code --api-key sk-abc")
    unit = tmp_path / "kimi.service"
    unit.write_text(text)
    spec = tmp_path / "kimi.toml"
    shown = CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec), "--json"])
    assert shown.exit_code == 0
    doc = json.loads(shown.stdout)
    assert sorted(doc["secrets_moved"]) == ["HF_TOKEN", "VLLM_API_KEY"]
    assert "hf_zzz" not in shown.stdout + spec.read_text() and "sk-abc" not in shown.stdout + spec.read_text()
    env = tmp_path / "kimi.env"
    assert sorted(env.read_text().splitlines()) == ["HF_TOKEN=hf_zzz", "VLLM_API_KEY=sk-abc"]
    assert stat.S_IMODE(os.stat(env).st_mode) == 0o600
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope")
    body = spec.read_text()  # top-level keys go before the tables
    spec.write_text(f'command = ["{bin_dir}/python3", "-m", "vllm.entrypoints.openai.api_server"]\n'
                    f'servescope = "{bin_dir}/servescope"\n' + body)
    out = tmp_path / "units" / "kimi.service"
    assert CliRunner().invoke(app, ["service", "render", str(spec), "-o", str(out), "--mkdir"]).exit_code == 0
    rendered = out.read_text()
    assert "EnvironmentFile=-/etc/servescope/kimi.env" in rendered and "hf_zzz" not in rendered
    assert "secrets = [\"HF_TOKEN\", \"VLLM_API_KEY\"]" in body   # names only, in file order: the unit checks them
    assert "does not set HF_TOKEN" in rendered and "does not set VLLM_API_KEY" in rendered
    checked = verify(out.parent, out.name)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr


def test_import_of_a_non_engine_unit_exit_2(tmp_path: Path) -> None:
    unit = tmp_path / "x.service"
    unit.write_text("[Service]\nExecStart=/bin/sleep 100\n")
    result = CliRunner().invoke(app, ["service", "import", str(unit)])
    assert result.exit_code == 2 and "runs neither vLLM nor SGLang" in result.output


def test_write_import_puts_secrets_beside_the_spec(tmp_path: Path) -> None:
    """The function `service import -o` calls: the spec at the path, the secrets as NAME.env (0600) beside it,
    nothing more when the unit has none."""
    from servescope.deploy.importer import import_unit, spec_toml, write_import
    from servescope.deploy.lint import parse_unit

    text = ("[Service]\nEnvironment=HF_TOKEN=hf_zzz NCCL_ALGO=Ring\n"
            "ExecStart=/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m\n")
    result = import_unit(parse_unit(text, "kimi.service"))
    spec = tmp_path / "spec.toml"
    env = write_import(result, spec)
    assert env == tmp_path / "kimi.env" and env.read_text() == "HF_TOKEN=hf_zzz\n"
    assert stat.S_IMODE(os.stat(env).st_mode) == 0o600
    assert spec.read_text() == spec_toml(result) and "hf_zzz" not in spec.read_text()
    plain = import_unit(parse_unit(text.replace("HF_TOKEN=hf_zzz ", ""), "plain.service"))
    assert write_import(plain, tmp_path / "plain.toml") is None and not (tmp_path / "plain.env").exists()
