"""Errors a user can fix: the CLI shows them as one line and exits 2."""

from __future__ import annotations

__all__ = ["InputError", "ServescopeError", "require_extra"]


class ServescopeError(Exception):
    """Base of servescope's own errors."""


class InputError(ServescopeError):
    """Bad input named by its source: a file, URL or option, and what is wrong with it.

    Args:
        source: the file path, URL or option at fault.
        problem: what is wrong, in a few words a user can act on.
    """

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


def require_extra(module: str, extra: str, command: str) -> None:
    """Raise one InputError line naming the extra when the optional ``module`` is not installed.

    Raises:
        InputError: ``{command}: needs {module}, which is not installed: pip install 'servescope[{extra}]'``.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module blocked in sys.modules, or a broken parent package
        found = False
    if not found:
        raise InputError(command, f"needs {module}, which is not installed: pip install 'servescope[{extra}]'")
