"""The test SSE server (``sse_server.py``) in its own process: started, its URL handed out, stopped."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from children import default_signals

SSE_SERVER = Path(__file__).parent / "sse_server.py"


@contextmanager
def running_sse_server(*args: str) -> Iterator[str]:
    """``sse_server.py ARGS`` on a free port of 127.0.0.1 until the block ends; yields its base URL."""
    proc = subprocess.Popen([sys.executable, str(SSE_SERVER), *args], stdout=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)  # it is stopped with SIGTERM
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
