"""Output paths are never created silently: every output option of every command refuses a missing folder in one
line naming the option and the path (exit 2, before any work, nothing made); `--mkdir` makes it where declared.

The commands are found by walking the app, so a command added later is checked too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from servescope.cli import app
from servescope.cli.common import OUTPUT_OPTIONS

RECORDED = Path(__file__).resolve().parents[1] / "data" / "h200-vllm" / "recorded" / "settings-dense.json"
_DUMMY = {"int": "1", "integer": "1", "float": "1", "path": "x", "text": "x"}


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    subs = getattr(command, "commands", None)
    if subs:
        return [found for name, sub in subs.items() for found in _commands(sub, (*path, name))]
    return [(path, command)]


def _cases() -> list[tuple[tuple[str, ...], list[str], str]]:
    """(command, the words its required parameters need, output option) for each output option."""
    cases = []
    for path, command in _commands(typer.main.get_command(app)):
        required: list[str] = []
        for param in command.params:
            if param.required and param.param_type_name == "argument":
                required.append("http://127.0.0.1:9" if param.name == "url" else "x")  # a URL is checked as parsed
            elif param.required and not OUTPUT_OPTIONS & set(param.opts):
                required += [param.opts[0], _DUMMY.get(param.type.name, "x")]
        for param in command.params:
            if param.param_type_name == "option" and OUTPUT_OPTIONS & set(param.opts):
                cases.append((path, required, param.opts[0]))
    return cases


CASES = _cases()


def test_the_walk_finds_the_commands_the_issue_names() -> None:
    found = {(" ".join(path), option) for path, _, option in CASES}
    assert {("report", "--html"), ("analyze", "--output"), ("bench comm", "--json-out"), ("bench serve", "--png"),
            ("bench comm", "--env-out"), ("service render", "--output"), ("service import", "--output")} <= found


@pytest.mark.parametrize(("path", "required", "option"), CASES, ids=[f"{' '.join(p)} {o}" for p, _, o in CASES])
def test_a_missing_output_folder_is_one_line_exit_2(tmp_path: Path, path: tuple[str, ...], required: list[str],
                                                     option: str) -> None:
    folder = tmp_path / "nonexistent" / "dir"
    target = folder / "out.file"
    result = CliRunner().invoke(app, [*path, *required, option, str(target)])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"servescope: error: {option} {target}: folder {folder} does not exist: create it")
    assert not (tmp_path / "nonexistent").exists()


def test_the_issue_repro_in_a_real_process(tmp_path: Path) -> None:
    """`report x.json --html /nonexistent/dir/r.html`: before, the folder was made and the whole text printed."""
    target = tmp_path / "nonexistent" / "dir" / "r.html"
    result = subprocess.run([sys.executable, "-m", "servescope", "report", str(RECORDED), "--html", str(target)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"servescope: error: --html {target}: folder {target.parent} does not exist: "
                             "create it first\n")
    assert not (tmp_path / "nonexistent").exists()


def test_report_html_writes_the_page_and_prints_one_line(tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    result = subprocess.run([sys.executable, "-m", "servescope", "report", str(RECORDED), "--html", str(target)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote {target} (HTML of {RECORDED})\n"
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_mkdir_makes_the_folder_where_a_command_declares_it(tmp_path: Path) -> None:
    unit = tmp_path / "u.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/vllm serve m/M --max-model-len 4096\n")
    spec = tmp_path / "new" / "folder" / "u.toml"
    refused = CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec)])
    assert refused.exit_code == 2 and refused.stderr.rstrip().endswith("create it, or pass --mkdir")
    made = CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec), "--mkdir"])
    assert made.exit_code == 0, made.output
    assert spec.is_file() and 'model = "m/M"' in spec.read_text()
