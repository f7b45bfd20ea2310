"""The journal: what tune has done so far, on disk after every step (atomically, mode 0600: it holds the command
line), so that ``tune --resume`` continues and ``tune --restore`` undoes after servescope itself crashed.

It records the original configuration (a launch command and environment, or the unit's drop-in file as it was:
its bytes and mode), the server process tune started (pid and start time, so a reused pid is never signalled),
the baseline, every trial, the kept changes, and the change being tried when it stopped.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from servescope.core.atomic import write_bytes_atomic
from servescope.core.changes import Candidate, ChangeEdit
from servescope.core.errors import InputError
from servescope.core.tune import KneeFigure, Trial
from servescope.tune.unit import FileState

__all__ = ["JOURNAL_SCHEMA", "Journal", "JournalProcess", "read_journal", "write_journal"]

JOURNAL_SCHEMA = "servescope.tune_journal"


class JournalProcess(msgspec.Struct, kw_only=True, frozen=True):
    """A server process tune started: its pid (its session's leader) and start time (``/proc/PID/stat`` 22)."""

    pid: int
    start_ticks: int | None


class Journal(msgspec.Struct, kw_only=True):
    """Where a tune run stands. ``state``: ``running``, ``done``, ``interrupted``, ``restored``."""

    schema: str = JOURNAL_SCHEMA
    schema_version: int = 1
    state: str = "running"
    kind: str
    url: str
    argv: list[str]
    env: dict[str, str]
    options: dict[str, Any]
    unit: str | None = None
    unit_path: str | None = None
    dropin: str | None = None
    dropin_before: str | None = None  # base64 of the drop-in's bytes before tune; None: there was none
    dropin_before_mode: int | None = None
    log_dir: str | None = None
    process: JournalProcess | None = None
    baseline: list[KneeFigure] = []
    noise: float | None = None
    trials: list[Trial] = []
    kept: list[ChangeEdit] = []
    trying: Candidate | None = None
    updated_at: str = ""

    def before(self) -> FileState:
        """The drop-in as it was before tune."""
        if self.dropin_before is None or self.dropin_before_mode is None:
            return None
        return base64.b64decode(self.dropin_before), self.dropin_before_mode

    def set_before(self, state: FileState) -> None:
        self.dropin_before = None if state is None else base64.b64encode(state[0]).decode("ascii")
        self.dropin_before_mode = None if state is None else state[1]


def write_journal(path: Path, journal: Journal) -> None:
    """Write ``journal`` atomically (mode 0600)."""
    journal.updated_at = datetime.now(UTC).isoformat(timespec="seconds")
    write_bytes_atomic(path, msgspec.json.format(msgspec.json.encode(journal), indent=2) + b"\n", mode=0o600)


def read_journal(path: Path) -> Journal:
    """The journal at ``path``.

    Raises:
        InputError: missing, unreadable, or not a tune journal.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), f"cannot read the journal ({exc.strerror or exc})") from None
    try:
        journal = msgspec.json.decode(data, type=Journal)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(str(path), f"not a servescope tune journal ({exc})") from None
    if journal.schema != JOURNAL_SCHEMA or journal.schema_version != 1:
        raise InputError(str(path), f"not a servescope tune journal (schema {journal.schema!r})")
    return journal
