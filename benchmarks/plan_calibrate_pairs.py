#!/usr/bin/env python3
"""plan --calibrate on the real vLLM 0.26 H200 captures made with distinct prompts per request (issue 24): each
pair calibrated at one batch and predicting the other (16 -> 1, 1 -> 16).

  .venv/bin/python benchmarks/plan_calibrate_pairs.py          # markdown table on stdout (docs/measurements.md)

Each capture is analyzed and written as `servescope profile --json` writes it (the analysis and its ``profile``
section: model, batch, tokens, ``"prompts": "distinct"``, from provenance.json); the planner gets the model's shape
from provenance.json, with ``quantization_config: {quant_method: fp8}`` where the server ran ``--quantization
fp8`` (its server_flags: weights one byte, per-tensor scales). Truth: the mean device duration of the capture's
decode step annotations (``execute_context_0(0)_generation_B(B)``, ``gpu_user_annotation``) by plain gzip + json.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.profile import encode_profile
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200-vllm"
PAIRS = [("dense", "async", "ab/dense-async"), ("dense", "noasync", "ab/dense-noasync"),
         ("moe", "async", "ab/moe-async"), ("moe", "noasync", "ab/moe-noasync"),
         ("dense", "fp8", "dense-fp8"), ("moe", "fp8", "moe-fp8")]
BATCHES = (1, 16)


def provenance(folder: str) -> dict[str, Any]:
    prov: dict[str, Any] = json.loads((DATA / folder / "provenance.json").read_text(encoding="utf-8"))
    return prov


def true_step_ms(folder: str, batch: int) -> float:
    """Mean device duration of the capture's decode steps of ``batch`` requests, by plain json."""
    with gzip.open(DATA / folder / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    name = f"execute_context_0(0)_generation_{batch}({batch})"
    steps = [float(e["dur"]) for e in events if e.get("cat") == "gpu_user_annotation" and e.get("name") == name]
    return sum(steps) / len(steps) / 1e3


def config(folder: str, out: Path) -> Path:
    """The model's config.json for the planner: provenance's shape, quantized as the server ran it."""
    prov = provenance(folder)
    shape = dict(prov["model_shape"])
    flags = prov.get("server_flags", [])
    if "--quantization" in flags and flags[flags.index("--quantization") + 1] == "fp8":
        shape["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    path = out / f"{prov['model']}{'-fp8' if 'quantization_config' in shape else ''}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(shape), encoding="utf-8")
    return path


def profile_doc(folder: str, out: Path) -> Path:
    """The capture as `servescope profile --json` writes it, beside nothing (the device is checked from the trace)."""
    prov = provenance(folder)
    trace = DATA / folder / "rank0.pt.trace.json.gz"
    path = out / (folder.replace("/", "_") + ".profile.json")
    path.write_bytes(encode_profile(analyze(AnalyzeRequest(paths=[trace])), [trace], capture={
        "model": prov["model"], "batch": prov["batch"], "input_tokens": prov["input_tokens"],
        "output_tokens": prov["output_tokens"], "prompts": "distinct"}))
    return path


def measure() -> list[dict[str, Any]]:
    """One row per (kind, flavour): the true steps and the error of each direction."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for kind, flavour, stem in PAIRS:
            folders = {b: f"{stem}-b{b}" for b in BATCHES}
            truth = {b: true_step_ms(f, b) for b, f in folders.items()}
            cfg = config(folders[1], out)
            docs = {b: profile_doc(f, out) for b, f in folders.items()}
            row: dict[str, Any] = {"kind": kind, "flavour": flavour, "truth_ms": truth, "error": {}, "predicted_ms": {}}
            for fit, check in ((16, 1), (1, 16)):
                prov = provenance(folders[check])
                context = prov["input_tokens"] + prov["output_tokens"] // 2
                doc = run_plan(PlanRequest(model=str(cfg), hardware="h200", gpus=1, batches=(check,), context=context,
                                           calibrate=str(docs[fit])))
                predicted = doc["layouts"][0]["points"][0]["step_ms"]
                row["predicted_ms"][(fit, check)] = predicted
                row["error"][(fit, check)] = predicted / truth[check] - 1
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| capture pair | true step b1 / b16 (ms) | 16→1 | 1→16 |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} {r['flavour']} | {r['truth_ms'][1]:.2f} / {r['truth_ms'][16]:.2f} | "
                     f"{r['error'][(16, 1)]:+.1%} | {r['error'][(1, 16)]:+.1%} |")
    return "\n".join(lines).replace("-", "−").replace("|−−−|−−−|−−−|−−−|", "|---|---|---|---|")


if __name__ == "__main__":
    sys.stdout.write(table(measure()) + "\n")
