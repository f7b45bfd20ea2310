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

    from servescope.cli import apps

    for name in modules:
        importlib.import_module(f"servescope.cli.{name}")
    return apps.app


def __getattr__(name: str) -> Any:
    if name == "app":
        root = _load(_ALL_MODULES)
        globals()["app"] = root
        return root
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    from servescope.cli import startup

    first = sys.argv[1:2]
    command = first[0] if first and first[0] in COMMAND_MODULES else None
    startup.prepare(command, sys.argv[2:])  # start-up tricks: see servescope.cli.startup
    try:
        if startup.run_plain(command, sys.argv[2:]):  # analyze with plain flags, without typer
            startup.finish(command, 0)
            return
        root = _load(COMMAND_MODULES[command]) if command is not None else __getattr__("app")
        root()
    except SystemExit as done:
        startup.finish(command, done.code)
        raise
    except KeyboardInterrupt:
        from servescope.cli.common import err

        err.print("servescope: interrupted", markup=False)
        sys.exit(130)
    finally:
        startup.release()
