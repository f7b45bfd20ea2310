"""Start-up tricks, in one place: what a command does before typer is imported and after its work is done, each
with its reason and what it was measured to save.

Every command imports only **the module that declares it** (:data:`COMMAND_MODULES`, :func:`load_commands`):
typer builds every declared command when the app runs (~80 ms for all of them), and each command imports its
feature code inside itself.

``analyze`` is the command people time against other tools (benchmarks/analyze_vs_hta.py: the 35 MB trace in
~0.4 s on a 2-core VM, start-up included), so it alone gets them:

* **the head start** (:mod:`servescope.cli.head_start`): its traces start decoding in child processes before
  typer (~50 ms) and the analysis (numpy, the rules: ~100 ms) are imported;
* **no typer for plain flags** (:mod:`servescope.cli.plain`): typer's import and command build cost ~25-30 ms of
  CPU on a 2-core machine that the decoding children need; plain arguments are given to the command as typer would
  give them, anything else goes through typer;
* **no cyclic garbage collection**: one pass that makes little cyclic garbage and ends in ``os._exit``; the
  collector's passes over every object the imports made (typer, numpy) cost ~25 ms;
* **one BLAS thread** (``OPENBLAS_NUM_THREADS=1`` unless the user set it): analyze does no linear algebra, and
  numpy's OpenBLAS would start a thread per core on import (~100 ms of CPU on two cores, taken from the decoding
  children; 0.93x wall);
* **no teardown** (:func:`finish`): after a successful run its output is written, flushed and closed, and freeing
  every object of a large analysis one by one (and a last collection over them) costs ~45 ms.

Every other command starts and ends as Python does. Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

__all__ = ["ALL_MODULES", "COMMAND_MODULES", "FAST_COMMANDS", "finish", "load_commands", "prepare", "release",
           "run_plain"]

# Each top-level command (or group) and the modules that declare it; a group's commands may come from more
# than one module.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "analyze": ("analyze",), "report": ("analyze",), "diff": ("analyze",), "plan": ("plan",),
    "profile": ("profile",), "health": ("health",), "settings": ("settings",), "tune": ("tune",),
    "capture": ("capture",), "gpu": ("gpu",), "bench": ("bench",), "service": ("service",),
}
ALL_MODULES = ("analyze", "bench", "capture", "gpu", "plan", "profile", "health", "service", "settings", "tune")
"""Every module, in the order that gives `servescope --help` and `servescope bench --help` their order."""

FAST_COMMANDS = frozenset({"analyze"})
"""The commands that get the tricks above."""


def load_commands(modules: tuple[str, ...]) -> typer.Typer:
    """The root app with the commands of ``modules`` (of ``servescope.cli``) declared on it."""
    import importlib

    from servescope.cli import apps

    for name in modules:
        importlib.import_module(f"servescope.cli.{name}")
    return apps.app


def prepare(command: str | None, args: Sequence[str]) -> None:
    """Before typer is imported: the tricks for ``command`` (its arguments ``args``, unparsed)."""
    if command not in FAST_COMMANDS:
        return
    import gc

    from servescope.cli import head_start

    gc.disable()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    head_start.start(args)  # its traces start decoding now, while typer is imported and parses


def run_plain(command: str | None, args: Sequence[str]) -> bool:
    """Run ``command ARGS`` without typer when it is a fast command whose arguments are plain; False (nothing
    done) when typer must parse them.

    Raises:
        SystemExit: the command failed, or was interrupted (as on typer's route).
    """
    if command != "analyze":
        return False
    from servescope.cli import plain

    return plain.run_plain(args)


def finish(command: str | None, code: object) -> None:
    """After ``command`` ended with exit ``code``: a successful fast command exits now, without teardown."""
    if command in FAST_COMMANDS and code in (0, None):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def release() -> None:
    """Stop what :func:`prepare` started and the command did not take (it failed or ended before reading)."""
    from servescope.cli import head_start

    head_start.release()
