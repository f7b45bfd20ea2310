"""The house keeps every module readable top-down: none over 500 lines (issue 25)."""

from __future__ import annotations

from pathlib import Path

LIMIT = 500
SRC = Path(__file__).resolve().parents[1] / "src" / "servescope"


def test_no_module_is_over_500_lines() -> None:
    sizes = {p.relative_to(SRC).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in SRC.rglob("*.py")}
    assert len(sizes) > 100  # the package, not an empty folder
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines: {over}"
