"""The files a plan reads, checked before any work: each is one line naming its option when it is not a file."""

from __future__ import annotations

from pathlib import Path

from servescope.core.errors import InputError

__all__ = ["check_input_file"]

_KINDS = {"--calibrate": "an analyze --json or profile --json document",
          "--topology": "an `nvidia-smi topo -m` text file"}


def check_input_file(path: str | None, flag: str) -> None:
    """Nothing when ``path`` (given as ``flag``) is None or a file.

    Raises:
        InputError: ``PATH: no such file (FLAG)``, or a folder, naming the JSON documents it holds.
    """
    if path is None or Path(path).is_file():
        return
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(path, f"no such file ({flag})")
    found = sorted(p.name for p in folder.glob("*.json"))
    hint = f"; it holds {', '.join(found[:4])}{', …' if len(found) > 4 else ''}" if found else ""
    kind = _KINDS.get(flag, "a bench comm --json curve")
    raise InputError(path, f"a folder, not a file ({flag} takes {kind}{hint})")
