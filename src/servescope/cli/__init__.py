"""The ``servescope`` command line: parse flags, call one feature function, render. No analysis here.

``common`` holds the root app and its groups; each module beside it registers one family of commands.
The app is put together on first use (``servescope.cli.app``), so that ``servescope analyze`` with plain
flags can run without typer at all (see ``analyze.run_analyze_fast``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

    app: typer.Typer

__all__ = ["app", "main"]

# Every module that registers commands, in the order `servescope --help` lists them.
_COMMAND_MODULES = ("bench", "capture", "gpu", "plan", "profile", "server", "service", "settings")


def _full_app() -> typer.Typer:
    import importlib

    from servescope.cli import analyze, common

    root = globals().get("app")
    if root is None:
        root = common.app
        analyze.register(root)
        for name in _COMMAND_MODULES:
            importlib.import_module(f"servescope.cli.{name}")
        globals()["app"] = root
    return root


def __getattr__(name: str) -> Any:
    if name == "app":
        return _full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _exit_now() -> None:
    """Exit 0 without tearing the interpreter down: its output is written, flushed and closed, and freeing
    every object of a large analysis one by one (and a last garbage collection over them) costs ~45 ms."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    """Console-script entry point."""
    from servescope.cli.analyze import run_analyze_fast

    args = sys.argv[1:]
    try:
        if args[:1] == ["analyze"] and run_analyze_fast(args[1:]):
            _exit_now()
        _full_app()()
    except KeyboardInterrupt:
        from servescope.cli.common import err

        err.print("servescope: interrupted", markup=False)
        sys.exit(130)
