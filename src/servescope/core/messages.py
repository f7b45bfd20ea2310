"""Finding messages from templates kept in data files: a field the facts do not have prints as N/A."""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

__all__ = ["format_message", "size_text", "step_time"]


class _Values(dict[str, Any]):
    """Message fields; one the facts do not have is None (printed N/A)."""

    def __missing__(self, key: str) -> None:
        return None


class _Formatter(string.Formatter):
    """A value that is not available prints as N/A whatever its format spec."""

    def format_field(self, value: Any, format_spec: str) -> str:
        return "N/A" if value is None else super().format_field(value, format_spec)


_FORMATTER = _Formatter()


def format_message(template: str, values: Mapping[str, Any]) -> str:
    """``template`` (a ``str.format`` template) over ``values``; missing or None fields print as N/A."""
    return _FORMATTER.vformat(template, (), _Values(values))


def step_time(us: float) -> str:
    """A time a message quotes: ``3.74 ms`` from a millisecond up, else ``854 µs``."""
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def size_text(nbytes: float) -> str:
    """A message size a plan quotes, to three figures: ``14 KiB``, ``1.75 GiB``, ``512 B``."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:.3g} {unit}"
    return f"{nbytes:.0f} B"
