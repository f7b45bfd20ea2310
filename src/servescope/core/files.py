"""Reading the files users and the package hand us, with one-line errors: JSON documents, bundled presets."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servescope.core.errors import InputError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["HARDWARE_DIR", "hardware_profile_names", "read_bytes", "read_json", "read_text", "unreadable"]

#: Where the bundled hardware profiles live inside the package.
HARDWARE_DIR = ("data", "hardware")


def read_json(path: str | Path | Traversable, *, source: str | None = None) -> Any:
    """The JSON value in ``path`` (a file, or a file bundled in the package).

    Raises:
        InputError: the file cannot be read or is not JSON; named ``source`` (default: the path).
    """
    # imported here, as importlib.resources is below: the trace decoder imports this module (unreadable) before
    # its children fork, where json and importlib.resources cost ~7 ms
    import json

    where = source if source is not None else str(path)
    try:
        text = (Path(path) if isinstance(path, str) else path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(where, exc.strerror or "cannot read") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, f"not JSON: {exc.msg} at line {exc.lineno}") from None


def read_bytes(path: Path) -> bytes:
    """The bytes of the file a user named.

    Raises:
        InputError: ``PATH: no such file``, ``PATH: is a directory, not a file`` or ``PATH: cannot read: WHY``.
    """
    try:
        return path.read_bytes()
    except OSError as exc:
        raise unreadable(str(path), exc, {FileNotFoundError: "no such file",
                                          IsADirectoryError: "is a directory, not a file"}) from None


def read_text(path: Path) -> str:
    """The UTF-8 text of the file a user named.

    Raises:
        InputError: ``PATH: not a text file`` or ``PATH: cannot read (WHY)``.
    """
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(str(path), "not a text file") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read ({exc.strerror or exc})") from None


def unreadable(source: str, exc: OSError | UnicodeDecodeError,
               problems: Mapping[type[OSError | UnicodeDecodeError], str]) -> InputError:
    """The one-line error for a file that could not be read: what ``problems`` says for the first of its
    exception types that ``exc`` is (``{FileNotFoundError: "no such file", ...}``), else ``cannot read: WHY``.

    Example:
        >>> unreadable("a.json", FileNotFoundError(2, "No such file"), {FileNotFoundError: "no such file"}).problem
        'no such file'
    """
    problem = next((said for kind, said in problems.items() if isinstance(exc, kind)), None)
    if problem is None:
        problem = f"cannot read: {(exc.strerror if isinstance(exc, OSError) else None) or exc}"
    return InputError(source, problem)


def hardware_profile_names() -> list[str]:
    """Names of the bundled hardware profiles (``data/hardware/*.toml``), sorted."""
    from importlib.resources import files

    folder = files("servescope").joinpath(*HARDWARE_DIR)
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))
