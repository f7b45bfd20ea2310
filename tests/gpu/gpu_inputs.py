"""Real GPU inputs (helpers): nvidia-smi outputs from ../shared/gpu/h200, the H200 recording in tests/data/gpu,
and the public ``nvidia-smi topo`` outputs in tests/data/gpu/topo."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import msgspec

from servescope.core.gpu import GpuInfo, GpuSnapshot
from servescope.gpu.smi import parse_compute_apps_csv, parse_query_gpu_csv, parse_topo_matrix, parse_topo_p2p
from tracefiles import SHARED

SHARED_H200 = SHARED / "gpu" / "h200"  # ../shared: tests that read it are needs_shared
RECORDING = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h200-nvml"
SETS = ("idle", "holding-10GiB")
TOPO = Path(__file__).resolve().parents[1] / "data" / "gpu" / "topo"


def shared_file(name: str) -> str:
    """A file of ../shared/gpu/h200; fails loudly when the folder is missing."""
    path = SHARED_H200 / name
    assert path.is_file(), f"missing {path}: CI lays ../shared beside the checkout"
    return path.read_text(encoding="utf-8")


def recorded_file(set_name: str, name: str) -> str:
    """A file of the real H200 recording (tools/record_gpu_fixtures.py); fails loudly when missing."""
    path = RECORDING / set_name / name
    assert path.is_file(), (
        f"missing {path}: run `python3 tools/record_gpu_fixtures.py --out {RECORDING} --hold-gib 10` on a GPU host"
    )
    return path.read_text(encoding="utf-8")


def holding_snapshot() -> GpuSnapshot:
    """The real "holding 10 GiB" outputs: query-gpu (noheader, nounits) and query-compute-apps."""
    gpu_block = shared_file("nvidia-smi-holding-10GiB.txt").split("nounits\n", 1)[1].split("\n\n", 1)[0]
    apps_block = shared_file("nvidia-smi-holding-10GiB.txt").split("--format=csv\n", 1)[1].split("\n\n", 1)[0]
    gpus = parse_query_gpu_csv(gpu_block, fields=["index", "memory.used", "memory.total"])
    procs = parse_compute_apps_csv(apps_block, gpus=gpus)
    return GpuSnapshot(gpus, procs, None, "nvidia-smi", "2026-12-02T15:27:24+00:00")


def plain_numbers() -> tuple[int, int, str, int]:
    """(GPU used MiB, holder pid, holder name, holder MiB) from the plain table in the holding file."""
    used = re.search(r"(\d+)MiB /\s+\d+MiB", shared_file("nvidia-smi-holding-10GiB.txt"))
    proc = re.search(r"\|\s+0\s+N/A\s+N/A\s+(\d+)\s+C\s+(\S+)\s+(\d+)MiB", shared_file("nvidia-smi-holding-10GiB.txt"))
    assert used and proc
    return int(used.group(1)), int(proc.group(1)), proc.group(2), int(proc.group(3))


def topo_text(folder: str, name: str = "topo-m.txt") -> str:
    path = TOPO / folder / name
    assert path.is_file(), f"missing {path}"
    assert (TOPO / folder / "SOURCE.md").is_file(), f"{folder} has no SOURCE.md"
    return path.read_text(encoding="utf-8")


def snapshot_of(text: str, p2p: str | None = None) -> GpuSnapshot:
    topo = parse_topo_matrix(text)
    if p2p is not None:
        topo = msgspec.structs.replace(topo, p2p_read=parse_topo_p2p(p2p)[1])
    gpus = tuple(GpuInfo(index=i) for i in range(topo.gpu_count))
    return GpuSnapshot(gpus, (), topo, "nvidia-smi", "2026-12-03T00:00:00+00:00")


def fake_nvidia_smi(tmp_path: Path, answers: dict[str, Path]) -> None:
    """An ``nvidia-smi`` on PATH that prints recorded outputs for the arguments it knows."""
    cases = "\n".join(f'  "{args}") cat "{path}" ;;' for args, path in answers.items())
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}\n  *) echo "unknown $*" >&2; exit 3 ;;\nesac\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def two_gpu_xml(tmp_path: Path) -> Path:
    """The H200's real ``nvidia-smi -q -x`` with its <gpu> element twice (no 2-GPU XML recorded)."""
    xml = shared_file("nvidia-smi-q.xml")
    gpu = re.search(r"<gpu id=.*?</gpu>\n", xml, re.DOTALL)
    assert gpu
    path = tmp_path / "q.xml"
    path.write_text(xml.replace(gpu.group(0), gpu.group(0) * 2), encoding="utf-8")
    return path
