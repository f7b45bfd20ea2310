"""The health result document: what ``servescope health [--wait] --json`` writes and the table shows.

``ready`` is true only when every check passed: ``/health`` answered 200, ``/v1/models`` listed a model,
and a 1-token completion succeeded. ``phase`` says what the server is doing in words a person acts on:

- ``ready``: every check passed;
- ``loading``: the port refuses connections while the server process is alive (vLLM binds its port
  but only listens once the engine is up, so a loading vLLM refuses connections);
- ``crashed``: the port refuses connections and the process is gone (or a zombie, or the unit failed);
- ``engine dead``: ``/health`` answered 503 (vLLM's answer once its engine core has died);
- ``unreachable``: the port refuses connections and no ``pid`` / ``unit`` was given to tell loading
  from dead;
- ``not ready``: the server answers, but a check failed (no model listed, the completion failed).

Not available is ``None`` (``null`` in JSON), never 0 or "".
"""

from __future__ import annotations

import msgspec

from servescope.core.document import Document

__all__ = ["HEALTH_SCHEMA", "HEALTH_SCHEMA_VERSION", "PHASES", "Check", "HealthResult", "ProcessInfo"]

HEALTH_SCHEMA = "servescope.health"
HEALTH_SCHEMA_VERSION = 1
PHASES = ("ready", "loading", "crashed", "engine dead", "unreachable", "not ready")


class Check(msgspec.Struct, kw_only=True, frozen=True):
    """One readiness check: ``health`` (GET /health), ``models`` (GET /v1/models) or ``completion``."""

    name: str
    ok: bool
    detail: str


class ProcessInfo(msgspec.Struct, kw_only=True, frozen=True):
    """The server process as last seen in ``/proc`` (``--pid``) or by systemd (``--unit``).

    ``state`` is the ``/proc/PID/stat`` state letter (``R``, ``S``, ``Z`` ...), or the unit's
    ``ActiveState/SubState`` (``active/running``, ``failed/failed`` ...). ``exit_status`` is the wait
    status of a zombie as the kernel keeps it (``/proc/PID/stat`` field 52) or ``None``.
    """

    pid: int | None
    alive: bool
    state: str | None = None
    unit: str | None = None
    exit_status: int | None = None
    detail: str | None = None


class HealthResult(Document, kw_only=True, frozen=True):
    """Readiness of one OpenAI-compatible server at one moment (after waiting, when asked to wait).

    Durations are seconds on a monotonic clock; ``checked_at`` (UTC, ISO 8601) only labels the result.
    The API key is never part of this document; ``api_key_source`` names where one came from
    (``--api-key``, ``SERVESCOPE_API_KEY``, ``VLLM_API_KEY``, ``OPENAI_API_KEY``) or is ``None`` when none was sent.
    """

    schema: str = HEALTH_SCHEMA
    schema_version: int = HEALTH_SCHEMA_VERSION
    servescope_version: str
    checked_at: str
    url: str
    ready: bool
    phase: str
    model: str | None
    max_model_len: int | None
    elapsed_s: float
    waited: bool
    timed_out: bool
    checks: list[Check]
    process: ProcessInfo | None = None
    log_path: str | None = None
    log_tail: list[str] = msgspec.field(default_factory=list)
    api_key_source: str | None = None
