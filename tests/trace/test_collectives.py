"""Each phase's collectives in the analysis document (issue 39 item 2): the message sizes, the group and the kernels,
against plain json over a real NCCL trace (HTA's two-rank all-reduce test trace: PyTorch's ``record_param_comms``
args on every NCCL kernel)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from servescope.trace.analyze import AnalyzeRequest, analyze
from tracefiles import SHARED

NCCL_2RANK = SHARED / "traces" / "hta" / "nccl_allreduce_2rank_rank0.json.gz"
_WIDTH = {"Float": 4, "Long": 8}  # the dtypes this trace's collectives name, in bytes


@pytest.mark.needs_shared
def test_sizes_group_and_kernels_are_those_the_kernels_recorded() -> None:
    with gzip.open(NCCL_2RANK, "rt", encoding="utf-8") as fh:
        kernels = [e for e in json.load(fh)["traceEvents"]
                   if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    expected: dict[str, Counter[int]] = {}  # by plain name: NCCL's all-reduce, the rest (broadcast)
    names: dict[str, Counter[str]] = {}
    time: dict[tuple[str, int], float] = {}
    for e in kernels:
        kind = "comm.all_reduce" if "AllReduce" in e["name"] else "comm.other"
        size = e["args"]["In msg nelems"] * _WIDTH[e["args"]["dtype"]]
        expected.setdefault(kind, Counter())[size] += 1
        time[kind, size] = time.get((kind, size), 0.0) + e["dur"]
        names.setdefault(kind, Counter())[e["name"]] += 1
    assert set(expected) == {"comm.all_reduce", "comm.other"} and sum(expected["comm.all_reduce"].values()) == 15
    (rank,) = analyze(AnalyzeRequest(paths=[NCCL_2RANK])).ranks
    seen: dict[str, Counter[int]] = {}
    kernels_seen: dict[str, Counter[str]] = {}
    for phase in rank.phases.values():
        for category, stats in phase.collectives.items():
            assert stats.group == 2  # the kernels' Group size
            for size in stats.sizes:
                seen.setdefault(category, Counter())[size.bytes] += size.calls
                assert size.total_us == pytest.approx(time[category, size.bytes], rel=1e-6)
            kernels_seen.setdefault(category, Counter()).update(stats.kernels)
    assert seen == expected
    assert kernels_seen == names
