"""Spec loading: strict keys and types, defaults from the data file, inline secrets refused."""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.errors import InputError
from servescope.deploy.spec import engine_args, load_spec, parse_spec

BASE = 'name = "svc"\nmodel = "m/M"\n'


def test_defaults_come_from_the_data_file() -> None:
    data = tomllib.loads(files("servescope").joinpath("data", "deploy", "defaults.toml").read_text())
    spec = parse_spec(BASE, "s.toml")
    assert spec.guard.max_used_mib == data["guard"]["max_used_mib"]
    assert spec.restart.burst == data["restart"]["burst"]
    engines = tomllib.loads(files("servescope").joinpath("data", "engines.toml").read_text())["engine"]
    assert spec.engine_command == next(e["command"] for e in engines if e["id"] == "vllm")


def test_args_table_keeps_order_and_flags() -> None:
    spec = parse_spec(BASE + '[args]\nzeta = 1\nalpha = "x"\nenforce-eager = true\nskipped = false\n'
                      'extra = ["a", "b"]\n', "s.toml")
    assert engine_args(spec) == ["--model", "m/M", "--zeta", "1", "--alpha", "x", "--enforce-eager",
                                 "--extra", "a", "b"]


@pytest.mark.parametrize(("text", "expected"), [
    (BASE + "colour = 1\n", "s.toml: colour: unknown key"),
    (BASE + "[guard]\ntimeout_s = \"ten\"\n", "s.toml: guard.timeout_s: expected int, got str"),
    ('name = "svc"\n', "s.toml: model: missing required key"),
    (BASE + 'engine = "tgi"\n', "s.toml: engine: invalid enum value 'tgi'; allowed: vllm, sglang"),
    (BASE + "[env]\nHF_TOKEN = \"hf_abc\"\n", "s.toml: env.HF_TOKEN: a secret inline"),
    (BASE + "args = [\"--api-key\", \"k\"]\n", "s.toml: args: --api-key inline"),
    (BASE + "= broken\n", "s.toml: not valid TOML"),
    (BASE + 'secrets = ["VLLM_API_KEY"]\n', "s.toml: secrets: names the variables env_file sets, but there is "
     "no env_file"),
    (BASE + 'env_file = "/etc/x.env"\nsecrets = ["VLLM API KEY"]\n', "s.toml: secrets: 'VLLM API KEY' is not a "
     "variable name"),
])
def test_bad_spec_is_one_clear_line(text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse_spec(text, "s.toml")
    assert str(info.value).startswith(expected)
    assert "hf_abc" not in str(info.value)


def test_cli_bad_spec_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(BASE + "[restart]\nburst = 2\nwhen = 3\n")
    result = CliRunner().invoke(app, ["service", "render", str(spec)])
    assert result.exit_code == 2
    assert result.output.strip() == f"servescope: error: {spec}: restart.when: unknown key"
    missing = CliRunner().invoke(app, ["service", "render", str(tmp_path / "none.toml")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_load_spec_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_spec(tmp_path / "nope.toml")


@pytest.mark.parametrize(("table", "problem"), [
    ('[extra.Service]\nType = ["notify"]\n', "extra.Service.Type: render writes Type= itself"),
    ('[extra.Service]\nRestartSec = ["5"]\n', "extra.Service.RestartSec: render writes RestartSec= itself (set "
                                              "restart.delay_s)"),
    ('[extra.Service]\nEnvironment = ["A=1"]\n', "extra.Service.Environment: render writes Environment= itself"),
    ('[extra."Bad Section"]\nX = ["1"]\n', "extra.Bad Section.X: not a unit section and directive name"),
    ('start_timeout_s = 0\n', "start_timeout_s: must be > 0"),
])
def test_extra_cannot_set_what_render_writes(table: str, problem: str) -> None:
    text = BASE.replace('model = "m/M"\n', 'model = "m/M"\n' + (table if not table.startswith("[") else ""))
    text += table if table.startswith("[") else ""
    with pytest.raises(InputError, match="^s.toml: " + problem.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(text, "s.toml")


def test_extra_adds_to_list_valued_directives() -> None:
    spec = parse_spec(BASE + '[extra.Service]\nExecStartPre = ["/bin/true"]\nNice = ["-5"]\n', "s.toml")
    assert spec.extra == {"Service": {"ExecStartPre": ["/bin/true"], "Nice": ["-5"]}}
