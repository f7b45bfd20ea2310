"""The entry point: typer declares every command, ``main()`` loads only the module of the one it runs.

analyze, report and diff were declared once by a hand-written flag table (and ``analyze`` parsed without
typer); their flags are listed here as they were, so that the typer declarations keep every one, in order.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from servescope.cli import COMMAND_MODULES, app
from servescope.trace.read.files import discover_traces, example_trace_dir

# the project's own capture (a real vLLM TP=2 run on the CPU, 90 KB): these run on any clone
SMALL = example_trace_dir("vllm-cpu-tp2") / "rank0.pt.trace.json.gz"

# What `--help` listed before the commands moved to typer declarations (326a414).
FLAGS_BEFORE = {
    "analyze": ["--example", "--example-name", "--json", "--output", "-o", "--html", "--taxonomy", "--step-gap-us",
                "--top", "--help"],
    "report": ["--html", "--top", "--json", "--help"],
    "diff": ["--phase", "--json", "--taxonomy", "--help"],
}
ARGUMENTS_BEFORE = {"analyze": "[OPTIONS] [paths]...", "report": "[OPTIONS] {document}",
                    "diff": "[OPTIONS] {before} {after}"}


@pytest.mark.parametrize("command", sorted(FLAGS_BEFORE))
def test_help_lists_the_flags_it_listed_before(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"Usage: servescope {command} {ARGUMENTS_BEFORE[command]}" in result.output
    options = result.output[result.output.index("Options"):]
    listed = re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)(?=\s)", options)
    assert [flag for flag in listed if flag in FLAGS_BEFORE[command]] == FLAGS_BEFORE[command]  # new ones may join


def test_every_command_is_in_the_table_main_loads_from() -> None:
    """A command missing from COMMAND_MODULES would still run, through the whole app; the table keeps
    ``main()`` to the one module."""
    from typer.main import get_command

    group = get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    assert list(group.commands) == list(COMMAND_MODULES)


# main() as the console script runs it, with os._exit (how a successful analyze ends) first naming every
# module the process imported; forked children name theirs too, a subset.
_MAIN_NAMING_MODULES = """import os, sys
real_exit = os._exit
def named_exit(code):
    sys.stderr.write("modules: " + " ".join(sys.modules) + "\\n")
    sys.stderr.write("blas threads: " + os.environ.get("OPENBLAS_NUM_THREADS", "unset") + "\\n")
    sys.stderr.flush()
    real_exit(code)
os._exit = named_exit
sys.argv = ["servescope", *sys.argv[1:]]
from servescope.cli import main
main()
"""


def test_analyze_imports_no_other_command_module_and_no_rich(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", _MAIN_NAMING_MODULES, "analyze", str(SMALL), "--json", "-o",
                           str(target)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    imported = {m for line in proc.stderr.splitlines() if line.startswith("modules: ") for m in line.split()[1:]}
    assert {"servescope.cli.plain", "servescope.trace.analyze", "numpy"} <= imported  # the route ran
    # plain flags: no typer either (servescope.cli.plain), so not even analyze's typer declaration
    others = {f"servescope.cli.{m}" for modules in COMMAND_MODULES.values() for m in modules} | {"typer"}
    # pydantic: typer 0.29+ converts every parameter through it (~1/5 of the command); pyproject pins typer below
    assert not (others | {"rich", "plotly", "torch", "pydantic"}) & imported
    assert target.read_bytes().startswith(b"{") and proc.stdout.startswith("{")
    # numpy's BLAS starts no thread pool for a command that does no linear algebra
    assert "blas threads: 1" in proc.stderr.splitlines()


def test_analyze_keeps_the_users_blas_threads(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _MAIN_NAMING_MODULES, "analyze", str(SMALL), "--json", "-o",
                           str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "blas threads: 3" in proc.stderr.splitlines()


@pytest.mark.parametrize(("argv", "says"), [
    (["analyze", "missing_rank0.pt.trace.json.gz", "--json"], "missing_rank0.pt.trace.json.gz"),
    (["analyze", "--json"], "give trace files or directories, or --example"),
    (["analyze", str(SMALL), "--top", "-1"], "--top"),
    (["analyze", str(SMALL), "--jsn"], "--jsn"),
], ids=["missing file", "no input", "bad value", "unknown flag"])
def test_bad_input_through_main_is_exit_2_without_a_traceback(argv: list[str], says: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "servescope", *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert says in proc.stderr


def test_the_traces_decode_before_typer_is_imported_and_are_read_whole(tmp_path: Path) -> None:
    """analyze's head start: a read-ahead child forked before typer's import decodes the traces the command then
    reads; every file arrives whole."""
    example = example_trace_dir("vllm-cpu-tp2")
    target = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", _MAIN_NAMING_MODULES, "analyze", "--json", str(example), "-o",
                           str(target)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = [set(line.split()[1:]) for line in proc.stderr.splitlines() if line.startswith("modules: ")]
    assert len(imported) > 1  # the command and a child forked by the head start
    assert all("typer" not in modules for modules in imported)  # plain flags: typer is never imported
    # every file read whole: its event count as json.load counts it
    doc = json.loads(target.read_text())
    read = {Path(trace["path"]).resolve(): trace["events"] for trace in doc["traces"]}
    assert read == {path: len(json.load(gzip.open(path))["traceEvents"]) for path in discover_traces([example])}
