"""The category of every piece of work, by the best evidence the trace holds, and which evidence decided.

Bases, best first (:data:`servescope.core.analysis.BASES`):

* ``op``: the frames around its launch (:mod:`servescope.trace.classify.launch`): the operator, annotation, module or
  python function that launched it, or the run of operators it belongs to;
* ``graph``: a kernel replayed from a CUDA/HIP graph has no launching frames; with the graph-capture trace
  given beside the replay, the kernels the capture launched (named in their launch records, with their own
  frames) are lined up with the replayed ones and lend them their category;
* ``peer``: the same for graph replays lined up with the kernels this trace launched eagerly (a prefill run
  outside the graph), and for kernels with no launch record at all: the category their name got from ``op``
  elsewhere in the trace (the most time);
* ``name``: the taxonomy's name rules;
* ``unknown``: no rule knows it (category ``other``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import BASES
from servescope.core.categories import CATEGORY_OTHER
from servescope.trace.classify.launch import frame_categories, launch_context
from servescope.trace.classify.taxonomy import Taxonomy
from servescope.trace.classify.work import Work
from servescope.trace.read.table import KIND_KERNEL, KIND_NAMES, TraceData

if TYPE_CHECKING:
    import difflib

__all__ = ["CaptureReference", "Classified", "capture_reference", "classify_work", "first_most", "is_capture"]

BASIS_OP, BASIS_GRAPH, BASIS_PEER, BASIS_NAME, BASIS_UNKNOWN = (BASES.index(b) for b in BASES)
_CAPTURE_MIN_LAUNCHES = 20
_CAPTURE_MAX_RUN_SHARE = 0.1


class Classified(msgspec.Struct, frozen=True):
    """Per work row (in ``Work.rows`` order): category index, basis index (into ``BASES``), and the frame that
    decided it (``op``, ``graph``, ``peer``; else -1), an index into ``frame_names``; and the category its name
    alone gives (what the kernel computes, wherever it was launched)."""

    category: npt.NDArray[np.int32]
    basis: npt.NDArray[np.int8]
    frame: npt.NDArray[np.int32]
    frame_names: list[str]
    by_name: npt.NDArray[np.int32]

    def frames(self) -> list[str | None]:
        """The name of the frame that decided each row, or None."""
        names = self.frame_names
        return [names[f] if f >= 0 else None for f in self.frame.tolist()]


class CaptureReference(msgspec.Struct, frozen=True):
    """The kernels a graph-capture trace launched, in launch order, with the category their frames decide."""

    names: list[str]
    categories: list[str]  # "" where the frames decided nothing
    frames: list[str | None]


def is_capture(data: TraceData) -> bool:
    """Whether ``data`` is a graph-capture trace: many kernel launches that name their kernel, almost none run."""
    named = len(data.launches.kernel)
    return named >= _CAPTURE_MIN_LAUNCHES and len(data.device) <= _CAPTURE_MAX_RUN_SHARE * named


def capture_reference(data: TraceData, taxonomy: Taxonomy) -> CaptureReference:
    """The launches of a capture trace that name their kernel, with the category their frames decide."""
    launches = data.launches
    rows = np.array(sorted(launches.kernel, key=lambda r: launches.ts_us[r]), dtype=np.int64)
    categories = list(taxonomy.categories)
    index = {name: i for i, name in enumerate(categories)}
    start = launches.ts_us[rows]
    found, frame, _ = frame_categories(data, taxonomy, index, start, start + launches.dur_us[rows],
                                       launches.thread[rows])
    return CaptureReference(
        names=[data.names[launches.kernel[int(r)]] for r in rows.tolist()],
        categories=[categories[c] if c >= 0 else "" for c in found.tolist()],
        frames=[data.names[f] if f >= 0 else None for f in frame.tolist()],
    )


def _name_categories(data: TraceData, names: npt.NDArray[np.int32], kinds: npt.NDArray[np.int8],
                     taxonomy: Taxonomy, index: dict[str, int]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
    """Category index of every row by the name rules, and whether that rule outranks the launching op
    (``outranks_launch``), classifying each distinct (name, kind) once."""
    key = names.astype(np.int64) * 8 + kinds.astype(np.int64)
    distinct, inverse = np.unique(key, return_inverse=True)
    if len(key) == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=bool)
    of_distinct = np.zeros(len(distinct), dtype=np.int32)
    outranks = np.zeros(len(distinct), dtype=bool)
    for i, k in enumerate(distinct.tolist()):
        kind = KIND_NAMES[k % 8]
        category, rule = taxonomy.decide(data.names[k // 8], kind)  # one match gives both answers
        of_distinct[i] = index[category]
        outranks[i] = kind == "kernel" and rule is not None and rule.outranks_launch
    return of_distinct[inverse], outranks[inverse]


def classify_work(data: TraceData, work: Work, taxonomy: Taxonomy,
                  capture: CaptureReference | None = None) -> Classified:
    """Category and basis of every work row of one trace."""
    categories = list(taxonomy.categories)
    index = {name: i for i, name in enumerate(categories)}
    table, rows = work.table, work.rows
    names = table.name[rows]
    kinds = table.kind[rows]
    context = launch_context(data, work, taxonomy, categories)
    by_name, outranks = _name_categories(data, names, kinds, taxonomy, index)
    category = context.category.copy()
    refining = [k for k, rule in enumerate(context.rules) if rule.refines is not None]
    if refining and len(category):
        groups = [taxonomy.categories[c] for c in categories]
        # the op only says which collective; a kernel its name files elsewhere is a copy it launched
        stray = np.zeros((len(context.rules) + 1, len(categories)), dtype=bool)  # the last row: no rule
        for k in refining:
            stray[k] = [group not in (context.rules[k].refines, "other") for group in groups]
        category[stray[context.rule, by_name]] = -1
    if work.kind == "cpu_op":  # bookkeeping ops (views, allocation: by_name in taxonomy.toml) keep their name's
        own = [index[c] for c in taxonomy.marked("by_name") if c in index]
        category[np.isin(by_name, own) & (context.frame != names)] = -1
    basis = np.full(len(rows), BASIS_NAME, dtype=np.int8)
    basis[category >= 0] = BASIS_OP
    frame = np.where((context.frame >= 0) & (category >= 0), context.frame, -1).astype(np.int32)
    frame_names = data.names

    if work.kind == "device":
        kernel = kinds == KIND_KERNEL
        replayed = np.flatnonzero(context.replayed & kernel & (category < 0))
        if len(replayed):
            frame_names = _align_replays(data, work, replayed, category, basis, frame, index, capture,
                                         _Names(by_name, taxonomy, index))
        orphans = np.flatnonzero(kernel & (category < 0) & (context.replayed | ~context.launched))
        if len(orphans):
            _by_peer_name(names, work.dur_us, orphans, category, basis, frame)

    # a name that lists what the kernel computes outranks a launching op (or a graph's or a peer's context) that
    # names other work: Inductor's fused norm + fp8 quantisation launched under the GEMM op it feeds is norm
    overruled = np.flatnonzero(outranks & (category >= 0) & (category != by_name))
    category[overruled] = -1
    basis[overruled] = BASIS_NAME
    frame[overruled] = -1
    rest = category < 0
    category[rest] = by_name[rest]
    other = index[CATEGORY_OTHER]
    basis[rest & (category == other)] = BASIS_UNKNOWN
    return Classified(category.astype(np.int32), basis, frame, frame_names, by_name)


class _Names(msgspec.Struct, frozen=True):
    """What the name rules say of the work rows (``by_name``) and of any other kernel name."""

    by_name: npt.NDArray[np.int32]
    taxonomy: Taxonomy
    index: dict[str, int]

    def of(self, names: list[str]) -> npt.NDArray[np.int32]:
        cache: dict[str, int] = {}
        return np.array([cache.setdefault(n, self.index[self.taxonomy.classify(n, "kernel")]) for n in names],
                        dtype=np.int32)

    def generic(self) -> npt.NDArray[np.bool_]:
        """Per category index: a name in it says nothing of the layer (a copy, a fill, a sort, unknown)."""
        flags = np.zeros(len(self.index), dtype=bool)
        # categories marked generic in taxonomy.toml say nothing of the layer their kernel serves: a replayed
        # kernel whose name says one of these may stand for a kernel of another name at its place in the
        # reference; one whose name says a specific layer (attention, moe, gemm, ...) only for one that says the same
        for name in self.taxonomy.marked("generic"):
            if name in self.index:
                flags[self.index[name]] = True
        return flags


def _align_replays(data: TraceData, work: Work, replayed: npt.NDArray[np.int64], category: npt.NDArray[np.int32],
                   basis: npt.NDArray[np.int8], frame: npt.NDArray[np.int32], index: dict[str, int],
                   capture: CaptureReference | None, by_names: _Names) -> list[str]:
    """Line up each graph launch's kernels with a reference sequence and take the categories of their matches:
    the capture's launches (basis ``graph``), else the kernels this trace launched and decided by ``op``, in
    launch order (basis ``peer``). Returns the frame names ``frame`` indexes (``data.names``, and after them
    the capture's frames this trace doesn't name)."""
    import difflib  # only graph replays need it: not imported on the common path

    names = work.table.name[work.rows]
    frame_names = data.names
    if capture is not None:
        ref_names = list(capture.names)
        ref_cats = np.array([index.get(c, -1) for c in capture.categories], dtype=np.int32)
        frame_names, ref_frames = _frame_ids(data.names, capture.frames)
        ref_by_name = by_names.of(ref_names)
        how = BASIS_GRAPH
    else:
        decided = np.flatnonzero((category >= 0) & (basis == BASIS_OP))
        if len(decided) == 0:
            return frame_names
        launch = work.launch[decided]
        decided = decided[np.argsort(data.launches.ts_us[launch], kind="stable")]
        ref_names = [data.names[int(n)] for n in names[decided].tolist()]
        ref_cats = category[decided]
        ref_frames = frame[decided]
        ref_by_name = by_names.by_name[decided]
        how = BASIS_PEER
    ref_list = ref_cats.tolist()
    correlation = work.table.correlation[work.rows[replayed]]
    by_launch = np.argsort(correlation, kind="stable")  # rows are in start order: a launch's kernels stay so
    cuts = np.flatnonzero(np.diff(correlation[by_launch])) + 1
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(ref_names)
    cache: dict[tuple[int, ...], npt.NDArray[np.int64]] = {}
    refs: list[npt.NDArray[np.int64]] = []
    for part in np.split(by_launch, cuts):
        key = tuple(names[replayed[part]].tolist())
        if key not in cache:
            matcher.set_seq1([data.names[n] for n in key])
            cache[key] = np.array(_matches(matcher, len(key), ref_list), dtype=np.int64)
        refs.append(cache[key])
    rows = replayed[by_launch]
    ref = np.concatenate(refs)
    ok = ref >= 0
    ok[ok] = ref_cats[ref[ok]] >= 0
    # a kernel stands for a kernel of another name only when the names do not disagree about the layer: the
    # same name, or names filed alike by the name rules, or a replayed name that says nothing specific
    mine = by_names.by_name[rows]
    other_name = np.zeros(len(rows), dtype=bool)
    other_name[ok] = [data.names[n] != ref_names[r] for n, r in zip(names[rows[ok]].tolist(), ref[ok].tolist(),
                                                                     strict=True)]
    agree = np.ones(len(rows), dtype=bool)
    agree[ok] = (mine[ok] == ref_by_name[ref[ok]]) | by_names.generic()[mine[ok]]
    ok &= ~other_name | agree
    rows, ref = rows[ok], ref[ok]
    category[rows] = ref_cats[ref]
    basis[rows] = how
    frame[rows] = ref_frames[ref]
    return frame_names


def _frame_ids(names: list[str], frames: list[str | None]) -> tuple[list[str], npt.NDArray[np.int32]]:
    """``frames`` as indices into ``names``, and after them the frames ``names`` lacks (-1: None)."""
    known = {name: i for i, name in reversed(list(enumerate(names)))}  # the first of equal names
    extra: list[str] = []
    ids = []
    for name in frames:
        if name is None:
            ids.append(-1)
            continue
        i = known.get(name)
        if i is None:
            i = known[name] = len(names) + len(extra)
            extra.append(name)
        ids.append(i)
    return (names + extra if extra else names), np.array(ids, dtype=np.int32)


def _matches(matcher: difflib.SequenceMatcher[str], size: int, ref_cats: list[int]) -> list[int]:
    """For each kernel of the replayed sequence, the reference kernel it stands for, or -1.

    Equal runs match one to one, and so do replaced runs of equal length (the same layer at another shape
    picks other GEMM tiles). A replaced or extra run of another length lies between matched neighbours: when
    those neighbours and the reference kernels it replaces are all of one category, it is that layer's work
    too (a sort the decode runs where the prefill ran another), and stands for its left neighbour.
    """
    matched = [-1] * size
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for k in range(i2 - i1):
                matched[i1 + k] = j1 + k
        elif tag in ("replace", "delete"):
            around = [j for j in (j1 - 1, j2) if 0 <= j < len(ref_cats)] + list(range(j1, j2))
            if around and len({ref_cats[j] for j in around}) == 1 and ref_cats[around[0]] >= 0:
                for k in range(i1, i2):
                    matched[k] = around[0]
    return matched


def first_most(group: npt.NDArray[np.int64], value: npt.NDArray[np.int64], weight: npt.NDArray[np.float64]
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per distinct ``group``: the ``value`` with the largest summed ``weight`` (summed in row order), ties to the
    value seen first, as ``max`` over a dict filled in row order picks. Returns (groups ascending, values)."""
    shift = int(value.max()) + 1
    pair, first, inverse = np.unique(group * shift + value, return_index=True, return_inverse=True)
    total = np.bincount(inverse.ravel(), weights=weight)
    pair_group = pair // shift
    order = np.lexsort((first, -total, pair_group))
    best = order[np.concatenate(([True], np.diff(pair_group[order]) != 0))]
    return pair_group[best], pair[best] % shift


def _by_peer_name(names: npt.NDArray[np.int32], dur: npt.NDArray[np.float64], rows: npt.NDArray[np.int64],
                  category: npt.NDArray[np.int32], basis: npt.NDArray[np.int8], frame: npt.NDArray[np.int32]) -> None:
    """Rows with no launching frames take the category their name got most time for from ``op`` elsewhere."""
    decided = np.flatnonzero((basis == BASIS_OP) & (category >= 0))
    if len(decided) == 0:
        return
    decided_names = names[decided].astype(np.int64)
    peer_names, peer_cats = first_most(decided_names, category[decided].astype(np.int64), dur[decided] + 1e-9)
    # the frame of the last decided row of each name
    last = len(decided) - 1 - np.unique(decided_names[::-1], return_index=True)[1]
    frame_of = frame[decided[last]]  # in the order of peer_names (both ascending by name)
    at = np.clip(np.searchsorted(peer_names, names[rows]), 0, len(peer_names) - 1)
    known = peer_names[at] == names[rows]
    rows, at = rows[known], at[known]
    category[rows] = peer_cats[at]
    basis[rows] = BASIS_PEER
    frame[rows] = frame_of[at]
