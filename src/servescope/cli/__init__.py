"""The ``servescope`` command line: parse flags, call one feature function, render. No analysis here.

``common`` holds the root app and its groups; each module beside it declares one family of commands with
typer. Typer builds every declared command when the app runs (~80 ms for all of them), so ``main()``
imports only the module that declares the command named first on the command line; ``servescope.cli.app``
is the whole app, put together on first use.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

    app: typer.Typer

__all__ = ["COMMAND_MODULES", "app", "main"]

# Each top-level command (or group) and the modules that declare it; a group's commands may come from more
# than one module.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "analyze": ("analyze",), "report": ("analyze",), "diff": ("analyze",), "plan": ("plan",),
    "profile": ("profile",), "health": ("health",), "settings": ("settings",), "tune": ("tune",),
    "capture": ("capture",), "gpu": ("gpu",), "bench": ("bench",), "service": ("service",),
}
# Every module, in the order that gives `servescope --help` and `servescope bench --help` their order.
_ALL_MODULES = ("analyze", "bench", "capture", "gpu", "plan", "profile", "health", "service", "settings", "tune")


def _load(modules: tuple[str, ...]) -> typer.Typer:
    """The root app with the commands of ``modules`` declared on it."""
    import importlib

    from servescope.cli import common

    for name in modules:
        importlib.import_module(f"servescope.cli.{name}")
    return common.app


def __getattr__(name: str) -> Any:
    if name == "app":
        root = _load(_ALL_MODULES)
        globals()["app"] = root
        return root
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
    from servescope.cli import head_start

    first = sys.argv[1:2]
    command = first[0] if first and first[0] in COMMAND_MODULES else None
    if command == "analyze":
        # One pass that makes little cyclic garbage and ends in os._exit: the collector's passes over every
        # object the imports made (typer, numpy) cost ~25 ms of ~0.4 s on the 35 MB trace.
        import gc
        import os

        gc.disable()
        # analyze does no linear algebra; numpy's OpenBLAS would start a thread per core on import (~100 ms of
        # CPU on two cores, taken from the decoding children). A user's own setting wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        head_start.start(sys.argv[2:])  # its traces start decoding now, while typer is imported and parses
    root = _load(COMMAND_MODULES[command]) if command is not None else __getattr__("app")
    try:
        root()
    except SystemExit as done:
        if command == "analyze" and done.code in (0, None):
            _exit_now()
        raise
    except KeyboardInterrupt:
        from servescope.cli.common import err

        err.print("servescope: interrupted", markup=False)
        sys.exit(130)
    finally:
        head_start.release()
