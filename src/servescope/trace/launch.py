"""What launched each piece of work: the CPU-side frames around its launch, read against the launch rules.

A kernel carries the correlation id of the runtime call that launched it (``cudaLaunchKernel``, one
``cudaGraphLaunch`` for every kernel of a graph replay). That call lies, on its thread, inside frames: CPU
operators (``aten::mm``, ``vllm::moe_forward``), annotations (``nccl:all_reduce``) and, in traces recorded
with stacks or modules, python functions (``nn.Module: Qwen2RMSNorm_0``). The innermost frame that a launch
rule of the taxonomy matches decides the kernel's category; frames no rule matches (``aten::mul``) say
nothing and the search goes on outwards. On traces whose work is CPU operators, the operator itself is the
innermost frame.

Traces without stacks write layers as plain aten operators; the taxonomy's sequence rules recognise them in
the run of a thread's top-level operators (``to pow mean add rsqrt mul`` is an RMSNorm), for the operators no
launch rule decided.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servescope.trace.reader import KIND_KERNEL, OpTable, TraceData
from servescope.trace.taxonomy import Rule, Taxonomy
from servescope.trace.work import Work

__all__ = ["LaunchContext", "frame_categories", "launch_context", "launch_rows"]

_GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)
_TOLERANCE_US = 1e-3  # float rounding between a frame's end and the end of a call inside it
_ATEN = "aten::"


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """Per work row (in ``Work.rows`` order): the category index its launching frames decide (-1: none),
    that frame's name id (-1: none), whether it was replayed from a graph, and whether a launch was found."""

    category: npt.NDArray[np.int32]
    frame: npt.NDArray[np.int32]
    replayed: npt.NDArray[np.bool_]
    launched: npt.NDArray[np.bool_]
    refines: list[str | None]  # per row: the group a refining rule that decided it is limited to


def launch_rows(data: TraceData, correlation: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Row in ``data.launches`` of the runtime call with each correlation id, or -1."""
    launches = data.launches
    if len(launches) == 0 or len(correlation) == 0:
        return np.full(len(correlation), -1, dtype=np.int64)
    order = np.argsort(launches.correlation, kind="stable")
    sorted_corr = launches.correlation[order]
    pos = np.clip(np.searchsorted(sorted_corr, correlation), 0, len(sorted_corr) - 1)
    found = (sorted_corr[pos] == correlation) & (correlation >= 0)
    return np.where(found, order[pos], -1).astype(np.int64)


@dataclass(slots=True)
class _Frames:
    """The frames of one thread that some launch rule matches, sorted by start (parents before children)."""

    start: list[float]
    end: list[float]
    rule: list[int]  # index into the rule list
    name: list[int]
    parent: list[int]


def _informative(data: TraceData, taxonomy: Taxonomy,
                 rules: list[Rule]) -> dict[int, _Frames]:
    """Per thread id, every frame (cpu_op, CPU annotation, python function) a launch rule matches."""
    rule_index = {id(rule): i for i, rule in enumerate(rules)}
    rows: dict[int, list[tuple[float, float, int, int]]] = defaultdict(list)

    def collect(table: OpTable, kind: str) -> None:
        if len(table) == 0:
            return
        distinct, inverse = np.unique(table.name, return_inverse=True)
        decided = np.array([rule_index[id(rule)] if (rule := taxonomy.launch_rule(data.names[int(n)], kind)) else -1
                            for n in distinct.tolist()], dtype=np.int32)
        per_row = decided[inverse]
        keep = np.flatnonzero(per_row >= 0)
        ts, dur = table.ts_us[keep].tolist(), table.dur_us[keep].tolist()
        for k, t, d, th, n in zip(per_row[keep].tolist(), ts, dur, table.thread[keep].tolist(),
                                  table.name[keep].tolist(), strict=True):
            rows[th].append((t, t + d, k, n))

    collect(data.cpu_ops, "cpu_op")
    collect(data.frames, "python")
    thread_ids = {pt: i for i, pt in enumerate(data.threads)}
    for ann in data.annotations:
        if ann.on_gpu:
            continue
        rule = taxonomy.launch_rule(ann.name, "annotation")
        thread = thread_ids.get((ann.pid, ann.tid))
        if rule is not None and thread is not None:
            name = _name_id(data, ann.name)
            rows[thread].append((ann.ts_us, ann.ts_us + ann.dur_us, rule_index[id(rule)], name))
    out: dict[int, _Frames] = {}
    for thread, frames in rows.items():
        frames.sort(key=lambda f: (f[0], -f[1]))
        parent: list[int] = []
        stack: list[int] = []
        for i, (start, _end, _rule, _name) in enumerate(frames):
            while stack and frames[stack[-1]][1] < start:
                stack.pop()
            parent.append(stack[-1] if stack else -1)
            stack.append(i)
        out[thread] = _Frames([f[0] for f in frames], [f[1] for f in frames], [f[2] for f in frames],
                              [f[3] for f in frames], parent)
    return out


def _name_id(data: TraceData, name: str) -> int:
    try:
        return data.names.index(name)
    except ValueError:
        data.names.append(name)
        return len(data.names) - 1


def _innermost(frames: _Frames, start: float, end: float) -> int:
    """The innermost of ``frames`` that contains [start, end], or -1."""
    pos = bisect.bisect_right(frames.start, start) - 1
    while pos >= 0 and frames.end[pos] + _TOLERANCE_US < end:
        pos = frames.parent[pos]
    return pos


def launch_context(data: TraceData, work: Work, taxonomy: Taxonomy, categories: list[str]) -> LaunchContext:
    """The category each work row's launching frames decide, by the taxonomy's launch and sequence rules."""
    n = len(work.rows)
    category = np.full(n, -1, dtype=np.int32)
    frame = np.full(n, -1, dtype=np.int32)
    replayed = np.zeros(n, dtype=bool)
    launched = np.zeros(n, dtype=bool)
    refines: list[str | None] = [None] * n
    if n == 0:
        return LaunchContext(category, frame, replayed, launched, refines)
    table = work.table
    if work.kind == "device":
        launch = launch_rows(data, table.correlation[work.rows])
        launched = launch >= 0
        at = launch[launched]
        graph_names = np.array([bool(_GRAPH_LAUNCH.search(data.names[int(i)]))
                                for i in np.unique(data.launches.name).tolist()] or [False])
        distinct = np.unique(data.launches.name)
        is_graph = np.zeros(len(at), dtype=bool)
        if len(at):
            is_graph = graph_names[np.searchsorted(distinct, data.launches.name[at])]
        replayed[np.flatnonzero(launched)[is_graph]] = True
        # copies and sets are memory work whatever launched them: only kernels take their launch's context
        query = np.flatnonzero(launched & ~replayed & (table.kind[work.rows] == KIND_KERNEL))
        q_launch = launch[query]
        q_start = data.launches.ts_us[q_launch]
        q_end = q_start + data.launches.dur_us[q_launch]
        q_thread = data.launches.thread[q_launch]
    else:
        query = np.arange(n)
        q_start = table.ts_us[work.rows]
        q_end = q_start + table.dur_us[work.rows]
        q_thread = table.thread[work.rows]
        launched[:] = True
    index = {name: i for i, name in enumerate(categories)}
    found, found_frame, rule_at = frame_categories(data, taxonomy, index, q_start, q_end, q_thread)
    category[query] = found
    frame[query] = found_frame
    inherit = [row for row, rule in zip(query.tolist(), rule_at, strict=True) if rule and rule.inherit]
    for row, rule in zip(query.tolist(), rule_at, strict=True):
        if rule is not None:
            refines[row] = rule.refines
    if inherit:
        _inherit_collective(work, category, inherit, taxonomy, categories)
    if work.kind == "cpu_op" or len(data.frames) == 0:
        _sequences(data, work, taxonomy, index, category, frame, launched, replayed)
    return LaunchContext(category, frame, replayed, launched, refines)


def frame_categories(data: TraceData, taxonomy: Taxonomy, index: dict[str, int], start: npt.NDArray[np.float64],
                     end: npt.NDArray[np.float64], thread: npt.NDArray[np.int32],
                     ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], list[Rule | None]]:
    """For each call [start, end] on ``thread``: the category index its innermost matched frame decides (-1:
    none), that frame's name id, and the rule that decided."""
    n = len(start)
    category = np.full(n, -1, dtype=np.int32)
    frame = np.full(n, -1, dtype=np.int32)
    decided: list[Rule | None] = [None] * n
    rules = list(taxonomy.launch_rules)
    frames = _informative(data, taxonomy, rules)
    if not frames:
        return category, frame, decided
    for i, (s, e, th) in enumerate(zip(start.tolist(), end.tolist(), thread.tolist(), strict=True)):
        on_thread = frames.get(th)
        if on_thread is None:
            continue
        pos = _innermost(on_thread, s, e)
        if pos < 0:
            continue
        rule = rules[on_thread.rule[pos]]
        category[i] = index[rule.category]
        frame[i] = on_thread.name[pos]
        decided[i] = rule
    return category, frame, decided


def _inherit_collective(work: Work, category: npt.NDArray[np.int32], rows: list[int], taxonomy: Taxonomy,
                        categories: list[str]) -> None:
    """A wait takes the category of the last collective (other than a wait) before it on its thread."""
    comm = np.array([taxonomy.is_communication(c) for c in categories], dtype=bool)
    waiting = set(rows)
    thread = work.table.thread[work.rows]
    last: dict[int, int] = {}
    for row in range(len(work.rows)):  # rows are in start order
        cat = int(category[row])
        th = int(thread[row])
        if row in waiting:
            if th in last:
                category[row] = last[th]
        elif cat >= 0 and comm[cat]:
            last[th] = cat


def _sequences(data: TraceData, work: Work, taxonomy: Taxonomy, index: dict[str, int],
               category: npt.NDArray[np.int32], frame: npt.NDArray[np.int32], launched: npt.NDArray[np.bool_],
               replayed: npt.NDArray[np.bool_]) -> None:
    """Sequence rules over each thread's top-level cpu_ops; a work row launched inside a matched top-level op
    (or being one) and not decided by a launch rule takes the rule's category."""
    if not taxonomy.sequence_rules or len(data.cpu_ops) == 0:
        return
    ops = data.cpu_ops
    region: dict[int, tuple[list[float], list[float], list[int], list[int]]] = {}  # starts, ends, labels, names
    for thread in np.unique(ops.thread).tolist():
        rows = np.flatnonzero(ops.thread == thread)
        order = rows[np.lexsort((-ops.dur_us[rows], ops.ts_us[rows]))]
        start = ops.ts_us[order]
        end = start + ops.dur_us[order]
        reach = np.maximum.accumulate(end)
        top = np.ones(len(order), dtype=bool)
        top[1:] = start[1:] >= reach[:-1]
        top_rows = order[top]
        names = [data.names[int(n)] for n in ops.name[top_rows].tolist()]
        tokens = [n[len(_ATEN):] if n.startswith(_ATEN) else n for n in names]
        text = " ".join(tokens)
        offsets = np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]]) if tokens else np.zeros(0)
        label = np.full(len(tokens), -1, dtype=np.int32)
        rule_of = np.full(len(tokens), -1, dtype=np.int32)
        for k, rule in reversed(list(enumerate(taxonomy.sequence_rules))):  # earlier rules win: applied last
            for pattern in rule.patterns:
                for match in re.finditer(r"(?<!\S)(?:" + pattern + r")(?!\S)", text):
                    lo = int(np.searchsorted(offsets, match.start()))
                    hi = int(np.searchsorted(offsets, match.end()))
                    label[lo:hi] = index[rule.category]
                    rule_of[lo:hi] = k
        hit = np.flatnonzero(label >= 0)
        if len(hit):
            region[thread] = (start[top][hit].tolist(), end[top][hit].tolist(), label[hit].tolist(),
                              ops.name[top_rows[hit]].tolist())
    if not region:
        return
    table = work.table
    if work.kind == "device":
        launch = launch_rows(data, table.correlation[work.rows])
        candidates = np.flatnonzero((category < 0) & launched & ~replayed & (table.kind[work.rows] == KIND_KERNEL))
        q_start = data.launches.ts_us[launch[candidates]]
        q_thread = data.launches.thread[launch[candidates]]
    else:
        candidates = np.flatnonzero(category < 0)
        q_start = table.ts_us[work.rows[candidates]]
        q_thread = table.thread[work.rows[candidates]]
    for row, start, thread in zip(candidates.tolist(), q_start.tolist(), q_thread.tolist(), strict=True):
        found = region.get(thread)
        if found is None:
            continue
        starts, ends, labels, op_names = found
        pos = bisect.bisect_right(starts, start) - 1
        if pos >= 0 and start <= ends[pos] + _TOLERANCE_US:
            category[row] = labels[pos]
            frame[row] = op_names[pos]
