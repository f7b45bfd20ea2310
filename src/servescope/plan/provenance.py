"""Whether plan's inputs describe what is planned: a calibration capture and a collective curve.

A calibration (``--calibrate``, an ``analyze --json`` document) is checked against the plan for:

- *work kind*: a rank whose work is CPU operators (``RankAnalysis.work_kind == "cpu_op"``: a trace without
  device events) against a GPU plan; the hardware profiles describe GPUs;
- *device*: the analysis document does not record the device, so it is read from the ``deviceProperties`` of
  the traces it names (``inputs``), when they are on this machine; the name must contain one of the
  hardware profile's ``match`` strings. Traces not at hand: not checked, said in the notes;
- *model*: the served model's name (``profile.model``, present in ``profile --json`` documents) against the
  planned model's name, both reduced to lower-case letters and digits (``moonshotai/Kimi-K2.5`` = ``kimi-k2.5``;
  a config file by its file or folder name). No ``profile`` section: not checked, said in the notes;
- *TP*: the capture's tensor-parallel size (its ranks or world size) must be the TP of one of the planned
  layouts (a fit from TP=2 says nothing about the collectives or per-rank shares of a plan without TP=2).

A collective curve given with ``--comm`` is checked for its *device* (the curve's ``device`` must contain one
of the profile's ``match`` strings) and its *backend* (a GPU plan needs a GPU collective library: nccl or
rccl, not gloo or mpi on the host).

Each difference is one line. ``plan`` refuses an input with differences (exit 2, naming the file and what
differs) unless ``--force``; with it the input is used and named in the headline and the JSON ``notes``.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

from servescope.core.analysis import AnalysisDoc
from servescope.core.comm import CurveDoc
from servescope.plan.hardware import HardwareProfile
from servescope.plan.model import ModelArch

__all__ = ["GPU_BACKENDS", "calibration_differences", "curve_differences", "model_key", "trace_device"]

GPU_BACKENDS = ("nccl", "rccl")
_HEAD_BYTES = 1 << 16  # deviceProperties sits in the trace's header, before traceEvents
_DEVICE = re.compile(rb'"deviceProperties"\s*:\s*\[\s*\{[^}]*?"name"\s*:\s*"([^"]+)"')


def model_key(name: str) -> str:
    """A model's name reduced for comparison: the last path part (a ``config.json``'s folder), without
    ``.json`` / ``.config`` / ``.toml``, lower-case letters and digits only."""
    path = Path(name)
    base = path.parent.name if path.name == "config.json" else path.name
    for suffix in (".json", ".toml", ".config"):
        base = base.removesuffix(suffix)
    return re.sub(r"[^a-z0-9]", "", base.lower())


def trace_device(path: str) -> str | None:
    """The first device name in a Kineto trace's header, ``None`` when the file is not here or has none."""
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else Path(path).open("rb")) as fh:
            head = fh.read(_HEAD_BYTES)
    except (OSError, EOFError):
        return None
    found = _DEVICE.search(head)
    return found.group(1).decode("utf-8", "replace") if found else None


def _describes(hw: HardwareProfile, device: str) -> bool:
    return any(m and m.lower() in device.lower() for m in hw.match)


def calibration_differences(doc: AnalysisDoc, raw: Any, arch: ModelArch, hw: HardwareProfile, *, tp: int,
                            planned_tp: set[int]) -> tuple[list[str], list[str]]:
    """(what differs from the plan, what could not be checked) for a calibration document (module doc)."""
    diffs: list[str] = []
    unchecked: list[str] = []
    kinds = sorted({r.work_kind for r in doc.ranks})
    if "cpu_op" in kinds:
        diffs.append(f"work kind: CPU operators (a trace without GPU kernels), the plan is for GPU kernels on "
                     f"{hw.gpu or hw.name}")
    devices = sorted({d for d in (trace_device(t.path) for t in doc.traces if t.role == "worker") if d})
    if devices:
        other = [d for d in devices if not _describes(hw, d)]
        if other:
            diffs.append(f"device: captured on {', '.join(other)}, the plan is for {hw.gpu or hw.name} "
                         f"(profile {hw.name} matches {', '.join(hw.match) or 'no device name'})")
    else:
        unchecked.append("device (the analysis does not record it and its traces are not here)")
    prof = raw.get("profile") if isinstance(raw, dict) else None
    served = prof.get("model") if isinstance(prof, dict) else None
    if isinstance(served, str) and served:
        if model_key(served) != model_key(arch.name):
            diffs.append(f"model: captured serving {served}, the plan is for {arch.name}")
    else:
        unchecked.append("model (the analysis has no profile section naming it)")
    if planned_tp and tp not in planned_tp:
        diffs.append(f"TP: the capture ran TP={tp}, the planned layouts have TP "
                     f"{', '.join(map(str, sorted(planned_tp)))}")
    return diffs, unchecked


def curve_differences(doc: CurveDoc, hw: HardwareProfile) -> list[str]:
    """What differs between a ``--comm`` curve file and the planned hardware (module doc)."""
    diffs: list[str] = []
    if not _describes(hw, doc.device):
        diffs.append(f"device: measured on {doc.device or 'an unnamed device'}, the plan is for "
                     f"{hw.gpu or hw.name} (profile {hw.name} matches {', '.join(hw.match) or 'no device name'})")
    if doc.backend.lower() not in GPU_BACKENDS:
        diffs.append(f"backend: {doc.backend or 'unknown'}, not a GPU collective library "
                     f"({' or '.join(GPU_BACKENDS)})")
    return diffs
