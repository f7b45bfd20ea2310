"""Decoded events sorted into the tables of a :class:`~servescope.trace.read.table.TraceData`, and the trace assembled.

:class:`Collector` takes the events of each decoded block in one pass: device work, CPU operators, runtime
launches (with a correlation id), python frames and annotations each go to their table in event order, names
and threads interned. :func:`trace_data` then leaves out the rows with impossible times, fails a trace with too
many malformed events, and reads the trace's header into a :class:`TraceData`.
"""

from __future__ import annotations

import itertools
import operator
from collections import defaultdict
from pathlib import Path

from servescope.core.errors import InputError
from servescope.trace.read.events import Event, Header, WholeTrace
from servescope.trace.read.table import (
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

__all__ = ["MALFORMED_EXAMPLES", "MALFORMED_SHARE", "Collector", "drop_bad_times", "trace_data"]

# Malformed events (a field of the wrong type, a negative duration, a time out of range) are left out and
# counted, the first few named; more than this share of a trace's events fails it: then it is not the odd
# bad event of a real trace but a file this reader does not understand.
MALFORMED_SHARE = 0.01
MALFORMED_EXAMPLES = 3
_MAX_TS_US = 1e17  # ~3,000 years of microseconds: a timestamp beyond is no clock's

_DEVICE_KINDS = {"kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY, "gpu_memset": KIND_MEMSET}
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"})
_ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
_DEVICE, _CPU, _LAUNCH, _ANNOTATION, _FRAME = range(5)
_TABLE_OF = {**dict.fromkeys(_DEVICE_KINDS, _DEVICE), "cpu_op": _CPU, **dict.fromkeys(_RUNTIME_CATS, _LAUNCH),
             **dict.fromkeys(_ANNOTATION_CATS, _ANNOTATION), "python_function": _FRAME}
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}
_THREAD = operator.attrgetter("pid", "tid")  # a (pid, tid) key; map over it is ~20% faster than a comprehension


class Collector:
    """Sorts decoded events into the tables in one pass, keeping each table in event order, and interns names."""

    def __init__(self) -> None:
        self.ids: defaultdict[str, int] = defaultdict(itertools.count().__next__)  # name -> id, in first-seen order
        self.thread_ids: defaultdict[tuple[int | str, int | str], int] = defaultdict(itertools.count().__next__)
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
        return list(self.ids)  # dicts keep insertion order: position == id

    @property
    def threads(self) -> list[tuple[int | str, int | str]]:
        return list(self.thread_ids)

    def take(self, events: list[Event]) -> None:
        """Adds the events of one decoded block (and counts those its decoder left out, see ``skipped``)."""
        skipped: list[tuple[int, str]] = getattr(events, "skipped", [])
        for index, problem in skipped:
            if len(self.malformed_examples) < MALFORMED_EXAMPLES:
                self.malformed_examples.append(f"event {self.count + index}: {problem}")
        self.malformed += len(skipped)
        self.count += len(events) + len(skipped)
        tables: tuple[list[Event], ...] = ([], [], [], [], [])
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
            ids = self.ids
            self.launches.kernel.update({first + i: ids[a.kernel] for i, e in enumerate(launches)
                                         if (a := e.args) is not None and a.kernel is not None})
        if frames:
            self._add(self.frames, frames, KIND_PYTHON)
        if annotations:
            self._add(self.annotations, annotations,
                      [KIND_GPU_ANNOTATION if e.cat == "gpu_user_annotation" else KIND_USER_ANNOTATION
                       for e in annotations])

    def _add(self, table: Table, events: list[Event], kind: int | list[int]) -> int:
        ids = self.ids
        return table.append(kind, [ids[e.name] for e in events], [e.ts for e in events], [e.dur for e in events],
                            [a.correlation if (a := e.args) is not None and a.correlation is not None else -1
                             for e in events],
                            list(map(self.thread_ids.__getitem__, map(_THREAD, events))))

    def _collectives(self, device: list[Event], first: int) -> None:
        for offset, ev in enumerate(device):
            args = ev.args
            if args is None or args.collective is None:
                continue
            row = first + offset
            width = _DTYPE_BYTES.get(args.dtype.lower()) if args.dtype is not None else None
            if args.in_nelems is not None and width is not None:
                self.device.msg_bytes[row] = args.in_nelems * width
            out = args.out_nelems * width if args.out_nelems is not None and width is not None else -1
            self.device.msg_out[row] = (out, args.group_size if args.group_size is not None else -1)


def drop_bad_times(sink: Collector) -> None:
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


def trace_data(path: Path, size: int, sink: Collector, header: Header | WholeTrace, *,
               times_checked: bool = False) -> TraceData:
    """The trace of ``path`` from its collected tables and its header.

    Raises:
        InputError: the trace holds no events, or more than :data:`MALFORMED_SHARE` of them are malformed.
    """
    if sink.count == 0:
        raise InputError(str(path), "empty trace (traceEvents holds no events)")
    if not times_checked:
        drop_bad_times(sink)
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
