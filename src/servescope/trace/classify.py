"""The category of every piece of work, by the best evidence the trace holds, and which evidence decided.

Bases, best first (:data:`servescope.core.analysis.BASES`):

* ``op``: the frames around its launch (:mod:`servescope.trace.launch`): the operator, annotation, module or
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

import difflib
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servescope.core.analysis import BASES
from servescope.trace.launch import frame_categories, launch_context, launch_rows
from servescope.trace.reader import KIND_KERNEL, KIND_NAMES, TraceData
from servescope.trace.taxonomy import CATEGORY_OTHER, Taxonomy
from servescope.trace.work import Work

__all__ = ["CaptureReference", "Classified", "capture_reference", "classify_work", "is_capture"]

BASIS_OP, BASIS_GRAPH, BASIS_PEER, BASIS_NAME, BASIS_UNKNOWN = (BASES.index(b) for b in BASES)
_CAPTURE_MIN_LAUNCHES = 20
_CAPTURE_MAX_RUN_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class Classified:
    """Per work row (in ``Work.rows`` order): category index, basis index (into ``BASES``), and the name of
    the frame that decided it (``op``, ``graph``, ``peer``; else None)."""

    category: npt.NDArray[np.int32]
    basis: npt.NDArray[np.int8]
    frame: list[str | None]


@dataclass(frozen=True, slots=True)
class CaptureReference:
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
                     taxonomy: Taxonomy, index: dict[str, int]) -> npt.NDArray[np.int32]:
    """Category index of every row by the name rules, classifying each distinct (name, kind) once."""
    key = names.astype(np.int64) * 8 + kinds.astype(np.int64)
    distinct, inverse = np.unique(key, return_inverse=True)
    of_distinct = np.array(
        [index[taxonomy.classify(data.names[int(k) // 8], KIND_NAMES[int(k) % 8])] for k in distinct.tolist()],
        dtype=np.int32,
    )
    return of_distinct[inverse] if len(key) else np.zeros(0, dtype=np.int32)


def classify_work(data: TraceData, work: Work, taxonomy: Taxonomy,
                  capture: CaptureReference | None = None) -> Classified:
    """Category and basis of every work row of one trace."""
    categories = list(taxonomy.categories)
    index = {name: i for i, name in enumerate(categories)}
    table, rows = work.table, work.rows
    names = table.name[rows]
    kinds = table.kind[rows]
    context = launch_context(data, work, taxonomy, categories)
    by_name = _name_categories(data, names, kinds, taxonomy, index)
    category = context.category.copy()
    groups = [taxonomy.categories[c] for c in categories]
    for row, group in enumerate(context.refines):
        if group is not None and groups[by_name[row]] not in (group, "other"):
            category[row] = -1  # the op only says which collective; this kernel is a copy it launched
    if work.kind == "cpu_op":  # bookkeeping ops (views, allocation) are framework time wherever they run
        framework = index.get("framework", -1)
        category[(by_name == framework) & (context.frame != names)] = -1
    basis = np.full(len(rows), BASIS_NAME, dtype=np.int8)
    basis[category >= 0] = BASIS_OP
    frame_names: list[str | None] = [data.names[f] if f >= 0 and c >= 0 else None
                                     for f, c in zip(context.frame.tolist(), category.tolist(), strict=True)]

    if work.kind == "device":
        kernel = kinds == KIND_KERNEL
        replayed = np.flatnonzero(context.replayed & kernel & (category < 0))
        if len(replayed):
            _align_replays(data, work, replayed, category, basis, frame_names, index, capture)
        orphans = np.flatnonzero(kernel & (category < 0) & (context.replayed | ~context.launched))
        if len(orphans):
            _by_peer_name(names, work.dur_us, orphans, category, basis, frame_names)

    rest = category < 0
    category[rest] = by_name[rest]
    other = index[CATEGORY_OTHER]
    basis[rest & (category == other)] = BASIS_UNKNOWN
    return Classified(category.astype(np.int32), basis, frame_names)


def _align_replays(data: TraceData, work: Work, replayed: npt.NDArray[np.int64], category: npt.NDArray[np.int32],
                   basis: npt.NDArray[np.int8], frames: list[str | None], index: dict[str, int],
                   capture: CaptureReference | None) -> None:
    """Line up each graph launch's kernels with a reference sequence and take the categories of their matches:
    the capture's launches (basis ``graph``), else the kernels this trace launched and decided by ``op``, in
    launch order (basis ``peer``)."""
    names = work.table.name[work.rows]
    if capture is not None:
        ref_names = list(capture.names)
        ref_cats = [index.get(c, -1) for c in capture.categories]
        ref_frames = list(capture.frames)
        how = BASIS_GRAPH
    else:
        decided = np.flatnonzero((category >= 0) & (basis == BASIS_OP))
        if len(decided) == 0:
            return
        launch = launch_rows(data, work.table.correlation[work.rows[decided]])
        decided = decided[np.argsort(data.launches.ts_us[launch], kind="stable")]
        ref_names = [data.names[int(n)] for n in names[decided].tolist()]
        ref_cats = category[decided].tolist()
        ref_frames = [frames[i] for i in decided.tolist()]
        how = BASIS_PEER
    by_launch: dict[int, list[int]] = defaultdict(list)
    correlation = work.table.correlation[work.rows]
    for row in replayed.tolist():  # rows are in start order
        by_launch[int(correlation[row])].append(row)
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(ref_names)
    cache: dict[tuple[int, ...], list[int]] = {}
    for group in by_launch.values():
        key = tuple(names[group].tolist())
        if key not in cache:
            matcher.set_seq1([data.names[n] for n in key])
            cache[key] = _matches(matcher, len(key), ref_cats)
        for row, ref in zip(group, cache[key], strict=True):
            if ref >= 0 and ref_cats[ref] >= 0:
                category[row] = ref_cats[ref]
                basis[row] = how
                frames[row] = ref_frames[ref]


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


def _by_peer_name(names: npt.NDArray[np.int32], dur: npt.NDArray[np.float64], rows: npt.NDArray[np.int64],
                  category: npt.NDArray[np.int32], basis: npt.NDArray[np.int8], frames: list[str | None]) -> None:
    """Rows with no launching frames take the category their name got most time for from ``op`` elsewhere."""
    decided = np.flatnonzero((basis == BASIS_OP) & (category >= 0))
    if len(decided) == 0:
        return
    weight: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for n, c, d in zip(names[decided].tolist(), category[decided].tolist(), dur[decided].tolist(), strict=True):
        weight[n][c] += d + 1e-9
    frame_of = {int(names[i]): frames[i] for i in decided.tolist()}
    for row in rows.tolist():
        by_cat = weight.get(int(names[row]))
        if by_cat:
            category[row] = max(by_cat, key=lambda c: by_cat[c])
            basis[row] = BASIS_PEER
            frames[row] = frame_of.get(int(names[row]))
