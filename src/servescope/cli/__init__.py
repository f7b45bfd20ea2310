"""The ``servescope`` command line: parse flags, call one feature function, render. No analysis here.

``common`` holds the root app and its groups; each module beside it registers one family of commands.
"""

from __future__ import annotations

import sys

from servescope.cli import (  # noqa: F401  (each module registers its commands)
    analyze,
    bench,
    capture,
    gpu,
    plan,
    profile,
    server,
    service,
    settings,
)
from servescope.cli.common import app, err

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("servescope: interrupted", markup=False)
        sys.exit(130)
