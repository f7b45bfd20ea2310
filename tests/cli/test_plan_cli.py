"""``servescope plan`` through the CLI: tables, --json, -o and --html files, one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app

runner = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "data"
BASE = ["plan", "--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8"]


def test_table_names_every_layout_and_the_choice() -> None:
    result = runner.invoke(app, [*BASE, "--batch", "1,64"])
    assert result.exit_code == 0, result.output
    for name in ("TP=8", "TP=8 EP=8", "DP=8 EP=8", "PP=8", "TP=4 PP=2"):
        assert name in result.stdout
    assert "recommended: " in result.stdout and "memory per GPU" in result.stdout


def test_json_output_file_and_html(tmp_path: Path) -> None:
    out, page = tmp_path / "plan.json", tmp_path / "plan.html"
    result = runner.invoke(app, [*BASE, "--batch", "1,8", "--context", "1024", "--json", "-o", str(out),
                                 "--html", str(page)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == doc
    assert [p["batch"] for p in doc["layouts"][0]["points"]] == [1, 8] and doc["context"] == 1024
    html = page.read_text(encoding="utf-8")
    assert 'id="chart-plan-steps"' in html and "plotly" in html.lower()
    for layout in doc["layouts"]:
        assert f'"name":"{layout["name"]}"' in html  # a trace of the chart per layout
    assert "<script src=" not in html  # self-contained: plotly.js inlined
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_comm_file_and_calibrate_are_recorded(tmp_path: Path) -> None:
    comm = DATA / "comm" / "h200_ws1_nccl.json"
    capture = DATA / "vllm-cpu-profile" / "tp1_b1.analysis.json"
    config = DATA / "vllm-cpu-profile" / "tiny-llama.config.json"
    result = runner.invoke(app, ["plan", "--model", str(config), "--hardware", "h200", "--gpus", "1", "--batch", "1",
                                 "--comm", str(comm), "--calibrate", str(capture), "--json", "--force"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"]["comm"]["path"] == str(comm) and doc["calibration"]["path"] == str(capture)
    assert [line.split(" differs")[0] for line in doc["forced"]] == [f"forced: --calibrate {capture}"]
    assert doc["curves"][0]["origin"] == "measured curve" and doc["curves"][0]["world_size"] == 1


@pytest.mark.parametrize(("batches", "expected"), [
    (["--batch", "1", "--batch", "64", "--batch", "1024"], [1, 64, 1024]),   # each one kept, not only the last
    (["--batch", "1,8", "--batch", "64"], [1, 8, 64]),
    (["--batch", "64,1", "--batch", "1"], [1, 64]),                          # sorted and distinct, as one list
    ([], [1, 8, 32, 128]),
])
def test_batch_is_repeatable_and_comma_separated(batches: list[str], expected: list[int]) -> None:
    result = runner.invoke(app, [*BASE, *batches, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [p["batch"] for p in doc["layouts"][0]["points"]] == expected


@pytest.mark.parametrize(("args", "words"), [
    (["--model", "no-such-model", "--hardware", "h200", "--gpus", "8"], ["no-such-model", "presets"]),
    (["--model", "kimi-k2.5", "--hardware", "no-such-gpu", "--gpus", "8"], ["no-such-gpu", "profiles"]),
    (["--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8", "--batch", "1,x"], ["--batch"]),
    (["--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "0"], ["--gpus"]),
    (["--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8", "--comm", "/no/such.json"], ["/no/such.json"]),
    (["--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8", "--calibrate", "/no/a.json"], ["/no/a.json"]),
])
def test_bad_input_is_one_line_exit_2(args: list[str], words: list[str]) -> None:
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope: error: "), result.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in result.output and result.stdout == ""


def test_bad_calibration_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "capture.json"
    bad.write_text("[1, 2", encoding="utf-8")
    result = runner.invoke(app, [*BASE, "--calibrate", str(bad)])
    assert result.exit_code == 2 and str(bad) in result.stderr and len(result.stderr.splitlines()) == 1


def test_real_subprocess() -> None:
    proc = subprocess.run([sys.executable, "-m", "servescope", *BASE, "--batch", "1", "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)["recommendation"]
    # a layout where its lead exceeds the bands; else none, and the measurement that settles it (issue 38): TP=8 leads
    # TP=4 PP=2 by 0.33 ms at batch 1 on 8 H200, and its 8-GPU custom all-reduce is an assumed figure
    assert rec["layout"] is not None or (rec["decided"] is False and rec["leading"]
                                         and rec["measure"]["command"].startswith("servescope bench comm"))


def test_report_re_renders_a_saved_plan_without_recomputing(tmp_path: Path) -> None:
    saved, page = tmp_path / "plan.json", tmp_path / "plan.html"
    first = runner.invoke(app, [*BASE, "--batch", "1,8", "-o", str(saved)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["report", str(saved)])
    assert again.exit_code == 0, again.output
    assert again.stdout == first.stdout  # the same view, from the document alone
    wrote = runner.invoke(app, ["report", str(saved), "--html", str(page)])
    assert wrote.exit_code == 0 and wrote.stdout.splitlines() == [f"wrote {page} (HTML of {saved})"]
    assert 'id="chart-plan-steps"' in page.read_text(encoding="utf-8")
    cannot = runner.invoke(app, ["report", str(saved), "--html", str(saved / "under-a-file.html")])
    assert cannot.exit_code == 2 and len(cannot.stderr.strip().splitlines()) == 1
    assert f"--html {saved / 'under-a-file.html'}: {saved} is not a folder" in cannot.stderr


# --- provenance (issue 15 item 4): the bad cases of the issue, on the repo's real files ---------------------

CPU = DATA / "vllm-cpu-profile"
GLOO = DATA / "comm" / "cpu_ws2_gloo.json"  # bench comm --backend gloo on this CPU VM: device "cpu (gloo)"


def test_cpu_capture_for_kimi_on_rtx_pro_6000_is_refused_and_force_does_not_pass_physics() -> None:
    args = ["plan", "--model", "kimi-k2.5", "--hardware", "rtx-pro-6000", "--gpus", "8", "--batch", "1,8",
            "--calibrate", str(CPU / "tp1_b4.analysis.json")]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    lines = [ln for ln in refused.output.splitlines() if ln.strip()]
    assert len(lines) == 1, refused.output
    assert str(CPU / "tp1_b4.analysis.json") in lines[0] and "work kind: CPU operators" in lines[0]
    assert ("model: captured serving tiny-llama (the document's profile section), the plan is for kimi-k2.5"
            in lines[0] and "--force" in lines[0])
    assert "TP: the capture ran TP=1 on 1 GPU, the plan is for 8" in lines[0]
    # --force takes the provenance, not the physics: a 1.4 ms step cannot hold Kimi's weights read once
    forced = runner.invoke(app, [*args, "--force"])
    assert forced.exit_code == 2
    line = forced.output.strip()
    assert "\n" not in line and "is shorter than reading its weights once at the datasheet rate" in line


def test_cpu_capture_forced_onto_a_gpu_plan_is_named() -> None:
    args = ["plan", "--model", str(CPU / "tiny-llama.config.json"), "--hardware", "rtx-pro-6000", "--gpus", "1",
            "--batch", "1,8", "--context", "48", "--calibrate", str(CPU / "tp1_b4.analysis.json")]
    assert runner.invoke(app, args).exit_code == 2
    forced = runner.invoke(app, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert forced.stdout.startswith("FORCED --calibrate ") and "work kind" in forced.stdout.splitlines()[0]
    doc = json.loads(runner.invoke(app, [*args, "--force", "--json"]).stdout)
    assert doc["notes"][0] == doc["forced"][0] and "work kind: CPU operators" in doc["forced"][0]


def test_gloo_curve_from_this_cpu_for_an_h200_plan_is_refused_then_forced_and_named() -> None:
    args = [*BASE, "--batch", "1,8", "--comm", str(GLOO)]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    line = refused.output.strip()
    assert "\n" not in line and line.count(str(GLOO)) == 1
    assert "device: measured on cpu (gloo)" in line and "backend: gloo" in line
    doc = json.loads(runner.invoke(app, [*args, "--force", "--json"]).stdout)
    assert doc["notes"] != [] and doc["notes"][0] == doc["forced"][0]
    assert "backend: gloo" in doc["forced"][0] and str(GLOO) in doc["forced"][0]


def test_matching_curve_is_not_flagged() -> None:
    result = runner.invoke(app, [*BASE, "--batch", "1", "--comm", str(DATA / "comm" / "h200_ws1_nccl.json"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["forced"] == []
