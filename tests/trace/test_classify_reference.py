"""Classification on whole columns (launch.py, classify.py, breakdown._kernel_rows) against a plain reference.

The reference below is the first, row-by-row implementation of the same rules: per thread a sorted list of
matched frames with a stack for parents and a bisect + walk out per launch, a Python pass over the rows for
waits, sequence matches mapped to operators one by one, replays grouped in a dict, peers and launch frames
counted in dicts. Both must give every row the same category, basis and frame, on the real traces and on
synthetic ones whose frames overlap without nesting, tie on start and end, and sit on several threads.
"""

from __future__ import annotations

import bisect
import difflib
import gzip
import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servescope.core.analysis import BASES
from servescope.core.categories import CATEGORY_OTHER
from servescope.trace.classify.taxonomy import Taxonomy, load_taxonomy
from servescope.trace.classify.work import Work, launch_rows, select_work
from servescope.trace.classify.work_category import (
    CaptureReference,
    _matches,
    capture_reference,
    classify_work,
)
from servescope.trace.read.table import KIND_KERNEL, KIND_NAMES, KIND_USER_ANNOTATION, TraceData
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.steps.breakdown import _kernel_rows
from tracefiles import ROOT, TRACES

_TOL = 1e-3
_OP, _GRAPH, _PEER, _NAME, _UNKNOWN = range(len(BASES))


# ---------------------------------------------------------------------------------------------------------------
# the reference: one row at a time


def _ref_informative(data: TraceData, taxonomy: Taxonomy, rules: list[Any]) -> dict[int, tuple[list[Any], ...]]:
    rule_index = {id(rule): i for i, rule in enumerate(rules)}
    rows: dict[int, list[tuple[float, float, int, int]]] = defaultdict(list)
    for table, kind in ((data.cpu_ops, "cpu_op"), (data.frames, "python")):
        for r in range(len(table)):
            rule = taxonomy.launch_rule(data.names[int(table.name[r])], kind)
            if rule is not None:
                t, d = float(table.ts_us[r]), float(table.dur_us[r])
                rows[int(table.thread[r])].append((t, t + d, rule_index[id(rule)], int(table.name[r])))
    ann = data.annotations
    for r in range(len(ann)):
        name = int(ann.name[r])
        rule = None if ann.kind[r] != KIND_USER_ANNOTATION else taxonomy.launch_rule(data.names[name], "annotation")
        if rule is not None:
            t, d = float(ann.ts_us[r]), float(ann.dur_us[r])
            rows[int(ann.thread[r])].append((t, t + d, rule_index[id(rule)], name))
    out = {}
    for thread, frames in rows.items():
        frames.sort(key=lambda f: (f[0], -f[1]))
        parent: list[int] = []
        stack: list[int] = []
        for i, (start, _e, _r, _n) in enumerate(frames):
            while stack and frames[stack[-1]][1] < start:
                stack.pop()
            parent.append(stack[-1] if stack else -1)
            stack.append(i)
        out[thread] = ([f[0] for f in frames], [f[1] for f in frames], [f[2] for f in frames],
                       [f[3] for f in frames], parent)
    return out


def _ref_frames(data: TraceData, taxonomy: Taxonomy, index: dict[str, int], start: Any, end: Any, thread: Any
                ) -> tuple[list[int], list[int], list[Any]]:
    rules = list(taxonomy.launch_rules)
    frames = _ref_informative(data, taxonomy, rules)
    n = len(start)
    category, frame, decided = [-1] * n, [-1] * n, [None] * n
    for i, (s, e, th) in enumerate(zip(start.tolist(), end.tolist(), thread.tolist(), strict=True)):
        if th not in frames:
            continue
        starts, ends, rule_at, names, parent = frames[th]
        pos = bisect.bisect_right(starts, s) - 1
        while pos >= 0 and ends[pos] + _TOL < e:
            pos = parent[pos]
        if pos >= 0:
            rule = rules[rule_at[pos]]
            category[i], frame[i], decided[i] = index[rule.category], names[pos], rule
    return category, frame, decided


def _ref_sequences(data: TraceData, work: Work, taxonomy: Taxonomy, index: dict[str, int], category: list[int],
                   frame: list[int], launched: list[bool], replayed: list[bool]) -> None:
    if not taxonomy.sequence_rules or len(data.cpu_ops) == 0:
        return
    ops = data.cpu_ops
    region = {}
    for thread in sorted(set(ops.thread.tolist())):
        rows = [r for r in range(len(ops)) if ops.thread[r] == thread]
        rows.sort(key=lambda r: (ops.ts_us[r], -ops.dur_us[r]))
        top, reach = [], -np.inf
        for r in rows:
            if ops.ts_us[r] >= reach:
                top.append(r)
            reach = max(reach, ops.ts_us[r] + ops.dur_us[r])
        tokens = [data.names[int(ops.name[r])].removeprefix("aten::") for r in top]
        text = " ".join(tokens)
        offsets = list(np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]])) if tokens else []
        label = [-1] * len(tokens)
        for rule in reversed(taxonomy.sequence_rules):
            for pattern in rule.patterns:
                for m in re.finditer(r"(?<!\S)(?:" + pattern + r")(?!\S)", text):
                    lo, hi = bisect.bisect_left(offsets, m.start()), bisect.bisect_left(offsets, m.end())
                    label[lo:hi] = [index[rule.category]] * (hi - lo)
        hit = [k for k, v in enumerate(label) if v >= 0]
        if hit:
            region[thread] = ([float(ops.ts_us[top[k]]) for k in hit],
                              [float(ops.ts_us[top[k]] + ops.dur_us[top[k]]) for k in hit],
                              [label[k] for k in hit], [int(ops.name[top[k]]) for k in hit])
    table = work.table
    launch = launch_rows(data, table.correlation[work.rows]) if work.kind == "device" else None
    for row in range(len(work.rows)):
        if category[row] >= 0:
            continue
        if launch is not None:
            if not launched[row] or replayed[row] or table.kind[work.rows[row]] != KIND_KERNEL:
                continue
            s, th = float(data.launches.ts_us[launch[row]]), int(data.launches.thread[launch[row]])
        else:
            s, th = float(table.ts_us[work.rows[row]]), int(table.thread[work.rows[row]])
        if th not in region:
            continue
        starts, ends, labels, names = region[th]
        pos = bisect.bisect_right(starts, s) - 1
        if pos >= 0 and s <= ends[pos] + _TOL:
            category[row], frame[row] = labels[pos], names[pos]


def _ref_context(data: TraceData, work: Work, taxonomy: Taxonomy, categories: list[str]) -> dict[str, Any]:
    n = len(work.rows)
    table = work.table
    category, frame, refines = [-1] * n, [-1] * n, [None] * n
    replayed, launched = [False] * n, [False] * n
    index = {name: i for i, name in enumerate(categories)}
    if work.kind == "device":
        launch = launch_rows(data, table.correlation[work.rows]).tolist()
        query = []
        for row, at in enumerate(launch):
            if at < 0:
                continue
            launched[row] = True
            replayed[row] = bool(re.search("GraphLaunch", data.names[int(data.launches.name[at])], re.I))
            if not replayed[row] and table.kind[work.rows[row]] == KIND_KERNEL:
                query.append(row)
        q_launch = np.array([launch[r] for r in query], dtype=np.int64)
        q_start = data.launches.ts_us[q_launch]
        q_end, q_thread = q_start + data.launches.dur_us[q_launch], data.launches.thread[q_launch]
    else:
        query = list(range(n))
        launched = [True] * n
        q_start = table.ts_us[work.rows]
        q_end, q_thread = q_start + table.dur_us[work.rows], table.thread[work.rows]
    found, found_frame, rule_at = _ref_frames(data, taxonomy, index, q_start, q_end, q_thread)
    waiting = set()
    for row, c, f, rule in zip(query, found, found_frame, rule_at, strict=True):
        category[row], frame[row] = c, f
        if rule is not None:
            refines[row] = rule.refines
            if rule.inherit:
                waiting.add(row)
    if waiting:
        comm = [taxonomy.is_communication(c) for c in categories]
        thread = table.thread[work.rows].tolist()
        last: dict[int, int] = {}
        for row in range(n):
            if row in waiting:
                if thread[row] in last:
                    category[row] = last[thread[row]]
            elif category[row] >= 0 and comm[category[row]]:
                last[thread[row]] = category[row]
    if work.kind == "cpu_op" or len(data.frames) == 0:
        _ref_sequences(data, work, taxonomy, index, category, frame, launched, replayed)
    return {"category": category, "frame": frame, "refines": refines, "replayed": replayed, "launched": launched}


def reference_classify(data: TraceData, work: Work, taxonomy: Taxonomy, capture: CaptureReference | None = None
                       ) -> tuple[list[int], list[int], list[str | None]]:
    categories = list(taxonomy.categories)
    index = {name: i for i, name in enumerate(categories)}
    names, kinds = work.table.name[work.rows], work.table.kind[work.rows]
    ctx = _ref_context(data, work, taxonomy, categories)
    by_name = [index[taxonomy.classify(data.names[n], KIND_NAMES[k])] for n, k in zip(names.tolist(), kinds.tolist(),
                                                                                       strict=True)]
    category = list(ctx["category"])
    for row, group in enumerate(ctx["refines"]):
        if group is not None and taxonomy.categories[categories[by_name[row]]] not in (group, "other"):
            category[row] = -1
    if work.kind == "cpu_op":
        for row in range(len(category)):
            if by_name[row] == index.get("framework", -1) and ctx["frame"][row] != names[row]:
                category[row] = -1
    basis = [_OP if c >= 0 else _NAME for c in category]
    frames = [data.names[f] if f >= 0 and c >= 0 else None for f, c in zip(ctx["frame"], category, strict=True)]
    if work.kind == "device":
        kernel = [k == KIND_KERNEL for k in kinds.tolist()]
        replayed = [r for r in range(len(category)) if ctx["replayed"][r] and kernel[r] and category[r] < 0]
        if replayed:
            _ref_align(data, work, replayed, category, basis, frames, index, capture, by_name, taxonomy)
        orphans = [r for r in range(len(category)) if kernel[r] and category[r] < 0
                   and (ctx["replayed"][r] or not ctx["launched"][r])]
        decided = [r for r in range(len(category)) if basis[r] == _OP and category[r] >= 0]
        weight: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for r in decided:
            weight[int(names[r])][category[r]] += float(work.dur_us[r]) + 1e-9
        frame_of = {int(names[r]): frames[r] for r in decided}
        for r in orphans:
            by_cat = weight.get(int(names[r]))
            if by_cat:
                category[r], basis[r] = max(by_cat, key=lambda c: by_cat[c]), _PEER
                frames[r] = frame_of.get(int(names[r]))
    for r in range(len(category)):
        rule = taxonomy.name_rule(data.names[names[r]], "kernel") if kinds[r] == KIND_KERNEL else None
        if category[r] >= 0 and category[r] != by_name[r] and rule is not None and rule.outranks_launch:
            category[r], basis[r], frames[r] = -1, _NAME, None  # the name lists what the kernel computes
        if category[r] < 0:
            category[r] = by_name[r]
            if category[r] == index[CATEGORY_OTHER]:
                basis[r] = _UNKNOWN
    return category, basis, frames


def _ref_align(data: TraceData, work: Work, replayed: list[int], category: list[int], basis: list[int],
               frames: list[str | None], index: dict[str, int], capture: CaptureReference | None,
               by_name: list[int], taxonomy: Taxonomy) -> None:
    names = work.table.name[work.rows].tolist()
    generic = {index[c] for c in ("elementwise", "reduction", "indexing", "sort_scan", "other", "memcpy", "memset")
               if c in index}
    if capture is not None:
        ref_names, ref_frames = list(capture.names), list(capture.frames)
        ref_cats = [index.get(c, -1) for c in capture.categories]
        ref_by_name = [index[taxonomy.classify(n, "kernel")] for n in ref_names]
        how = _GRAPH
    else:
        decided = [r for r in range(len(category)) if category[r] >= 0 and basis[r] == _OP]
        if not decided:
            return
        launch = launch_rows(data, work.table.correlation[work.rows[decided]])
        decided = [decided[i] for i in np.argsort(data.launches.ts_us[launch], kind="stable").tolist()]
        ref_names = [data.names[names[r]] for r in decided]
        ref_cats, ref_frames = [category[r] for r in decided], [frames[r] for r in decided]
        ref_by_name = [by_name[r] for r in decided]
        how = _PEER
    by_launch: dict[int, list[int]] = defaultdict(list)
    correlation = work.table.correlation[work.rows].tolist()
    for row in replayed:
        by_launch[correlation[row]].append(row)
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(ref_names)
    for group in by_launch.values():
        matcher.set_seq1([data.names[names[r]] for r in group])
        for row, ref in zip(group, _matches(matcher, len(group), ref_cats), strict=True):
            if ref >= 0 and ref_cats[ref] >= 0:
                same_name = data.names[names[row]] == ref_names[ref]
                if not same_name and by_name[row] != ref_by_name[ref] and by_name[row] not in generic:
                    continue  # the names disagree about the layer: the position is not evidence
                category[row], basis[row], frames[row] = ref_cats[ref], how, ref_frames[ref]


def _ref_launch_ops(groups: list[int], frames: list[str | None]) -> dict[int, str]:
    counted: dict[int, Counter[str]] = {}
    for group, frame in zip(groups, frames, strict=True):
        if frame is not None:
            counted.setdefault(group, Counter())[frame] += 1
    return {g: c.most_common(1)[0][0] for g, c in counted.items()}


# ---------------------------------------------------------------------------------------------------------------
# the comparison


def _check(data: TraceData, taxonomy: Taxonomy, capture: CaptureReference | None = None) -> None:
    work = select_work(data)
    got = classify_work(data, work, taxonomy, capture)
    category, basis, frames = reference_classify(data, work, taxonomy, capture)
    assert got.category.tolist() == category
    assert got.basis.tolist() == basis
    assert got.frames() == frames
    # the launch frame of each kernel row: the frame that decided most of its calls, ties to the first seen
    rows = _kernel_rows(data, work.table.name[work.rows], work.table.kind[work.rows], got, work.dur_us,
                        list(taxonomy.categories), 0)
    names, kinds = work.table.name[work.rows].tolist(), work.table.kind[work.rows].tolist()
    keys = list(zip(names, kinds, category, basis, strict=True))
    group_of = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    expected = _ref_launch_ops([group_of[k] for k in keys], frames)
    categories = list(taxonomy.categories)
    by_key = {(data.names[k[0]], categories[k[2]], BASES[k[3]], k[1]): expected.get(g) for k, g in group_of.items()}
    for row in rows:
        key = (row.name, row.category, row.basis, KIND_NAMES.index(row.kind))
        assert row.launch_op == by_key[key], row.name


REAL = [
    "hta/a100_8rank_rank3_nccl.json.gz",
    "hta/nccl_allreduce_2rank_rank0.json.gz",
    "public/hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz",
    "public/vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz",
    "public/xdit_sd35_mi300x_compiled.json.gz",
    "tracelens/h100_qwen1.5-0.5b_inference.json.gz",
    "vllm-cpu/tp2_b4_16tok_rank0.pt.trace.json.gz",
    str(ROOT / "tests/data/h200-vllm/moe-graphs-b16/rank0.pt.trace.json.gz"),
    str(ROOT / "tests/data/h200/dense_b16_rank0.pt.trace.json.gz"),
]
PAIRS = [
    ("tracelens/vllm_decode_full_graph_replay.json.gz",
     "tracelens/vllm_decode_full_graph_capture_rank0.pt.trace.json.gz"),
    ("tracelens/sglang_qwen3-8b_decode_graph_replay.json.gz",
     "tracelens/sglang_qwen3-8b_decode_graph_capture_bs32.json.gz"),
]


def _path(name: str | Path) -> Path:
    path = Path(name)
    if not path.exists():
        pytest.skip(f"{path} missing")
    return path


@pytest.mark.parametrize("name", [p if p.startswith("/") else TRACES / p for p in REAL],
                         ids=lambda n: Path(n).name.split(".")[0])
def test_same_as_reference_on_real_traces(name: str | Path) -> None:
    _check(decode_trace(_path(name)), load_taxonomy(None))


@pytest.mark.parametrize(("replay", "capture"), [(TRACES / r, TRACES / c) for r, c in PAIRS],
                         ids=lambda n: Path(n).name.split(".")[0])
def test_same_as_reference_on_graph_replays(replay: Path, capture: Path) -> None:
    taxonomy = load_taxonomy(None)
    captured = decode_trace(_path(capture))
    reference = capture_reference(captured, taxonomy)
    rows = np.array(sorted(captured.launches.kernel, key=lambda r: captured.launches.ts_us[r]), dtype=np.int64)
    start = captured.launches.ts_us[rows]
    categories = list(taxonomy.categories)
    found, frame, _ = _ref_frames(captured, taxonomy, {c: i for i, c in enumerate(categories)}, start,
                                  start + captured.launches.dur_us[rows], captured.launches.thread[rows])
    assert reference.categories == [categories[c] if c >= 0 else "" for c in found]
    assert reference.frames == [captured.names[f] if f >= 0 else None for f in frame]
    _check(decode_trace(_path(replay)), taxonomy, reference)
    _check(decode_trace(_path(replay)), taxonomy)  # no capture: lined up with its own launches


# synthetic traces: frames that nest, overlap without nesting, tie, and sit on two threads
_CPU_NAMES = ["aten::mm", "aten::mul", "aten::linear", "vllm::moe_forward", "aten::add", "aten::silu",
              "_c10d_functional::wait_tensor", "c10d::allreduce_", "aten::pow", "aten::mean", "aten::rsqrt",
              "aten::to", "aten::softmax", "aten::topk", "aten::view", "aten::sum", "aten::argmax"]
_PY_NAMES = ["nn.Module: LlamaRMSNorm_0", "nn.Module: Linear_1", "model.py(12): forward",
             "vllm/model_executor/layers/rotary_embedding.py(88): forward", "torch/optim/adam.py(3): step"]
_ANN_NAMES = ["nccl:all_reduce", "nccl:all_to_all", "## forward ##", "Optimizer.step#Adam.step"]
_KERNELS = ["ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4, mul>",
            "ncclKernel_AllReduce_RING_LL_Sum_float", "triton_poi_fused_0", "fused_moe_kernel", "Memcpy DtoD"]


_LAYER = ["aten::to", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::to"]


def _synthetic(seed: int, with_python: bool, with_kernels: bool = True) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    events: list[dict[str, Any]] = []
    corr = 0
    reach = 0.0

    def add(cat: str, name: str, ts: float, dur: float, tid: int, **args: Any) -> None:
        nonlocal reach
        if not with_kernels and cat in ("cuda_runtime", "kernel", "gpu_memcpy"):
            return
        if cat == "cpu_op":
            reach = max(reach, ts + dur)
        ev = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
        if args:
            ev["args"] = args
        events.append(ev)

    for tid in (1, 2):
        t = 1000.0 * tid
        # a collective, then (on the other thread, later) a wait with none before it on its own thread
        add("cpu_op", "c10d::allreduce_" if tid == 1 else "_c10d_functional::wait_tensor", t, 1.0, tid)
        for _ in range(150):
            t += rnd.choice([0.0, 0.5, 1.0, 3.0])
            if rnd.random() < 0.05:  # an RMSNorm as a run of top-level operators, each launching a kernel
                t = reach + 1.0
                for name in _LAYER:
                    add("cpu_op", name, t, 4.0, tid)
                    corr += 1
                    at = t + rnd.choice([1.0, 4.0004, 4.002])  # just after the op: within the tolerance, or not
                    add("cuda_runtime", "cudaLaunchKernel", at, 1.0, tid, correlation=corr)
                    add("kernel", _KERNELS[1], 5000.0 + corr * 10, 2.0, 7, correlation=corr)
                    t += 5.0
            dur = rnd.choice([1.0, 2.0, 5.0, 20.0, 60.0])
            roll = rnd.random()
            if roll < 0.55:
                add("cpu_op", rnd.choice(_CPU_NAMES), t, dur, tid)
            elif roll < 0.8 and with_python:
                add("python_function", rnd.choice(_PY_NAMES), t, dur, tid)
            elif roll < 0.9:
                add("user_annotation", rnd.choice(_ANN_NAMES), t, dur, tid)
            if rnd.random() < 0.7:  # a launch somewhere in what is open now
                corr += 1
                at, length = rnd.choice([(t, 0.0), (t, 1.0), (t + 0.2, 0.3), (t + 0.5, 1.0), (t + dur - 0.5, 0.5),
                                         (t + dur, 0.0), (t + dur - 0.3, 0.3004), (t + dur - 0.3, 0.302)])
                graph = rnd.random() < 0.1  # (t + dur - 0.3, 0.3004): ends within the 1 ns tolerance of the op
                add("cuda_runtime", "cudaGraphLaunch" if graph else "cudaLaunchKernel", at, length, tid,
                    correlation=corr)
                for k in range(3 if graph else 1):
                    name = rnd.choice(_KERNELS)
                    add("gpu_memcpy" if name.startswith("Memcpy") else "kernel", name,
                        5000.0 + corr * 10 + k, 2.0 + k, 7, correlation=corr)
        for _ in range(5):  # a kernel whose launch is not in the trace
            add("kernel", rnd.choice(_KERNELS), 9000.0 + rnd.random() * 100, 1.0, 7, correlation=10_000 + _)
    return events


@pytest.mark.parametrize("seed", range(12))
def test_same_as_reference_on_synthetic_frames(tmp_path: Path, seed: int) -> None:
    """Seeds 0-7: kernels (with python frames on even seeds); 8-11: CPU work (cpu_op self time)."""
    path = tmp_path / "synthetic.json.gz"
    events = _synthetic(seed, with_python=seed % 2 == 0, with_kernels=seed < 8)
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    data = decode_trace(path)
    assert select_work(data).kind == ("device" if seed < 8 else "cpu_op")
    taxonomy = load_taxonomy(None)
    _check(data, taxonomy)
    work = select_work(data)
    classified = classify_work(data, work, taxonomy)
    decided = {BASES[b] for b in classified.basis.tolist()}
    assert {"op", "name"} <= decided
