"""analyze's plain route: with plain flags the command gets from servescope.cli.plain exactly the values typer's
parse gives it, and typer is never imported; anything it is not sure of goes to typer."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from servescope.cli import app, head_start, plain
from servescope.trace.read.files import example_trace_dir

EXAMPLE = example_trace_dir("vllm-cpu-tp2")
RANK0 = EXAMPLE / "rank0.pt.trace.json.gz"


def _command() -> click.Command:
    return get_command(app).commands["analyze"]  # type: ignore[attr-defined,no-any-return]


def _typer_values(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What typer's route hands plain.run for ``analyze ARGS`` (the command parsed by typer, run captured)."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(plain, "run", lambda **values: seen.update(values))
    result = CliRunner().invoke(app, ["analyze", *args])
    assert result.exit_code == 0, result.output
    return seen


def test_the_flags_are_the_commands_declaration() -> None:
    declared = {}
    for param in _command().params:
        if param.param_type_name != "option":
            continue
        kind = "flag" if param.is_flag else "paths" if param.multiple else None  # type: ignore[attr-defined]
        for name in param.opts:
            declared[name] = (param.name, kind)
    assert {name: (p, k if k in ("flag", "paths") else None) for name, (p, k) in plain.FLAGS.items()} == declared
    assert head_start.VALUE_OPTIONS == {name for name, (_, kind) in plain.FLAGS.items() if kind != "flag"}


def test_run_takes_the_commands_parameters_and_defaults() -> None:
    run = {name: p.default for name, p in inspect.signature(plain.run).parameters.items()}
    typer_defaults = {p.name: p.default for p in _command().params}
    assert run == typer_defaults


@pytest.mark.parametrize("args", [
    [str(RANK0)],
    [str(RANK0), "--json", "-o", "out.json"],
    ["--json", str(RANK0), str(EXAMPLE)],
    ["-o", "out.json", "--html", "page.html", str(EXAMPLE), "--top", "7"],
    ["--top=0", str(EXAMPLE), "--step-gap-us", "250.5"],
    ["--step-gap-us=3", "--taxonomy", "my.toml", str(RANK0)],
    ["--settings", "a.json", "--settings=b.json", str(RANK0), "--output=o.json"],
    ["--example"],
    ["--example-name", "vllm-cpu-tp2", "--json"],
    ["--example-name=h200-vllm-moe-b16", "--example", "missing.json.gz"],
    ["--top", "015", str(RANK0)],
])
def test_plain_arguments_give_what_typer_gives(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    monkeypatch.chdir(tmp_path)
    values = plain.parse(args)
    assert values is not None
    defaults = {name: p.default for name, p in inspect.signature(plain.run).parameters.items()}
    assert {**defaults, **values} == _typer_values(args, monkeypatch)


@pytest.mark.parametrize("args", [
    [],  # nothing named: the command's own error, through typer
    ["--help"], ["-h"], [str(RANK0), "--jsn"], ["--", str(RANK0)], ["-"], [""],
    [str(RANK0), "--top", "-1"], [str(RANK0), "--top=abc"], [str(RANK0), "--top", "1e3"],
    [str(RANK0), "--step-gap-us", "1e3"], [str(RANK0), "--step-gap-us", "-5"], [str(RANK0), "--step-gap-us=nan"],
    [str(RANK0), "-oout.json"], [str(RANK0), "--json=1"], [str(RANK0), "--json", "--json"],
    [str(RANK0), "-o", "a.json", "--output", "b.json"], [str(RANK0), "-o"], [str(RANK0), "--top", "5", "--top", "6"],
    [str(RANK0), "-o", "missing/out.json"], [str(RANK0), "--html", "missing/page.html"], [str(RANK0), "-o", ""],
    [str(RANK0), "--example-name", "--json"],
])
def test_anything_else_goes_to_typer(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert plain.parse(args) is None


_MODULES_AT_EXIT = """import os, sys
real_exit = os._exit
def named_exit(code):
    sys.stderr.write("modules: " + " ".join(sys.modules) + "\\n")
    sys.stderr.flush()
    real_exit(code)
os._exit = named_exit
sys.argv = ["servescope", *sys.argv[1:]]
from servescope.cli import main
main()
"""


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    proc = subprocess.run([sys.executable, "-c", _MODULES_AT_EXIT, "analyze", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "100"})
    imported = {m for line in proc.stderr.splitlines() if line.startswith("modules: ") for m in line.split()[1:]}
    return proc, imported


@pytest.mark.parametrize("mode", [["--json"], []], ids=["json", "text"])
def test_both_routes_write_the_same(mode: list[str], tmp_path: Path) -> None:
    """The plain route imports no typer; typer's route (a repeated --top makes it parse) prints and writes the same
    bytes, the analysis' time stamp aside."""
    plain_run, plain_modules = _run([str(EXAMPLE), *mode, "-o", "plain.json", "--top", "5"], tmp_path)
    typer_run, typer_modules = _run([str(EXAMPLE), *mode, "-o", "typer.json", "--top", "5", "--top", "5"], tmp_path)
    assert plain_run.returncode == typer_run.returncode == 0, plain_run.stderr + typer_run.stderr
    assert "typer" not in plain_modules and "servescope.cli.analyze" not in plain_modules
    assert "typer" in typer_modules and "servescope.cli.analyze" in typer_modules

    def stamp_free(text: str) -> str:
        import re

        return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "<created>", text)

    assert stamp_free(plain_run.stdout) == stamp_free(typer_run.stdout)
    assert stamp_free((tmp_path / "plain.json").read_text()) == stamp_free((tmp_path / "typer.json").read_text())
    assert [ln for ln in plain_run.stderr.splitlines() if not ln.startswith("modules: ")] == \
        [ln for ln in typer_run.stderr.splitlines() if not ln.startswith("modules: ")]


def test_a_failure_on_the_plain_route_is_typer_routes_line(tmp_path: Path) -> None:
    proc, imported = _run(["missing_rank0.pt.trace.json.gz", "--json"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "servescope: error: missing_rank0.pt.trace.json.gz: no such file" in proc.stderr
    assert "typer" not in imported


@pytest.mark.parametrize("args", [[""], [str(RANK0), "--taxonomy", ""], [str(RANK0), "-o", ""]])
def test_an_empty_argument_fails_in_one_line(args: list[str], tmp_path: Path) -> None:
    """``analyze "$TRACE"`` with the variable unset: typer reads the empty path as ".", so the command analyzed
    whatever the working folder held (here, a real trace: it used to exit 0). Now one line, exit 2, before anything is
    read."""
    import shutil

    shutil.copy(RANK0, tmp_path / RANK0.name)
    proc, imported = _run(args, tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert [ln for ln in proc.stderr.splitlines() if not ln.startswith("modules: ")] == [
        "servescope: error: an empty argument (an unset variable?): give trace files or directories, or --example"]
    assert "servescope.trace.read.readahead" not in imported  # nothing guessed, nothing decoded
