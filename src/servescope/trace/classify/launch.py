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

Everything per row is done on whole columns: each distinct frame name is matched against the rules once, the
launches find their frames by binary search, and walk out to the enclosing frames all at once.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.trace.classify.taxonomy import Taxonomy
from servescope.trace.classify.taxonomy_file import Rule
from servescope.trace.classify.work import Work
from servescope.trace.read.table import KIND_KERNEL, KIND_USER_ANNOTATION, Table, TraceData, distinct_ids

__all__ = ["LaunchContext", "frame_categories", "launch_context"]

_TOLERANCE_US = 1e-3  # float rounding between a frame's end and the end of a call inside it
_ATEN = "aten::"


class LaunchContext(msgspec.Struct, frozen=True):
    """Per work row (in ``Work.rows`` order): the category index its launching frames decide (-1: none),
    that frame's name id (-1: none), whether it was replayed from a graph, whether a launch was found, and
    the launch rule that decided (index into ``rules``, -1: none)."""

    category: npt.NDArray[np.int32]
    frame: npt.NDArray[np.int32]
    replayed: npt.NDArray[np.bool_]
    launched: npt.NDArray[np.bool_]
    rule: npt.NDArray[np.int32]
    rules: tuple[Rule, ...]


class _Frames(msgspec.Struct):
    """Every frame (cpu_op, CPU annotation, python function) some launch rule matches, sorted by thread, then
    start (parents before children); ``parent`` is the enclosing frame's position (-1: none) and ``threads``
    maps a thread id to its [first, last) positions."""

    start: npt.NDArray[np.float64]
    end: npt.NDArray[np.float64]
    rule: npt.NDArray[np.int32]  # index into the rule list
    name: npt.NDArray[np.int32]
    parent: npt.NDArray[np.int64]
    threads: dict[int, tuple[int, int]]


def _matched(data: TraceData, table: Table, kind: str, taxonomy: Taxonomy, rules: list[Rule],
             rule_index: dict[int, int]) -> npt.NDArray[np.int32]:
    """Per row of ``table``: the index of the launch rule its name matches (-1: none), each name matched once."""
    if len(table) == 0 or not any(kind in rule.kinds for rule in rules):  # no rule reads this kind of frame
        return np.full(len(table), -1, dtype=np.int32)
    present = np.flatnonzero(np.bincount(table.name, minlength=len(data.names)))
    lut = np.full(len(data.names), -1, dtype=np.int32)
    for n in present.tolist():
        rule = taxonomy.launch_rule(data.names[n], kind)
        if rule is not None:
            lut[n] = rule_index[id(rule)]
    return lut[table.name]


def _informative(data: TraceData, taxonomy: Taxonomy, rules: list[Rule]) -> _Frames:
    """Every frame (cpu_op, CPU annotation, python function) a launch rule matches, with its parent."""
    rule_index = {id(rule): i for i, rule in enumerate(rules)}
    starts: list[npt.NDArray[np.float64]] = []
    ends: list[npt.NDArray[np.float64]] = []
    matched: list[npt.NDArray[np.int32]] = []
    names: list[npt.NDArray[np.int32]] = []
    threads: list[npt.NDArray[np.int32]] = []
    for table, kind in ((data.cpu_ops, "cpu_op"), (data.frames, "python"), (data.annotations, "annotation")):
        per_row = _matched(data, table, kind, taxonomy, rules, rule_index)
        matches = per_row >= 0
        if kind == "annotation":  # GPU-side annotations launch nothing
            matches &= table.kind == KIND_USER_ANNOTATION
        keep = np.flatnonzero(matches)
        starts.append(table.ts_us[keep])
        ends.append(table.ts_us[keep] + table.dur_us[keep])
        matched.append(per_row[keep])
        names.append(table.name[keep])
        threads.append(table.thread[keep])
    start, end = np.concatenate(starts), np.concatenate(ends)
    thread = np.concatenate(threads).astype(np.int64)
    order = _outer_first(thread, start, end)  # stable: ties keep cpu_op, python, annotation order
    start, end, thread = start[order], end[order], thread[order]
    bounds: dict[int, tuple[int, int]] = {}
    if len(thread):
        cut = np.flatnonzero(np.diff(thread)) + 1
        lo = np.concatenate(([0], cut))
        hi = np.concatenate((cut, [len(thread)]))
        bounds = {int(t): (int(a), int(b)) for t, a, b in zip(thread[lo].tolist(), lo.tolist(), hi.tolist(),
                                                              strict=True)}
    return _Frames(start, end, np.concatenate(matched)[order], np.concatenate(names)[order],
                   _parents(start.tolist(), end.tolist(), bounds), bounds)


def _outer_first(thread: npt.NDArray[np.integer[Any]], start: npt.NDArray[np.float64],
                 end: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Positions by thread, then start, the one that ends later first where two start together (a frame before
    the frames inside it); stable. ``np.lexsort((-end, start, thread))``, without its full sort on ``end`` (~3 ms
    a 40k-row table): the starts come nearly sorted, so only the rows that share a start are ordered by end."""
    order = np.argsort(start, kind="stable")
    sorted_start = start[order]
    tied = np.flatnonzero(sorted_start[1:] == sorted_start[:-1])
    if len(tied):
        in_tie = np.zeros(len(order), dtype=bool)
        in_tie[tied] = in_tie[tied + 1] = True
        slots = np.flatnonzero(in_tie)  # whole runs of equal starts, each in place
        rows = order[slots]
        order[slots] = rows[np.lexsort((-end[rows], start[rows]))]
    return order[np.argsort(thread[order], kind="stable")]


def _parents(start: list[float], end: list[float], bounds: dict[int, tuple[int, int]]) -> npt.NDArray[np.int64]:
    """Each frame's enclosing frame on its thread (-1: none), by one pass with a stack per thread."""
    parent = [-1] * len(start)
    for lo, hi in bounds.values():
        stack: list[int] = []
        for i in range(lo, hi):
            s = start[i]
            while stack and end[stack[-1]] < s:
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(i)
    return np.array(parent, dtype=np.int64)


def _by_thread(thread: npt.NDArray[np.int64]) -> list[tuple[int, npt.NDArray[np.int64]]]:
    """The positions of each distinct value of ``thread``, ascending within each."""
    if len(thread) == 0:
        return []
    order = np.argsort(thread, kind="stable")
    cut = np.flatnonzero(np.diff(thread[order])) + 1
    return [(int(thread[part[0]]), part) for part in np.split(order, cut)]


def _innermost(frames: _Frames, start: npt.NDArray[np.float64], end: npt.NDArray[np.float64],
               thread: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each call [start, end] on ``thread``: the innermost of ``frames`` that contains it, or -1."""
    pos = np.full(len(start), -1, dtype=np.int64)
    for th, sel in _by_thread(thread):
        span = frames.threads.get(th)
        if span is None:
            continue
        lo, hi = span
        last = np.searchsorted(frames.start[lo:hi], start[sel], side="right") - 1  # last frame opened by then
        pos[sel] = np.where(last >= 0, last + lo, -1)
    walking = np.flatnonzero(pos >= 0)
    while len(walking):  # out to the parent while the frame ends before the call does
        at = pos[walking]
        short = frames.end[at] + _TOLERANCE_US < end[walking]
        walking = walking[short]
        pos[walking] = frames.parent[at[short]]
        walking = walking[pos[walking] >= 0]
    return pos


def launch_context(data: TraceData, work: Work, taxonomy: Taxonomy, categories: list[str]) -> LaunchContext:
    """The category each work row's launching frames decide, by the taxonomy's launch and sequence rules."""
    n = len(work.rows)
    rules = tuple(taxonomy.launch_rules)
    category = np.full(n, -1, dtype=np.int32)
    frame = np.full(n, -1, dtype=np.int32)
    replayed = np.zeros(n, dtype=bool)
    launched = np.zeros(n, dtype=bool)
    rule_of = np.full(n, -1, dtype=np.int32)
    if n == 0:
        return LaunchContext(category, frame, replayed, launched, rule_of, rules)
    table = work.table
    launch: npt.NDArray[np.int64] | None = None
    if work.kind == "device":
        launch = work.launch
        launched = launch >= 0
        replayed = work.replayed
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
    found, found_frame, found_rule = frame_categories(data, taxonomy, index, q_start, q_end, q_thread)
    category[query] = found
    frame[query] = found_frame
    rule_of[query] = found_rule
    inherits = np.array([bool(rule.inherit) for rule in rules] + [False], dtype=bool)
    inherit = np.flatnonzero(inherits[rule_of])  # -1 (no rule) reads the trailing False
    if len(inherit):
        _inherit_collective(work, category, inherit, taxonomy, categories)
    if work.kind == "cpu_op" or len(data.frames) == 0:
        _sequences(data, work, taxonomy, index, category, frame, launched, replayed, launch)
    return LaunchContext(category, frame, replayed, launched, rule_of, rules)


def frame_categories(data: TraceData, taxonomy: Taxonomy, index: dict[str, int], start: npt.NDArray[np.float64],
                     end: npt.NDArray[np.float64], thread: npt.NDArray[np.int32],
                     ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """For each call [start, end] on ``thread``: the category index its innermost matched frame decides (-1:
    none), that frame's name id, and the index in ``taxonomy.launch_rules`` of the rule that decided (-1)."""
    n = len(start)
    category = np.full(n, -1, dtype=np.int32)
    frame = np.full(n, -1, dtype=np.int32)
    decided = np.full(n, -1, dtype=np.int32)
    rules = list(taxonomy.launch_rules)
    if n == 0 or not rules:
        return category, frame, decided
    frames = _informative(data, taxonomy, rules)
    if not frames.threads:
        return category, frame, decided
    pos = _innermost(frames, start, end, thread.astype(np.int64))
    hit = np.flatnonzero(pos >= 0)
    decided[hit] = frames.rule[pos[hit]]
    frame[hit] = frames.name[pos[hit]]
    rule_category = np.full(len(rules), -1, dtype=np.int32)
    for k in distinct_ids(decided[hit]).tolist():
        rule_category[k] = index[rules[k].category]
    category[hit] = rule_category[decided[hit]]
    return category, frame, decided


def _inherit_collective(work: Work, category: npt.NDArray[np.int32], rows: npt.NDArray[np.int64],
                        taxonomy: Taxonomy, categories: list[str]) -> None:
    """A wait takes the category of the last collective (other than a wait) before it on its thread."""
    comm = np.array([taxonomy.is_communication(c) for c in categories] + [False], dtype=bool)
    waiting = np.zeros(len(category), dtype=bool)
    waiting[rows] = True
    thread = work.table.thread[work.rows].astype(np.int64)
    thread = thread - (thread.min() if len(thread) else 0)
    source = np.flatnonzero(~waiting & comm[category])  # -1 (undecided) reads the trailing False
    if len(source) == 0:
        return
    stride = len(category) + 1
    key = thread[source] * stride + source  # rows are in start order: by thread, then row
    order = np.argsort(key, kind="stable")
    key, source = key[order], source[order]
    before = np.searchsorted(key, thread[rows] * stride + rows) - 1
    found = before >= 0
    found[found] = thread[source[before[found]]] == thread[rows[found]]
    category[rows[found]] = category[source[before[found]]]


@cache
def _required_literals(pattern: str) -> tuple[str, ...] | None:
    """Texts one of which every match of ``pattern`` contains (the longest run of plain characters of each
    top-level alternative), or None when that can't be told: a text without any of them can't match."""
    try:
        parsed = re._parser.parse(pattern)  # type: ignore[attr-defined]
    except (re.error, AttributeError, TypeError):
        return None
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    constants = re._constants  # type: ignore[attr-defined]
    items = list(parsed)
    branches = ([list(b) for b in items[0][1][1]] if len(items) == 1 and items[0][0] is constants.BRANCH
                else [items])
    out: list[str] = []
    for branch in branches:
        best, run = "", ""
        for op, arg in branch:
            if op is constants.LITERAL:
                run += chr(arg)
                best = max(best, run, key=len)
            else:
                run = ""
        if not best:
            return None
        out.append(best)
    return tuple(out)


def _sequences(data: TraceData, work: Work, taxonomy: Taxonomy, index: dict[str, int],
               category: npt.NDArray[np.int32], frame: npt.NDArray[np.int32], launched: npt.NDArray[np.bool_],
               replayed: npt.NDArray[np.bool_], launch: npt.NDArray[np.int64] | None) -> None:
    """Sequence rules over each thread's top-level cpu_ops; a work row launched inside a matched top-level op
    (or being one) and not decided by a launch rule takes the rule's category."""
    if not taxonomy.sequence_rules or len(data.cpu_ops) == 0:
        return
    ops = data.cpu_ops
    token_of: dict[int, str] = {}
    for n in np.flatnonzero(np.bincount(ops.name, minlength=len(data.names))).tolist():
        name = data.names[n]
        token_of[n] = name[len(_ATEN):] if name.startswith(_ATEN) else name
    # a run of text between spaces lies within one operator's token: a pattern that needs a text with a run
    # no operator name has can't match any thread's run of operators
    vocabulary = " ".join(token_of.values())
    patterns = [(rule, pattern, needed) for rule in reversed(taxonomy.sequence_rules)  # earlier rules win
                for pattern in rule.patterns
                if (needed := _required_literals(pattern)) is None
                or any(all(run in vocabulary for run in literal.split()) for literal in needed)]
    if not patterns:
        return
    region: dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int32],
                            npt.NDArray[np.int32]]] = {}  # starts, ends, labels, names
    all_order = _outer_first(ops.thread, ops.ts_us, ops.ts_us + ops.dur_us)  # stable: ties keep row order
    if len(data.step_markers) and data.step_markers.any():  # a ProfilerStep#N range holds, not is, a layer
        all_order = all_order[~data.step_markers[all_order]]
    for thread, part in _by_thread(ops.thread[all_order].astype(np.int64)):
        order = all_order[part]
        start = ops.ts_us[order]
        end = start + ops.dur_us[order]
        reach = np.maximum.accumulate(end)
        top = np.ones(len(order), dtype=bool)
        top[1:] = start[1:] >= reach[:-1]
        top_rows = order[top]
        tokens = [token_of[n] for n in ops.name[top_rows].tolist()]
        text = " ".join(tokens)
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        offsets = np.concatenate(([0], np.cumsum(lengths[:-1] + 1))) if len(tokens) else np.zeros(0, np.int64)
        label = np.full(len(tokens), -1, dtype=np.int32)
        for rule, pattern, needed in patterns:  # earlier rules win: applied last
            if needed is not None and not any(literal in text for literal in needed):
                continue  # the pattern can't match this text
            spans = [m.span() for m in re.finditer(r"(?<!\S)(?:" + pattern + r")(?!\S)", text)]
            if not spans:
                continue
            bounds = np.searchsorted(offsets, np.array(spans, dtype=np.int64).ravel()).tolist()
            value = index[rule.category]
            for lo, hi in zip(bounds[::2], bounds[1::2], strict=True):
                label[lo:hi] = value
        hit = np.flatnonzero(label >= 0)
        if len(hit):
            region[thread] = (start[top][hit], end[top][hit], label[hit], ops.name[top_rows[hit]])
    if not region:
        return
    table = work.table
    if work.kind == "device":
        assert launch is not None
        candidates = np.flatnonzero((category < 0) & launched & ~replayed & (table.kind[work.rows] == KIND_KERNEL))
        q_start = data.launches.ts_us[launch[candidates]]
        q_thread = data.launches.thread[launch[candidates]]
    else:
        candidates = np.flatnonzero(category < 0)
        q_start = table.ts_us[work.rows[candidates]]
        q_thread = table.thread[work.rows[candidates]]
    for thread, sel in _by_thread(q_thread.astype(np.int64)):
        found = region.get(thread)
        if found is None:
            continue
        starts, ends, labels, op_names = found
        at = q_start[sel]
        pos = np.searchsorted(starts, at, side="right") - 1
        ok = pos >= 0
        ok[ok] = at[ok] <= ends[pos[ok]] + _TOLERANCE_US
        rows = candidates[sel[ok]]
        category[rows] = labels[pos[ok]]
        frame[rows] = op_names[pos[ok]]
