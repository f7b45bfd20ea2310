"""A big trace decoded in parts: each part the whole events of one byte range, the parts joined in order.

The read-ahead (:mod:`servescope.trace.read.readahead`) forks a process per part; each decodes its range of the
same mapped or inflated JSON into a picklable :class:`Part`, and the caller joins them into one
:class:`~servescope.trace.read.table.TraceData`, names and threads interned anew. No numpy here.
"""

from __future__ import annotations

import contextlib
import mmap
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from servescope.core.errors import InputError
from servescope.trace.read.collect import MALFORMED_EXAMPLES, Collector, drop_bad_times, trace_data
from servescope.trace.read.events import Header
from servescope.trace.read.jsonscan import (
    EVENT_BOUNDARY,
    NO_EVENTS,
    Buffer,
    NotStreamable,
    decode_range,
    events_key,
    load_bytes,
)
from servescope.trace.read.table import Table, TraceData

__all__ = ["Part", "decode_part", "decode_parts", "join_parts"]


@dataclass(slots=True)
class Part:
    """The events of one byte range of a trace, names and threads interned locally (picklable: a read-ahead
    child sends it). The first part holds the object up to ``traceEvents``, the one that reached the end of
    the events array the object's keys after it."""

    names: list[str]
    threads: list[tuple[int | str, int | str]]
    device: Table
    cpu_ops: Table
    launches: Table
    frames: Table
    annotations: Table
    count: int
    head: bytes | None
    rest: bytes | None
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)


def decode_part(path: Path, index: int, parts: int) -> Part:
    """The events of the ``index``-th of ``parts`` equal byte ranges of an object-form trace's JSON, each range
    moved to the next event boundary, so that the parts meet exactly. A plain file is mapped, not read; a gzip
    one is inflated whole.

    Raises:
        ValueError: the file is not an object-form trace of the usual layout, or a block of the range does not
            decode alone (:func:`~servescope.trace.read.trace_json.decode_trace` must decide).
    """
    with _json_of(path) as buf:
        return _part(buf, index, parts)


def decode_parts(path: Path, parts: int, each: Callable[[Callable[[int], Part]], None]) -> None:
    """Calls ``each`` once with a function that decodes part ``i`` of ``parts`` (as :func:`decode_part`), the file
    mapped or inflated once for all of them: ``each`` may fork, and the children share the JSON.

    Raises:
        ValueError: as :func:`decode_part`.
    """
    with _json_of(path) as buf:
        each(lambda index: _part(buf, index, parts))


@contextlib.contextmanager
def _json_of(path: Path) -> Iterator[Buffer]:
    """The JSON of a trace file: mapped (plain) or inflated (gzip).

    Raises:
        ValueError: the file cannot be read or inflated.
    """
    with path.open("rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    if gzipped:
        try:
            inflated = load_bytes(path)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        yield inflated
        return
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) as buf:
        yield buf


def _part(buf: Buffer, index: int, parts: int) -> Part:
    size = len(buf)
    key = events_key(buf)
    if key is None:
        raise ValueError("not an object-form trace with traceEvents near the start")

    def cut(i: int) -> re.Match[bytes] | None:  # the boundary the ranges i-1 and i meet at
        return EVENT_BOUNDARY.search(buf, max(key.end(), size * i // parts))

    start_at = cut(index) if index else None
    if index and start_at is None:  # the events ended before this range: an empty part
        return Part([], [], Table(), Table(), Table(), Table(), Table(), 0, None, None)
    start = start_at.end() - 1 if start_at is not None else key.end()
    end_at = cut(index + 1) if index + 1 < parts else None
    sink = Collector()
    try:
        if end_at is not None:  # a middle range: whole events up to the next part's first
            decode_range(buf, start, end_at.start() + 1, sink, ends_array=False)
            rest = None
        else:  # the last range: it ends the array
            rest = decode_range(buf, start, size, sink, ends_array=True)
    except (NotStreamable, msgspec.DecodeError, OverflowError) as exc:
        raise ValueError(str(exc)) from None
    head = bytes(buf[: key.start()]) if index == 0 else None
    drop_bad_times(sink)  # here, in each part's child, rather than over the joined trace in the caller
    return Part(sink.names, sink.threads, sink.device, sink.cpu_ops, sink.launches, sink.frames, sink.annotations,
                sink.count, head, rest, sink.malformed, sink.malformed_examples)


def join_parts(path: Path, parts: list[Part]) -> TraceData:
    """The whole trace from its parts, in order: names and threads interned anew, rows renumbered.

    Raises:
        ValueError: the parts do not make one trace (no head, or no end of the events array).
        InputError: the trace holds no events.
    """
    head, rest = parts[0].head, next((p.rest for p in parts if p.rest is not None), None)
    if head is None or rest is None:
        raise ValueError("the parts do not start and end the events array")
    sink = Collector()
    for i, part in enumerate(parts):
        names = [sink.ids[name] for name in part.names]
        threads = [sink.thread_ids[thread] for thread in part.threads]
        for into, table in ((sink.device, part.device), (sink.cpu_ops, part.cpu_ops),
                            (sink.launches, part.launches), (sink.frames, part.frames),
                            (sink.annotations, part.annotations)):
            into.extend(table, names, threads)
        sink.malformed_examples.extend(f"{e} (part {i + 1})" for e in part.malformed_examples)
        sink.malformed += part.malformed
        sink.count += part.count
    try:
        header = msgspec.json.decode(head + NO_EVENTS + rest, type=Header)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None
    del sink.malformed_examples[MALFORMED_EXAMPLES:]
    return trace_data(path, path.stat().st_size, sink, header, times_checked=True)
