"""The ``service status --json`` document: what ``systemctl show`` says of one unit."""

from __future__ import annotations

from servescope.core.document import Document

__all__ = ["SERVICE_SCHEMA", "SERVICE_SCHEMA_VERSION", "ServiceStatus"]

SERVICE_SCHEMA = "servescope.service"
SERVICE_SCHEMA_VERSION = 1


class _StatusFields(Document, frozen=True):
    """``systemctl show`` of the unit: states, main pid (None when not running) and restarts.

    Each field names its ``systemctl show -p`` twin: ``LoadState``, ``ActiveState``, ``SubState``, ``Result``,
    ``MainPID``, ``NRestarts``, ``ExecMainStartTimestamp``, ``FragmentPath``.
    """

    name: str
    load_state: str | None
    active_state: str | None
    sub_state: str | None
    result: str | None
    main_pid: int | None
    restarts: int | None
    started_at: str | None
    fragment_path: str | None


class ServiceStatus(_StatusFields, kw_only=True, frozen=True):
    """:class:`_StatusFields` with its schema (keyword-only, after the positional fields)."""

    schema: str = SERVICE_SCHEMA
    schema_version: int = SERVICE_SCHEMA_VERSION
