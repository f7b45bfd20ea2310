"""plan --calibrate against the real vLLM 0.26 captures from the H200 (tests/data/h200-vllm, issue 14 item 5).

Each capture is analyzed here; the planner is given the model's real shape (the capture's provenance.json),
calibrated on one batch's capture and asked for another batch's decode step, which is compared with that
capture's own decode step mean. The errors were measured once (2026-12-03) and are in the README's plan section;
the test holds each within that error plus ``MARGIN`` so a change to the planner that moves any of them shows here
(and the README's table is redone), and checks that plan's notes flag the predictions it cannot make well.
Nothing in the planner was fitted to these captures.

What the errors are made of (README): every step here is host-bound, CUDA graphs or not (the device is busy
1.0-2.6 ms of a 3.3-4.5 ms graph step, 1.0-2.6 of 12-32 ms eager), so the planner holds the step at the
capture's own step and adds what the device does beyond it; the host's share differs between captures, which
are separate profiling windows on a live server (idle per step, dense graphs: 1.75 / 1.71 / 1.94 ms at batch
1 / 16 / 64; MoE: 2.37 / 2.58 / 2.06 ms). `servescope profile` sends one prompt to all B requests, so the MoE
batch routes its tokens to nearly the same 8 experts (fused_moe_kernel 12.2 / 17.6 / 38.7 µs a call at
1 / 16 / 64), not the E(1-(1-k/E)^B) experts the planner assumes: calibrated at 16 or 64 it fits an HBM
efficiency above 1 and says so. analyze files most of moe-graphs-b64's replays as attention
(tests/trace/test_labels.py KNOWN_MISFILED), which shows in the calibration's parts, not in its step (host-held).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.jsonout import encode_analysis
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-vllm"
BATCHES = (1, 16, 64)
DELAY = 20  # the window is engine steps 20..27 after /start_profile (provenance.json "window")
# (kind, mode, fit, check) -> error measured on 2026-12-03 (prediction / measured step - 1), the README's table;
# the CUDA-graph rows remeasured when calibrate priced the small calls of weights and attention as other
MEASURED = {
    ("dense", "graphs", 1, 16): +0.017, ("dense", "graphs", 1, 64): -0.085, ("dense", "graphs", 16, 1): -0.033,
    ("dense", "graphs", 16, 64): -0.056, ("dense", "graphs", 64, 1): +0.049, ("dense", "graphs", 64, 16): +0.077,
    ("moe", "graphs", 1, 16): -0.111, ("moe", "graphs", 1, 64): +0.260, ("moe", "graphs", 16, 1): +0.125,
    ("moe", "graphs", 16, 64): +0.007, ("moe", "graphs", 64, 1): +0.117, ("moe", "graphs", 64, 16): -0.007,
    ("dense", "eager", 1, 16): -0.320, ("dense", "eager", 1, 64): +0.040, ("dense", "eager", 16, 1): +0.470,
    ("dense", "eager", 16, 64): +0.529, ("dense", "eager", 64, 1): -0.039, ("dense", "eager", 64, 16): -0.346,
    ("moe", "eager", 1, 16): +0.029, ("moe", "eager", 1, 64): +0.247, ("moe", "eager", 16, 1): -0.028,
    ("moe", "eager", 16, 64): +0.212, ("moe", "eager", 64, 1): -0.198, ("moe", "eager", 64, 16): -0.175,
}
# The margin: the captures are fixed files, so the numbers repeat exactly while the planner does; 2 points
# absorbs float noise and the third digit of the README, and any change of the planner's rules that moves a
# case more than that (the skeleton table's rule changes moved cases by 4-30 points) is a change of what the
# README reports, to be remeasured.
MARGIN = 0.02
FEW_REQUESTS_NOTE = "shows little of the per-request cost"


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per capture folder name: (analysis path, decode batch, decode step mean ms); per kind: (config, context)."""
    folder = tmp_path_factory.mktemp("h200-vllm")
    out: dict[str, Any] = {}
    for kind in ("dense", "moe"):
        for mode in ("graphs", "eager"):
            for batch in BATCHES:
                name = f"{kind}-{mode}-b{batch}"
                path = folder / f"{name}.analysis.json"
                doc = analyze(AnalyzeRequest(paths=[DATA / name / "rank0.pt.trace.json.gz"]))
                path.write_bytes(encode_analysis(doc))
                phase = json.loads(path.read_bytes())["ranks"][0]["phases"]["decode"]
                out[name] = (path, round(phase["tokens_per_step"]), phase["step_us"]["mean"] / 1e3)
        prov = json.loads((DATA / f"{kind}-graphs-b1" / "provenance.json").read_text(encoding="utf-8"))
        config = folder / f"{kind}.config.json"
        config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
        out[kind] = (config, prov["input_tokens"] + DELAY + 8 // 2)  # the mean context of the 8 steps
    return out


def _plan(captures: dict[str, Any], kind: str, mode: str, fit: int, check: int) -> tuple[dict[str, Any], float]:
    config, context = captures[kind]
    analysis, fit_batch, _ = captures[f"{kind}-{mode}-b{fit}"]
    _, batch, measured = captures[f"{kind}-{mode}-b{check}"]
    assert (fit_batch, batch) == (fit, check)
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(batch,), context=context,
                               calibrate=str(analysis)))
    return doc, doc["layouts"][0]["points"][0]["step_ms"] / measured - 1


@pytest.mark.parametrize(("kind", "mode", "fit", "check"), sorted(MEASURED), ids=lambda v: str(v))
def test_calibrated_on_one_real_capture_predicts_another_batch(captures: dict[str, Any], kind: str, mode: str,
                                                               fit: int, check: int) -> None:
    doc, error = _plan(captures, kind, mode, fit, check)
    measured = MEASURED[(kind, mode, fit, check)]
    print(f"{kind} {mode}: calibrated on b{fit}, predicted b{check}: error {error:+.1%} (README {measured:+.1%})")
    assert abs(error) <= abs(measured) + MARGIN, f"{error:+.1%}, the README says {measured:+.1%}: remeasure"
    assert error == pytest.approx(measured, abs=MARGIN)
    notes = [n for n in doc["notes"] if FEW_REQUESTS_NOTE in n]
    assert bool(notes) == (fit < 16 and check > 4 * fit)  # from batch 1 to 16 and 64 it says it cannot know
    assert any("launch-bound capture" in n for n in doc["notes"]) or kind == "dense" and mode == "graphs"


def test_the_within_10_percent_claim(captures: dict[str, Any]) -> None:
    """Issue 14 asked for within 10% on dense and MoE: what holds, as the README says. Dense graphs: every pair
    within 10%; MoE graphs: between 16 and 64 within 1%, the pairs with batch 1 at 11-26% (batch 1 routes
    8 experts' weights, the step's host share differs), each of the far ones flagged in plan's notes."""
    dense = [abs(_plan(captures, "dense", "graphs", f, c)[1]) for f in BATCHES for c in BATCHES if f != c]
    assert max(dense) <= 0.10 + 0.005
    assert abs(_plan(captures, "moe", "graphs", 16, 64)[1]) < 0.01
    assert abs(_plan(captures, "moe", "graphs", 64, 16)[1]) < 0.01
    doc, _ = _plan(captures, "moe", "graphs", 16, 64)
    assert any("hbm_efficiency above 1" in n for n in doc["notes"])  # the same-experts batch, said
