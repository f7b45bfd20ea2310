"""Time of one collective (op, group size, bytes): from a curve file when one covers it, else an α-β estimate.

Sources, first match wins for a (op, group size):

1. the user's ``--comm`` file (``bench comm`` output): origin ``measured curve`` (or ``published curve`` when
   the file says ``source = "published"``);
2. bundled curves ``data/comm/*.json`` whose ``device`` contains one of the hardware profile's ``match``
   strings (or whose file name starts with the profile's name): ``published curve`` / ``measured curve``;
3. the α-β estimate (origin ``assumed``)::

       t = base_us + hops × hop_us + bus_factor × bytes / (p2p_gbps × link_efficiency)

   with hops all_reduce 2(n−1) (ring), all_gather and reduce_scatter n−1, all_to_all and send_recv 1, and
   nccl-tests' bus factors (all_reduce 2(n−1)/n, the others (n−1)/n, send_recv 1). On PCIe this is the
   "one x16 link per GPU, no multicast" picture: an all_to_all pushes (n−1)/n of its buffer through it.

Since issue 24 an all-reduce first takes the path the engine takes (:func:`servescope.plan.paths.allreduce_path`:
vLLM 0.26's custom all-reduce one-shot / two-shot, torch symmetric memory, or NCCL) and is priced on it, in this
order: a ``calibrated`` point (the user's own capture, ``--calibrate``: :mod:`servescope.plan.captured`), the
user's ``--comm`` curve (NCCL only), an ``in-situ`` point (a kernel in a real trace:
``data/comm/points.toml``), a ``published`` point (a microbenchmark of that implementation), a bundled curve
(NCCL only, the variant timed with the unit's ``NCCL_ALGO`` / ``NCCL_PROTO`` / ``NCCL_NVLS_ENABLE`` where one
exists), the α-β estimate (one hop for a one-shot kernel, two for a two-shot). Past a point's largest size, where
``data/comm/points.toml`` has a bus bandwidth published for those GPUs (``[[bandwidth]]``), the call costs
``max(bus_factor × bytes ÷ that bandwidth, the point's largest time)`` (:meth:`CommCosts._from_point`); the same
bandwidth caps an all_gather's or reduce_scatter's α-β estimate there (assumed). A figure not measured in a real
step gets the wait for the last rank added (``Factors.wait_us``, ``data/plan.toml`` ``[comm.wait]``), kept apart
in :class:`Priced`. ``NCCL_PROTO=LL`` counts the bandwidth term twice on the NCCL path
(:func:`servescope.plan.paths.nccl_env_effects`); not an all-to-all, which NCCL runs as grouped sends and
receives whose protocol ``NCCL_P2P_LL_THRESHOLD`` picks, not ``NCCL_PROTO`` (src/enqueue.cc).

An all-to-all between GPUs without NVLink (``interconnect = "pcie"``) that no calibrated point, curve or point
covers is priced by :mod:`servescope.plan.alltoall` instead of the α-β estimate: each GPU's sends serialised
through its own x16 link, the host bridge shared by every sender, the longer of the two plus one step's latency
(origin ``assumed``: the model; its inputs' own provenance in :class:`~servescope.core.plan.PcieAllToAllTerms`).

A curve file is used only for its own world size: its numbers say nothing about another group size.
Within a file the ``default`` variant is used, replayed from a CUDA graph when the file has it (vLLM
decodes inside CUDA graphs), else eager. ``bytes`` follow nccl-tests' *size* (core/comm.py): all_reduce
the buffer, all_gather the gathered output, reduce_scatter the full input, all_to_all the per-rank send
buffer, send_recv the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from servescope.core.comm import OPS, CurveDoc, OpCurve, bus_factor, curve_doc_from_dict, time_us_at
from servescope.core.files import read_json
from servescope.core.plan import PcieAllToAllTerms
from servescope.plan.alltoall import on_pcie, pcie_all_to_all
from servescope.plan.bands import classify_point, extended_by
from servescope.plan.factors import Factors
from servescope.plan.hardware import HardwareProfile
from servescope.plan.paths import (
    Bandwidth,
    PathChoice,
    Point,
    allreduce_path,
    load_bandwidths,
    load_points,
    nccl_env_effects,
    point_time_us,
)
from servescope.plan.topology import PcieTopology

__all__ = ["ALL_OPS", "PCIE_A2A_SOURCE", "CommCosts", "CurveSource", "Priced", "bundled_curves", "estimate_us",
           "user_curves"]

ALL_OPS = (*OPS, "send_recv")
MEASURED, PUBLISHED, ASSUMED = "measured curve", "published curve", "assumed"
IN_SITU, PUBLISHED_POINT, CALIBRATED = "in-situ", "published point", "calibrated"
PCIE_A2A_SOURCE = "PCIe all-to-all model"


@dataclass(frozen=True, kw_only=True)
class Priced:
    """One collective call as priced: ``us`` = transfer (with ``collective_scale``) + ``wait_us``.

    Attributes:
        us: the whole call, µs.
        wait_us: the part that is the wait for the last rank added to a microbenchmark figure (0 for in-situ).
        origin: where the transfer figure came from (``in-situ``, ``published point``, ``published curve``,
            ``measured curve``, ``assumed``).
        impl: the implementation (``paths.IMPLS``; ``nccl`` for every op but a routed all-reduce).
        why: the path rule that chose it.
        source: the document or file behind the figure.
        path: the path in a few words, for the screen (``PathChoice.label``, with the unit's NCCL_ALGO /
            NCCL_PROTO on the NCCL path).
        alltoall: the PCIe all-to-all model's terms where it priced the call (:mod:`servescope.plan.alltoall`).
        band: the class of the figure's band (:mod:`servescope.plan.bands`): ``in_situ``, ``calibrated``,
            ``published_same_device``, ``published_sibling``, ``assumed``.
        doublings: how far past its measured sizes the figure was carried (0 within them).
    """

    us: float
    wait_us: float
    origin: str
    impl: str
    why: str
    source: str
    path: str
    alltoall: PcieAllToAllTerms | None = None
    band: str = "assumed"
    doublings: float = 0.0


@dataclass(frozen=True, kw_only=True)
class CurveSource:
    """One curve document and where it came from (a path) and how it is marked (its origin)."""

    doc: CurveDoc
    path: str
    origin: str


def _hops(op: str, n: int) -> int:
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1}.get(op, 1)


def estimate_us(op: str, group: int, nbytes: float, hw: HardwareProfile, factors: Factors) -> float:
    """α-β time of one ``op`` over ``group`` GPUs moving ``nbytes`` (nccl-tests size), µs; 0 for one GPU."""
    if group <= 1:
        return 0.0
    base, hop = factors.comm_alpha.get(hw.interconnect, (10.0, 5.0))
    base = hw.base_us if hw.base_us is not None else base
    hop = hw.hop_us if hw.hop_us is not None else hop
    factor = 1.0 if op == "send_recv" else bus_factor(op, group)
    gbps = hw.p2p_gbps * factors.link_efficiency
    return base + _hops(op, group) * hop + factor * nbytes / (gbps * 1e3)  # GB/s = 1e3 bytes/µs


def bundled_curves(hw: HardwareProfile) -> list[CurveSource]:
    """The bundled curve files (``data/comm/*.json``) that describe ``hw``'s GPUs.

    Raises:
        InputError: a bundled file that matches is not a valid curve file.
    """
    folder = files("servescope").joinpath("data", "comm")
    if not folder.is_dir():
        return []
    out: list[CurveSource] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".json"):
            continue
        where = f"bundled curves {entry.name}"
        data = read_json(entry, source=where)
        device = str(data.get("device", "")).lower() if isinstance(data, dict) else ""
        named = entry.name.lower().startswith(hw.name.lower())
        if not named and not any(m.lower() in device for m in hw.match if m):
            continue
        doc = curve_doc_from_dict(data, source=where)
        out.append(CurveSource(doc=doc, path=where, origin=MEASURED if doc.source == "measured" else PUBLISHED))
    return out


def user_curves(path: str | Path) -> CurveSource:
    """A ``bench comm`` curve file given with ``--comm``.

    Raises:
        InputError: unreadable or not a ``servescope.comm-curves/1`` document.
    """
    from servescope.core.comm import load_curves

    doc = load_curves(path)
    return CurveSource(doc=doc, path=str(path), origin=MEASURED if doc.source == "measured" else PUBLISHED)


class CommCosts:
    """Collective times for one hardware profile, from curves where they exist, else the α-β estimate.

    Args:
        hw: the hardware profile (link bandwidth and kind for the estimate; what the path rules read).
        factors: ``link_efficiency``, ``comm_alpha`` and ``collective_scale``.
        sources: curve documents in order of preference.
        graph: prefer curves timed inside a CUDA graph.
        env: the serving unit's environment (``NCCL_*``, ``VLLM_*``): the path and the curve variant.
        points: per-call points (default: ``data/comm/points.toml``).
        user_path: the ``--comm`` file's path: its curve is preferred over any point.
        engine: ``"vllm"`` (the path of :mod:`servescope.plan.paths`, points, the wait term) or ``None``: every op
            as plain NCCL from the curves or the α-β estimate, no wait (the curve machinery on its own).
        calibrated: per-call points measured in the user's own capture (``--calibrate``,
            :mod:`servescope.plan.captured`): first of all for their op, group size and implementation.
        bandwidths: bus bandwidths published for boxes (default: ``data/comm/points.toml`` ``[[bandwidth]]``).
    """

    def __init__(self, hw: HardwareProfile, factors: Factors, sources: list[CurveSource], *,
                 graph: bool = True, env: dict[str, str] | None = None, points: list[Point] | None = None,
                 user_path: str | None = None, engine: str | None = "vllm",
                 calibrated: list[Point] | None = None, bandwidths: list[Bandwidth] | None = None,
                 topology: PcieTopology | None = None) -> None:
        self.hw, self.factors, self.sources, self.graph = hw, factors, sources, graph
        self.user_path, self.engine = user_path, engine
        self.calibrated = list(calibrated or [])
        self.env = dict(env or {})
        self.points = load_points() if points is None else points
        self.bandwidths = load_bandwidths() if bandwidths is None else bandwidths
        self.nccl_env = nccl_env_effects(self.env)
        self.topology = topology

    def curve_for(self, op: str, group: int) -> tuple[OpCurve, CurveSource] | None:
        """The curve used for ``op`` over ``group`` GPUs and its source, ``None`` when the estimate is used."""
        if op not in OPS or group <= 1:
            return None
        prefer = {k: v.lower() for k, v in self.nccl_env.prefer.items()}
        for source in self.sources:
            if source.doc.world_size != group:
                continue
            if prefer:  # a variant timed under the unit's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE
                for c in source.doc.curves:
                    if (c.op == op and c.points and all(c.env.get(k, "").lower() == v for k, v in prefer.items())):
                        return c, source
            for graph in ((True, False) if self.graph else (False, True)):
                curve = source.doc.curve(op, variant="default", graph=graph)
                if curve is not None and curve.points:
                    return curve, source
        return None

    def _point(self, op: str, impl: str, group: int, origin: str, nbytes: float = 0.0) -> Point | None:
        """The point of ``origin`` for the call: of several, the one whose sizes lie nearest ``nbytes``."""
        found = [p for p in (self.calibrated if origin == CALIBRATED else self.points)
                 if p.origin == origin and p.is_for(op, impl, group, self.hw.name)]
        return min(found, key=lambda p: extended_by(nbytes, p.bytes), default=None)

    def _bandwidth(self, op: str, impl: str, group: int) -> Bandwidth | None:
        return next((b for b in self.bandwidths if b.is_for(op, impl, group, self.hw.name)), None)

    def _from_point(self, point: Point, op: str, group: int, nbytes: float,
                    curve: tuple[OpCurve, CurveSource] | None, *, ll: bool = False) -> float:
        """The point's time within its measured sizes. Past its largest: with a bus bandwidth published for these
        GPUs, ``max(bus_factor × bytes ÷ it (twice under LL), min(largest time, the point's trend))``; else that
        time carried on by the shape of the NCCL curve (else the α-β estimate) from there: a point's own slope,
        fitted on a few small sizes, is not extended to messages many times larger. Below a one-size point, the
        same shape down from it."""
        top, bottom = max(point.bytes), min(point.bytes)
        if nbytes < bottom and len(point.bytes) == 1:  # one size: below it, the curve's (else estimate's) shape
            return point_time_us(point, bottom) * min(self._shape(op, group, curve, nbytes, bottom), 1.0)
        if nbytes <= top:
            return point_time_us(point, nbytes)
        if (bw := self._bandwidth(op, point.impl, group)) is not None:
            floor = (2 if ll else 1) * bus_factor(op, group) * nbytes / (bw.bus_gbps * 1e3)  # GB/s = 1e3 B/µs
            return max(floor, min(point_time_us(point, top), point_time_us(point, nbytes)))
        return point_time_us(point, top) * max(self._shape(op, group, curve, nbytes, top), 1.0)

    def _shape(self, op: str, group: int, curve: tuple[OpCurve, CurveSource] | None, nbytes: float,
               ref: float) -> float:
        """How much longer a call of ``nbytes`` takes than one of ``ref``: by the NCCL curve, else the estimate."""
        if curve is not None:
            return time_us_at(curve[0], nbytes) / max(time_us_at(curve[0], ref), 1e-9)
        return (estimate_us(op, group, nbytes, self.hw, self.factors)
                / max(estimate_us(op, group, ref, self.hw, self.factors), 1e-9))

    def price(self, op: str, group: int, nbytes: float, *, senders: int | None = None) -> Priced:
        """One call of ``op`` over ``group`` GPUs at ``nbytes`` on the engine's path (module doc); ``senders``: the
        GPUs of an all-to-all that hold tokens (default all)."""
        if group <= 1:
            return Priced(us=0.0, wait_us=0.0, origin=ASSUMED, impl="none", why="one GPU", source="",
                          path="none (one GPU)")
        if self.engine is None:
            found = self.curve_for(op, group)
            if found is None:
                t = estimate_us(op, group, nbytes, self.hw, self.factors)
                return Priced(us=t * self.factors.collective_scale, wait_us=0.0, origin=ASSUMED, impl="nccl",
                              why="plain NCCL (no engine path)", source="α-β estimate", path="NCCL")
            return Priced(us=time_us_at(found[0], nbytes) * self.factors.collective_scale, wait_us=0.0,
                          origin=found[1].origin, impl="nccl", why="plain NCCL (no engine path)",
                          source=found[1].path, path="NCCL", band=self._curve_band(found[1]),
                          doublings=extended_by(nbytes, [p.bytes for p in found[0].points]))
        path = (allreduce_path(int(nbytes), group, self.hw, self.env) if op == "all_reduce" else
                PathChoice(impl="nccl", why="NCCL (pynccl): vLLM 0.26 runs every collective but the TP all-reduce "
                                            "through it (cuda_communicator.py)", label="NCCL"))
        label = path.label
        if path.impl == "nccl":
            knobs = [f"{k}={self.env[k]}" for k in ("NCCL_ALGO", "NCCL_PROTO") if k in self.env]
            label = ", ".join([label, *knobs])
        scale = self.factors.collective_scale
        wait = self.factors.wait_us
        ll = path.impl == "nccl" and self.nccl_env.ll_only and op not in ("send_recv", "all_to_all")
        found = self.curve_for(op, group) if path.impl == "nccl" else None
        why = path.why
        band, doublings = "assumed", 0.0
        if (point := self._point(op, path.impl, group, CALIBRATED, nbytes)) is not None:
            return Priced(us=self._from_point(point, op, group, nbytes, found, ll=ll) * scale, wait_us=0.0,
                          origin=CALIBRATED, impl=path.impl, why=why, source=self._beyond(point, group, nbytes),
                          path=label, band="calibrated", doublings=extended_by(nbytes, point.bytes))
        if found is not None and found[1].path == self.user_path:
            t, origin, source = time_us_at(found[0], nbytes), found[1].origin, found[1].path
            band = "in_situ" if origin == MEASURED else "published_same_device"
            doublings = extended_by(nbytes, [p.bytes for p in found[0].points])
        elif (point := self._point(op, path.impl, group, "in-situ", nbytes)) is not None:
            return Priced(us=self._from_point(point, op, group, nbytes, found, ll=ll) * scale, wait_us=0.0,
                          origin=IN_SITU, impl=path.impl, why=why, source=self._beyond(point, group, nbytes),
                          path=label, band=classify_point("in-situ", point.stands_for, self.hw.name, point.band),
                          doublings=extended_by(nbytes, point.bytes))
        elif (point := self._point(op, path.impl, group, "published", nbytes)) is not None:
            t, origin = self._from_point(point, op, group, nbytes, found, ll=ll), PUBLISHED_POINT
            source = self._beyond(point, group, nbytes)
            ll = ll and source == point.source  # past the point the published bandwidth holds the LL term
            band = classify_point("published", point.stands_for, self.hw.name, point.band)
            doublings = extended_by(nbytes, point.bytes)
            bw = self._bandwidth(op, point.impl, group)
            if bw is not None and nbytes > max(point.bytes) and t > point_time_us(point, max(point.bytes)) + 1e-9:
                band, doublings = "published_same_device", extended_by(nbytes, [bw.bytes, bw.bytes])
        elif found is not None:
            t, origin, source = time_us_at(found[0], nbytes), found[1].origin, found[1].path
            band, doublings = self._curve_band(found[1]), extended_by(nbytes, [p.bytes for p in found[0].points])
        elif op == "all_to_all" and on_pcie(self.hw):
            return self._pcie_all_to_all(group, nbytes, senders, path)
        else:
            est_op = {"custom_1stage": "send_recv", "custom_2stage": "reduce_scatter"}.get(path.impl, op)
            t, origin, source = estimate_us(est_op, group, nbytes, self.hw, self.factors), ASSUMED, "α-β estimate"
        if ll:
            t += bus_factor(op, group) * nbytes / (self.hw.p2p_gbps * self.factors.link_efficiency * 1e3)
        bw = self._bandwidth("all_reduce", "nccl", group)
        if source == "α-β estimate" and op in ("all_gather", "reduce_scatter") and path.impl == "nccl" and bw:
            t = max(t, (2 if ll else 1) * bus_factor(op, group) * nbytes / (bw.bus_gbps * 1e3))
            why += (f"; its bandwidth at most the all-reduce's {bw.bus_gbps:g} GB/s bus bandwidth published for "
                    f"these GPUs ({op}: assumed, nccl-tests' bus bandwidth reflects the same links; {bw.source})")
        return Priced(us=t * scale + wait, wait_us=wait, origin=origin, impl=path.impl, why=why, source=source,
                      path=label, band=band, doublings=doublings)

    def _curve_band(self, source: CurveSource) -> str:
        """A curve's class: the user's measured curve is in situ on this box; any other, published for the card."""
        return "in_situ" if source.path == self.user_path and source.origin == MEASURED else "published_same_device"

    def _beyond(self, point: Point, group: int, nbytes: float) -> str:
        """The point's source, and the published bandwidth's where it prices ``nbytes`` past the point."""
        bw = self._bandwidth(point.op, point.impl, group)
        if bw is None or nbytes <= max(point.bytes):
            return point.source
        return (f"{point.source}; past {max(point.bytes):,} B: {bw.bus_gbps:g} GB/s bus bandwidth ({bw.origin}) "
                f"from {bw.source}")

    def _pcie_all_to_all(self, group: int, nbytes: float, senders: int | None, path: PathChoice) -> Priced:
        """An all-to-all between PCIe GPUs by :func:`~servescope.plan.alltoall.pcie_all_to_all`, the bound named."""
        m = pcie_all_to_all(group, nbytes, self.hw, self.factors, senders=senders, topology=self.topology)
        binds = {"bridge": "host bridge", "uplink": "switch uplink"}.get(m.bound, "link")
        if m.uplink_us is None:
            shared = (f"the host bridge shared by {m.senders} sender{'s' if m.senders != 1 else ''} "
                      f"({m.bridge_bytes:,.0f} B at {m.bridge_gbps.value:g} GB/s {m.bridge_gbps.origin} = "
                      f"{m.bridge_us:.1f} µs)")
        else:
            shared = (f"behind PCIe switches, what leaves the busiest switch through its x16 uplink: "
                      f"{m.uplink_us:.1f} µs")
        why = (f"{path.why}; all-to-all over PCIe without NVLink, so no multicast: each GPU's sends serialised "
               f"through its own x16 link ({group - 1}/{group} of {nbytes:,.0f} B at {m.link_gbps.value:g} GB/s "
               f"{m.link_gbps.origin} × {m.link_efficiency.value:g} {m.link_efficiency.origin} = {m.link_us:.1f} µs), "
               f"{shared}: the {binds} binds, + {m.latency_us.value:g} µs latency ({m.latency_us.origin})"
               + (f"; topology {m.topology}" if m.topology else ""))
        label = ("NCCL all-to-all over PCIe, no multicast: sends serialised through each GPU's x16 link, "
                 + ("host bridge shared" if m.uplink_us is None else "switch uplinks shared") + f"; the {binds} binds")
        source = (f"{PCIE_A2A_SOURCE} (plan/alltoall.py): link {m.link_gbps.value:g} GB/s ({m.link_gbps.origin}) × "
                  f"{m.link_efficiency.value:g} ({m.link_efficiency.origin}); bridge {m.bridge_gbps.value:g} GB/s "
                  f"({m.bridge_gbps.origin}: {m.bridge_gbps.source}); latency {m.latency_us.value:g} µs "
                  f"({m.latency_us.origin}: {m.latency_us.source})")
        wait = self.factors.wait_us
        return Priced(us=m.us * self.factors.collective_scale + wait, wait_us=wait, origin=ASSUMED, impl="nccl",
                      why=why, source=source, path=label, alltoall=m)

    def time_us(self, op: str, group: int, nbytes: float) -> tuple[float, str]:
        """(time of one op in µs including ``collective_scale``, origin of the figure)."""
        priced = self.price(op, group, nbytes)
        return priced.us, priced.origin

    def with_factors(self, factors: Factors) -> CommCosts:
        """The same sources under other factors."""
        return CommCosts(self.hw, factors, self.sources, graph=self.graph, env=self.env, points=self.points,
                         user_path=self.user_path, engine=self.engine, calibrated=self.calibrated,
                         bandwidths=self.bandwidths, topology=self.topology)

    def with_calibrated(self, points: list[Point]) -> CommCosts:
        """The same sources and factors, with the user's capture's per-call points first."""
        return CommCosts(self.hw, self.factors, self.sources, graph=self.graph, env=self.env, points=self.points,
                         user_path=self.user_path, engine=self.engine, calibrated=points, bandwidths=self.bandwidths,
                         topology=self.topology)
