"""Atomic writes leave the mode a plain write would, or the one asked for, set before the file appears."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from servescope.core.atomic import write_bytes_atomic, write_text_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_what_open_would_give(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # the independent route: open() under this process's umask
    atomic = write_text_atomic(tmp_path / "report.html", "<html></html>")
    assert _mode(atomic) == _mode(plain)
    assert atomic.read_text() == "<html></html>"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "unit.service"
    target.write_text("old")
    target.chmod(0o640)
    write_bytes_atomic(target, b"new")
    assert (_mode(target), target.read_bytes()) == (0o640, b"new")


def test_an_asked_mode_wins(tmp_path: Path) -> None:
    target = tmp_path / "secrets.env"
    target.write_text("old")
    target.chmod(0o644)
    write_text_atomic(target, "TOKEN=x\n", mode=0o600)
    assert _mode(target) == 0o600


def test_a_missing_folder_is_never_made_unless_asked(tmp_path: Path) -> None:
    import pytest

    from servescope.core.errors import InputError

    target = tmp_path / "no" / "such" / "r.html"
    with pytest.raises(InputError, match=rf"^{target}: folder {tmp_path / 'no' / 'such'} does not exist$"):
        write_text_atomic(target, "x")
    assert list(tmp_path.iterdir()) == []
    assert write_text_atomic(target, "x", mkdir=True).read_text() == "x"
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputError, match="is not a folder"):
        write_text_atomic(blocker / "r.html", "x", mkdir=True)
