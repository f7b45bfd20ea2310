"""Where EP and TP cross over batch, with the reason in numbers (issue 24 item 4).

EP's side at a batch is the fastest feasible layout with expert parallelism (``TP=N EP=N``, ``DP=N EP=N``); TP's
is the layout that splits everything over all GPUs by tensor parallelism (``TP=N``). Their step times are
compared at every power of two from 1 to :data:`LAST` (or the largest requested batch, if larger); where the
faster side changes between two of them, bisection on the model finds the integer batch at which it changes, so
the faster side one batch below the crossover is the other one. The reasons give, at the crossover batch (without
one: at the first and the last batch searched), each side's collectives as count × µs a call, the parts that
differ, the all-to-all's two bounds on PCIe with each input's provenance (:mod:`servescope.plan.alltoall`), and
how many requests each side's KV cache holds at the plan's context. Step times within :data:`TIE` of each other are
the same step: TP, the simpler layout, is taken as the faster, and the sentence says "or as fast".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from servescope.core.messages import size_text
from servescope.core.plan import (
    CollectivePath,
    EpTpAt,
    EpTpCollective,
    EpTpCrossing,
    EpTpSide,
    EpVsTp,
    PcieAllToAllTerms,
)
from servescope.plan.alltoall import ASSUMPTION, pcie_all_to_all
from servescope.plan.bands import compare
from servescope.plan.collectives import PCIE_A2A_SOURCE, CommCosts
from servescope.plan.cost import LayoutMemory, PointCost
from servescope.plan.layouts import Layout

__all__ = ["FIRST", "LAST", "TIE", "ep_vs_tp"]

FIRST, LAST = 1, 65536
TIE = 1e-6  # relative: step times this close are the same step (TP, the simpler layout, is taken as faster)
_PARTS = ("weights", "attention", "collectives", "other")

Predict = Callable[[Layout, LayoutMemory, int], PointCost]


class _Sides:
    """The two families and a cache of their predictions."""

    def __init__(self, ep: list[tuple[Layout, LayoutMemory]], tp: list[tuple[Layout, LayoutMemory]],
                 predict: Predict) -> None:
        self.ep, self.tp, self.predict = ep, tp, predict
        self.cache: dict[tuple[str, int], PointCost] = {}

    def best(self, family: list[tuple[Layout, LayoutMemory]], batch: int) -> tuple[Layout, PointCost]:
        out: tuple[Layout, PointCost] | None = None
        for layout, memory in family:
            key = (layout.name, batch)
            if key not in self.cache:
                self.cache[key] = self.predict(layout, memory, batch)
            p = self.cache[key]
            if out is None or p.step_ms < out[1].step_ms:
                out = (layout, p)
        assert out is not None
        return out

    def ep_faster(self, batch: int, side: int = 0) -> bool:
        """EP's step shorter than TP's: as predicted (``side`` 0), with every figure of EP at the near side of its
        band and TP's at the far side (−1), or the other way round (+1)."""
        ep, tp = self.best(self.ep, batch)[1], self.best(self.tp, batch)[1]
        gap = ep.step_ms - tp.step_ms  # a figure both use moves both alike (bands.compare)
        if side < 0:
            gap -= compare("TP", tp.terms, tp.step_ms, "EP", ep.terms, ep.step_ms, batch).band_ms
        elif side > 0:
            gap += compare("EP", ep.terms, ep.step_ms, "TP", tp.terms, tp.step_ms, batch).band_ms
        return gap < -TIE * tp.step_ms

    def tied(self, batch: int) -> bool:
        ep, tp = self.best(self.ep, batch)[1].step_ms, self.best(self.tp, batch)[1].step_ms
        return abs(ep - tp) <= TIE * tp


def _grid(last: int) -> list[int]:
    out, b = [], FIRST
    while b < last:
        out.append(b)
        b *= 2
    return [*out, last]


def _model_of(point: PointCost, path: CollectivePath, comm: CommCosts) -> PcieAllToAllTerms | None:
    if path.op != "all_to_all" or not path.source.startswith(PCIE_A2A_SOURCE):
        return None
    coll = next(c for c in point.collectives if c.op == "all_to_all")
    return pcie_all_to_all(coll.group, coll.bytes_each, comm.hw, comm.factors, senders=coll.senders,
                           topology=comm.topology)


def _side(layout: Layout, point: PointCost, comm: CommCosts) -> EpTpSide:
    colls = [EpTpCollective(op=p.op, what=p.what, count=p.count, group=p.group, bytes_each=p.bytes_each,
                            us_each=p.us_each, wait_us_each=p.wait_us_each, ms=p.count * p.us_each / 1e3,
                            origin=p.origin, path=p.path or "") for p in point.collective_paths]
    model = next((m for p in point.collective_paths if (m := _model_of(point, p, comm)) is not None), None)
    return EpTpSide(layout=layout.name, step_ms=point.step_ms, parts_ms=dict(point.parts_ms),
                    origins={k: list(v) for k, v in point.origins.items()}, collectives=colls,
                    all_to_all=model)


def _collectives_text(side: EpTpSide) -> str:
    terms: dict[str, dict[tuple[str, str], int]] = {}  # op -> (µs a call as shown, origin) -> calls
    for c in side.collectives:
        each = terms.setdefault(c.op, {})
        key = (f"{c.us_each:,.1f}", c.origin)
        each[key] = each.get(key, 0) + c.count
    parts = [f"{op} {' + '.join(f'{n} × {us} µs ({origin})' for (us, origin), n in t.items())}"
             for op, t in terms.items()]
    return f"{side.layout} {side.parts_ms['collectives']:,.2f} ms: {'; '.join(parts) or 'none'}"


def _a2a_text(side: EpTpSide, batch: int, *, assumption: bool) -> str:
    m = side.all_to_all
    assert m is not None
    link, eff, bridge, lat = m.link_gbps, m.link_efficiency, m.bridge_gbps, m.latency_us
    a2a = next(c for c in side.collectives if c.op == "all_to_all")
    g = m.group
    binds = f"the {({'bridge': 'host bridge', 'uplink': 'switch uplink'}).get(m.bound, 'link')} binds"
    said = f"{ASSUMPTION}; " if assumption else ""
    whose = "1 sender's" if m.senders == 1 else f"{m.senders} senders'"
    return (f"{side.layout}'s all_to_all at batch {batch:,}: {said}each GPU sends {g - 1}/{g} of "
            f"{size_text(m.bytes_each)} through its x16 link: {m.link_us:,.1f} µs at {link.value:g} GB/s "
            f"({link.origin}) × {eff.value:g} ({eff.origin}); "
            f"{whose} "
            f"{size_text(m.bridge_bytes)} cross the host bridge: "
            f"{m.bridge_us:,.1f} µs at {bridge.value:g} GB/s ({bridge.origin}): {binds}; + "
            f"{lat.value:g} µs latency ({lat.origin}) + {a2a.wait_us_each:.1f} µs wait (assumed) = "
            f"{a2a.us_each:,.1f} µs a call")


def _step_change(lo: EpTpAt, hi: EpTpAt) -> str:
    """From one batch below the crossover to it: each side's step change and the part that moved most."""
    out = []
    for a, b in ((lo.tp, hi.tp), (lo.ep, hi.ep)):
        moved = max(_PARTS, key=lambda k: abs(b.parts_ms[k] - a.parts_ms[k]))
        name = b.layout if a.layout == b.layout else f"{a.layout} → {b.layout}"
        out.append(f"{name} {b.step_ms - a.step_ms:+,.2f} ms (most of it {moved} "
                   f"{b.parts_ms[moved] - a.parts_ms[moved]:+,.2f})")
    return f"from batch {lo.batch:,} to {hi.batch:,}: {'; '.join(out)}"


def _reasons(at: EpTpAt, kv: dict[str, int], context: int, *, assumption: bool = True) -> list[str]:
    b, ep, tp = at.batch, at.ep, at.tp
    out = [f"at batch {b:,} collectives: {_collectives_text(tp)}. {_collectives_text(ep)}"]
    others = [f"{k} {tp.parts_ms[k]:,.2f} vs {ep.parts_ms[k]:,.2f} ms ({', '.join(tp.origins[k])})"
              for k in _PARTS if k != "collectives" and abs(tp.parts_ms[k] - ep.parts_ms[k]) > 0.005]
    if others:
        out.append(f"at batch {b:,} {tp.layout} vs {ep.layout}: {'; '.join(others)}")
    if ep.all_to_all is not None:
        out.append(_a2a_text(ep, b, assumption=assumption))
    holds = [f"{n} {v:,}" for n, v in kv.items() if n in (ep.layout, tp.layout)]
    if holds:
        out.append(f"at context {context:,} the KV cache holds at most batch {', '.join(holds)}")
    return out


def _crossings(sides: _Sides, grid: list[int], side: int = 0) -> list[EpTpCrossing]:
    """Each batch at which the faster side changes: between two grid batches whose faster side differs, the
    integer batch by bisection (the faster side one batch below it is then the other one); ``side`` as
    :meth:`_Sides.ep_faster`."""
    out: list[EpTpCrossing] = []
    for lo, hi in zip(grid, grid[1:], strict=False):
        first = sides.ep_faster(lo, side)
        if sides.ep_faster(hi, side) == first:
            continue
        a, c = lo, hi  # invariant: ep_faster(a) == first != ep_faster(c)
        while c - a > 1:
            mid = (a + c) // 2
            if sides.ep_faster(mid, side) == first:
                a = mid
            else:
                c = mid
        below = (sides.best(sides.ep, a) if first else sides.best(sides.tp, a))[0].name
        above = (sides.best(sides.tp, c) if first else sides.best(sides.ep, c))[0].name
        out.append(EpTpCrossing(batch=c, faster_below=below, faster_from=above))
    return out


def _steps(a: EpTpAt, b: EpTpAt) -> str:
    """``(A: TP=8 x vs TP=8 EP=8 y ms a step; B: x' vs y' ms)``."""
    return (f"({a.batch:,}: {a.tp.layout} {a.tp.step_ms:,.2f} vs {a.ep.layout} {a.ep.step_ms:,.2f} ms a step; "
            f"{b.batch:,}: {b.tp.step_ms:,.2f} vs {b.ep.step_ms:,.2f} ms)")


def ep_vs_tp(ep: Sequence[tuple[Layout, LayoutMemory]], tp: Sequence[tuple[Layout, LayoutMemory]], predict: Predict,
             comm: CommCosts, *, context: int, last: int = LAST) -> EpVsTp | None:
    """Where EP and TP cross (module doc), ``None`` when either side has no feasible layout."""
    if not ep or not tp:
        return None
    sides = _Sides(list(ep), list(tp), predict)
    crossings = _crossings(sides, _grid(last))

    def at(batch: int) -> EpTpAt:
        (el, ep_p), (tl, tp_p) = sides.best(sides.ep, batch), sides.best(sides.tp, batch)
        return EpTpAt(batch=batch, ep=_side(el, ep_p, comm), tp=_side(tl, tp_p, comm))

    kv = {layout.name: memory.kv_tokens_per_gpu // max(context, 1) * (layout.dp if layout.kind == "dp_ep" else 1)
          for layout, memory in [*ep, *tp]}
    start = at(FIRST)
    faster_first = (start.ep if sides.ep_faster(FIRST) else start.tp).layout
    if crossings:
        c = crossings[0]
        below, there = at(c.batch - 1), at(c.batch)
        points = [below, there]
        sentence = (f"EP and TP cross at batch {c.batch:,}: {c.faster_below} is faster below it, "
                    f"{c.faster_from} from it {_steps(below, there)}")
        if len(crossings) > 1:
            sentence += "; they cross again at batch " + ", ".join(f"{x.batch:,}" for x in crossings[1:])
        reasons = [_step_change(below, there), *_reasons(there, kv, context)]
    else:
        end = at(last)
        points = [start, end]
        other = (start.tp if faster_first == start.ep.layout else start.ep).layout
        ties = [b for b in (FIRST, last) if sides.tied(b)]
        sentence = (f"EP and TP do not cross from batch {FIRST} to {last:,}: {faster_first} is faster than {other} "
                    f"{'or as fast ' if ties else ''}at every batch {_steps(start, end)}")
        reasons = [*_reasons(start, kv, context),
                   *_reasons(end, {}, context, assumption=start.ep.all_to_all is None)]
        reasons += [f"at batch {b:,} they predict the same step, {at(b).tp.step_ms:,.2f} ms: the same "
                    "collectives and weight reads" for b in ties]
    grid = _grid(last)
    band = [next(iter(_crossings(sides, grid, s)), None) for s in (-1, 1)]
    crossover_band = [c.batch if c else None for c in band]
    if crossings or any(crossover_band):
        sentence += "; with every figure at one side of its band, then the other: " + ", ".join(
            f"{'EP' if s < 0 else 'TP'} favoured: " + (f"batch {c.batch:,}" if c else "no crossing")
            for s, c in zip((-1, 1), band, strict=True))
    return EpVsTp(ep_layouts=[x.name for x, _ in ep], tp_layouts=[x.name for x, _ in tp], searched=[FIRST, last],
                  faster_first=faster_first, crossover_batch=crossings[0].batch if crossings else None,
                  crossings=crossings, at=points, kv_max_batch=kv, sentence=sentence, reasons=reasons,
                  crossover_band=crossover_band)
