"""The package's own TOML data files (``servescope/data/*.toml``), parsed once per install instead of once per run.

``analyze`` reads taxonomy.toml, findings.toml, steps.toml, engines.toml, deployment.toml and changes.toml every
run; tomllib takes ~25 ms for them (plus ~6 ms to import), marshal reads the same dicts back in well under 1 ms.
So each file's parsed data is kept in ``$XDG_CACHE_HOME/servescope/data/`` (else ``~/.cache/…``), as Python keeps
its ``__pycache__``: one file per data file, valid only for the data file's exact path, size and modification time,
this servescope version and this Python's marshal format, and checked by a CRC before it is read. It is written
atomically (a temporary file and a rename) and never required: a missing, unwritable or read-only cache folder,
no home folder, a stale or damaged entry, or data marshal cannot hold (a TOML date) all mean the file is parsed
as before. User files (``analyze --taxonomy FILE``) never go through it.

Example:
    >>> bundled_toml("taxonomy.toml")["version"]
    1
"""

from __future__ import annotations

import marshal
import os
import sys
import zlib
from pathlib import Path
from typing import Any

from servescope import __version__

__all__ = ["DATA_DIR", "bundled_toml", "cache_folder", "code_stamp", "data_stamp", "read_derived", "write_derived"]

DATA_DIR = Path(__file__).parent.parent / "data"
"""The package's data folder (importlib.resources would import zipfile and its readers: ~7 ms)."""
_MAGIC = b"servescope-data-1\n"
_STAMP = f"{__version__} {sys.implementation.cache_tag} marshal {marshal.version}"


def cache_folder() -> Path | None:
    """Where the parsed data files are kept: ``$XDG_CACHE_HOME/servescope/data``, else ``~/.cache/servescope/data``;
    None when neither can be told (no ``XDG_CACHE_HOME`` and no home folder)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec: a relative path is to be ignored
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError, OSError):
            return None
    return Path(base) / "servescope" / "data"


def bundled_toml(name: str) -> dict[str, Any]:
    """The bundled data file ``name`` (``taxonomy.toml``), parsed: from the cache when it holds this very file,
    else by tomllib (and then cached). A fresh dict each call: the caller may keep or change it.

    Raises:
        tomllib.TOMLDecodeError: the file is not TOML (a broken install; never cached).
        OSError: the file cannot be read.
    """
    path = DATA_DIR / name
    with path.open("rb") as handle:
        stat = os.fstat(handle.fileno())
        key = f"{_STAMP} {path} {stat.st_size} {stat.st_mtime_ns}"
        entry = _entry(path)
        cached = _read(entry, key) if entry is not None else None
        if cached is not None:
            return cached
        raw = handle.read()
    import tomllib

    text = raw.decode("utf-8")
    if "\r" in text:  # as Path.read_text reads it: universal newlines
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    data = tomllib.loads(text)
    if entry is not None:
        _write(entry, key, data)
    return data


def data_stamp(name: str) -> str:
    """The bundled data file ``name`` as the cache tells it apart: its path, size and modification time ("" when
    it cannot be read)."""
    path = DATA_DIR / name
    try:
        stat = path.stat()
    except OSError:
        return ""
    return f"{path} {stat.st_size} {stat.st_mtime_ns}"


def code_stamp(source: str) -> str:
    """The code in the file ``source`` (a module's ``__file__``) as data derived by it is told apart: a CRC of its
    text ("unknown" when it cannot be read)."""
    try:
        with open(source, "rb") as handle:
            return f"{zlib.crc32(handle.read()):08x}"
    except OSError:
        return "unknown"


def read_derived(name: str, stamp: str) -> dict[str, Any] | None:
    """Data this install derived from its own code and kept under ``name`` (the regex needles), when it was kept
    by code of the same ``stamp`` (and this servescope and Python); else None. Never required, as above."""
    folder = cache_folder()
    return _read(folder / f"{name}.marshal", f"{_STAMP} {name} {stamp}") if folder is not None else None


def write_derived(name: str, stamp: str, data: dict[str, Any]) -> None:
    """Keep ``data`` under ``name`` for :func:`read_derived` (atomically; quietly nothing when it cannot be)."""
    folder = cache_folder()
    if folder is not None:
        _write(folder / f"{name}.marshal", f"{_STAMP} {name} {stamp}", data)


def _entry(path: Path) -> Path | None:
    """The cache file of the data file ``path``: its name and a hash of its full path (checkouts side by side)."""
    folder = cache_folder()
    if folder is None:
        return None
    return folder / f"{path.stem}-{zlib.crc32(str(path).encode()):08x}.marshal"


def _read(entry: Path, key: str) -> dict[str, Any] | None:
    """The data cached in ``entry`` when it was made from the file ``key`` names, intact; else None."""
    try:
        blob = entry.read_bytes()
    except OSError:
        return None
    head = _MAGIC + key.encode() + b"\n"
    if not blob.startswith(head) or len(blob) < len(head) + 4:
        return None
    body = memoryview(blob)[len(head) + 4 :]
    if int.from_bytes(blob[len(head) : len(head) + 4], "little") != zlib.crc32(body):
        return None
    try:
        data = marshal.loads(body)
    except (ValueError, EOFError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def _write(entry: Path, key: str, data: dict[str, Any]) -> None:
    """Keep ``data`` in ``entry``, atomically; quietly nothing when it cannot be (read-only, full, a TOML date)."""
    try:
        body = marshal.dumps(data)
    except ValueError:  # a value marshal cannot hold (a TOML date or time)
        return
    blob = _MAGIC + key.encode() + b"\n" + zlib.crc32(body).to_bytes(4, "little") + body
    import tempfile

    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
        os.replace(tmp, entry)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
