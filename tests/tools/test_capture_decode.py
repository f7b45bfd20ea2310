"""src/servescope/bench/capture_decode.py's torch-free helpers: step names servescope parses, file names, truth totals.

The script imports torch and transformers only inside functions, so it loads here without them; the
capture itself needs torch and is exercised by hand (tools/README.md), not in CI.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from servescope.trace.steps.find import parse_vllm_step
from servescope.trace.steps.ranks import rank_from_name

SCRIPT = Path(__file__).resolve().parents[2] / "src" / "servescope" / "bench" / "capture_decode.py"


@pytest.fixture(scope="module")
def tool() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("capture_decode", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_loads_without_torch(tool: ModuleType) -> None:
    assert "torch" not in vars(tool) and "transformers" not in vars(tool)


def test_step_names_are_vllms_and_servescope_reads_them(tool: ModuleType) -> None:
    assert tool.prefill_step_name(16, 128) == "execute_context_16(2048)_generation_0(0)"
    assert tool.decode_step_name(16) == "execute_context_0(0)_generation_16(16)"
    assert parse_vllm_step(tool.prefill_step_name(2, 16)) == ("prefill", 2, 32, 0, 0)
    assert parse_vllm_step(tool.decode_step_name(64)) == ("decode", 0, 0, 64, 64)


def test_file_names_give_rank_zero(tool: ModuleType) -> None:
    assert tool.capture_stem("moe", 64, True) == "moe_b64_graphs_rank0"
    assert tool.capture_stem("dense", 1, False) == "dense_b1_rank0"
    assert rank_from_name(tool.capture_stem("dense", 16, True) + tool.TRACE_SUFFIX) == 0


def test_totals_by_name(tool: ModuleType) -> None:
    rows = [("gemm", "kernel", 2.0), ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 0.5), ("gemm", "kernel", 3.25)]
    totals = tool.totals_by_name(rows)
    assert list(totals) == ["gemm", "Memcpy DtoD (Device -> Device)"]  # largest total first
    assert totals["gemm"] == {"kind": "kernel", "count": 2, "total_us": 5.25}


def test_cpu_self_times_subtract_direct_children_per_thread(tool: ModuleType) -> None:
    ops = [("linear", 1, 0.0, 10.0), ("mm", 1, 1.0, 6.0), ("empty", 1, 2.0, 1.0), ("other_thread", 2, 1.0, 4.0)]
    assert tool.cpu_self_times(ops) == [("linear", 4.0), ("mm", 5.0), ("empty", 1.0), ("other_thread", 4.0)]


def test_truth_file_round_trip(tool: ModuleType, tmp_path: Path) -> None:
    kernels = tool.totals_by_name([("k1", "kernel", 1.5), ("k2", "kernel", 2.5), ("k1", "kernel", 1.0)])
    truth = tool.build_truth(work="device", kernels=kernels, batch=4, input_tokens=8, decode_steps=3,
                             cuda_graphs=True, model={"dtype": object()}, wall_ms=[2.0, 1.0, 3.0],
                             device="test")
    path = tmp_path / "moe_b4_graphs_rank0.truth.json"
    tool.write_truth(path, truth)
    back = json.loads(path.read_text())
    assert back["kernels"]["k1"] == {"kind": "kernel", "count": 2, "total_us": 2.5}
    assert back["device_total_us"] == 5.0 and back["event_count"] == 3
    assert back["steps"] == {"prefill": 1, "decode": 3}
    assert back["step_names"]["decode"] == "execute_context_0(0)_generation_4(4)"
    assert back["wall_ms_per_decode_step"] == 2.0 and back["cuda_graphs"] is True and back["device"] == "test"
    assert isinstance(back["model"]["dtype"], str)  # values JSON cannot hold are written as strings
