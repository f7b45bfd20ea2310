"""User errors through the CLI: exit 2, one stderr line ``servescope: error: FILE: problem``, no traceback.

Broken inputs are made in tmp_path from the bytes of real traces. Most cases run in-process with
``CliRunner`` (whose result keeps stdout and stderr apart); one runs ``python -m servescope`` for real.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from servescope.cli import app
from servescope.trace.analyze import example_trace_dir

runner = CliRunner()
# the project's own capture (a real vLLM TP=2 run on the CPU, 90 KB): these run on any clone
SMALL = example_trace_dir("vllm-cpu-tp2") / "rank0.pt.trace.json.gz"
PREFIX = "servescope: error: "


def _assert_one_line_error(stdout: str, stderr: str, exit_code: int, *words: str) -> str:
    """The single stderr line; checks the exit code, the prefix, the words and the absence of a traceback."""
    assert exit_code == 2, f"exit {exit_code}\nstdout: {stdout}\nstderr: {stderr}"
    assert "Traceback" not in stdout and "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"want one stderr line, got {len(lines)}: {stderr!r}"
    line = lines[0]
    assert line.startswith(PREFIX), line
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert stdout == "", f"a failed command printed to stdout: {stdout!r}"
    return line


def _user_error(result: Result, *words: str) -> str:
    # The CLI ends with typer.Exit (SystemExit); any other exception escaped the error handling.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return _assert_one_line_error(result.stdout, result.stderr, result.exit_code, *words)


def _analyze(*args: str | Path) -> Result:
    return runner.invoke(app, ["analyze", *map(str, args)])


# --- analyze: trace inputs -----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "rank0.pt.trace.json.gz"
    _user_error(_analyze(missing), str(missing), "no such file")


def test_missing_file_subprocess(tmp_path: Path) -> None:
    """The real entry point: ``python -m servescope``, a fresh interpreter, real file descriptors."""
    missing = tmp_path / "run" / "rank1.pt.trace.json.gz"
    proc = subprocess.run([sys.executable, "-m", "servescope", "analyze", str(missing)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    _assert_one_line_error(proc.stdout, proc.stderr, proc.returncode, str(missing), "no such file")


def test_truncated_gzip(tmp_path: Path) -> None:
    raw = SMALL.read_bytes()
    cut = tmp_path / "rank0.json.gz"
    cut.write_bytes(raw[: len(raw) // 2])
    _user_error(_analyze(cut), str(cut), "truncated gzip")


def test_truncated_json(tmp_path: Path) -> None:
    text = gzip.decompress(SMALL.read_bytes())
    cut = tmp_path / "rank0.json"
    cut.write_bytes(text[: len(text) // 2])
    _user_error(_analyze(cut), str(cut), "invalid JSON")


@pytest.mark.parametrize("text", ['{"a": 1}', "[1, 2, 3]", "42"])
def test_json_that_is_not_a_trace(tmp_path: Path, text: str) -> None:
    other = tmp_path / "config.json"
    other.write_text(text)
    _user_error(_analyze(other), str(other), "not a profiler trace")


def test_trace_with_string_timestamps(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(SMALL.read_bytes()))
    doc["traceEvents"] = [dict(ev, ts=str(ev.get("ts", 0))) for ev in doc["traceEvents"]]
    bad = tmp_path / "rank0.json"
    bad.write_text(json.dumps(doc))
    _user_error(_analyze(bad), str(bad), "not a profiler trace", "ts")


def test_empty_trace(tmp_path: Path) -> None:
    empty = tmp_path / "rank0.json"
    empty.write_text('{"traceEvents": []}')
    _user_error(_analyze(empty), str(empty), "empty")


def test_bad_file_inside_a_directory_is_left_out_and_named(tmp_path: Path) -> None:
    """Issue 37: the rest of the folder is analysed; the damaged file is named with why; alone it is an error."""
    raw = SMALL.read_bytes()
    (tmp_path / "rank0.json.gz").write_bytes(raw)
    bad = tmp_path / "rank1.json.gz"
    bad.write_bytes(raw[:1000])
    result = _analyze(tmp_path)
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert "left out " in result.stdout and f"{bad.name}: truncated gzip" in result.stdout  # its path cut at the start
    assert "rank 0" in result.stdout
    _user_error(_analyze(bad), str(bad), "truncated gzip")


def test_directory_without_traces(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the traces are elsewhere")
    _user_error(_analyze(tmp_path), str(tmp_path), "no trace files")


def test_long_path_stays_one_line(tmp_path: Path) -> None:
    """Rich must not wrap the message at the console width: a long path is still one line."""
    missing = tmp_path / ("very_long_directory_name_" * 8) / ("rank0_" * 20 + ".pt.trace.json.gz")
    _user_error(_analyze(missing), str(missing))


def test_path_with_brackets_is_printed_verbatim(tmp_path: Path) -> None:
    missing = tmp_path / "rank[0][bold]x[/bold].json"
    _user_error(_analyze(missing), str(missing))


def test_path_with_emoji_code_is_printed_verbatim(tmp_path: Path) -> None:
    missing = tmp_path / "run:smile:1.json"
    _user_error(_analyze(missing), str(missing))


# --- analyze: no inputs, options ------------------------------------------------------------------------


def test_no_arguments_at_all_shows_usage() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage:" in result.output
    assert "analyze" in result.output
    assert "Traceback" not in result.output


def test_analyze_without_paths() -> None:
    _user_error(_analyze(), "give trace files or directories")


def test_taxonomy_invalid_toml(tmp_path: Path) -> None:
    bad = tmp_path / "kernels.toml"
    bad.write_text('version = 1\n[[rule]\ncategory = "gemm"\n')
    _user_error(_analyze(SMALL, "--taxonomy", bad), str(bad), "TOML")


def test_taxonomy_missing(tmp_path: Path) -> None:
    missing = tmp_path / "kernels.toml"
    _user_error(_analyze(SMALL, "--taxonomy", missing), str(missing), "no such file")


def test_taxonomy_that_is_a_trace(tmp_path: Path) -> None:
    """A common slip: the trace given as --taxonomy (binary gzip, not UTF-8 TOML)."""
    _user_error(_analyze(SMALL, "--taxonomy", SMALL), str(SMALL))


def test_output_path_is_a_directory(tmp_path: Path) -> None:
    _user_error(_analyze(SMALL, "-o", tmp_path), str(tmp_path))


def test_html_path_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "report"
    blocker.write_text("a file, not a folder")
    _user_error(_analyze(SMALL, "--html", blocker / "index.html"), str(blocker))


# --- report: a saved analysis --------------------------------------------------------------------------


def test_report_on_a_trace(tmp_path: Path) -> None:
    """A trace is JSON, but not a saved analysis."""
    trace = tmp_path / "rank0.json"
    trace.write_bytes(gzip.decompress(SMALL.read_bytes()))
    _user_error(runner.invoke(app, ["report", str(trace)]), str(trace), "not a servescope analysis")


def test_report_on_a_gzipped_trace() -> None:
    _user_error(runner.invoke(app, ["report", str(SMALL)]), str(SMALL), "not a servescope analysis")


@pytest.mark.parametrize("text", ["", '{"a": 1}', "[]", "not json"])
def test_report_on_other_files(tmp_path: Path, text: str) -> None:
    other = tmp_path / "analysis.json"
    other.write_text(text)
    _user_error(runner.invoke(app, ["report", str(other)]), str(other), "not a servescope analysis")


def test_report_on_a_truncated_saved_analysis(tmp_path: Path) -> None:
    saved = tmp_path / "analysis.json"
    made = _analyze(SMALL, "-o", saved, "--json")
    assert made.exit_code == 0, made.output
    whole = saved.read_bytes()
    assert runner.invoke(app, ["report", str(saved)]).exit_code == 0
    saved.write_bytes(whole[: len(whole) // 2])
    _user_error(runner.invoke(app, ["report", str(saved)]), str(saved), "not a servescope analysis")


def test_report_on_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "analysis.json"
    _user_error(runner.invoke(app, ["report", str(missing)]), str(missing))


def test_report_on_a_directory(tmp_path: Path) -> None:
    _user_error(runner.invoke(app, ["report", str(tmp_path)]), str(tmp_path))


@pytest.mark.parametrize("command", [["bench", "gemm"], ["bench", "comm"]])
def test_every_batch_given_is_read(command: list[str]) -> None:
    """`--batch x --batch 1`: the first value is read too (a plain option kept only the last, `1`, and ran the bench
    on it), so the bad one is named in one line and nothing runs."""
    result = runner.invoke(app, [*command, "--model", "llama-3-8b", "--batch", "x", "--batch", "1"])
    assert result.exit_code == 2
    assert "--batch: not a comma-separated list of integers: 'x,1'" in result.output


@pytest.mark.parametrize("command", [["bench", "gemm"], ["bench", "comm"]])
def test_a_batch_below_one_is_one_line(command: list[str]) -> None:
    """`--batch 0`: no decode step has no request; refused like plan's, before anything runs."""
    result = runner.invoke(app, [*command, "--model", "llama-3-8b", "--batch", "0"])
    assert result.exit_code == 2
    assert result.output.strip() == "servescope: error: --batch: expected integers from 1 to 1048576, got '0'"


def _url_commands() -> list[tuple[list[str], bool]]:
    """Every command that takes a server URL: its words, and whether the URL is an argument (else ``--url``)."""
    import typer.main

    found: list[tuple[list[str], bool]] = []

    def walk(command: Any, words: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*words, name])
        for param in command.params:
            if param.name == "url":
                found.append((words, param.param_type_name == "argument"))

    walk(typer.main.get_command(app), [])
    return found


def test_every_command_that_takes_a_url_says_in_one_line_when_it_is_not_one() -> None:
    """``http://[::1`` (an IPv6 host left open) is no URL: each command says so before it acts (looks for the
    server's process, starts a server); bench serve and profile had raised Python's ValueError."""
    commands = _url_commands()
    assert {" ".join(words) for words, _ in commands} >= {"bench serve", "profile", "health", "tune", "settings"}
    for words, positional in commands:
        bad = "http://[::1"
        result = runner.invoke(app, [*words, bad] if positional else [*words, "--url", bad])
        _assert_one_line_error(result.stdout, result.stderr, result.exit_code, bad, "not a server URL")
