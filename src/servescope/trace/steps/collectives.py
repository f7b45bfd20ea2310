"""The collectives of each phase of a rank: the message sizes their kernels recorded, the group, the kernels.

PyTorch's profiler writes on each NCCL kernel the collective's ``In msg nelems``, ``Out msg nelems``, ``dtype`` and
``Group size`` (``record_param_comms``), which the reader keeps per row (``Table.msg_bytes``, ``Table.msg_out``).
Here the work rows of each communication category are grouped by the phase of the step that launched them: calls
and time at each size (nccl-tests' size: an all-gather's gathered output, any other collective's input), the group
most of them ran over, and the calls of each kernel name (which implementation ran). ``plan --calibrate`` prices
the capture's collectives from this part of the document, never from the trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from servescope.core.analysis import CollectiveStats, MessageSize, StepRow
from servescope.core.categories import COMMUNICATION, Category
from servescope.trace.classify.work import Work
from servescope.trace.read.table import TraceData

__all__ = ["ALL_GATHER", "phase_collectives"]

ALL_GATHER = "all_gather"  # the collective whose nccl-tests size is its output (taxonomy.toml's collective mark)


def _sizes(work: Work, rows: npt.NDArray[np.int64], gathered: npt.NDArray[np.bool_],
           ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(message bytes or -1, group or -1) of each work row in ``rows`` (``gathered``: its size is its output)."""
    table = work.table
    size, group = np.full(len(rows), -1, dtype=np.int64), np.full(len(rows), -1, dtype=np.int64)
    if not table.msg_out and not table.msg_bytes:
        return size, group
    keys = np.array(sorted(table.msg_out.keys() | table.msg_bytes.keys()), dtype=np.int64)
    in_bytes = np.array([table.msg_bytes.get(k, -1) for k in keys.tolist()], dtype=np.int64)
    out = np.array([table.msg_out.get(k, (-1, -1)) for k in keys.tolist()], dtype=np.int64).reshape(-1, 2)
    table_rows = work.rows[rows]
    at = np.clip(np.searchsorted(keys, table_rows), 0, len(keys) - 1)
    found = keys[at] == table_rows
    size[found] = np.where(gathered[found], out[at[found], 0], in_bytes[at[found]])
    group[found] = out[at[found], 1]
    return size, group


def phase_collectives(data: TraceData, work: Work, category: npt.NDArray[np.int32], names: Sequence[str],
                      table: Mapping[str, Category], step_of: npt.NDArray[np.int64],
                      steps: Sequence[StepRow]) -> dict[str, dict[str, CollectiveStats]]:
    """Per phase, per communication category (``names`` indexed by ``category``, marked in ``table``), the
    collectives of the work rows launched by ``steps`` (``step_of``: each work row's step index, -1: none)."""
    comm = np.array([table[n].group == COMMUNICATION if n in table else False for n in names], dtype=bool)
    rows = np.flatnonzero(comm[category] & (step_of >= 0)) if len(category) else np.zeros(0, dtype=np.int64)
    if len(rows) == 0:
        return {}
    labels = sorted({s.phase for s in steps})
    code = np.full(int(step_of.max()) + 1, -1, dtype=np.int64)  # step index -> its phase's place in labels
    for s in steps:
        if s.index < len(code):
            code[s.index] = labels.index(s.phase)
    gathered = np.array([table[n].collective == ALL_GATHER if n in table else False for n in names],
                        dtype=bool)[category[rows]]
    size, group = _sizes(work, rows, gathered)
    kernel = work.table.name[work.rows[rows]]
    dur = work.dur_us[rows]
    out: dict[str, dict[str, CollectiveStats]] = {}
    phases = code[step_of[rows]]
    for at, phase in enumerate(labels):
        in_phase = phases == at
        if not in_phase.any():
            continue
        # return_counts: np.unique without it asks numpy.ma whether the array is masked (its import: ~8 ms a run)
        for c in np.unique(category[rows][in_phase], return_counts=True)[0].tolist():
            sel = in_phase & (category[rows] == c)
            sized = sel & (size >= 0)
            by_size = [MessageSize(bytes=int(b), calls=int(np.count_nonzero(sized & (size == b))),
                                   total_us=float(dur[sized & (size == b)].sum()))
                       for b in np.unique(size[sized], return_counts=True)[0].tolist()]
            groups, counts = np.unique(group[sel & (group > 0)], return_counts=True)
            ids, calls = np.unique(kernel[sel], return_counts=True)
            out.setdefault(phase, {})[names[c]] = CollectiveStats(
                group=int(groups[np.argmax(counts)]) if len(groups) else None, sizes=by_size,
                kernels={data.names[int(i)]: int(n) for n, i in sorted(zip(calls.tolist(), ids.tolist(), strict=True),
                                                                      key=lambda pair: (-pair[0], pair[1]))})
    return out
