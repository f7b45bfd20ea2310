"""Real GPU inputs (helpers): nvidia-smi outputs from ../shared/gpu/h200 and the H200 recording in tests/data/gpu."""

from __future__ import annotations

from pathlib import Path

SHARED_H200 = Path(__file__).resolve().parents[3] / "shared" / "gpu" / "h200"
RECORDING = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h200-nvml"
SETS = ("idle", "holding-10GiB")


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
