"""``servescope tune`` at the command line: bad input is one line and exit 2, secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app

from .toy import free_port, toy_command

runner = CliRunner()


def _one_error_line(args: list[str]) -> str:
    result = runner.invoke(app, ["tune", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("servescope: error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(("args", "says"), [
    ([], "--launch/--unit: give exactly one"),
    (["--launch", "x", "--unit", "y"], "--launch/--unit: give exactly one"),
    (["--launch", "vllm serve m", "--slo", "ttft_p42=3"], "unknown statistic"),
    (["--launch", "vllm serve m", "--budget", "soon"], "--budget: 'soon' is not a duration"),
    (["--launch", "vllm serve m", "--env", "NOEQUALS"], "--env: 'NOEQUALS' is not NAME=VALUE"),
    (["--launch", "vllm 'serve"], "--launch: not a command line"),
    (["--unit", "vllm-test"], "--yes: restarting a unit needs --yes"),
])
def test_bad_input_is_one_line(args: list[str], says: str, tmp_path: Path) -> None:
    assert says in _one_error_line([*args, "--journal", str(tmp_path / "j.json")])


def test_restore_without_a_journal(tmp_path: Path) -> None:
    assert "cannot read the journal" in _one_error_line(["--restore", "--journal", str(tmp_path / "none.json")])


def test_a_cut_off_run_is_not_overwritten(tmp_path: Path) -> None:
    journal = tmp_path / "j.json"
    journal.write_text('{"schema": "servescope.tune_journal", "schema_version": 1, "state": "running", '
                       '"kind": "launch", "url": "http://127.0.0.1:1", "argv": ["x"], "env": {}, "options": {}}')
    line = _one_error_line(["--launch", "vllm serve m", "--journal", str(journal)])
    assert "--resume continues it, --restore undoes it" in line


def test_a_server_that_fails_as_it_is_names_why_without_its_key(tmp_path: Path) -> None:
    key = "sk-servescope-test-0123456789"
    line = _one_error_line(["--launch", toy_command(free_port(), "--api-key", key), "--journal",
                            str(tmp_path / "j.json"), "--ready-timeout", "60", "--quiet"])
    assert "did not start" in line and "unrecognized arguments" in line
    assert key not in line


def test_analyze_names_the_catalogues_next_step() -> None:
    capture = Path(__file__).resolve().parents[1] / "data" / "h200-vllm" / "ab" / "dense-eager-b16"
    result = runner.invoke(app, ["analyze", str(capture)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    tail = result.output[result.output.index("next steps"):]
    # the server ran --enforce-eager (its settings document beside the trace): graphs are the step to try
    assert "--enforce-eager removed: CUDA graphs on" in tail
    assert "async" not in tail  # on by vLLM 0.26's default: in place, not named
