"""Whether plan's inputs describe what is planned: a calibration capture and a collective curve.

A calibration (``--calibrate``, an ``analyze --json`` document) is checked against the plan for:

- *work kind*: a rank whose work is CPU operators (``RankAnalysis.work_kind == "cpu_op"``: a trace without
  device events) against a GPU plan; the hardware profiles describe GPUs;
- *device*: the device the analysis recorded for its worker traces (``TraceInfo.device``, from their
  ``deviceProperties``: the traces are not read again), else the ``device`` of a ``provenance.json`` beside them; the
  name must contain one of the hardware profile's ``match`` strings. Neither (a CPU trace, or a document of schema
  version 1, which recorded no device): not checked, said in the notes;
- *model*: by its shape when one is known: the ``model_shape`` (a HF config) of a ``provenance.json`` beside the
  worker traces, compared field by field (width, layers, heads, KV heads, MLP widths, experts, vocabulary) with
  the planned model; else by name: the served model's name (``profile.model`` of a ``profile --json``
  document, or of a ``profile.json`` beside the traces; the ``--served-model-name`` / ``--model`` of the command
  line in a ``settings.json`` beside them) against the planned model's name, both reduced to lower-case letters
  and digits (``moonshotai/Kimi-K2.5`` = ``kimi-k2.5``; a config file by its file or folder name). Neither:
  not checked, said in the notes;
- *quantization*: a server started with ``--quantization M`` (the ``server_flags`` of a ``provenance.json`` beside
  the traces, else the command line of a ``settings.json``) against the planned model's weight dtypes: ``fp8``
  needs fp8 weights (a ``quantization_config`` with ``quant_method: fp8``), any other method quantized ones; a fit
  of bf16 bytes to a server that read one byte a weight doubles the efficiency it finds;
- *TP*: the capture's tensor-parallel size (its ranks or world size) must be the plan's GPU count and the TP of
  one of the planned layouts (a fit from TP=1 on one GPU says nothing about the collectives or per-rank shares of
  eight GPUs; before 2026-12-05 a TP=1 capture passed for an 8-GPU plan because PP=8 has TP=1).

"Beside the traces" means the folders of the worker traces the document names and, for a capture copied from
the machine it was made on (its recorded paths no longer point anywhere), the calibration document's own folder:
there a trace is looked for by its file name.

A collective curve given with ``--comm`` is checked for its *device* (the curve's ``device`` must contain one
of the profile's ``match`` strings) and its *backend* (a GPU plan needs a GPU collective library: nccl or
rccl, not gloo or mpi on the host).

Each difference is one line. ``plan`` refuses an input with differences (exit 2, naming the file and what
differs) unless ``--force``; with it the input is used and named in the headline and the JSON ``notes``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from servescope.core.analysis import AnalysisDoc
from servescope.core.comm import CurveDoc
from servescope.core.errors import InputError
from servescope.plan.hardware import HardwareProfile
from servescope.plan.model import ModelArch, arch_from_hf_config

__all__ = ["GPU_BACKENDS", "calibration_differences", "capture_model", "capture_quantization",
           "curve_differences", "model_key", "shape_differences"]

# Fields of the architecture whose difference makes a capture another model (shape comparison).
SHAPE_FIELDS = ("hidden", "layers", "heads", "kv_heads", "intermediate", "moe_intermediate", "experts", "top_k",
                "vocab")

GPU_BACKENDS = ("nccl", "rccl")


def model_key(name: str) -> str:
    """A model's name reduced for comparison: the last path part (a ``config.json``'s folder), without
    ``.json`` / ``.config`` / ``.toml``, lower-case letters and digits only."""
    path = Path(name)
    base = path.parent.name if path.name == "config.json" else path.name
    for suffix in (".json", ".toml", ".config"):
        base = base.removesuffix(suffix)
    return re.sub(r"[^a-z0-9]", "", base.lower())


def _provenance_devices(doc: AnalysisDoc, beside: Path | None) -> list[str]:
    """The ``device`` a ``provenance.json`` in :func:`_capture_folders` names (its first part: the GPU's name)."""
    named = (_read_json(f / "provenance.json") for f in _capture_folders(doc, beside))
    return sorted({str(p["device"]).split(",")[0].strip() for p in named
                   if isinstance(p, dict) and isinstance(p.get("device"), str) and p["device"].strip()})


def _describes(hw: HardwareProfile, device: str) -> bool:
    return any(m and m.lower() in device.lower() for m in hw.match)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _capture_folders(doc: AnalysisDoc, beside: Path | None = None) -> list[Path]:
    """Where a capture's companion files (``provenance.json``, ``profile.json``, ``settings.json``) may lie: the
    folders of its worker traces that are on this machine, then ``beside`` (the calibration document's own
    folder: a capture copied from the server it was made on keeps its files together, not its absolute paths)."""
    folders = [f for f in sorted({Path(t.path).parent for t in doc.traces if t.role == "worker"}) if f.is_dir()]
    return folders + ([beside] if beside is not None and beside.is_dir() and beside not in folders else [])


def _command_words(settings: Any) -> list[str] | None:
    """The words of the command line in a ``settings`` document, ``None`` when it has none."""
    groups = settings.get("groups") if isinstance(settings, dict) else None
    for group in groups if isinstance(groups, list) else []:
        for item in group.get("settings", []) if isinstance(group, dict) else []:
            if isinstance(item, dict) and item.get("key") == "command line" and isinstance(item.get("value"), str):
                try:
                    return shlex.split(item["value"])
                except ValueError:
                    return list(item["value"].split())
    return None


def _flag(words: list[str], flag: str) -> str | None:
    """The value of ``flag`` (``--flag V`` or ``--flag=V``) in ``words``, the last one given."""
    found = None
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def _command_model(settings: Any) -> str | None:
    """The served model name (or the ``--model``) of the command line in a ``settings`` document."""
    words = _command_words(settings)
    if words is None:
        return None
    return _flag(words, "--served-model-name") or _flag(words, "--model")


def capture_quantization(doc: AnalysisDoc, beside: Path | None = None) -> tuple[str, str] | None:
    """(the ``--quantization`` the captured server ran with, where it was read): the ``server_flags`` of a
    ``provenance.json`` in :func:`_capture_folders`, else the command line of a ``settings.json`` there."""
    for folder in _capture_folders(doc, beside):
        prov = _read_json(folder / "provenance.json")
        flags = prov.get("server_flags") if isinstance(prov, dict) else None
        words = ([str(w) for w in flags] if isinstance(flags, list)
                 else _command_words(_read_json(folder / "settings.json")))
        where = str(folder / ("provenance.json" if isinstance(flags, list) else "settings.json"))
        method = _flag(words, "--quantization") if words else None
        if method:
            return method, where
    return None


def capture_model(doc: AnalysisDoc, raw: Any, beside: Path | None = None) -> tuple[str | None, ModelArch | None, str]:
    """(served model name, model shape, where they were read) of a calibration capture (module doc)."""
    name: str | None = None
    where = ""
    prof = raw.get("profile") if isinstance(raw, dict) else None
    if isinstance(prof, dict) and isinstance(prof.get("model"), str) and prof["model"]:
        name, where = prof["model"], "the document's profile section"
    for folder in _capture_folders(doc, beside):
        prov = _read_json(folder / "provenance.json")
        shape = prov.get("model_shape") if isinstance(prov, dict) else None
        if isinstance(shape, dict):
            label = str(prov.get("model") or folder.name)
            try:
                return name or label, arch_from_hf_config(shape, name=label, source=str(folder / "provenance.json")), \
                    str(folder / "provenance.json")
            except InputError:
                pass
        if name is None:
            profile = _read_json(folder / "profile.json")
            inner = profile.get("profile") if isinstance(profile, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("model"), str) and inner["model"]:
                name, where = inner["model"], str(folder / "profile.json")
        if name is None:
            served = _command_model(_read_json(folder / "settings.json"))
            if served:
                name, where = served, str(folder / "settings.json")
    return name, None, where


def shape_differences(captured: ModelArch, arch: ModelArch) -> list[str]:
    """``field captured ≠ planned`` for each :data:`SHAPE_FIELDS` field that differs."""
    return [f"{f} {getattr(captured, f)} ≠ {getattr(arch, f)}" for f in SHAPE_FIELDS
            if getattr(captured, f) != getattr(arch, f)]


def calibration_differences(doc: AnalysisDoc, raw: Any, arch: ModelArch, hw: HardwareProfile, *, tp: int,
                            planned_tp: set[int], gpus: int | None = None,
                            beside: Path | None = None) -> tuple[list[str], list[str]]:
    """(what differs from the plan, what could not be checked) for a calibration document (module doc)."""
    diffs: list[str] = []
    unchecked: list[str] = []
    kinds = sorted({r.work_kind for r in doc.ranks})
    if "cpu_op" in kinds:
        diffs.append(f"work kind: CPU operators (a trace without GPU kernels), the plan is for GPU kernels on "
                     f"{hw.gpu or hw.name}")
    devices = sorted({t.device for t in doc.traces if t.role == "worker" and t.device})
    if not devices:
        devices = _provenance_devices(doc, beside)
    if devices:
        other = [d for d in devices if not _describes(hw, d)]
        if other:
            diffs.append(f"device: captured on {', '.join(other)}, the plan is for {hw.gpu or hw.name} "
                         f"(profile {hw.name} matches {', '.join(hw.match) or 'no device name'})")
    else:
        recorded = ("its traces name none" if doc.schema_version >= 2 else
                    f"an analysis of schema version {doc.schema_version} does not record it: analyze its traces again")
        unchecked.append(f"device ({recorded}, and no provenance.json lies beside them)")
    served, shape, where = capture_model(doc, raw, beside)
    if shape is not None:
        differ = shape_differences(shape, arch)
        if differ:
            diffs.append(f"model: captured serving {served} ({where}), whose shape is not {arch.name}'s: "
                         f"{', '.join(differ)}")
    elif served:
        if model_key(served) != model_key(arch.name):
            diffs.append(f"model: captured serving {served} ({where}), the plan is for {arch.name}")
    else:
        unchecked.append("model (no profile section, and no provenance.json, profile.json or settings.json "
                         "beside its traces names it)")
    quant = capture_quantization(doc, beside)
    if quant is not None:
        method, qwhere = quant
        dtypes = {arch.weight_dtype, arch.expert_weight_dtype if arch.moe_layers else arch.weight_dtype}
        plain = arch.weight_dtype == arch.dtype and (not arch.moe_layers or arch.expert_weight_dtype == arch.dtype)
        if (method == "fp8" and not any(d.startswith("fp8") for d in dtypes)) or (method != "fp8" and plain):
            diffs.append(f"quantization: the captured server ran --quantization {method} ({qwhere}), the plan's "
                         f"{arch.name} has {', '.join(sorted(dtypes))} weights (give its config.json the "
                         f"quantization_config the server used)")
    if gpus is not None and tp != gpus:
        diffs.append(f"TP: the capture ran TP={tp} on {tp} GPU{'s' if tp != 1 else ''}, the plan is for {gpus}")
    elif planned_tp and tp not in planned_tp:
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
