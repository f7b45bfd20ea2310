"""report/gpu.py's topology and holders views: a fixed-width console into a string, compared exactly."""

from __future__ import annotations

import io

from rich.console import Console

from servescope.gpu.holders import GpuHolders, Holder, HoldersReport
from servescope.gpu.topology import GpuLinks, GpuPair, TopologyReport
from servescope.report.gpu import render_holders, render_topology


def rendered(render: object, report: object) -> str:
    buf = io.StringIO()
    render(report, Console(file=buf, width=100, highlight=False, color_system=None))  # type: ignore[operator]
    return buf.getvalue()


def test_topology_view() -> None:
    report = TopologyReport(
        "nvml",
        "2026-12-03T09:00:00+00:00",
        (
            GpuLinks(0, "NVIDIA H200", "00000000:00:06.0", 5, 5, 16, 16, "0-15", "0"),
            GpuLinks(1, "NVIDIA H200", "00000000:00:07.0", 4, 5, 8, 16, None, None),
        ),
        (GpuPair(0, 1, "NV18", 18, "SYS", "OK", True),),
        True,
        "all pairs NVLink (NV18): NCCL uses NVLink P2P",
        (("NIC0", "mlx5_0"),),
    )
    assert rendered(render_topology, report) == (
        "GPU topology (nvml, 2026-12-03T09:00:00+00:00)\n"
        "verdict: all pairs NVLink (NV18): NCCL uses NVLink P2P\n"
        " gpu  name         bus id            PCIe now  PCIe max  CPU affinity  NUMA \n"
        "   0  NVIDIA H200  00000000:00:06.0  gen5 x16  gen5 x16  0-15          0    \n"
        "   1  NVIDIA H200  00000000:00:07.0  gen4 x8   gen5 x16  N/A           N/A  \n"
        " pair  link  NVLinks  PCIe path  P2P read \n"
        " 0-1   NV18       18  SYS        OK       \n"
        "NICs: NIC0=mlx5_0\n"
    )


def test_topology_view_one_gpu_has_no_pair_table() -> None:
    report = TopologyReport(
        "nvidia-smi", "t", (GpuLinks(0, None, None, None, None, None, None, None, None),), (), True, "one GPU", ()
    )
    assert rendered(render_topology, report) == (
        "GPU topology (nvidia-smi, t)\n"
        "verdict: one GPU\n"
        " gpu  name  bus id  PCIe now  PCIe max  CPU affinity  NUMA \n"
        "   0  N/A   N/A     N/A       N/A       N/A           N/A  \n"
    )


def test_holders_view() -> None:
    report = HoldersReport(
        "nvidia-smi",
        "2026-12-02T15:27:24+00:00",
        (
            GpuHolders(
                0, "NVIDIA H200", 12867, 143771, 12858,
                (Holder(414, "python3", 12858, "root", "python3 -c 'import torch' --api-key ***"),),
            ),
            GpuHolders(1, "NVIDIA H200", 0, 143771, 0, ()),
        ),
        (Holder(415, None, None, None, None),),
    )
    assert rendered(render_holders, report) == (
        "GPU memory holders (nvidia-smi, 2026-12-02T15:27:24+00:00)\n"
        "GPU0 NVIDIA H200: 12867 of 143771 MiB used, 12858 MiB held by 1 process\n"
        "  pid   user   used MiB   process   command                                 \n"
        "  414   root      12858   python3   python3 -c 'import torch' --api-key *** \n"
        "GPU1 NVIDIA H200: 0 of 143771 MiB used, no process holds memory\n"
        "processes on a GPU the source did not name:\n"
        "  pid   user   used MiB   process   command \n"
        "  415   N/A         N/A   N/A       N/A     \n"
    )
