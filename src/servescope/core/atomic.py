"""Atomic file writes: a reader sees the old file or the whole new one, never half of one.

A folder is never made on the way: a missing one is an :class:`~servescope.core.errors.InputError` naming the file
and the folder (one line, exit 2 in the CLI), unless the caller passes ``mkdir=True`` (a command's ``--mkdir``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from servescope.core.errors import InputError

__all__ = ["missing_folder", "write_bytes_atomic", "write_text_atomic"]


def missing_folder(path: str | os.PathLike[str]) -> Path | None:
    """The folder ``path`` would be written into when it does not exist (or is not a folder), else None."""
    parent = Path(path).absolute().parent
    return None if parent.is_dir() else parent


def _default_mode(target: Path) -> int:
    """The mode a plain ``open()`` would leave: the replaced file's, else 0o666 less the umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None,
                       mkdir: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The file gets ``mode`` when given (set before the rename: a secrets file is never readable by others),
    else the mode a plain write would leave (the replaced file's, or 0o666 less the umask).

    Raises:
        InputError: ``path``'s folder does not exist and ``mkdir`` is false.
    """
    target = Path(path)
    folder = missing_folder(target)
    if folder is not None:
        if not mkdir or folder.exists():
            raise InputError(str(target), f"folder {folder} does not exist" if not folder.exists()
                             else f"{folder} is not a folder")
        folder.mkdir(parents=True)
    final_mode = mode if mode is not None else _default_mode(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), final_mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int | None = None,
                      mkdir: bool = False) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (``mode`` and ``mkdir`` as for :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode, mkdir=mkdir)
