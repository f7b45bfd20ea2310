"""An all-to-all (EP dispatch or combine) between GPUs without NVLink: PCIe, no multicast (issue 24 item 4).

What it assumes about the links, in one place:

- **Each GPU's transfers are serialised through its own x16 link.** Without NVLink there is no multicast and
  no fabric between GPUs: a GPU sends each of its G − 1 peers its share of the per-rank send buffer S (the
  top-k routed copies of its tokens' hidden vectors, nccl-tests size), (G − 1)/G · S in all, one after another
  on its link at the profile's per-direction ``p2p_gbps`` × ``link_efficiency`` (``data/plan.toml``).
- **The host bridge is shared.** Without a PCIe switch, P2P traffic between GPUs on different root ports goes up
  through the CPU's root complex (and, between sockets, the inter-socket link): every sender's (G − 1)/G · S
  crosses it at once, ``senders`` × (G − 1)/G · S in all, at the aggregate rate a host was measured to sustain
  with every GPU reading from every other at once (``data/plan.toml`` ``[all_to_all_pcie]``, with its source).
- **Behind PCIe switches** (``plan --topology``, :mod:`servescope.plan.topology`): GPUs sharing a switch exchange
  inside it; what each switch's GPUs send to peers outside it goes through the switch's one x16 uplink (the
  profile's ``p2p_gbps`` × ``link_efficiency``): ``uplink`` = the busiest switch's senders × the share of peers
  outside it × S. The host bridge's figure (measured without switches) is then not used.
- **Without P2P** (the profile's ``p2p = false``, or ``topo -p2p r`` not OK in ``plan --topology``) NCCL stages the
  transfers through host memory: both bounds are multiplied by what that cost on the one box measured both ways
  (``data/plan.toml`` ``[all_to_all_pcie] p2p_off``, by message size, never below 1).
- The call takes ``latency + max(link, bridge or uplink)``: the larger bound applies, and it is named (``bound``). The
  latency is the α of the PCIe α-β estimate for one step (``base_us`` + one ``hop_us``, ``data/plan.toml``
  ``[comm.pcie]``, read off the 8-GPU PCIe nccl-tests all-reduce latency).
- ``NCCL_PROTO`` does not reach it: NCCL runs an all-to-all as grouped sends and receives, whose protocol it picks
  by ``NCCL_P2P_LL_THRESHOLD`` (LL only below 16 KiB a channel, src/enqueue.cc), not by ``NCCL_PROTO``.

Each input keeps its provenance (:class:`~servescope.core.plan.Figure`): the link rate the profile's
(``datasheet`` or ``assumed``), the efficiency and latency ``assumed``, the bridge rate ``published`` for the
profiles it was measured with and ``assumed`` for any other (another host's figure).
"""

from __future__ import annotations

import math
from typing import Any

from servescope.core.plan import Figure, PcieAllToAllTerms
from servescope.plan.factors import Factors, plan_data
from servescope.plan.hardware import HardwareProfile
from servescope.plan.topology import PcieTopology

__all__ = ["ASSUMPTION", "BOUNDS", "bridge_figure", "on_pcie", "p2p_off_factor", "pcie_all_to_all"]

BOUNDS = ("link", "bridge", "uplink")
ASSUMPTION = ("PCIe without NVLink, so no multicast: each GPU's sends serialised through its own x16 link, the "
              "host bridge shared by every sender")


def on_pcie(hw: HardwareProfile) -> bool:
    """Whether ``hw``'s all-to-alls take this model: GPUs joined by PCIe only (no NVLink, hence no multicast)."""
    return hw.interconnect == "pcie"


def _table() -> dict[str, Any]:
    table: dict[str, Any] = plan_data()["all_to_all_pcie"]
    return table


def bridge_figure(group: int, hw: HardwareProfile) -> Figure:
    """The host bridge's aggregate rate for an all-to-all over ``group`` GPUs: the figure measured at that many
    GPUs, else at the fewest measured above it, else at the most measured; ``published`` for the profiles it was
    measured with, ``assumed`` (another box's host) for the rest."""
    t = _table()
    rates = sorted((int(k), float(v)) for k, v in t["bridge_gbps"].items())
    at, gbps = next(((g, v) for g, v in rates if g >= group), rates[-1])
    measured = hw.name in t["profiles"]
    where = f"{t['source']} (the {at}-GPU figure"
    where += ")" if measured and at == group else f", taken for {group} GPUs of {hw.name}: assumed)"
    return Figure(value=gbps, unit="GB/s", origin="published" if measured and at == group else "assumed",
                  source=where)


def pcie_all_to_all(group: int, nbytes: float, hw: HardwareProfile, factors: Factors, *,
                    senders: int | None = None, topology: PcieTopology | None = None) -> PcieAllToAllTerms:
    """One all-to-all of ``nbytes`` a rank over ``group`` PCIe GPUs, ``senders`` of them holding tokens (default
    all), priced as the module doc says: every term with its inputs' provenance, as the plan document records it
    (:class:`~servescope.core.plan.PcieAllToAllTerms`: ``link_bytes`` = (G − 1)/G of the send buffer,
    ``bridge_bytes`` = ``senders`` × that, each bound its bytes ÷ its rate, ``us`` = latency + the longer)."""
    senders = group if senders is None else max(1, min(senders, group))
    base, hop = factors.comm_alpha.get("pcie", (10.0, 5.0))
    base = hw.base_us if hw.base_us is not None else base
    hop = hw.hop_us if hw.hop_us is not None else hop
    t = _table()
    link = Figure(value=hw.p2p_gbps, unit="GB/s per direction", origin=hw.p2p_origin,
                  source=f"hardware profile {hw.name}: p2p_gbps ({hw.source})")
    eff = Figure(value=factors.link_efficiency, unit="of the link",
                 origin=factors.origins.get("link_efficiency", "assumed"), source="data/plan.toml [efficiency] link")
    latency = Figure(value=base + hop, unit="µs", origin="assumed", source=str(t["latency_source"]))
    bridge = bridge_figure(group, hw)
    link_bytes = (group - 1) / group * nbytes
    bridge_bytes = senders * link_bytes
    link_us = link_bytes / (link.value * eff.value * 1e3)  # GB/s = 1e3 bytes/µs
    bridge_us = bridge_bytes / (bridge.value * 1e3)
    bound = "bridge" if bridge_us > link_us else "link"
    uplink_us = None
    where = None
    if topology is not None and group <= topology.gpus:
        where = topology.summary(group)
        if topology.behind_switches(group):  # the uplinks, not the host bridge, carry what leaves a switch
            out = max(senders * len(s) / group * (group - len(s)) / group * nbytes for s in topology.switches(group))
            uplink_us = out / (link.value * eff.value * 1e3)
            bridge_us = 0.0
            bound = "uplink" if uplink_us > link_us else "link"
    staged = 1.0 if hw.p2p else p2p_off_factor(nbytes)
    link_us, bridge_us = link_us * staged, bridge_us * staged
    uplink_us = None if uplink_us is None else uplink_us * staged
    far = max(link_us, bridge_us, uplink_us or 0.0)
    return PcieAllToAllTerms(group=group, senders=senders, bytes_each=round(nbytes), link_bytes=link_bytes,
                             bridge_bytes=bridge_bytes if uplink_us is None else 0.0, link_gbps=link,
                             link_efficiency=eff, bridge_gbps=bridge, latency_us=latency, link_us=link_us,
                             bridge_us=bridge_us, bound=bound, us=latency.value + far, assumption=ASSUMPTION,
                             uplink_us=uplink_us, topology=where, p2p_off_factor=None if hw.p2p else staged)


def p2p_off_factor(nbytes: float) -> float:
    """What staging through host memory multiplies a transfer by at ``nbytes`` (``[all_to_all_pcie] p2p_off``:
    log-linear between the sizes measured, the largest one's beyond them, never below 1)."""
    points = sorted((int(k), float(v)) for k, v in _table()["p2p_off"].items())
    if nbytes <= points[0][0]:
        return max(1.0, points[0][1])
    for (b0, v0), (b1, v1) in zip(points, points[1:], strict=False):
        if nbytes <= b1:
            f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return max(1.0, v0 + f * (v1 - v0))
    return max(1.0, points[-1][1])
