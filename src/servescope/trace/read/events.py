"""A trace's events as msgspec decodes them: only the fields analysis reads, one JSON array of events at a time.

:class:`BlockDecoder` decodes a block of the ``traceEvents`` array; an event that does not decode (a field of the
wrong type, an id beyond int64) is left out and named, not the block. :class:`Header` is the trace object without
its events, :class:`WholeTrace` a small trace decoded in one pass. No numpy here: a read-ahead child imports this.
"""

from __future__ import annotations

from typing import Any, ClassVar, Union

import msgspec

__all__ = ["BlockDecoder", "Event", "Header", "WholeTrace"]


class _Args(msgspec.Struct, gc=False):  # no cycles: skip GC tracking of 1e6 objects
    correlation: int | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    kernel: str | None = None  # on a runtime launch: the kernel it launched (newer Kineto, ROCm)


class _Fields(msgspec.Struct, gc=False):
    """The fields analysis reads from an event (the phase aside)."""

    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: _Args | None = None


class Event(_Fields, gc=False):
    """An event of any phase, field by field."""

    ph: str = ""


class _Complete(_Fields, gc=False, tag_field="ph", tag="X"):
    """An ``X`` (complete) event: the only phase analysis reads."""

    ph: ClassVar[str] = "X"


# Every other phase of the Chrome trace-event format, decoded to an empty object: flow, instant, counter
# and metadata events are a third of a Kineto trace and analysis counts them only.
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{i}", [("ph", ClassVar[str], phase)], tag_field="ph", tag=phase, gc=False)
    for i, phase in enumerate(("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M",
                               "V", "v", "R", "c", "(", ")"))
)
_ByPhase = Union[_Complete, *_OTHER_PHASES]  # type: ignore[valid-type]  # noqa: UP007


class _Skipping(list[Any]):
    """Events of a block decoded one by one, and (index in the block, problem) of those that did not decode."""

    skipped: list[tuple[int, str]]


class BlockDecoder:
    """Decodes a JSON array of events, by phase when every event names a known one (fast: only ``X``
    events get fields), else field by field (:class:`Event`); a block with a malformed event (a field of
    the wrong type, an id beyond int64) is decoded event by event, the malformed ones left out and named
    in the list's ``skipped``. JSON that is not well formed is not an event problem: it raises."""

    def __init__(self) -> None:
        self._by_phase = msgspec.json.Decoder(list[_ByPhase])
        self._plain = msgspec.json.Decoder(list[Event])
        self._raw = msgspec.json.Decoder(list[msgspec.Raw])
        self._one = msgspec.json.Decoder(Event)

    def decode(self, data: bytes | bytearray | memoryview) -> list[Any]:
        try:
            return self._by_phase.decode(data)
        except (msgspec.ValidationError, OverflowError):
            pass
        try:
            return self._plain.decode(data)
        except (msgspec.ValidationError, OverflowError):
            return self._one_by_one(data)

    def _one_by_one(self, data: bytes | bytearray | memoryview) -> _Skipping:
        out = _Skipping()
        out.skipped = []
        for index, raw in enumerate(self._raw.decode(data)):
            try:
                out.append(self._one.decode(raw))
            except (msgspec.ValidationError, OverflowError) as exc:
                out.skipped.append((index, str(exc) or type(exc).__name__))
        return out


class Header(msgspec.Struct):
    """The trace object's keys that analysis reads; ``traceEvents`` left undecoded."""

    traceEvents: msgspec.Raw = msgspec.Raw()  # noqa: N815 - the trace's own key
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    vllm_version: str | None = None
    host_name: str | None = None
    schemaVersion: int | str | None = None  # noqa: N815
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815


class WholeTrace(msgspec.Struct, gc=False):
    """A trace small enough to decode in one pass (no chunking, no second scan)."""

    traceEvents: list[Event] | msgspec.UnsetType = msgspec.UNSET  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    vllm_version: str | None = None
    host_name: str | None = None
    schemaVersion: int | str | None = None  # noqa: N815
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815
