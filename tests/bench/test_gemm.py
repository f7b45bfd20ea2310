"""bench.gemm on the CPU with real torch, the recorded H200 run, and tools/bench_gemm_device.py end to end.

Rates are recomputed from the raw per-sample times the document keeps (statistics.median, 2·M·N·K, bytes of
A, W and C by hand), never copied from an earlier run.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servescope.bench.gemm import list_hardware_profiles, load_datasheet, run_gemm_bench
from servescope.core.errors import InputError
from servescope.core.gemm import GemmBenchDoc, gemm_doc_to_json, load_gemm_doc
from servescope.plan.model import ModelArch, gemm_shapes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "bench_gemm_device.py"
RECORDED_H200 = ROOT / "tests" / "data" / "h200" / "gemm_bench.json"  # tools/bench_gemm_device.py on an H200
TINY = ModelArch(name="tiny", source="test", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                 intermediate=128, vocab=256, experts=8, top_k=2, moe_intermediate=32, first_dense_layers=1)
# Modules the GPU machine lacks: plan.model, core.gemm and bench.gemm must import without them.
NOT_ON_GPU_BOX = ("msgspec", "numpy", "pydantic", "typer", "rich", "plotly", "deflate")


@pytest.fixture(scope="module")
def cpu_doc() -> GemmBenchDoc:
    shapes = gemm_shapes(TINY, tp=1, batch=2) + gemm_shapes(TINY, tp=2, batch=2)
    return run_gemm_bench(shapes, device="cpu", iters=5, warmup=1, hardware="h200", cold_bytes=1 << 16,
                          copy_bytes=1 << 20, matmul_size=64)


def check_rates(doc: GemmBenchDoc) -> None:
    elem = {"bfloat16": 2, "float16": 2, "float32": 4}[doc.options.dtype]
    assert len(doc.copy_ceiling.times_s) == len(doc.matmul_ceiling.times_s) == doc.options.iters
    copy_median = statistics.median(doc.copy_ceiling.times_s)
    assert doc.copy_ceiling.gbps == pytest.approx(2 * doc.copy_ceiling.bytes_copied / copy_median / 1e9)
    assert len(doc.notes) == (max(t.tflops for t in doc.timings) > doc.matmul_ceiling.tflops) + (
        max(t.gbps for t in doc.timings) > doc.copy_ceiling.gbps)
    size = doc.matmul_ceiling.size
    matmul_median = statistics.median(doc.matmul_ceiling.times_s)
    assert doc.matmul_ceiling.tflops == pytest.approx(2 * size**3 / matmul_median / 1e12)
    for t in doc.timings:
        assert len(t.times_s) == doc.options.iters
        median = statistics.median(t.times_s)
        assert t.median_s == median
        assert t.tflops == pytest.approx(2 * t.m * t.n * t.k / median / 1e12)
        assert t.bytes_moved == (t.m * t.k + t.n * t.k + t.m * t.n) * elem
        assert t.gbps == pytest.approx(t.bytes_moved / median / 1e9)
        beaten_mm = max(x.tflops for x in doc.timings) > doc.matmul_ceiling.tflops
        beaten_copy = max(x.gbps for x in doc.timings) > doc.copy_ceiling.gbps
        assert t.frac_ceiling_tflops == (None if beaten_mm else pytest.approx(t.tflops / doc.matmul_ceiling.tflops))
        assert t.frac_ceiling_gbps == (None if beaten_copy else pytest.approx(t.gbps / doc.copy_ceiling.gbps))
        if doc.datasheet is not None:
            assert t.frac_datasheet_gbps == pytest.approx(t.gbps / doc.datasheet.hbm_gbps)
            assert doc.datasheet.dense_tflops is not None
            assert t.frac_datasheet_tflops == pytest.approx(t.tflops / doc.datasheet.dense_tflops)


def test_cpu_run_rates_follow_from_the_raw_times(cpu_doc: GemmBenchDoc) -> None:
    check_rates(cpu_doc)
    assert cpu_doc.options.device == "cpu"
    assert cpu_doc.copy_ceiling.bytes_copied == 1 << 20 and cpu_doc.matmul_ceiling.size == 64
    assert cpu_doc.copy_ceiling.gbps > 0 and cpu_doc.matmul_ceiling.tflops > 0
    import torch

    assert cpu_doc.torch_version == str(torch.__version__)


def test_equal_shapes_are_timed_once_and_named_by_every_user(cpu_doc: GemmBenchDoc) -> None:
    keys = [(s.m, s.n, s.k) for s in cpu_doc.shapes]
    assert [(t.m, t.n, t.k) for t in cpu_doc.timings] == list(dict.fromkeys(keys))
    # TP=1 and TP=2 share the replicated router: one timing, one name
    router = next(t for t in cpu_doc.timings if (t.n, t.k) == (8, 64))
    assert router.names == ("tiny:moe.router",)
    # the weights a sample cycles through span cold_bytes: 64 KiB over 8 KiB weights (TP=2's qkv, TP=1's o)
    qkv2 = next(t for t in cpu_doc.timings if (t.m, t.n, t.k) == (2, (2 + 2) * 16, 64))
    assert qkv2.calls_per_sample == (1 << 16) // (64 * 64 * 2)


def test_datasheet_is_marked_and_only_auto_on_a_matching_gpu(cpu_doc: GemmBenchDoc) -> None:
    assert cpu_doc.datasheet == load_datasheet("h200")
    sheet = load_datasheet("h200")
    assert (sheet.hbm_gbps, sheet.dense_tflops, sheet.memory_gb, sheet.quality) == (4800, 989, 141, "datasheet")
    assert "datasheet" in sheet.source
    auto = run_gemm_bench(gemm_shapes(TINY, tp=1, batch=1)[:1], device="cpu", iters=2, warmup=0, cold_bytes=0,
                          copy_bytes=1 << 20, matmul_size=64)
    assert auto.datasheet is None and auto.options.hardware is None
    assert all(t.frac_datasheet_gbps is None and t.frac_datasheet_tflops is None for t in auto.timings)
    assert "h200" in list_hardware_profiles()


def test_json_round_trip(cpu_doc: GemmBenchDoc, tmp_path: Path) -> None:
    path = tmp_path / "gemm.json"
    path.write_text(gemm_doc_to_json(cpu_doc), encoding="utf-8")
    assert load_gemm_doc(path) == cpu_doc


def test_recorded_h200_run_is_consistent() -> None:
    doc = load_gemm_doc(RECORDED_H200)
    assert "H200" in doc.device_name and doc.options.device.startswith("cuda")
    assert doc.datasheet is not None and doc.datasheet.name == "h200"
    check_rates(doc)
    # measured ceilings sit below the datasheet peaks
    assert 0.5 < doc.copy_ceiling.gbps / doc.datasheet.hbm_gbps < 1.0
    assert doc.datasheet.dense_tflops is not None
    assert 0.4 < doc.matmul_ceiling.tflops / doc.datasheet.dense_tflops < 1.0
    assert {s.model for s in doc.shapes} == {"skeleton-dense", "skeleton-moe", "llama-3-70b", "qwen3-235b-a22b"}


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"dtype": "int8"}, ValueError, "allowed bfloat16, float16, float32"),
    ({"device": "tpu"}, ValueError, "allowed auto, cpu, cuda, cuda:N"),
    ({"device": "cuda"}, InputError, "sees no CUDA device"),
    ({"iters": 0}, ValueError, "iters must be >= 1"),
    ({"hardware": "b300"}, InputError, "profiles: " + ", ".join(sorted(
        f.stem for f in (Path(__file__).resolve().parents[2] / "src/servescope/data/hardware").glob("*.toml")))),
    ({"matmul_size": 0}, ValueError, "matmul_size must be positive"),
])
def test_bad_options(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        run_gemm_bench(gemm_shapes(TINY, tp=1, batch=1), **kwargs)


def test_bad_hardware_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text('name = "x"\ngpu = "X"\nsource = "me"\nmemory_gb = 1\nhbm_gbps = "fast"\n', encoding="utf-8")
    with pytest.raises(InputError, match="hbm_gbps: expected a positive number"):
        load_datasheet(str(path))


def test_modules_import_without_our_dependencies() -> None:
    code = (f"import sys\nfor m in {NOT_ON_GPU_BOX!r}: sys.modules[m] = None\n"
            "import servescope.plan.model as pm, servescope.bench.gemm, servescope.core.gemm\n"
            "print(len(pm.gemm_shapes(pm.load_model_arch('llama-3-70b'), tp=8, batch=1)), 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["5", "False"]


def test_device_script_runs_without_our_dependencies(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    argv = ["--out", str(out), "--device", "cpu", "--models", "dense", "llama-3-70b", "--batches", "1",
            "--iters", "2", "--warmup", "0", "--cold-bytes", "0", "--copy-bytes", "100000", "--matmul-size", "32"]
    # numpy stays importable: torch itself imports it when present
    blocked = tuple(m for m in NOT_ON_GPU_BOX if m != "numpy")
    code = (f"import runpy, sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            f"sys.argv = [{str(SCRIPT)!r}, *{argv!r}]\nrunpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = load_gemm_doc(out)
    assert [s.model for s in doc.shapes] == ["skeleton-dense"] * 5 + ["llama-3-70b"] * 5
    dense = {s.name: (s.n, s.k) for s in doc.shapes if s.model == "skeleton-dense"}
    # capture_decode's dense model: hidden 2048, intermediate 5632, 16 heads, 8 KV heads of 128, vocab 32000; TP=1
    assert dense == {"attn.qkv": ((16 + 2 * 8) * 128, 2048), "attn.o": (2048, 2048), "mlp.gate_up": (2 * 5632, 2048),
                     "mlp.down": (2048, 5632), "lm_head": (32000, 2048)}
    assert {s.tp for s in doc.shapes if s.model == "llama-3-70b"} == {8}
    assert f"wrote {out}" in done.stdout


def test_no_fraction_of_a_ceiling_is_over_one_and_a_beaten_ceiling_is_named(cpu_doc: GemmBenchDoc) -> None:
    """On a CPU small GEMMs can outrun the ceilings (caches, the kernel picked per shape): no ratio over 100%."""
    for t in cpu_doc.timings:
        assert t.frac_ceiling_tflops is None or t.frac_ceiling_tflops <= 1.0
        assert t.frac_ceiling_gbps is None or t.frac_ceiling_gbps <= 1.0
    if any(t.frac_ceiling_tflops is None for t in cpu_doc.timings):
        assert any(f"{cpu_doc.matmul_ceiling.size}^3 matmul" in n and "no compute ceiling" in n for n in cpu_doc.notes)
    if any(t.frac_ceiling_gbps is None for t in cpu_doc.timings):
        assert any("no memory ceiling" in n for n in cpu_doc.notes)


def test_cli_table_shows_no_ratio_over_100_percent_and_the_notes(cpu_doc: GemmBenchDoc) -> None:
    import io
    import re

    from rich.console import Console

    from servescope.report.gpu import render_gemm

    out = io.StringIO()
    render_gemm(cpu_doc, Console(file=out, width=200, highlight=False))
    text = out.getvalue()
    assert all(int(p) <= 100 for p in re.findall(r"(\d+)%", text))
    assert "TFLOP/s, above" not in text or "note: " in text
    assert f"matmul {cpu_doc.matmul_ceiling.tflops:.3g} TFLOP/s" in text  # significant digits, never "0.0"


def test_ceilings_on_a_cpu_stop_at_their_time_budget() -> None:
    """A ceiling sample that takes long (a CPU's 1024^3 bf16 matmul: ~0.7 s) stops at the budget, >= 3 samples."""
    import time

    import torch

    from servescope.bench.gemm import _Sampler

    sampler = _Sampler(torch, torch.device("cpu"), iters=50, warmup=10, budget_s=0.3)
    calls = []
    started = time.perf_counter()
    times = sampler.sample(lambda: (calls.append(1), time.sleep(0.05)), 1)
    assert 3 <= len(times) <= 10 and len(calls) < 20
    assert time.perf_counter() - started < 1.5
    assert all(t >= 0.05 for t in times)
    assert len(_Sampler(torch, torch.device("cpu"), iters=4, warmup=0, budget_s=None).sample(lambda: None, 1)) == 4


def test_progress_is_reported_before_the_ceilings_and_after_each_shape() -> None:
    seen: list[tuple[int, int]] = []
    doc = run_gemm_bench(gemm_shapes(TINY, tp=1, batch=1), device="cpu", iters=2, warmup=0, cold_bytes=0,
                         copy_bytes=1 << 20, matmul_size=32, progress=lambda d, n: seen.append((d, n)))
    n = len(doc.timings)
    assert seen == [(i, n) for i in range(n + 1)]
