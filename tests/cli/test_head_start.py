"""analyze's head start: traces guessed from the raw arguments decode while typer imports; the command takes
them only when it reads exactly those files."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from servescope.cli import app, head_start
from servescope.trace.files import discover_traces, example_trace_dir

EXAMPLE = example_trace_dir("vllm-cpu-tp2")
RANK0 = EXAMPLE / "rank0.pt.trace.json.gz"


def test_value_options_are_the_commands_options_that_take_a_value() -> None:
    command = get_command(app).commands["analyze"]  # type: ignore[attr-defined]
    declared = {name for param in command.params if param.param_type_name == "option" and not param.is_flag
                for name in param.opts}
    assert declared == head_start.VALUE_OPTIONS


@pytest.mark.parametrize(("args", "named"), [
    ([str(RANK0), "--json", "-o", "out.json"], [RANK0]),
    (["--json", str(RANK0)], [RANK0]),
    (["-o", str(EXAMPLE / "rank1.pt.trace.json.gz"), str(RANK0)], [RANK0]),  # a value, not a trace
    (["--top=5", str(EXAMPLE)], [EXAMPLE]),
    (["--example-name", "vllm-cpu-tp2"], [EXAMPLE]),
    (["--example-name=vllm-cpu-tp2", "--json"], [EXAMPLE]),
    (["--example"], [example_trace_dir()]),
    (["--", str(RANK0)], [RANK0]),
])
def test_guess_names_what_the_command_will_read(args: list[str], named: list[Path]) -> None:
    assert head_start.guess(args) == discover_traces(named)


@pytest.mark.parametrize("args", [[], ["--json"], ["--help", str(RANK0)], ["/no/such/trace.json"],
                                  ["--example-name", "no-such-example"]])
def test_no_guess_where_the_arguments_name_nothing_readable(args: list[str]) -> None:
    assert head_start.guess(args) is None


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_wrong_guess_is_stopped_and_not_handed_out() -> None:
    head_start.start([str(EXAMPLE)])
    pending = head_start._pending
    assert pending is not None
    pids = [child.pid for child in pending._children]
    assert head_start.claim([RANK0]) is None
    assert all(_reaped(pid) for pid in pids)
    assert head_start.claim(discover_traces([EXAMPLE])) is None  # claimed once, then gone


def test_a_right_guess_is_handed_out_once() -> None:
    head_start.start([str(EXAMPLE), "--json"])
    found = discover_traces([EXAMPLE])
    with head_start.claim(found) as read_ahead:  # type: ignore[union-attr]
        kernels = [read_ahead.take(path) for path in found]
    assert len(kernels) == len(found)
    assert head_start.claim(found) is None


# main() as the console script runs it; os._exit (how a successful analyze ends, and how read-ahead children end)
# first names whether typer was imported in that process.
_MAIN = """import os, sys
real_exit = os._exit
def named_exit(code):
    sys.stderr.write(f"process {os.getpid()} typer={'typer' in sys.modules}\\n")
    sys.stderr.flush()
    real_exit(code)
os._exit = named_exit
sys.argv = ["servescope", *sys.argv[1:]]
from servescope.cli import main
main()
"""


def test_main_decodes_before_typer_is_imported_and_the_result_is_the_traces(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", _MAIN, "analyze", "--json", str(EXAMPLE), "-o", str(target)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ends = [line for line in proc.stderr.splitlines() if line.startswith("process ")]
    assert any(line.endswith("typer=False") for line in ends), ends  # a child forked before typer's import
    assert any(line.endswith("typer=True") for line in ends), ends  # the command itself
    # every file read whole: its event count as json.load counts it
    doc = json.loads(target.read_text())
    read = {Path(trace["path"]).resolve(): trace["events"] for trace in doc["traces"]}
    assert read == {path: len(json.load(gzip.open(path))["traceEvents"]) for path in discover_traces([EXAMPLE])}
