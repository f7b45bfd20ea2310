"""EP with all-to-all in place of the MoE all-reduce: the seed's question, per batch with bands (issue 38 item 3).

The seed (DESIGN.md) reasoned that expert parallelism would replace the 60 MoE all-reduces of a Kimi-K2.5 TP=8 step
with all-to-alls: less time for a single stream, more at high concurrency on PCIe (no multicast; each GPU pushes its
transfers through one x16 link). vLLM 0.26 runs an all-to-all only under DP attention (``DP=N EP=N`` with an
all-to-all backend, :mod:`servescope.plan.ep_backend`); at DP = 1 (``TP=N EP=N``) it keeps the all-reduce. So this is
a what-if on the ``TP=N EP=N`` layout: its step (weights of the busiest rank's experts, TP attention) with each MoE
layer's all-reduce taken out and a dispatch and a combine all-to-all put in, each rank sending its ``ceil(B/N)``
tokens' ``top_k`` routed copies of the hidden vector (the all-to-all DeepEP-style backends run; the ranks holding
tokens are the senders), priced as any all-to-all of the plan (:meth:`CommCosts.price`: a ``bench comm`` curve or
point where one covers it, else on PCIe :mod:`servescope.plan.alltoall` with its inputs' provenance).

It is compared with the ``TP=N`` layout at every batch the plan asks for, and the crossover searched from batch 1 to
4,096 as :mod:`servescope.plan.ep_vs_tp` does, also with every figure at one side of its band, then the other
(:func:`servescope.plan.bands.compare`: a figure both sides use moves both alike).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import msgspec

from servescope.core.plan_bands import A2aRow, A2aWhatIf
from servescope.plan.bands import Term, band_of, compare, term_for
from servescope.plan.collectives import CommCosts
from servescope.plan.cost import LayoutMemory, PointCost
from servescope.plan.decide import measurement
from servescope.plan.layouts import Layout
from servescope.plan.model import ModelArch

__all__ = ["LAST", "a2a_what_if"]

LAST = 4096
MOE_WHAT = "MoE output"  # cost.collectives_per_step: the all-reduce after each MoE block at DP = 1

Predict = Callable[[Layout, LayoutMemory, int], PointCost]


def _swapped(arch: ModelArch, point: PointCost, comm: CommCosts, group: int) -> tuple[float, list[Term], A2aRow]:
    """The EP step with its MoE all-reduces replaced by dispatch + combine all-to-alls, its terms, and the row."""
    b = point.batch
    moe = next(p for p in point.collective_paths if p.op == "all_reduce" and p.what.startswith(MOE_WHAT))
    per_rank = math.ceil(b / group)
    nbytes = per_rank * arch.top_k * int(arch.hidden * arch.dtype_bytes)
    priced = comm.price("all_to_all", group, nbytes, senders=math.ceil(b / per_rank))
    calls = 2 * arch.moe_layers
    removed_ms = moe.count * moe.us_each / 1e3
    added_ms = calls * priced.us / 1e3
    terms: list[Term] = []
    for t in point.terms:  # the all-reduce figure loses the MoE calls' share
        if t.op == "all_reduce" and t.group == group and t.calls:
            keep = (t.calls - moe.count) / t.calls
            t = Term(figure=t.figure, band=t.band, ms=t.ms * keep, lo_ms=t.lo_ms * keep, hi_ms=t.hi_ms * keep,
                     op=t.op, group=t.group, bytes=t.bytes, calls=t.calls - moe.count)
        terms.append(t)
    figure = f"all_to_all over {group} GPUs, {priced.path}: {priced.origin}"
    terms.append(term_for(figure, priced.band, added_ms, doublings=priced.doublings, op="all_to_all", group=group,
                          nbytes=nbytes, calls=calls))
    step = point.step_ms - removed_ms + added_ms
    bound = priced.alltoall.bound if priced.alltoall else ""
    row = A2aRow(batch=b, tp_ms=0.0, tp_low_ms=0.0, tp_high_ms=0.0, ep_ms=step, ep_low_ms=0.0, ep_high_ms=0.0,
                 all_reduce_calls=moe.count, all_reduce_us_each=moe.us_each, all_to_all_calls=calls,
                 all_to_all_bytes=nbytes, all_to_all_us_each=priced.us, all_to_all_origin=priced.origin,
                 all_to_all_band=priced.band, bound=bound, decided=False)
    return step, terms, row


def a2a_what_if(arch: ModelArch, ep: tuple[Layout, LayoutMemory], tp: tuple[Layout, LayoutMemory],
                predict: Predict, comm: CommCosts, batches: Sequence[int]) -> A2aWhatIf | None:
    """The what-if of the module doc, ``None`` without MoE layers or a ``TP=N EP=N`` layout at DP = 1."""
    (el, em), (tl, tm) = ep, tp
    if not arch.moe_layers or el.dp != 1 or el.ep <= 1 or el.pp != 1:
        return None
    group = el.tp
    cache: dict[int, tuple[float, list[Term], A2aRow, PointCost]] = {}

    def at(b: int) -> tuple[float, list[Term], A2aRow, PointCost]:
        if b not in cache:
            step, terms, row = _swapped(arch, predict(el, em, b), comm, group)
            cache[b] = (step, terms, row, predict(tl, tm, b))
        return cache[b]

    def gap(b: int, side: int = 0) -> float:
        """EP's step less TP's; side −1: every figure at the side that favours EP; +1: TP."""
        ep_ms, ep_terms, _, t = at(b)
        d = ep_ms - t.step_ms
        if side < 0:
            d -= compare("TP", t.terms, t.step_ms, "EP", ep_terms, ep_ms, b).band_ms
        elif side > 0:
            d += compare("EP", ep_terms, ep_ms, "TP", t.terms, t.step_ms, b).band_ms
        return d

    def crossing(side: int) -> int | None:
        grid = [1 << i for i in range(LAST.bit_length())]
        for lo, hi in zip(grid, grid[1:], strict=False):
            if (gap(lo, side) < 0) == (gap(hi, side) < 0):
                continue
            a, c = lo, hi
            while c - a > 1:
                mid = (a + c) // 2
                a, c = (mid, c) if (gap(mid, side) < 0) == (gap(lo, side) < 0) else (a, mid)
            return c
        return None

    rows = []
    for b in batches:
        ep_ms, ep_terms, row, t = at(b)
        (elo, ehi), (tlo, thi) = band_of(ep_ms, ep_terms), band_of(t.step_ms, t.terms)
        faster, slower = (("EP", ep_terms, ep_ms), ("TP", t.terms, t.step_ms)) if ep_ms < t.step_ms else \
            (("TP", t.terms, t.step_ms), ("EP", ep_terms, ep_ms))
        decided = compare(faster[0], faster[1], faster[2], slower[0], slower[1], slower[2], b).decided
        rows.append(msgspec.structs.replace(row, tp_ms=t.step_ms, tp_low_ms=tlo, tp_high_ms=thi, ep_low_ms=elo,
                                            ep_high_ms=ehi, decided=decided))
    nominal, favoured, against = crossing(0), crossing(-1), crossing(1)
    name = f"{el.name} with all-to-all"
    first = "EP" if gap(1) < 0 else "TP"
    if nominal:
        sentence = (f"{name} is {'faster' if first == 'EP' else 'slower'} than {tl.name} up to batch {nominal - 1:,} "
                    f"and {'slower' if first == 'EP' else 'faster'} from batch {nominal:,}")
    else:
        sentence = f"{name} is {'faster' if first == 'EP' else 'slower'} than {tl.name} at every batch to {LAST:,}"
    def side_text(side: int, at_batch: int | None) -> str:
        if at_batch:
            return f"crossing at batch {at_batch:,}"
        always = "EP" if gap(1, side) < 0 else "TP"
        return f"{always} faster at every batch to {LAST:,}"

    sentence += (f"; with every figure at the side that favours EP, then TP: {side_text(-1, favoured)}; "
                 f"{side_text(1, against)}")
    if not (favoured and against):
        sentence += ": these figures do not place the crossover"
    closest = min(rows, key=lambda r: r.batch)
    faster_first = closest.ep_ms < closest.tp_ms
    first_call = at(closest.batch)
    c = (compare("EP", first_call[1], first_call[0], "TP", first_call[3].terms, first_call[3].step_ms, closest.batch)
         if faster_first else
         compare("TP", first_call[3].terms, first_call[3].step_ms, "EP", first_call[1], first_call[0], closest.batch))
    measure = measurement(c, el.gpus) if not c.decided else None
    return A2aWhatIf(layout=name, versus=tl.name, rows=rows, crossover_batch=nominal,
                     crossover_band=[favoured, against], sentence=sentence, measure=measure,
                     assumption=("what-if: vLLM 0.26 keeps the MoE all-reduce at DP = 1 and runs an all-to-all only "
                                 "under DP attention; here each MoE layer's all-reduce of the TP=N EP=N step is "
                                 "replaced by a dispatch and a combine all-to-all of ceil(B/N) tokens' top-k copies "
                                 "a rank"))
