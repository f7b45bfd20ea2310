"""Decide only what the figures decide (issue 38 item 2).

At each batch the fastest layout is set against the next one: the call is decided where the margin between them
exceeds what the two steps' figures, each at the far side of its band, can take from it
(:func:`servescope.plan.bands.compare`). Where it does not, the figure that can take the most decides the call,
and the plan names the command that measures it on this box: a collective by ``servescope bench comm`` at the
message sizes the two layouts send, whose result ``plan --comm`` then reads as an in-situ curve (its band
``in_situ``); another figure by a capture that ``plan --calibrate`` fits.

How long ``bench comm`` runs: the launch of its processes (``data/bands.toml`` ``[bench_comm]``, with its basis)
plus, per size, its warm-up and timed calls at the far side of the figure's band.
"""

from __future__ import annotations

from collections.abc import Sequence

from servescope.core.plan import BatchCall, Measurement, PlanLayout, PlanPoint
from servescope.plan.bands import Compared, Term, compare, load_bands

__all__ = ["batch_calls", "measurement"]

ITERS, WARMUP = 50, 10  # bench comm's defaults (cli/bench.py)


def _terms(point: PlanPoint) -> list[Term]:
    return [Term(figure=t.figure, band=t.band, ms=t.ms, lo_ms=t.lo_ms, hi_ms=t.hi_ms, op=t.op or "",
                 group=t.group or 0, bytes=tuple(t.bytes or ()), calls=t.calls or 0) for t in point.figures or []]


def compared_at(layouts: Sequence[PlanLayout], k: int) -> Compared | None:
    """The fastest layout whose KV cache holds the batch against the next one, at the ``k``-th batch."""
    options = sorted(((x.points[k].step_ms, x.name, x.points[k]) for x in layouts
                      if x.feasible and x.points[k].fits_kv), key=lambda o: o[0])
    if len(options) < 2:
        return None
    (a_ms, a, pa), (b_ms, b, pb) = options[0], options[1]
    return compare(a, _terms(pa), a_ms, b, _terms(pb), b_ms, pa.batch)


def batch_calls(layouts: Sequence[PlanLayout]) -> tuple[list[BatchCall], dict[int, Compared]]:
    """The call at every batch (fastest against next), and the comparisons behind them by batch."""
    feasible = [x for x in layouts if x.feasible]
    out: list[BatchCall] = []
    found: dict[int, Compared] = {}
    if not feasible:
        return out, found
    for k, p in enumerate(feasible[0].points):
        c = compared_at(feasible, k)
        if c is None:
            fits = [x.name for x in feasible if x.points[k].fits_kv]
            if fits:
                out.append(BatchCall(batch=p.batch, fastest=fits[0], next=None, margin_ms=None, band_ms=None,
                                     decided=True, deciding=None, deciding_ms=None))
            continue
        found[p.batch] = c
        top = c.by_figure[0] if c.by_figure else None
        out.append(BatchCall(batch=p.batch, fastest=c.a, next=c.b, margin_ms=c.margin_ms, band_ms=c.band_ms,
                             decided=c.decided, deciding=top[0] if top else None, deciding_ms=top[1] if top else None))
    return out, found


def _bench_seconds(sizes: Sequence[int], us_each: float, group: int) -> tuple[float, str]:
    b = load_bands()["bench_comm"]
    calls = len(sizes) * (ITERS + WARMUP)
    seconds = float(b["launch_s"]) + calls * us_each / 1e6
    return seconds, (f"{b['launch_s']} s to launch {group} processes and join them ({b['basis']}) + {calls} calls "
                     f"at up to {us_each:,.0f} µs")


def measurement(c: Compared, gpus: int, others: Sequence[Compared] = ()) -> Measurement | None:
    """What settles the close call ``c``: the command measuring its deciding figure (at the sizes it is sent at in
    ``c`` and in the ``others`` close calls), and about how long it runs."""
    if not c.by_figure:
        return None
    name, _, ta, tb = c.by_figure[0]
    term = ta or tb
    assert term is not None
    if term.op and term.group > 1:
        sizes = sorted({n for x in (c, *others) for f, _, xa, xb in x.by_figure if f == name
                        for t in (xa, xb) if t is not None for n in t.bytes})
        each_us = max(((t.ms + t.hi_ms) * 1e3 / max(1, t.calls) for t in (ta, tb) if t is not None), default=0.0)
        seconds, basis = _bench_seconds(sizes, each_us, term.group)
        spec = ",".join(_size_arg(n) for n in sizes)
        command = f"servescope bench comm --gpus {term.group} --ops {term.op} --sizes {spec} -o comm.json"
        return Measurement(figure=name, band=term.band, command=command, seconds=seconds, basis=basis,
                           then=f"servescope plan … --comm comm.json: the measured curve replaces the figure, with "
                                f"the in-situ band of data/bands.toml ({_pct('in_situ')})")
    return Measurement(figure=name, band=term.band,
                       command=f"servescope profile URL --batch {c.batch} -o capture.json (a capture of this model "
                               f"on this box, TP={gpus} or the layout it runs)",
                       seconds=float(load_bands()["profile"]["seconds"]), basis=str(load_bands()["profile"]["basis"]),
                       then=f"servescope plan … --calibrate capture.json: the step's parts fitted to it, with the "
                            f"calibrated band ({_pct('calibrated')})")


def _size_arg(nbytes: int) -> str:
    """A size as ``bench comm --sizes`` reads it: ``56K``, ``2M``, else bytes."""
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes % div == 0:
            return f"{nbytes // div}{unit}"
    return str(nbytes)


def _pct(cls: str) -> str:
    b = load_bands()["class"][cls]
    return f"−{float(b['lo']):.0%} .. +{float(b['hi']):.0%}"
