"""Trace files → :class:`TraceData`: the decoded columns (:mod:`servescope.trace.decode`) as numpy arrays.

``read_trace`` reads one file here; :class:`~servescope.trace.readahead.ReadAhead` reads several in child
processes, and :func:`to_trace_data` turns what either returns into the arrays analysis works on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from servescope.trace.decode import (
    KIND_CPU_OP,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_NAMES,
    KIND_PYTHON,
    Annotation,
    Columns,
    DecodedTrace,
    decode_trace,
)

__all__ = [
    "KIND_CPU_OP",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "KIND_NAMES",
    "KIND_PYTHON",
    "Annotation",
    "OpTable",
    "TraceData",
    "distinct_ids",
    "read_trace",
    "to_trace_data",
]


@dataclass(slots=True)
class OpTable:
    """Columns of timed work or launches; ``name`` indexes ``TraceData.names``."""

    kind: npt.NDArray[np.int8]
    name: npt.NDArray[np.int32]
    ts_us: npt.NDArray[np.float64]
    dur_us: npt.NDArray[np.float64]
    correlation: npt.NDArray[np.int64]  # -1 where absent
    thread: npt.NDArray[np.int32]  # index into TraceData.threads
    msg_bytes: dict[int, int] = field(default_factory=dict)  # row -> bytes, for collectives that record it
    kernel: dict[int, int] = field(default_factory=dict)  # launch row -> name id of the kernel it launched

    def __len__(self) -> int:
        return int(self.ts_us.shape[0])

    @classmethod
    def of(cls, columns: Columns) -> OpTable:
        """The table over ``columns``' buffers (no copy)."""
        return cls(
            kind=np.frombuffer(columns.kind, dtype=np.int8),
            name=np.frombuffer(columns.name, dtype=np.intc).astype(np.int32, copy=False),
            ts_us=np.frombuffer(columns.ts_us, dtype=np.float64),
            dur_us=np.frombuffer(columns.dur_us, dtype=np.float64),
            correlation=np.frombuffer(columns.correlation, dtype=np.int64),
            thread=np.frombuffer(columns.thread, dtype=np.intc).astype(np.int32, copy=False),
            msg_bytes=columns.msg_bytes,
            kernel=columns.kernel,
        )


@dataclass(slots=True)
class TraceData:
    """One trace file, reduced to what analysis needs."""

    path: Path
    size_bytes: int
    event_count: int
    names: list[str]
    threads: list[tuple[int | str, int | str]]  # (pid, tid) of each thread id the tables use
    device: OpTable  # kernels, memcpy, memset
    cpu_ops: OpTable  # every cpu_op (the work in traces without device events)
    launches: OpTable  # runtime calls with a correlation id
    frames: OpTable  # python_function events: the python stack (traces captured with_stack / with_modules)
    annotations: list[Annotation]
    distributed: dict[str, Any] | None
    metadata: dict[str, str]
    # cpu_op rows that mark a profiler step (``ProfilerStep#N``, torch.profiler's schedule): ranges, not work
    step_markers: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    malformed: int = 0  # events left out as malformed, and the first few named
    malformed_examples: list[str] = field(default_factory=list)


STEP_MARKER_PREFIX = "ProfilerStep#"


def _step_markers(names: list[str], cpu_ops: OpTable) -> npt.NDArray[np.bool_]:
    ids = [i for i, name in enumerate(names) if name.startswith(STEP_MARKER_PREFIX)]
    if not ids or len(cpu_ops) == 0:
        return np.zeros(len(cpu_ops), dtype=bool)
    return np.isin(cpu_ops.name, np.array(ids, dtype=np.int32))


def distinct_ids(values: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.int64]:
    """The distinct values of an array of non-negative ids, ascending (``np.unique`` without its import of
    ``numpy.ma``, ~17 ms of a 0.4 s run)."""
    return np.flatnonzero(np.bincount(values)) if len(values) else np.zeros(0, dtype=np.int64)


def to_trace_data(decoded: DecodedTrace) -> TraceData:
    """The arrays analysis works on, over ``decoded``'s columns."""
    cpu_ops = OpTable.of(decoded.cpu_ops)
    return TraceData(
        path=decoded.path, size_bytes=decoded.size_bytes, event_count=decoded.event_count, names=decoded.names,
        threads=decoded.threads,
        device=OpTable.of(decoded.device), cpu_ops=cpu_ops, launches=OpTable.of(decoded.launches),
        frames=OpTable.of(decoded.frames),
        annotations=decoded.annotations, distributed=decoded.distributed, metadata=decoded.metadata,
        step_markers=_step_markers(decoded.names, cpu_ops),
        malformed=decoded.malformed, malformed_examples=decoded.malformed_examples,
    )


def read_trace(path: str | Path) -> TraceData:
    """Read one trace file into compact tables.

    Raises:
        InputError: the file is missing, unreadable, a truncated or corrupt gzip, not JSON, not a
            Chrome/Kineto trace, or holds no events.

    Example:
        >>> data = read_trace("rank0.pt.trace.json.gz")  # doctest: +SKIP
        >>> len(data.device), data.distributed["rank"]  # doctest: +SKIP
    """
    return to_trace_data(decode_trace(path))
