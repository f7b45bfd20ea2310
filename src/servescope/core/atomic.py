"""Atomic file writes: a reader sees the old file or the whole new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_bytes_atomic", "write_text_atomic"]


def _default_mode(target: Path) -> int:
    """The mode a plain ``open()`` would leave: the replaced file's, else 0o666 less the umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The file gets ``mode`` when given (set before the rename: a secrets file is never readable by others),
    else the mode a plain write would leave (the replaced file's, or 0o666 less the umask).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
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


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (``mode`` as for :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)
