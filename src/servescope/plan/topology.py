"""The box's PCIe topology for the all-to-all model: which GPUs share a PCIe switch (``plan --topology``).

Read from ``nvidia-smi topo -m`` (``servescope gpu topo`` shows the same matrix): two GPUs whose path is ``PIX`` or
``PXB`` sit behind one PCIe switch, and their transfers stay inside it; ``PHB``, ``NODE`` and ``SYS`` cross the CPU's
root complex (and, for ``SYS``, the link between sockets); ``NV#`` is NVLink. An all-to-all's group is the first
``group`` GPUs of the matrix (CUDA's order, as a server started without ``CUDA_VISIBLE_DEVICES`` uses them).

The same file may go on with ``nvidia-smi topo -p2p r`` (``{ nvidia-smi topo -m; nvidia-smi topo -p2p r; } >
topo.txt``): where any two of the group's GPUs cannot read each other's memory (a status other than ``OK``: ``GNS``
on GeForce cards, ``CNS``, ``DR``, …), the plan takes P2P as off whatever the hardware profile says: vLLM's custom
all-reduce needs it (:mod:`servescope.plan.paths`), and NCCL moves the data through host memory instead
(:func:`servescope.plan.alltoall.pcie_all_to_all`'s P2P-off factor).

What :func:`servescope.plan.alltoall.pcie_all_to_all` does with it: GPUs in switches send to the peers outside their
switch through the switch's one x16 uplink (the "uplink" bound); without switches every sender's traffic crosses the
host bridge (the "bridge" bound, the aggregate rate a direct-attach host was measured to sustain).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servescope.core.errors import InputError
from servescope.gpu.errors import GpuQueryError
from servescope.gpu.smi import parse_topo_matrix, parse_topo_p2p

__all__ = ["SWITCH_PATHS", "PcieTopology", "read_topology"]

SWITCH_PATHS = ("PIX", "PXB")  # behind one PCIe switch (or a chain of them), not through the host bridge


@dataclass(frozen=True, kw_only=True)
class PcieTopology:
    """The GPUs of a ``topo -m`` matrix: each pair's path kind and the groups behind one switch.

    Attributes:
        path: the file read.
        links: the GPU part of the matrix (``X`` on the diagonal).
        p2p: the ``topo -p2p r`` statuses between the GPUs, where the file holds them.
    """

    path: str
    links: tuple[tuple[str, ...], ...]
    p2p: tuple[tuple[str, ...], ...] | None = None  # topo -p2p r statuses (None: not in the file)

    @property
    def gpus(self) -> int:
        return len(self.links)

    def switches(self, group: int) -> list[list[int]]:
        """The first ``group`` GPUs split into the sets joined by switch paths (a GPU alone where it has none)."""
        seen: set[int] = set()
        out: list[list[int]] = []
        for start in range(group):
            if start in seen:
                continue
            part, todo = [], [start]
            while todo:
                g = todo.pop()
                if g in seen:
                    continue
                seen.add(g)
                part.append(g)
                todo += [h for h in range(group) if h not in seen and self.links[g][h] in SWITCH_PATHS]
            out.append(sorted(part))
        return out

    def behind_switches(self, group: int) -> bool:
        """Whether any two of the first ``group`` GPUs share a switch."""
        return any(len(s) > 1 for s in self.switches(group))

    def p2p_ok(self, group: int) -> bool | None:
        """Whether every two of the first ``group`` GPUs can read each other's memory (``None``: not known)."""
        if self.p2p is None or len(self.p2p) < group:
            return None
        return all(self.p2p[a][b] == "OK" for a in range(group) for b in range(group) if a != b)

    def kinds(self, group: int) -> dict[str, int]:
        """Pairs of the first ``group`` GPUs by path kind."""
        out: dict[str, int] = {}
        for a in range(group):
            for b in range(a + 1, group):
                out[self.links[a][b]] = out.get(self.links[a][b], 0) + 1
        return out

    def summary(self, group: int) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds(group).items()))
        parts = [s for s in self.switches(group) if len(s) > 1]
        where = (f"{len(parts)} PCIe switch{'es' if len(parts) != 1 else ''} ("
                 + "; ".join("GPU " + ",".join(map(str, s)) for s in parts) + "): transfers between switches take "
                 "their x16 uplinks" if parts else "no two GPUs behind one switch: every transfer crosses the host "
                 "bridge")
        ok = self.p2p_ok(group)
        statuses = sorted({self.p2p[a][b] for a in range(group) for b in range(group) if a != b}) if self.p2p else []
        p2p = ("" if ok is None else "; P2P on between them (topo -p2p: OK)" if ok else
               f"; P2P off between them (topo -p2p: {', '.join(statuses)}): no custom all-reduce, NCCL through host "
               f"memory")
        return f"{self.path}: the first {group} GPUs, pairs {kinds}; {where}{p2p}"


def read_topology(path: str | Path, group: int) -> PcieTopology:
    """The topology in an ``nvidia-smi topo -m`` file, for an all-to-all over its first ``group`` GPUs.

    Raises:
        InputError: unreadable, not a ``topo -m`` matrix, or fewer GPUs than ``group``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(str(p), f"cannot read it (--topology): {exc.strerror or exc}") from None
    try:
        topo = parse_topo_matrix(text)
    except GpuQueryError as exc:
        raise InputError(str(p), f"not an `nvidia-smi topo -m` matrix (--topology): {exc}") from None
    gpus = [i for i, d in enumerate(topo.devices) if d.startswith("GPU")]
    links = tuple(tuple(topo.links[a][b].strip() for b in gpus) for a in gpus)
    if len(links) < group:
        raise InputError(str(p), f"{len(links)} GPUs in the matrix, fewer than the plan's {group} (--topology)")
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line[:1].isspace() and "GPU0" in line]
    p2p = None
    if len(heads) > 1:  # topo -p2p r after topo -m
        try:
            labels, p2p = parse_topo_p2p("\n".join(lines[heads[1]:]))
        except GpuQueryError as exc:
            raise InputError(str(p), f"its second matrix is not `nvidia-smi topo -p2p r` (--topology): {exc}") from None
        if len(labels) != len(links):
            raise InputError(str(p), f"topo -p2p has {len(labels)} GPUs, topo -m {len(links)} (--topology)")
    return PcieTopology(path=str(p), links=links, p2p=p2p)
