"""Optional dependencies: every extra a message names exists and installs what its commands import; without
it a command says so in one line and exits 2 (no traceback)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _named_extras() -> set[str]:
    names = set()
    for path in [*(ROOT / "src").rglob("*.py"), ROOT / "README.md"]:
        names |= set(re.findall(r"servescope\[(\w+)\]", path.read_text(encoding="utf-8")))
        names |= set(re.findall(r'require_extra\([^,]+, "(\w+)"', path.read_text(encoding="utf-8")))
    return names


def test_every_extra_named_exists() -> None:
    named = _named_extras()
    assert {"bench", "capture"} <= named
    assert named <= set(EXTRAS), f"named but not in pyproject: {named - set(EXTRAS)}"


def test_bench_and_capture_extras_install_what_their_commands_import() -> None:
    def dists(extra: str) -> set[str]:
        return {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() for req in EXTRAS[extra]}

    assert "torch" in dists("bench")
    assert {"torch", "transformers"} <= dists("capture")


# torch (and transformers) made unimportable, as in an install without the extra
_BLOCKED = ("import sys\nfor m in ('torch', 'transformers'): sys.modules[m] = None\n"
            "from servescope.cli import main\nsys.argv = ['servescope', *sys.argv[1:]]\nmain()\n")


@pytest.mark.parametrize(("argv", "extra"), [
    (["bench", "comm", "--ops", "all_reduce", "--sizes", "1K"], "bench"),
    (["bench", "gemm", "--model", "llama-3-70b", "--tp", "8", "--batch", "1"], "bench"),
    (["capture", "decode", "--model", "dense", "--out", "/tmp/servescope-never-written"], "capture"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v[:2]))
def test_a_missing_extra_is_one_line_naming_it_and_exit_2(argv: list[str], extra: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _BLOCKED, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.endswith(f"pip install 'servescope[{extra}]'") and " ".join(argv[:2]) in line
