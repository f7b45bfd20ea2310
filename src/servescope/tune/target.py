"""What a tune target is: a server tune can start in a given configuration, stop, and put back as it found it.

Two kinds: :class:`~servescope.tune.launch.LaunchTarget` (a command servescope runs) and
:class:`~servescope.tune.unit.UnitTarget` (a systemd unit, changed through one drop-in).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from servescope.tune.edit import ServerConfig

__all__ = ["Started", "Target"]


@dataclass(frozen=True)
class Started:
    """How a start went: ``ok`` once the server answered ready; else ``reason`` (from its log) and the log's tail."""

    ok: bool
    reason: str
    seconds: float
    log_tail: list[str] = field(default_factory=list)


class Target(Protocol):
    """A server tune can reconfigure."""

    kind: str
    original: ServerConfig
    url: str

    @property
    def name(self) -> str: ...

    def start(self, config: ServerConfig, progress: Callable[[float, str], None] | None = None) -> Started:
        """Run ``config`` (stopping what runs first) and wait until ready or failed."""
        ...

    def stop(self) -> None:
        """Stop the server tune started (a unit: nothing; it stays as systemd has it)."""
        ...

    def log_lines(self) -> list[str]:
        """The running server's log lines."""
        ...

    def restore(self) -> None:
        """Put the original configuration back, byte for byte where it is a file."""
        ...
