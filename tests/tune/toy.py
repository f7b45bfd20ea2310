"""The toy server's knee, for the tune loop's tests: goodput 100 tok/s per running request up to 8.

The figure is read from what the server runs (its ``/config``, or for a unit what systemd would run: the unit and
its drop-ins, read by ``servescope.deploy.unitfile``), so the loop under test sees its changes land or not.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from servescope.core.tune import KneeFigure
from servescope.tune.measure import Measured

HERE = Path(__file__).resolve().parent
TOY = HERE / "toy_server.py"
CATALOGUE = HERE / "data" / "toy-changes.toml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toy_command(port: int, *flags: str) -> str:
    return " ".join([sys.executable, str(TOY), "--port", str(port), *flags])


def knee_of(seqs: int, seconds: float) -> Measured:
    goodput = 100.0 * min(seqs, 8)
    cause = "scheduler_cap" if seqs < 8 else "step_time"
    return Measured(KneeFigure(goodput_tokens_per_s=goodput, goodput_requests_per_s=goodput / 64,
                               load=float(min(seqs, 8)), unit="streams", spread=[goodput * 0.995, goodput * 1.005],
                               cause=cause, cause_message=f"toy: {seqs} requests at most", seconds=seconds),
                    {"running_max": float(seqs)})


def toy_measure(*, delay_s: float = 0.0, marker: Path | None = None, delay_from: int = 2,
                seqs_of: Callable[[str], int] | None = None) -> Callable[..., Measured]:
    """A measurement of the toy server; ``marker`` is written when a load starts, then a load at ``delay_from``
    requests or more (a trial's, not the baseline's) takes ``delay_s``."""
    def measure(url: str, *, start: float, progress: object, server_argv: Sequence[str] | None,
                also_at: float | None = None) -> Measured:
        if seqs_of is not None:
            seqs = seqs_of(url)
        else:
            with urllib.request.urlopen(url + "/config", timeout=10) as answer:
                seqs = int(json.load(answer)["max_num_seqs"])
        if marker is not None:
            marker.write_text(f"measuring {seqs}\n")
        slow = delay_s if seqs >= delay_from else 0.0
        time.sleep(slow)
        return knee_of(seqs, slow)
    return measure
