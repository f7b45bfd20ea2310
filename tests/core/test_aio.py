"""ctrl-c on a command's event loop (servescope.core.aio.run_loop): delivered between callbacks, as KeyboardInterrupt
after the coroutine unwound, never as a traceback from inside a transport callback."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from servescope.core.aio import run_loop


def _race(runner: Callable[[Coroutine[Any, Any, None]], None]) -> tuple[list[str], bool]:
    """A callback resolves the future the main task awaits, and ctrl-c arrives between its check that the future
    is pending and its resolving it (as a transport's data_received does with anyio's read event). Returns what
    the loop reported as errors and whether the coroutine unwound."""
    reported: list[str] = []
    unwound = False

    async def main() -> None:
        nonlocal unwound
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(repr(context.get("exception"))))
        fut: asyncio.Future[bool] = loop.create_future()

        def data_received() -> None:
            if not fut.done():
                os.kill(os.getpid(), signal.SIGINT)  # the signal lands here, between the check and the result
                fut.set_result(True)

        loop.call_soon(data_received)
        try:
            await fut
            await asyncio.sleep(5)  # the cancel reaches the task at its next wait
        finally:
            unwound = True

    with pytest.raises(KeyboardInterrupt):
        runner(main())
    return reported, unwound


def test_ctrl_c_inside_a_callback_is_taken_between_callbacks() -> None:
    reported, unwound = _race(run_loop)
    assert reported == [] and unwound
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was


def test_asyncio_run_fails_the_callback_the_signal_lands_in() -> None:
    # the mechanism run_loop replaces: its signal handler cancels the awaited future inside the callback
    reported, unwound = _race(asyncio.run)
    assert unwound and any("InvalidStateError" in r for r in reported)


def test_every_event_loop_of_the_package_is_run_by_run_loop() -> None:
    """No command runs its loop with ``asyncio.run`` (whose ctrl-c can land inside a callback): read with ``ast``,
    the only call to it is run_loop's own."""
    import ast
    from pathlib import Path

    import servescope

    package = Path(servescope.__file__).parent
    callers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"):
                callers.append(f"{path.relative_to(package)}:{node.lineno}")
    assert callers and all(c.startswith("core/aio.py:") for c in callers), callers
