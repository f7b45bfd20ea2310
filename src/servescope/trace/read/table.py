"""The one column type of a decoded trace: :class:`Table`, a row per event, and :class:`TraceData`, its tables.

The decoder (:mod:`servescope.trace.read.trace_json`) appends rows to plain ``array`` columns (a read-ahead child that
decodes imports no numpy, see :mod:`servescope.trace.read.readahead`, and pickles them as they are); analysis reads
the same columns as numpy arrays over those buffers, made on first read without a copy. After that first read
a table no longer grows: its buffers are exported, and an append raises ``BufferError``.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "KIND_CPU_OP",
    "KIND_GPU_ANNOTATION",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "KIND_NAMES",
    "KIND_PYTHON",
    "KIND_USER_ANNOTATION",
    "STEP_MARKER_PREFIX",
    "Table",
    "TraceData",
    "distinct_ids",
]

KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_CPU_OP, KIND_PYTHON, KIND_USER_ANNOTATION, KIND_GPU_ANNOTATION = range(7)
KIND_NAMES = ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "python_function", "user_annotation",
              "gpu_user_annotation")
STEP_MARKER_PREFIX = "ProfilerStep#"  # torch.profiler's schedule: a range per step, written as an annotation or op
_TYPECODES = ("b", "i", "d", "d", "q", "i")  # kind, name, ts_us, dur_us, correlation, thread


D = TypeVar("D", bound="np.generic")


class _Column(Generic[D]):
    """Column ``index`` of a :class:`Table`, read as a numpy array of ``D`` (the arrays are made on first read)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __get__(self, table: Table, owner: type[Table] | None = None) -> npt.NDArray[D]:
        column: npt.NDArray[D] = (table._arrays or table._numpy())[self.index]  # no call once the arrays are made
        return column


class Table:
    """One table of events, a row per event in trace order: ``kind`` (``KIND_*``; -1 for runtime launches),
    ``name`` (an index into :attr:`TraceData.names`), ``ts_us``, ``dur_us``, ``correlation`` (-1 where absent)
    and ``thread`` (an index into :attr:`TraceData.threads`), read as numpy arrays; ``msg_bytes`` holds the
    message size of the collectives that record it (row -> bytes of their input), ``msg_out`` their output's size
    and group (row -> (bytes or -1, ranks or -1)), ``kernel`` the kernel a runtime launch names (row -> name id)."""

    __slots__ = ("_columns", "_arrays", "msg_bytes", "msg_out", "kernel")

    def __init__(self) -> None:
        self._columns: tuple[array[Any], ...] = tuple(array(code) for code in _TYPECODES)
        self._arrays: tuple[Any, ...] | None = None
        self.msg_bytes: dict[int, int] = {}
        self.msg_out: dict[int, tuple[int, int]] = {}
        self.kernel: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._columns[2])

    def __getstate__(self) -> tuple[Any, ...]:
        return self._columns, self.msg_bytes, self.msg_out, self.kernel

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._columns, self.msg_bytes, self.msg_out, self.kernel = state
        self._arrays = None

    # -- written by the decoder -----------------------------------------------------------------------------

    def append(self, kind: int | list[int], name: list[int], ts_us: list[float], dur_us: list[float],
               correlation: int | list[int], thread: list[int]) -> int:
        """Append rows (``kind`` and ``correlation`` one value for all or one per row); returns the first new row."""
        first = len(self)
        count = len(ts_us)
        kinds, names, starts, durations, correlations, threads = self._columns
        kinds.fromlist([kind] * count if isinstance(kind, int) else kind)  # fromlist: twice extend's speed
        names.fromlist(name)
        starts.fromlist(ts_us)
        durations.fromlist(dur_us)
        correlations.fromlist([correlation] * count if isinstance(correlation, int) else correlation)
        threads.fromlist(thread)
        return first

    def extend(self, other: Table, name_ids: list[int], thread_ids: list[int]) -> None:
        """Append ``other``'s rows, its name and thread ids mapped through ``name_ids`` and ``thread_ids``
        (the caller joining parts does this, numpy at hand; a decoding child never does)."""
        first = len(self)
        kinds, names, starts, durations, correlations, threads = self._columns
        o_kinds, o_names, o_starts, o_durations, o_correlations, o_threads = other._columns
        kinds.extend(o_kinds)
        starts.extend(o_starts)
        durations.extend(o_durations)
        correlations.extend(o_correlations)
        _extend_mapped(names, o_names, name_ids)
        _extend_mapped(threads, o_threads, thread_ids)
        self.msg_bytes.update({first + row: size for row, size in other.msg_bytes.items()})
        self.msg_out.update({first + row: out for row, out in other.msg_out.items()})
        self.kernel.update({first + row: name_ids[name] for row, name in other.kernel.items()})

    def drop(self, rows: set[int]) -> None:
        """Leave out ``rows`` (a rare repair: rows renumbered, the per-row dicts with them)."""
        if not rows:
            return
        keep = [r for r in range(len(self)) if r not in rows]
        new_row = {old: new for new, old in enumerate(keep)}
        self._columns = tuple(array(column.typecode, [column[r] for r in keep]) for column in self._columns)
        self.msg_bytes = {new_row[r]: v for r, v in self.msg_bytes.items() if r in new_row}
        self.msg_out = {new_row[r]: v for r, v in self.msg_out.items() if r in new_row}
        self.kernel = {new_row[r]: v for r, v in self.kernel.items() if r in new_row}

    def bad_time_rows(self, max_ts_us: float) -> list[int]:
        """Rows with a negative duration or a start outside [0, ``max_ts_us``): none in the common case, found
        by three passes in C without looking at a row."""
        _, _, starts, durations, _, _ = self._columns
        if not starts or (min(durations) >= 0 and min(starts) >= 0 and max(starts) < max_ts_us):
            return []
        return [row for row, (ts, dur) in enumerate(zip(starts, durations, strict=True))
                if dur < 0 or ts < 0 or ts >= max_ts_us]

    def row(self, row: int) -> tuple[int, int, float, float, int, int]:
        """One row's (kind, name, ts_us, dur_us, correlation, thread), without making the numpy arrays."""
        kind, name, ts, dur, correlation, thread = (column[row] for column in self._columns)
        return kind, name, ts, dur, correlation, thread

    # -- read by analysis -----------------------------------------------------------------------------------

    def _numpy(self) -> tuple[Any, ...]:
        if self._arrays is None:
            import numpy as np

            kinds, names, starts, durations, correlations, threads = self._columns
            self._arrays = (
                np.frombuffer(kinds, dtype=np.int8),
                np.frombuffer(names, dtype=np.intc).astype(np.int32, copy=False),
                np.frombuffer(starts, dtype=np.float64),
                np.frombuffer(durations, dtype=np.float64),
                np.frombuffer(correlations, dtype=np.int64),
                np.frombuffer(threads, dtype=np.intc).astype(np.int32, copy=False),
            )
        return self._arrays

    kind: _Column[np.int8] = _Column(0)
    name: _Column[np.int32] = _Column(1)
    ts_us: _Column[np.float64] = _Column(2)
    dur_us: _Column[np.float64] = _Column(3)
    correlation: _Column[np.int64] = _Column(4)
    thread: _Column[np.int32] = _Column(5)


@dataclass(slots=True)
class TraceData:
    """One trace file, reduced to what analysis needs: what the decoder returns and analysis reads (picklable:
    a read-ahead child sends it whole)."""

    path: Path
    size_bytes: int
    event_count: int
    names: list[str]  # every name a table row uses, interned: position == id
    threads: list[tuple[int | str, int | str]]  # (pid, tid) of each thread id the tables use
    device: Table  # kernels, memcpy, memset
    cpu_ops: Table  # every cpu_op (the work in traces without device events), ProfilerStep#N markers too
    launches: Table  # runtime calls with a correlation id
    frames: Table  # python_function events: the python stack (traces captured with_stack / with_modules)
    annotations: Table  # user annotations, CPU-side (KIND_USER_ANNOTATION) and GPU-side (KIND_GPU_ANNOTATION)
    distributed: dict[str, Any] | None
    metadata: dict[str, str]
    malformed: int = 0  # events left out as malformed, and the first few named
    malformed_examples: list[str] = field(default_factory=list)
    _markers: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def step_markers(self) -> npt.NDArray[np.bool_]:
        """Per ``cpu_ops`` row: a profiler step marker (``ProfilerStep#N``): a range that holds steps' work, not
        work itself."""
        if self._markers is None:
            import numpy as np

            ids = [i for i, name in enumerate(self.names) if name.startswith(STEP_MARKER_PREFIX)]
            ops = self.cpu_ops
            self._markers = (np.isin(ops.name, np.array(ids, dtype=np.int32)) if ids and len(ops)
                             else np.zeros(len(ops), dtype=bool))
        return self._markers  # type: ignore[no-any-return]


def _extend_mapped(into: array[Any], ids: array[Any], mapping: list[int]) -> None:
    """``into`` extended by ``ids``, each mapped through ``mapping`` (an id column of another part)."""
    if mapping == list(range(len(mapping))):  # the first part's ids are the joined trace's own: copied as they are
        into.extend(ids)
    elif ids:
        import numpy as np

        mapped = np.asarray(mapping, dtype=np.intc)[np.frombuffer(ids, dtype=np.intc)]
        into.frombytes(mapped.tobytes())


def distinct_ids(values: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.int64]:
    """The distinct values of an array of non-negative ids, ascending (``np.unique`` without its import of
    ``numpy.ma``, ~17 ms of a 0.4 s run)."""
    import numpy as np

    return np.flatnonzero(np.bincount(values)) if len(values) else np.zeros(0, dtype=np.int64)
