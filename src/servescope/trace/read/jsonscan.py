"""Trace JSON as bytes: read or inflated, cut into blocks of whole events, each block decoded where it lies.

A trace's ``traceEvents`` array is cut at event boundaries (``}`` ``,`` ``{``) into blocks of about 2 MiB, so
that only one block's events exist as Python objects at a time. A boundary that falls inside a string or a nested
array makes a block fail to decode; the caller then decodes more carefully. A file up to 128 MiB of JSON is held
whole (libdeflate inflates a gzip one at once); a bigger one, or a gzip file over 64 MiB, is read as a stream
(:func:`stream_source`, :func:`stream_events`).
"""

from __future__ import annotations

import gzip
import mmap
import os
import queue
import re
import threading
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import deflate
import msgspec

from servescope.core.errors import InputError
from servescope.core.files import unreadable
from servescope.trace.read.collect import Collector
from servescope.trace.read.events import BlockDecoder

__all__ = [
    "EVENTS_KEY",
    "EVENT_BOUNDARY",
    "NON_SPACE",
    "NO_EVENTS",
    "WHITESPACE",
    "Buffer",
    "NotStreamable",
    "Prefixed",
    "array_bounds",
    "decode_in_place",
    "decode_range",
    "events_key",
    "fits_one_block",
    "gzip_problem",
    "iter_chunks",
    "last_events",
    "load_bytes",
    "stream_events",
    "stream_source",
]

_CHUNK_BYTES = 2 << 20  # one block of events in memory at a time when streaming
_STREAM_GZ_BYTES = 64 << 20  # compressed traces above this are decompressed as a stream
# Up to this many bytes of JSON a file is inflated whole (libdeflate, several times zlib's speed) and cut
# into blocks in place; above it, it is inflated and decoded as a stream, so memory stays flat.
_WHOLE_LIMIT = 128 << 20
# Boundary between two events of the traceEvents array. A split that lands inside a string or a nested
# array makes a chunk fail to decode, and then the whole array is decoded at once instead.
EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
NO_EVENTS = b'"traceEvents":[]'  # between the object's keys before and after its events: the header alone
NON_SPACE = re.compile(rb"\S")
WHITESPACE = b" \t\r\n"

Buffer = bytes | bytearray | mmap.mmap  # libdeflate inflates into a bytearray; copying it would double the peak


_UNREADABLE: dict[type[OSError | UnicodeDecodeError], str] = {
    FileNotFoundError: "no such file",
    IsADirectoryError: "is a directory, not a trace file",
}


class NotStreamable(Exception):
    """The streaming path cannot cut this file safely; the whole-buffer path decides."""


def load_bytes(path: Path) -> Buffer:
    """The JSON of a trace file, inflated when it is gzip.

    Raises:
        InputError: the file is missing, a directory, unreadable, or a truncated or corrupt gzip.
    """
    try:
        with path.open("rb") as handle:  # into a bytearray: events are decoded in place (decode_in_place)
            raw = bytearray(os.fstat(handle.fileno()).st_size)
            del raw[handle.readinto(raw) :]  # the file may have shrunk since
    except OSError as exc:
        raise unreadable(str(path), exc, _UNREADABLE) from None
    if raw[:2] == b"\x1f\x8b":
        # libdeflate is ~6x faster than zlib but sizes its output from the trailer (the last 4 bytes):
        # use it only when that trailer is plausible, and let zlib decide everything else (padding,
        # several members, > 4 GiB, damage), since zlib names the problem.
        declared = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
        if declared:
            try:
                out = deflate.gzip_decompress(raw)
                if len(out) == declared:
                    return out
            except (deflate.DeflateError, ValueError):
                pass
        try:
            return gzip.decompress(raw)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise InputError(str(path), gzip_problem(exc)) from None
    return raw


def gzip_problem(exc: EOFError | zlib.error | gzip.BadGzipFile) -> str:
    """What is wrong with a gzip file that did not inflate, in a few words."""
    return "truncated gzip" if isinstance(exc, EOFError) else f"corrupt gzip ({exc})"


def fits_one_block(buf: Buffer) -> bool:
    """Whether ``buf`` is small enough to decode in one pass."""
    return len(buf) <= _CHUNK_BYTES


# --- a buffer held whole -------------------------------------------------------------------------------


def events_key(buf: Buffer) -> re.Match[bytes] | None:
    """Where ``"traceEvents": [`` is, in an object-form trace that has it near the start."""
    key = EVENTS_KEY.search(buf, 0, _CHUNK_BYTES)
    first = NON_SPACE.search(buf, 0, 64)
    if key is None or first is None or buf[first.start()] != 0x7B:  # "{"
        return None
    return key


def array_bounds(buf: Buffer, raw: msgspec.Raw) -> tuple[int, int]:
    """Byte range of the elements inside the ``traceEvents`` array whose Raw slice is ``raw``.

    Raises:
        ValueError: ``raw`` is not an array of ``buf``'s traceEvents.
    """
    view = memoryview(raw)
    if bytes(view[:1]) != b"[":
        raise ValueError("traceEvents is not an array")
    size, probe = len(view), bytes(view[:64])
    for match in EVENTS_KEY.finditer(buf):
        start = match.end() - 1
        if buf[start : start + len(probe)] == probe and buf[start + size - 1 : start + size] == b"]":
            return start + 1, start + size - 1
    raise ValueError("traceEvents array not found")


def iter_chunks(buf: Buffer, start: int, end: int) -> list[tuple[int, int]]:
    """``buf[start:end]`` cut into ranges of whole events of about ``_CHUNK_BYTES``."""
    bounds: list[tuple[int, int]] = []
    pos = start
    while end - pos > _CHUNK_BYTES:
        match = EVENT_BOUNDARY.search(buf, pos + _CHUNK_BYTES, end)
        if match is None:
            break
        bounds.append((pos, match.start() + 1))  # the closing brace stays with the left chunk
        pos = match.end() - 1  # the next chunk starts at the opening brace
    bounds.append((pos, end))
    return bounds


def decode_range(buf: Buffer, start: int, end: int, sink: Collector, *, ends_array: bool) -> bytes:
    """The whole events in ``buf[start:end]`` into ``sink``, block by block in place (a mapped file's pages
    dropped behind). ``ends_array``: the range runs on past the events array, and the object's keys after it
    are returned.

    Raises:
        msgspec.DecodeError, NotStreamable, OverflowError: a block does not decode alone.
    """
    decoder = BlockDecoder()
    blocks = iter_chunks(buf, start, end)
    last = blocks.pop() if ends_array else None
    for lo, hi in blocks:
        if lo < hi:
            sink.take(decode_in_place(buf, lo, hi, decoder))
            _drop(buf, lo, hi)
    if last is None:
        return b""
    events, rest = last_events(bytes(buf[last[0] : last[1]]), decoder)
    sink.take(events)
    return rest


def decode_in_place(buf: Buffer, lo: int, hi: int, decoder: BlockDecoder) -> list[Any]:
    """The events of ``buf[lo:hi]`` (whole events; a separator byte on each side), decoded where they lie:
    those two bytes are ``[`` and ``]`` for the call and restored after. A bytes ``buf`` is copied instead."""
    if not isinstance(buf, bytearray | mmap.mmap):
        return decoder.decode(b"[" + buf[lo:hi] + b"]")
    before, after = buf[lo - 1], buf[hi]
    buf[lo - 1], buf[hi] = 0x5B, 0x5D  # "[", "]"
    try:
        with memoryview(buf) as view:
            return decoder.decode(view[lo - 1 : hi + 1])
    finally:
        buf[lo - 1], buf[hi] = before, after


def _drop(buf: Buffer, lo: int, hi: int) -> None:
    """Let the kernel take back the mapped pages inside ``buf[lo:hi]``, a block already decoded (a page
    touched again is read again from the file, so nothing is lost): a part of a gigabyte stays small."""
    first = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE
    last = hi - hi % mmap.PAGESIZE
    if isinstance(buf, mmap.mmap) and last > first:
        buf.madvise(mmap.MADV_DONTNEED, first, last - first)


def last_events(tail: bytes, decoder: BlockDecoder) -> tuple[list[Any], bytes]:
    """The events left in the last bytes of an object-form trace, and the keys after traceEvents.

    The ``]`` that closes traceEvents is the one, counting from the end, whose left side decodes as
    events and whose right side as the rest of the object (later keys such as Kineto's "INFO" list
    hold brackets of their own).

    Raises:
        NotStreamable: no such ``]``.
    """
    pos = len(tail)
    for _ in range(4096):
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            break
        rest = tail[pos + 1 :].strip()
        if rest != b"}" and not (rest.startswith(b",") and _valid_json(b'{"_":0' + rest)):
            continue
        body = tail[:pos].strip()
        try:
            return (decoder.decode(b"[" + body + b"]") if body else []), tail[pos + 1 :]
        except msgspec.DecodeError:
            continue
    raise NotStreamable("end of traceEvents not found")


def _valid_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True


# --- a stream ------------------------------------------------------------------------------------------


class _Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


def stream_source(path: Path, size: int) -> BinaryIO | _InflateAhead | None:
    """An open byte stream when the trace is too big to hold whole, else None."""
    declared = _gzip_declared_size(path, size) if path.is_file() else -1
    if declared < 0:
        return path.open("rb") if size > _WHOLE_LIMIT else None
    return _InflateAhead(path) if size > _STREAM_GZ_BYTES or declared > _WHOLE_LIMIT else None


def _gzip_declared_size(path: Path, size: int) -> int:
    with path.open("rb") as handle:
        if handle.read(2) != b"\x1f\x8b":
            return -1
        handle.seek(max(size - 4, 0))
        return int.from_bytes(handle.read(4), "little")


def stream_events(source: _Readable, sink: Collector) -> bytes:
    """Decode the events of an object-form trace block by block; returns the header without events.

    Only one block (``_CHUNK_BYTES``) and its decoded events are in memory at a time.

    Raises:
        NotStreamable: ``traceEvents`` is not near the start, or its end is not found.
    """
    decoder = BlockDecoder()
    first = source.read(_CHUNK_BYTES)
    key = EVENTS_KEY.search(first)
    if key is None:
        raise NotStreamable("traceEvents not near the start")
    head = first[: key.start()]
    # Events are decoded in place (decode_in_place): pending[0] is always the byte before the next event
    # (the array's "[", or a separator), and a bytearray drops decoded bytes from its front without copying.
    pending = bytearray(first[key.end() - 1 :])
    while True:
        block = source.read(_CHUNK_BYTES)
        if not block:
            break
        pending += block
        cut = _last_boundary(pending)
        if cut is None:
            continue
        left_end, right_start = cut
        sink.take(decode_in_place(pending, 1, left_end, decoder))
        del pending[: right_start - 1]
    events, rest = last_events(bytes(pending[1:]), decoder)
    sink.take(events)
    return head + NO_EVENTS + rest


def _last_boundary(buf: bytes | bytearray) -> tuple[int, int] | None:
    """(end of the left event, start of the right one) of the last ``}`` ``,`` ``{`` in ``buf``."""
    pos = len(buf)
    floor = max(0, pos - 4 * _CHUNK_BYTES)
    while pos > floor:
        brace = buf.rfind(b"{", floor, pos)
        if brace <= 0:
            return None
        j = brace - 1
        while j >= 0 and buf[j] in WHITESPACE:
            j -= 1
        if j >= 0 and buf[j] == 0x2C:  # ","
            j -= 1
            while j >= 0 and buf[j] in WHITESPACE:
                j -= 1
            if j >= 0 and buf[j] == 0x7D:  # "}"
                return j + 1, brace
        pos = brace
    return None


class Prefixed:
    """A byte stream with a few bytes already read put back in front."""

    def __init__(self, prefix: bytes, source: _Readable) -> None:
        self._prefix, self._source = prefix, source

    def read(self, n: int) -> bytes:
        if self._prefix:
            out, self._prefix = self._prefix + self._source.read(max(n - len(self._prefix), 0)), b""
            return out
        return self._source.read(n)


class _InflateAhead:
    """A gzip file inflated by a helper thread, a block ahead of the reader.

    zlib releases the GIL while it inflates, so on two cores the inflating overlaps the decoding, and
    only a few blocks of JSON are in memory at once instead of the whole file.
    """

    def __init__(self, path: Path) -> None:
        self._blocks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=2)
        self._pending = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._inflate, args=(path,), daemon=True)
        self._thread.start()

    def _inflate(self, path: Path) -> None:
        try:
            with gzip.open(path, "rb") as source:
                while not self._stop.is_set():
                    block = source.read(_CHUNK_BYTES)
                    self._blocks.put(block)
                    if not block:
                        return
        except BaseException as exc:  # handed to the reader, which raises it on its own thread
            self._blocks.put(exc)

    def read(self, n: int) -> bytes:
        while len(self._pending) < n:
            block = self._blocks.get()
            if isinstance(block, BaseException):
                raise block
            if not block:
                self._blocks.put(block)  # stay at the end for later reads
                break
            self._pending += block
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def __enter__(self) -> _InflateAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._blocks.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
