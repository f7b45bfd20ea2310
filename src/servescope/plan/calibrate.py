"""Efficiency factors fitted to a real capture: its decode breakdown against the model's own prediction.

The capture is an ``analyze --json`` (or ``profile --json``) document of a TP run of the same model. From its
decode phase, on the rank that spent least time in collectives (the others' collective time includes
waiting for the slowest rank):

- measured *weights* = ``gemm`` + ``moe`` + ``quantize`` µs per step; *attention* = ``attention``;
  *collectives* = every ``comm.*`` category; *other* = the step span minus those three.
- the model predicts the same four parts at efficiency 1 and scale 1 for the capture's TP size, batch
  (decode tokens per step) and context (the profile's input tokens plus half its output tokens when the
  document has them, else the plan's ``--context``).
- ``hbm_efficiency = weights_model / weights_measured``, ``attention_efficiency = attention_model /
  attention_measured``, ``collective_scale = collectives_measured / collectives_model``, ``other_scale =
  other_measured / other_model``. A part the capture lacks keeps its assumed factor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.core.analysis import AnalysisDoc, PhaseStats, RankAnalysis
from servescope.core.errors import InputError
from servescope.plan.collectives import CommCosts
from servescope.plan.cost import layout_memory, predict_point
from servescope.plan.factors import Factors
from servescope.plan.hardware import HardwareProfile
from servescope.plan.layouts import Layout
from servescope.plan.model import ModelArch
from servescope.report.jsonout import decode_analysis

__all__ = ["WEIGHT_CATEGORIES", "Calibration", "apply_calibration", "calibrate"]

WEIGHT_CATEGORIES = ("gemm", "moe", "quantize")
PARTS = ("weights", "attention", "collectives", "other")


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What was fitted, from which capture, and the per-part times (ms per step) behind each factor."""

    path: str
    rank: int
    tp: int
    batch: int
    context: int
    measured_ms: dict[str, float]
    modelled_ms: dict[str, float]
    fitted: dict[str, float]
    notes: list[str] = field(default_factory=list)


def _measured(phase: PhaseStats) -> dict[str, float]:
    cats = phase.categories
    weights = sum(c.per_step_us for name, c in cats.items() if name in WEIGHT_CATEGORIES)
    attention = cats["attention"].per_step_us if "attention" in cats else 0.0
    comm = sum(c.per_step_us for name, c in cats.items() if name.startswith("comm."))
    other = max(0.0, phase.step_us.mean - weights - attention - comm)
    return {"weights": weights / 1e3, "attention": attention / 1e3, "collectives": comm / 1e3,
            "other": other / 1e3, "step": phase.step_us.mean / 1e3}


def _context(raw: Any, default: int) -> tuple[int, str | None]:
    prof = raw.get("profile") if isinstance(raw, dict) else None
    if isinstance(prof, dict) and isinstance(prof.get("input_tokens"), int):
        prompt: int = prof["input_tokens"]
        out = prof.get("output_tokens")
        return prompt + (out // 2 if isinstance(out, int) else 0), None
    return default, f"context {default} tokens (--context): the document has no profile settings"


def calibrate(path: str | Path, arch: ModelArch, hw: HardwareProfile, comm: CommCosts, *,
              context: int) -> Calibration:
    """Factors fitted to the decode phase of the capture at ``path`` (see the module doc).

    Raises:
        InputError: the file is unreadable, not an analysis document, has no decode phase, no batch size,
            or its TP size does not split the model.
    """
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(source, exc.strerror or "cannot read") from None
    doc: AnalysisDoc = decode_analysis(data, source)
    raw = json.loads(data)
    ranks = [r for r in doc.ranks if "decode" in r.phases and r.phases["decode"].steps > 0]
    if not ranks:
        raise InputError(source, "no decode steps to calibrate from (capture a decode workload)")
    tp = max(len(doc.ranks), max((t.world_size or 1) for t in doc.traces) if doc.traces else 1)

    def comm_us(r: RankAnalysis) -> float:
        cats = r.phases["decode"].categories
        return sum(c.per_step_us for n, c in cats.items() if n.startswith("comm."))

    rank = min(ranks, key=lambda r: (comm_us(r), r.rank))
    phase = rank.phases["decode"]
    if not phase.tokens_per_step:
        raise InputError(source, "decode steps carry no token counts; the batch size is unknown")
    batch = max(1, round(phase.tokens_per_step))
    ctx, note = _context(raw, context)
    notes = [note] if note else []
    layout = Layout(kind="tp", tp=tp)
    if tp > 1 and (arch.heads % tp or arch.hidden % tp):
        raise InputError(source, f"the capture has {tp} ranks, which do not split {arch.name}")
    unit = comm.factors.replaced("unit", hbm_efficiency=1.0, attention_efficiency=1.0,
                                 collective_scale=1.0, other_scale=1.0)
    memory = layout_memory(arch, layout, hw, unit, context=ctx)
    point = predict_point(arch, layout, hw, comm.with_factors(unit), batch=batch, context=ctx, memory=memory)
    modelled = dict(point.parts_ms)
    measured = _measured(phase)
    fitted: dict[str, float] = {}
    ratios = {"hbm_efficiency": ("weights", True), "attention_efficiency": ("attention", True),
              "collective_scale": ("collectives", False), "other_scale": ("other", False)}
    for name, (part, inverse) in ratios.items():
        m, p = measured[part], modelled[part]
        if m <= 0 or p <= 0:
            notes.append(f"{name}: kept as assumed (the {'capture' if m <= 0 else 'model'} has no {part} time)")
            continue
        fitted[name] = p / m if inverse else m / p
    if fitted.get("hbm_efficiency", 0.0) > 1.0:
        notes.append("hbm_efficiency above 1: the capture read weights faster than the profile's HBM rate "
                     "(another device, or a cache-resident model)")
    return Calibration(path=source, rank=rank.rank, tp=tp, batch=batch, context=ctx, measured_ms=measured,
                       modelled_ms=modelled, fitted=fitted, notes=notes)


def apply_calibration(factors: Factors, calibration: Calibration) -> Factors:
    """``factors`` with the fitted values in place, marked ``calibrated``."""
    return factors.replaced("calibrated", **calibration.fitted)
