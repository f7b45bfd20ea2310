"""Running a command's event loop so that ctrl-c reaches it between callbacks, never inside one.

``asyncio.run`` takes SIGINT with a Python signal handler that cancels the main task wherever the interpreter
is: inside a transport callback that has just checked a future is pending and is about to resolve it, the cancel
lands first and the callback fails (``InvalidStateError``), which the loop prints as a traceback before the
command's own one-line "interrupted" (seen in a CI run of the interrupted knee search's test). :func:`run_loop`
has the loop take SIGINT instead (``loop.add_signal_handler``: the signal wakes the loop, and the cancel runs in a
turn of its own), then raises ``KeyboardInterrupt`` as ``asyncio.run`` would; a second ctrl-c interrupts at once.
Every command's loop runs through it (the knee search, the sweep, health, profile, tune's evidence, the load
workers). Off the main thread, where no signal handler can be set, it is ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_loop"]

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, with ctrl-c delivered by the loop between callbacks.

    Raises:
        KeyboardInterrupt: ctrl-c: ``main`` was cancelled and has finished unwinding.
    """
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    interrupted = False

    async def guarded() -> T:
        nonlocal interrupted
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            loop.remove_signal_handler(signal.SIGINT)  # a second ctrl-c interrupts at once
            task.cancel()

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
