"""The one column type: what the decoder writes is what analysis reads, sent between processes as plain arrays."""

from __future__ import annotations

import pickle
from array import array

import numpy as np
import pytest

from servescope.trace.classify.taxonomy import load_taxonomy
from servescope.trace.classify.work import select_work
from servescope.trace.read.table import KIND_KERNEL, KIND_USER_ANNOTATION, Table
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.steps.breakdown import break_down
from servescope.trace.steps.find import find_steps
from tracefiles import TRACES


def _table() -> Table:
    table = Table()
    table.append(KIND_KERNEL, [3, 1], [10.0, 20.5], [1.0, 2.0], [7, -1], [0, 1])
    table.append([KIND_KERNEL], [2], [30.0], [0.5], -1, [0])
    table.msg_bytes[1] = 4096
    return table


def test_rows_read_as_numpy_arrays_over_the_appended_columns() -> None:
    table = _table()
    assert len(table) == 3
    assert table.name.dtype == np.int32 and table.name.tolist() == [3, 1, 2]
    assert table.ts_us.tolist() == [10.0, 20.5, 30.0]
    assert table.correlation.tolist() == [7, -1, -1]
    assert table.thread.tolist() == [0, 1, 0]


def test_a_table_that_was_read_no_longer_grows() -> None:
    table = _table()
    _ = table.ts_us
    with pytest.raises(BufferError):
        table.append(KIND_KERNEL, [0], [1.0], [1.0], -1, [0])


def test_pickled_as_plain_arrays_and_read_again() -> None:
    """A read-ahead child imports no numpy: what it pickles holds arrays only, even after the parent read it."""
    table = _table()
    _ = table.dur_us  # numpy arrays made: they stay out of the pickle
    state = table.__getstate__()
    assert all(isinstance(column, array) for column in state[0])
    back = pickle.loads(pickle.dumps(table))
    assert back.dur_us.tolist() == [1.0, 2.0, 0.5] and back.msg_bytes == {1: 4096}


def test_drop_renumbers_rows_and_their_dicts() -> None:
    table = _table()
    table.kernel[2] = 9
    table.drop({0})
    assert table.name.tolist() == [1, 2]
    assert table.msg_bytes == {0: 4096} and table.kernel == {1: 9}


@pytest.mark.needs_shared
def test_analysis_leaves_the_decoded_names_alone() -> None:
    """Annotations are a table like the others, their names interned by the decoder: classifying by the frames
    around a launch (some of them annotations here) looks names up and writes none."""
    data = decode_trace(TRACES / "hta/nccl_allreduce_2rank_rank0.json.gz")
    taxonomy = load_taxonomy(None)
    annotations = data.annotations
    cpu = annotations.kind == KIND_USER_ANNOTATION
    assert any(taxonomy.launch_rule(data.names[n], "annotation") for n in annotations.name[cpu].tolist())
    names = list(data.names)
    work = select_work(data)
    break_down(data, work, find_steps(data, work), taxonomy, rank=0)
    assert data.names == names
