"""The CLI end to end: the README's commands, --json keys, saved analyses re-rendered, a real subprocess."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope import __version__
from servescope.cli import app
from tracefiles import TRACES, load_events

runner = CliRunner()
REQUIRED_KEYS = {"servescope_version", "traces", "ranks", "kernels", "device_totals", "findings"}


def _tp2(tmp_path: Path) -> Path:
    for f in (TRACES / "vllm-cpu").glob("tp2_*"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"servescope {__version__}"


def _profiler_table(text: str) -> tuple[list[tuple[str, float, int]], float]:
    """vLLM's ``profiler_out_0.txt`` (torch's key_averages table): the device rows (name cut at 55 characters,
    self CUDA µs, calls) and the ``Self CUDA time total`` line, in µs."""
    units = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}

    def us(cell: str) -> float:
        m = re.fullmatch(r"(-?[0-9.]+)(s|ms|us|ns)", cell)
        assert m, cell
        return float(m[1]) * units[m[2]]

    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    width = len(lines[rule].split("  ")[0])
    header = re.split(r"\s{2,}", lines[rule + 1][width:].strip())
    cpu, cuda, calls = header.index("Self CPU"), header.index("Self CUDA"), header.index("# of Calls")
    rows = []
    for line in lines[rule + 3:]:
        if line.startswith("---"):
            break
        cells = line[width:].split()
        if us(cells[cpu]) == 0 and us(cells[cuda]) > 0 and not line[:width].strip().startswith("execute_"):
            rows.append((line[:width].strip(), us(cells[cuda]), int(cells[calls])))
    total = re.search(r"^Self CUDA time total: (\S+)$", text, re.M)
    assert total
    return rows, us(total[1])


def test_default_example_is_a_real_vllm_capture_and_matches_vllms_profiler_table() -> None:
    """`analyze --example` (the README's first command): a real vLLM 0.26 capture from an H200, checked against
    the table vLLM's worker printed from the live profiler (profiler_out_0.txt): every device row's calls exact
    and time within 0.5%, the Self CUDA total, 8 decode steps at batch 16."""
    from servescope.trace.analyze import example_trace_dir

    result = runner.invoke(app, ["analyze", "--example", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows, total_us = _profiler_table((example_trace_dir() / "profiler_out_0.txt").read_text())
    assert len(rows) >= 30
    ours: dict[str, list[tuple[int, float]]] = {}  # by the table's cut name; servescope splits rows by launch
    by_name: dict[str, tuple[int, float]] = {}
    for row in doc["kernels"]:
        count, total = by_name.get(row["name"], (0, 0.0))
        by_name[row["name"]] = (count + row["count"], total + row["total_us"])
    for name, (count, total) in by_name.items():
        ours.setdefault(name if len(name) <= 55 else name[:52] + "...", []).append((count, total))
    for name, cuda_us, calls in rows:
        hit = [c for c in ours.get(name, []) if c[0] == calls and c[1] == pytest.approx(cuda_us, rel=0.005, abs=0.002)]
        assert hit, f"{name}: vLLM's table {calls} calls {cuda_us:.3f} µs; servescope {ours.get(name)}"
        ours[name].remove(hit[0])
    assert sum(r["total_us"] for r in doc["kernels"]) == pytest.approx(total_us, rel=0.005)
    assert [t["role"] for t in doc["traces"]] == ["worker"]  # the front end left out for size (README)
    [rank] = doc["ranks"]
    assert set(rank["phases"]) == {"decode"}
    assert rank["phases"]["decode"]["steps"] == 8
    assert rank["phases"]["decode"]["tokens_per_step"] == 16
    assert {"attention", "gemm", "moe", "norm"} <= set(rank["phases"]["decode"]["categories"])
    table = runner.invoke(app, ["analyze", "--example"])
    assert table.exit_code == 0 and "rank 0 · decode" in table.stdout
    assert "fused_moe_kernel" in table.stdout


def test_the_skeleton_h200_example_still_matches_its_truth() -> None:
    """`--example-name h200-moe-b16-graphs` (the project's own capture decode): its truth.json, as before."""
    from servescope.trace.analyze import example_trace_dir

    result = runner.invoke(app, ["analyze", "--example-name", "h200-moe-b16-graphs", "--json"])
    assert result.exit_code == 0, result.output
    truth = json.loads((example_trace_dir("h200-moe-b16-graphs") / "truth.json").read_text())
    got: dict[str, tuple[int, float]] = {}
    for row in json.loads(result.stdout)["kernels"]:
        count, total = got.get(row["name"], (0, 0.0))
        got[row["name"]] = (count + row["count"], total + row["total_us"])
    assert set(got) == set(truth["kernels"])
    for name, expected in truth["kernels"].items():
        assert got[name][0] == expected["count"], name
        assert got[name][1] == pytest.approx(expected["total_us"], rel=0.005, abs=0.01), name


def test_example_name_picks_the_tp2_capture_and_names_its_ranks() -> None:
    result = runner.invoke(app, ["analyze", "--example-name", "vllm-cpu-tp2"])
    assert result.exit_code == 0, result.output
    assert "rank 0 · decode" in result.stdout
    assert "rank 1 · decode" in result.stdout
    assert "frontend" in result.stdout
    wrong = runner.invoke(app, ["analyze", "--example-name", "nope"])
    assert wrong.exit_code == 2
    assert wrong.stderr.strip() == ("servescope: error: --example-name: no bundled example 'nope' "
                                    "(there are: h200-vllm-moe-b16, vllm-cpu-tp2, h200-moe-b16-graphs)")


def test_example_json_matches_its_own_traces() -> None:
    result = runner.invoke(app, ["analyze", "--example-name", "vllm-cpu-tp2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert REQUIRED_KEYS <= set(doc)
    from servescope.trace.analyze import example_trace_dir

    for rank in (0, 1):
        events = load_events(example_trace_dir("vllm-cpu-tp2") / f"rank{rank}.pt.trace.json.gz")
        shm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "_C::shm_allreduce"]
        rows = [k for k in doc["kernels"] if k["rank"] == rank and k["name"] == "_C::shm_allreduce"]
        assert rows[0]["count"] == len(shm) > 0
        assert rows[0]["category"] == "comm.all_reduce"
        ranks = {r["rank"]: r for r in doc["ranks"]}
        assert ranks[rank]["phases"]["decode"]["categories"]["comm.all_reduce"]["total_us"] > 0


@pytest.mark.needs_shared
def test_json_keys_and_roles(tmp_path: Path) -> None:
    result = runner.invoke(app, ["analyze", str(_tp2(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert REQUIRED_KEYS <= set(doc)
    roles = sorted((t["role"], t["rank"]) for t in doc["traces"])
    assert roles == [("frontend", None), ("worker", 0), ("worker", 1)]
    decode = doc["ranks"][0]["phases"]["decode"]
    assert {"steps", "step_us", "busy_us_per_step", "idle_us_per_step", "categories"} <= set(decode)
    assert {"mean", "median"} == set(decode["step_us"])
    for cat in decode["categories"].values():
        assert {"total_us", "share", "per_step_us", "calls_per_step", "mean_call_us"} <= set(cat)
    for finding in doc["findings"]:
        assert {"id", "severity", "message", "evidence"} <= set(finding)


@pytest.mark.needs_shared
def test_saved_analysis_renders_again_without_traces(tmp_path: Path) -> None:
    saved = tmp_path / "a.json"
    traces = tmp_path / "traces"
    traces.mkdir()
    first = runner.invoke(app, ["analyze", str(_tp2(traces)), "-o", str(saved)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["report", str(saved)])
    assert again.exit_code == 0, again.output
    assert again.stdout == first.stdout
    page = runner.invoke(app, ["report", str(saved), "--html", str(tmp_path / "r.html")])
    assert page.exit_code == 0 and page.stdout == f"wrote {tmp_path / 'r.html'} (HTML of {saved})\n"
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_real_subprocess_example_json() -> None:
    proc = subprocess.run([sys.executable, "-m", "servescope", "analyze", "--example", "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["servescope_version"] == __version__


def test_console_script_is_installed() -> None:
    exe = shutil.which("servescope", path=str(Path(sys.executable).parent))
    assert exe is not None
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("servescope ")


def test_capture_decode_without_torch_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    result = runner.invoke(app, ["capture", "decode", "--out", "x"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[0].startswith("servescope: error: capture decode: needs torch")
    assert "servescope[capture]" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_gpu_list_without_a_gpu_is_one_line() -> None:
    result = runner.invoke(app, ["gpu", "list"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope: error: no GPU query works here")


def test_health_on_a_dead_port_is_one_line() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = runner.invoke(app, ["health", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1  # unreachable is a finding (exit 1), not bad input (2)
    assert f"http://127.0.0.1:{port}" in result.output and "refused" in result.output
    assert "Traceback" not in result.output


def test_bench_gemm_cli_writes_a_result(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    result = runner.invoke(app, ["bench", "gemm", "--model", "llama-3-70b", "--tp", "8", "--batch", "1",
                                 "--iters", "2", "--device", "cpu", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    timings = doc["timings"]
    assert {(t["m"], t["k"]) for t in timings} >= {(1, 8192)}
    for t in timings:
        assert t["tflops"] == pytest.approx(2 * t["m"] * t["n"] * t["k"] / t["median_s"] / 1e12, rel=1e-6)
