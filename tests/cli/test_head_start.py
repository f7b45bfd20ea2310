"""analyze's head start: traces guessed from the raw arguments decode while typer imports; the command takes
them only when it reads exactly those files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.main import get_command

from servescope.cli import app, head_start
from servescope.trace.read.files import discover_traces, example_trace_dir

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


def test_ctrl_c_while_the_head_start_forks_stops_it_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """An interrupt in the command's first milliseconds (the traces found and their children just forked) ends in
    main's handler: one line, exit 130, the children stopped. It used to come before the handler: a traceback, and
    the children left to finish."""
    import gc
    import sys

    from servescope.cli import main

    started = head_start.start
    pids: list[int] = []

    def start_then_interrupted(args: list[str]) -> None:
        started(args)
        pending = head_start._pending
        pids.extend(child.pid for child in (pending._children if pending is not None else []))
        raise KeyboardInterrupt

    monkeypatch.setattr(head_start, "start", start_then_interrupted)
    monkeypatch.setattr(sys, "argv", ["servescope", "analyze", str(EXAMPLE), "--json"])
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # what analyze's start-up sets, undone after the test
    collecting = gc.isenabled()
    try:
        with pytest.raises(SystemExit) as ended:
            main()
    finally:
        if collecting:  # analyze's start-up turns the collector off for its one process; this one goes on
            gc.enable()
    assert ended.value.code == 130
    assert capsys.readouterr().err.strip() == "servescope: interrupted"
    assert head_start._pending is None
    assert all(_reaped(pid) for pid in pids)
