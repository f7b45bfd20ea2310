"""plan --calibrate with the server's own step timed at other batches (`servescope profile --unprofiled-batches`).

Under async scheduling a step is the longer of the host's cycle and the device's work, and the cycle moves with the
batch: one capture cannot tell it at another batch (on the lent H100's sweep, calibrated at 16 and predicting 1,
+73% for the MoE server). The steps timed beside the capture give it: the plan holds them as the floor at each
batch, linear between. Truth by another route: each batch's own capture of the same server (``h100-vllm/sweep``),
its five unprofiled runs in provenance.json by plain json; the timed batches are taken from the sibling captures'
runs with the checked batch left out, so every prediction is of a batch the calibration never saw.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import msgspec
import pytest

from servescope.core.analysis import BatchStep, decode_analysis
from servescope.plan.captured import production_host
from servescope.plan.factors import default_factors
from servescope.plan.host_cycle import host_steps
from tracefiles import ROOT, benchmark

bench = benchmark("plan_calibrate_pairs")
(DENSE, MOE), BATCHES = bench.SWEEPS["h100/sweep"]


def _median_run_ms(folder: str) -> float:
    prov = json.loads((bench.DATA / folder / "provenance.json").read_text(encoding="utf-8"))
    return statistics.median_low(float(r["itl_ms"]) for r in prov["unprofiled_runs"])


def test_the_floor_is_linear_between_the_timed_batches_and_the_nearest_beyond() -> None:
    base = default_factors()


    timed = dataclasses.replace(base, host_step_us=999.0, host_steps=((1, 2000.0), (4, 2600.0), (16, 3800.0)))
    assert timed.host_floor_us(1) == 2000.0 and timed.host_floor_us(4) == 2600.0
    assert timed.host_floor_us(2) == pytest.approx(2000.0 + 600.0 / 3)
    assert timed.host_floor_us(10) == pytest.approx(2600.0 + 1200.0 / 2)
    assert timed.host_floor_us(64) == 3800.0  # not extrapolated
    assert dataclasses.replace(base, host_step_us=999.0).host_floor_us(64) == 999.0
    table = timed.table()
    assert [k for k in table if k.startswith("host_step_us_b")] == ["host_step_us_b1", "host_step_us_b4",
                                                                    "host_step_us_b16"]
    assert "host_steps" not in table and "host_step_us_b1" not in base.table()


@pytest.mark.parametrize("stem", [DENSE, MOE], ids=["dense", "moe"])
def test_timed_batches_predict_a_batch_between_them_within_10pct(stem: str, tmp_path: Path) -> None:
    """Calibrated at every batch of the sweep, the timed batches all the others but the checked one: each checked
    batch between two timed ones lands within 10% of its own median run (measured: dense −5..+2%, MoE −9..+6%);
    without the timed batches the same predictions were off by up to 73%."""
    worst_timed = worst_alone = 0.0
    for fit in BATCHES:
        for check in BATCHES[1:-1]:
            if check == fit:
                continue
            truth = _median_run_ms(f"{stem}-b{check}")
            doc = bench.ladder_doc(stem, fit, tuple(b for b in BATCHES if b != check), tmp_path)
            timed = bench.predict(f"{stem}-b{fit}", f"{stem}-b{check}", tmp_path, document=doc)
            alone = bench.predict(f"{stem}-b{fit}", f"{stem}-b{check}", tmp_path, production=True)
            error = timed.layouts[0].points[0].step_ms / truth - 1
            assert abs(error) <= 0.10, (fit, check, f"{error:+.1%}")
            worst_timed = max(worst_timed, abs(error))
            worst_alone = max(worst_alone, abs(alone.layouts[0].points[0].step_ms / truth - 1))
    assert worst_alone > 0.10 and worst_alone > 2 * worst_timed


def test_the_plan_sets_its_steps_beside_the_servers_own_at_the_timed_batches(tmp_path: Path) -> None:
    """The notes name the floor taken and, per timed batch, the plan's step against the server's (its runs' median
    and range, from provenance.json by plain json); the factors table shows each batch's floor as calibrated."""
    timed = (1, 4, 32)
    doc = bench.ladder_doc(DENSE, 16, timed, tmp_path)
    plan = bench.predict(f"{DENSE}-b16", f"{DENSE}-b16", tmp_path, document=doc)
    notes = plan.calibration.notes
    assert any(n.startswith("host's cycle across batches:") for n in notes)
    check = next(n for n in plan.notes if n.startswith("checked against this server's own steps"))
    assert "the model's device work at each" in check  # async: the floor is the server's step; the device beside it
    for b in timed:
        prov = json.loads((bench.DATA / f"{DENSE}-b{b}" / "provenance.json").read_text(encoding="utf-8"))
        runs = sorted(float(r["itl_ms"]) for r in prov["unprofiled_runs"])
        assert f"{b} → device " in check and f"server {statistics.median_low(runs):.2f} ms" in check
        assert f"runs {runs[0]:.2f}–{runs[-1]:.2f}" in check
        assert plan.factors[f"host_step_us_b{b}"].origin == "calibrated"
        assert plan.factors[f"host_step_us_b{b}"].value == pytest.approx(statistics.median_low(runs) * 1000, abs=0.1)
    assert plan.factors["host_step_us_b16"].value == pytest.approx(_median_run_ms(f"{DENSE}-b16") * 1000, abs=0.1)


def test_serial_scheduling_keeps_its_fixed_host_time_and_only_checks_the_timed_batches() -> None:
    """Without async scheduling the host's time adds to the device's at every batch (measured flat across batches on
    both cards): the timed batches set no floor; they are only the check."""
    path = ROOT / "src" / "servescope" / "data" / "examples" / "h200-vllm-moe-b16" / "profile.json"
    doc = decode_analysis(path.read_bytes(), str(path))
    assert doc.unprofiled is not None
    reference = msgspec.structs.replace(doc.unprofiled, other_batches=(BatchStep(batch=1, step_us=2500.0),))
    phase = doc.ranks[0].phases["decode"]
    overlapped = production_host(msgspec.structs.replace(doc, unprofiled=reference), phase, host_bound=False,
                                 device=True)
    assert host_steps(overlapped, 16) == ((1, 2500.0), (16, doc.unprofiled.step_us))
    serial = production_host(msgspec.structs.replace(doc, unprofiled=reference, deployment={}), phase,
                             host_bound=False, device=True)
    assert serial is not None and not serial.overlapped and host_steps(serial, 16) == ()
    assert host_steps(production_host(doc, phase, host_bound=False, device=True), 16) == ()  # none timed


def _prov(folder: str) -> dict:
    return json.loads((bench.DATA / folder / "provenance.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("kind", "flavour"), bench.CLEAN_KINDS, ids=lambda x: str(x))
def test_clean_pairs_within_10pct_with_the_timed_batches(kind: str, flavour: str) -> None:
    """Issue 24's pairs on new captures (a lent H100: dense and MoE, bf16 and fp8, async scheduling on and off,
    distinct prompts), each calibrated on its server's first capture (the only one a profile has not slowed) and
    checked against the first capture of another server of the same flags: with the batches it timed, within 10%
    both ways (measured −4.5 .. +3.5%). From the capture alone, a MoE server with async scheduling at 16 requests
    runs its device longer than its host, so the host's cycle at 1 request is hidden (+120% / +208%); the plan then
    takes the longer, as its notes say. Truth: the other capture's five runs' median, from provenance.json."""
    rows = [r for r in _clean_rows() if (r["kind"], r["flavour"]) == (kind, flavour)]
    assert {r["direction"] for r in rows} == {"16→1", "1→16"}
    for r in rows:
        fit_set, fit, check_set, check = bench.CLEAN[r["direction"]]
        runs = [float(x["itl_ms"]) for x in _prov(f"{bench.H100}/steady/{check_set}/{kind}-{flavour}-b{check}")
                ["unprofiled_runs"]]
        assert len(runs) == 5 and r["truth"] == pytest.approx(statistics.median(runs))
        assert abs(r["timed_error"]) <= 0.10, (r["direction"], f"{r['timed_error']:+.1%}")
        if flavour.endswith("async") and not flavour.endswith("noasync") and kind == "moe" and check == 1:
            assert r["alone_error"] > 1.0  # the device-bound capture hides the host's cycle
        else:
            assert abs(r["alone_error"]) <= 0.11, (r["direction"], f"{r['alone_error']:+.1%}")


_CLEAN: list[dict] = []


def _clean_rows() -> list[dict]:
    if not _CLEAN:
        _CLEAN.extend(bench.clean_pairs())
    return _CLEAN


@pytest.mark.parametrize(("kind", "flavour"), [("moe", "async"), ("moe", "noasync"), ("moe", "fp8-async"),
                                               ("moe", "fp8-noasync"), ("dense", "noasync"),
                                               ("dense", "fp8-noasync")], ids=str)
def test_a_server_stays_slower_after_its_first_profile(kind: str, flavour: str) -> None:
    """``steady/w6``: each server's first capture (1 request) timed the batch five times before its profiled window
    and three times after (`profile --after-runs`). Where the host's time shows in the step (no async scheduling, or
    MoE at 1 request, whose device work is short), every run after is slower than every run before, and the next
    capture on the same server, a minute later, still times that batch as slow: the profile's effect lasts. From
    provenance.json by plain json."""
    first = _prov(f"{bench.H100}/steady/w6/{kind}-{flavour}-b1")
    before = [float(r["itl_ms"]) for r in first["unprofiled_runs"]]
    after = [float(r["itl_ms"]) for r in first["after_profile_runs"]]
    assert len(before) == 5 and len(after) == 3 and min(after) > max(before)
    later = _prov(f"{bench.H100}/steady/w6/{kind}-{flavour}-b16")
    again = next(float(t["itl_ms"]) for t in later["unprofiled_batches"] if t["batch"] == 1)
    assert again > max(before) and again == pytest.approx(statistics.median(after), rel=0.10)
    from servescope.server.timing import ServerTiming, after_profile_note

    def timing(ms: float) -> ServerTiming:
        return ServerTiming(itl_ms=ms, tpot_ms=ms, itl_metric="m", tpot_metric="t", seconds=1.0)

    note = after_profile_note([timing(x) for x in before], [timing(x) for x in after])
    assert note is not None and ("restart it" in note) == (statistics.median(after) > 1.05 * statistics.median(before))


@pytest.mark.parametrize("flavour", ["async", "fp8-async"])
def test_a_device_bound_step_hides_what_the_profile_left(flavour: str) -> None:
    """The dense server with async scheduling runs its device longer than its host at 1 request: the runs after the
    window lie within 3% of those before."""
    first = _prov(f"{bench.H100}/steady/w6/dense-{flavour}-b1")
    before = statistics.median(float(r["itl_ms"]) for r in first["unprofiled_runs"])
    after = statistics.median(float(r["itl_ms"]) for r in first["after_profile_runs"])
    assert after == pytest.approx(before, rel=0.03)


def test_a_timed_step_faster_than_the_weights_allow_is_refused(tmp_path: Path) -> None:
    """A timed step shorter than one read of the weights at the datasheet rate cannot be this model on this card:
    one line naming the capture and both numbers, exit 2."""
    import subprocess
    import sys

    doc = json.loads(bench.ladder_doc(DENSE, 16, (1, 4), tmp_path).read_text(encoding="utf-8"))
    doc["unprofiled"]["other_batches"][0]["step_us"] = 50.0  # 7.5 GB of bf16 weights read in 50 µs: impossible
    bad = tmp_path / "impossible.profile.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    config = bench.config(f"{DENSE}-b16", tmp_path)
    result = subprocess.run([sys.executable, "-m", "servescope", "plan", "--model", str(config), "--hardware",
                             "h100-sxm", "--gpus", "1", "--batch", "1,16", "--calibrate", str(bad)],
                            capture_output=True, text=True, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert str(bad) in lines[0] and "50 µs" in lines[0] and "at batch 1 " in lines[0]


def test_which_part_sets_the_step_at_each_timed_batch_and_serial_steps_become_the_servers(tmp_path: Path) -> None:
    """The MoE server with async scheduling (``w5``, its first capture at 16): at 1 and 2 requests the server's step
    lies above the model's device work, the host's cycle; at 32 the device's. Without async scheduling the note
    compares the model's whole step, and the plan's step at a timed batch is then the server's (truth: the timed
    median from provenance.json)."""
    folder = f"{bench.H100}/steady/w5/moe-async-b16"
    doc = bench.own_timed_doc(folder, (1, 2, 32), tmp_path)
    plan = bench.predict(folder, folder, tmp_path, document=doc)
    check = next(n for n in plan.notes if n.startswith("checked against this server's own steps"))
    cells = dict(cell.split(" → ", 1) for cell in check.split(": ", 1)[1].split("; "))
    assert cells["1"].endswith("the host's cycle sets it") and cells["2"].endswith("the host's cycle sets it")
    assert cells["32"].endswith("the device's work sets it")
    serial = f"{bench.H100}/steady/w5/moe-noasync-b16"
    timed = bench.timed_steps(serial)
    at_one = bench.predict_at(serial, bench.own_timed_doc(serial, (1, 4), tmp_path), 1, tmp_path)
    assert at_one == pytest.approx(timed[1], rel=1e-3)
    alone = bench.predict_at(serial, bench.own_timed_doc(serial, (), tmp_path), 1, tmp_path)
    assert abs(alone / timed[1] - 1) > 0.02  # the model alone was off; the timed step replaced it
