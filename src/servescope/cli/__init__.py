"""The ``servescope`` command line: parse flags, call one feature function, emit its result. No analysis here.

``apps`` holds the root app and its groups, ``common`` the one output function (``emit``) and the helpers that need
no typer; each module beside them declares one family of commands with typer. What happens before typer is
imported and after a command's work (which modules are imported for the command named, ``analyze`` with plain
flags without typer, the head start of ``analyze``, ...) is :mod:`servescope.cli.startup`; ``servescope.cli.app``
is the whole app, put together on first use.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from servescope.cli.startup import ALL_MODULES, COMMAND_MODULES, load_commands

if TYPE_CHECKING:
    import typer

    app: typer.Typer

__all__ = ["COMMAND_MODULES", "app", "main"]


def __getattr__(name: str) -> Any:
    if name == "app":
        root = load_commands(ALL_MODULES)
        globals()["app"] = root
        return root
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    from servescope.cli import startup

    first = sys.argv[1:2]
    command = first[0] if first and first[0] in COMMAND_MODULES else None
    try:
        startup.prepare(command, sys.argv[2:])  # start-up tricks: see servescope.cli.startup
        if startup.run_plain(command, sys.argv[2:]):  # analyze with plain flags, without typer
            startup.finish(command, 0)
            return
        root = load_commands(COMMAND_MODULES[command]) if command is not None else __getattr__("app")
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
