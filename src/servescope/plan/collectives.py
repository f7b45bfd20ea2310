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
from servescope.plan.factors import Factors
from servescope.plan.hardware import HardwareProfile

__all__ = ["ALL_OPS", "CommCosts", "CurveSource", "bundled_curves", "estimate_us", "user_curves"]

ALL_OPS = (*OPS, "send_recv")
MEASURED, PUBLISHED, ASSUMED = "measured curve", "published curve", "assumed"


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
        hw: the hardware profile (link bandwidth and kind for the estimate).
        factors: ``link_efficiency``, ``comm_alpha`` and ``collective_scale``.
        sources: curve documents in order of preference.
        graph: prefer curves timed inside a CUDA graph.
    """

    def __init__(self, hw: HardwareProfile, factors: Factors, sources: list[CurveSource], *,
                 graph: bool = True) -> None:
        self.hw, self.factors, self.sources, self.graph = hw, factors, sources, graph

    def curve_for(self, op: str, group: int) -> tuple[OpCurve, CurveSource] | None:
        """The curve used for ``op`` over ``group`` GPUs and its source, ``None`` when the estimate is used."""
        if op not in OPS or group <= 1:
            return None
        for source in self.sources:
            if source.doc.world_size != group:
                continue
            for graph in ((True, False) if self.graph else (False, True)):
                curve = source.doc.curve(op, variant="default", graph=graph)
                if curve is not None and curve.points:
                    return curve, source
        return None

    def time_us(self, op: str, group: int, nbytes: float) -> tuple[float, str]:
        """(time of one op in µs including ``collective_scale``, origin of the figure)."""
        if group <= 1:
            return 0.0, ASSUMED
        found = self.curve_for(op, group)
        if found is None:
            t, origin = estimate_us(op, group, nbytes, self.hw, self.factors), ASSUMED
        else:
            t, origin = time_us_at(found[0], nbytes), found[1].origin
        return t * self.factors.collective_scale, origin

    def with_factors(self, factors: Factors) -> CommCosts:
        """The same sources under other factors."""
        return CommCosts(self.hw, factors, self.sources, graph=self.graph)
