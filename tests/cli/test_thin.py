"""A thin CLI (issue 39, item 5): a command module parses, calls a feature function and gives the result through
``cli.common.emit`` (stdout, ``-o``, ``--html``): none writes stdout or a file itself. The place that does is
``cli/common.py``; ``cli/startup.py`` flushes stdout before its fast exit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import servescope.cli

CLI = Path(servescope.cli.__file__).parent
OWN_OUTPUT = re.compile(r"sys\.stdout\.(?:buffer\.)?write|write_(?:text|bytes)_atomic|\.write_(?:text|bytes)\(|"
                        r"\bprint_result\b")


def writes_itself(source: str) -> list[str]:
    """The lines of ``source`` that write stdout or a file other than through ``cli.common``."""
    return [line.strip() for line in source.splitlines() if OWN_OUTPUT.search(line)]


@pytest.mark.parametrize("path", sorted(p for p in CLI.glob("*.py") if p.name not in {"common.py", "startup.py"}),
                         ids=lambda p: p.name)
def test_a_command_module_writes_nothing_itself(path: Path) -> None:
    assert writes_itself(path.read_text(encoding="utf-8")) == []


def test_a_planted_write_is_found() -> None:
    planted = "    sys.stdout.buffer.write(encode(doc))\n    write_text_atomic(output, text)\n    emit(doc, render)\n"
    assert writes_itself(planted) == ["sys.stdout.buffer.write(encode(doc))", "write_text_atomic(output, text)"]
