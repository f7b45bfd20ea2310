"""Every command's ``--help`` as a terminal shows it at 80 and 120 columns (and 200, to see paragraphs reflow).

The command tree is walked from the typer app, so a new command is checked without being named here: it
renders (exit 0, typer's own usage line, not another parser's), every option and argument says what it is for,
no Markdown or reST markup is shown literally, every ``[`` of an entry is closed in that entry (a long
``[default: …]`` cropped at 80 columns left one open), no word of a help text is lost, and a description's
paragraphs are reflowed to the terminal rather than broken where the docstring's lines end.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from servescope.cli import app

runner = CliRunner()
ROOT = typer.main.get_command(app)
BOX = "│╭╰─╮╯"


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _walk(sub, (*path, name))


COMMANDS = dict(_walk(ROOT))


def _help(path: tuple[str, ...], columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)  # a $TERMINAL_WIDTH of the caller's would win
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns), "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    return result.output


def _description(text: str) -> list[str]:
    """The lines between the usage line and the first panel: the command's help text as rendered."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    return [line for line in lines[start:end] if line.strip()]


def _entries(text: str) -> list[str]:
    """Each option / argument / command entry of the panels (its lines joined), and each description paragraph."""
    groups: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.startswith("│"):
            inner = line.strip("│").rstrip()
            if inner[:2].strip():  # a new entry starts in the first columns (its name, or * when required)
                groups.append([])
            groups[-1].append(inner)
        elif not line.strip() or line[0] in BOX:
            groups.append([])
        else:
            groups[-1].append(line)
    return [" ".join(g) for g in groups if g]


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[\s│]+", text) if w}


def _plain(help_text: str) -> list[str]:
    """The words of a help text as the terminal should show them: Markdown's code backticks gone."""
    return inspect.cleandoc(help_text.replace("``", "`").replace("`", "")).split()


IDS = [" ".join(path) or "servescope" for path in COMMANDS]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_help_renders_every_option_described_without_markup(path: tuple[str, ...], columns: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    text = _help(path, columns, monkeypatch)
    assert re.search(rf"^ Usage: servescope{''.join(' ' + p for p in path)} ", text, re.M), text[:300]
    assert max(len(line) for line in text.splitlines()) <= columns
    for param in COMMANDS[path].params:
        assert (getattr(param, "help", None) or "").strip(), f"{param.opts} has no help"
    assert "`" not in text and "\b" not in text, [line for line in text.splitlines() if "`" in line]
    unbalanced = [entry for entry in _entries(text) if not _balanced(entry)]
    assert not unbalanced


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_no_word_of_a_help_text_is_lost(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Markup is rendered, never eaten: each word of the command's help and of each option's is on screen."""
    shown = _words(_help(path, 200, monkeypatch))
    command = COMMANDS[path]
    texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
    texts += [sub.help or "" for sub in getattr(command, "commands", {}).values() if not sub.hidden]
    if getattr(command, "commands", None):  # a group's list shows each command's first paragraph only
        texts = [texts[0].split("\n\n")[0], *texts[1:-len(command.commands)],
                 *[t.split("\n\n")[0] for t in texts[-len(command.commands):]]]
    missing = [w for text in texts for w in _plain(text) if w not in shown]
    assert not missing


@pytest.mark.parametrize("path", [p for p, c in COMMANDS.items() if len(inspect.cleandoc(c.help or "")) > 160],
                         ids=lambda p: " ".join(p))
def test_a_long_description_reflows_to_the_terminal(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Wider terminal, fewer lines; at 200 columns each paragraph takes the lines its length needs, not one per
    docstring line."""
    narrow, wide = (_description(_help(path, columns, monkeypatch)) for columns in (80, 200))
    assert len(wide) < len(narrow)
    paragraphs = inspect.cleandoc(COMMANDS[path].help or "").split("\n\n")
    assert len(wide) <= sum(math.ceil(len(p) / 180) for p in paragraphs), wide


def test_bench_comm_names_its_default_ops_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default list, one 50-character word, was cropped to ``[default: all_reduce,all_gather,…``."""
    ops = next(e for e in _entries(_help(("bench", "comm"), 80, monkeypatch)) if e.lstrip().startswith("--ops"))
    assert "…" not in ops and "[default: (all four)]" in ops
    assert {"all_reduce,", "all_gather,", "reduce_scatter,", "all_to_all."} <= _words(ops)
