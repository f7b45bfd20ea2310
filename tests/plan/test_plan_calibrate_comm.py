"""plan --calibrate takes the collectives from the user's own capture (issue 24 item 3).

A synthetic TP=8 capture of Kimi-K2.5 on 8 RTX PRO 6000 (PCIe) is built here, rank by rank, as PyTorch's profiler
writes a vLLM decode step: per layer the attention GEMMs, the attention kernel, an all-reduce, the MoE GEMMs and
another all-reduce, one embedding all-reduce and one logits all-gather a step. Every all-reduce is an NCCL kernel
with the args PyTorch records (``In msg nelems``, ``dtype``, ``Group size``), lasting the published per-call figure
of ``data/comm/points.toml``'s RTX 6000D point at the message size (read here with tomllib and interpolated by
hand), plus a per-rank wait for the slowest rank (rank r waits 2·r µs a call). The expected figure is taken by plain
``json`` and sums over the written files: the collective time per decode step of the rank that waited least.
"""

from __future__ import annotations

import gzip
import json
import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import InputError
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.profile import encode_profile
from servescope.trace.analyze import AnalyzeRequest, analyze

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
HIDDEN, LAYERS, VOCAB = 7168, 61, 163840  # Kimi-K2.5's config.json: hidden_size, num_hidden_layers, vocab_size
STEPS, TP = 12, 8
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _published_us(nbytes: int) -> float:
    """The RTX 6000D NCCL all-reduce point (sglang PR 32479: 45 µs at 4 KB, 344 µs at 64 KB), linear between."""
    data = tomllib.loads(files("servescope").joinpath("data", "comm", "points.toml").read_text(encoding="utf-8"))
    [p] = [p for p in data["point"] if "RTX 6000D" in p["source"]]
    (x0, x1), (y0, y1) = p["bytes"], p["us"]
    return float(y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0))


def _kernel(name: str, ts: float, dur: float, corr: int, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": corr, **(args or {})}}


def _rank_trace(rank: int, batch: int, ranks: int, ar_name: str = AR) -> dict[str, Any]:
    msg = batch * HIDDEN
    ar = _published_us(msg * 2) + 2.0 * rank
    ar_args = {"Collective name": "allreduce", "In msg nelems": msg, "Out msg nelems": msg, "Group size": ranks,
               "dtype": "BFloat16"}
    ag_args = {"Collective name": "_allgather_base", "In msg nelems": batch * VOCAB // ranks,
               "Out msg nelems": batch * VOCAB, "Group size": ranks, "dtype": "BFloat16"}
    events: list[dict[str, Any]] = []
    t = 1000.0
    name = f"execute_context_0(0)_generation_{batch}({batch})"
    for step in range(STEPS):  # each step one CUDA graph replay, as vLLM decodes
        start = t
        kernels: list[tuple[str, float, dict[str, Any] | None]] = [(ar_name, ar, ar_args)]
        for _ in range(LAYERS):
            kernels += [("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 60.0, None),
                        ("flash_fwd_splitkv_mla_kernel", 25.0, None),
                        (ar_name, ar, ar_args),
                        ("fused_moe_kernel", 90.0, None),
                        (ar_name, ar, ar_args)]
        kernels.append(("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                        _published_us(65536) + 2.0 * rank, ag_args))
        for k, dur, args in kernels:
            events.append(_kernel(k, t, dur, step + 1, args))
            t += dur + 1.0
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": 7, "ts": start,
                       "dur": t - start})
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": start - 500,
                       "dur": 450.0})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
                       "ts": start - 100, "dur": 20.0, "args": {"correlation": step + 1}})
        t += 300.0
    return {"deviceProperties": [{"id": 0, "name": DEVICE}], "distributedInfo": {"rank": rank, "world_size": ranks,
            "backend": "nccl"}, "traceEvents": events}


def _capture(folder: Path, *, ranks: int = TP, batch: int = 1, ar_name: str = AR) -> tuple[Path, float]:
    """(profile document of the synthetic capture, its collective µs per decode step on the least-waiting rank,
    by plain json and sums over the written traces)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    per_rank = []
    for r in range(ranks):
        body = _rank_trace(r, batch, ranks, ar_name)
        path = folder / f"rank{r}.pt.trace.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            json.dump(body, fh)
        paths.append(path)
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
        steps = [e for e in events if e["cat"] == "gpu_user_annotation"]
        comm = sum(e["dur"] for e in events if e["cat"] == "kernel" and "Collective name" in e.get("args", {}))
        per_rank.append(comm / len(steps))
    doc = analyze(AnalyzeRequest(paths=paths))
    out = folder / "capture.profile.json"
    out.write_bytes(encode_profile(doc, paths, capture={"model": "moonshotai/Kimi-K2.5", "batch": batch,
                                                        "input_tokens": 1000, "output_tokens": 64,
                                                        "prompts": "distinct"}))
    return out, min(per_rank)


@pytest.fixture(scope="module")
def tp8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    return _capture(tmp_path_factory.mktemp("tp8") / "b1")


def test_tp8_capture_gives_its_own_all_reduce_to_the_plan(tp8: tuple[Path, float]) -> None:
    capture, truth_us = tp8
    doc = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=TP, batches=(1, 8), context=1032,
                               calibrate=str(capture), env={"NCCL_PROTO": "LL"}))
    layouts = {x.name: x for x in doc.layouts}
    point = layouts[f"TP={TP}"].points[0]
    colls = point.collectives_per_step
    predicted_us = point.parts_ms["collectives"] * 1e3
    error = predicted_us / truth_us - 1
    print(f"TP=8 capture: {truth_us:.0f} µs of collectives a decode step (least-waiting rank); plan at TP=8 batch 1: "
          f"{predicted_us:.0f} µs ({error:+.2%})")
    assert abs(error) <= 0.05
    ar = (colls["all_reduce"].paths or [])[0]
    assert ar.origin == "calibrated" and ar.wait_us_each == 0.0 and "capture.profile.json" in ar.source
    assert ar.us_each == pytest.approx(_published_us(HIDDEN * 2), rel=1e-6)  # rank 0 waits 0 µs
    assert "calibrated" in point.origins["collectives"]
    # the same links and group size: every TP=8 layout's all-reduce is the capture's, at batch 8 too
    for name, x in layouts.items():
        for p in x.points:
            all_reduce = p.collectives_per_step.get("all_reduce")
            for path in (all_reduce.paths or []) if all_reduce else []:
                assert (path.origin == "calibrated") == (path.group == TP), (name, path)
    assert doc.factors["collective_scale"].origin == "assumed"
    assert any(n.startswith("calibrated all_reduce over 8 GPUs (nccl)") for n in doc.notes)


def test_a_capture_of_another_group_size_is_refused(tmp_path: Path) -> None:
    capture, _ = _capture(tmp_path / "tp4", ranks=4)
    with pytest.raises(InputError, match="TP: the capture ran TP=4 on 4 GPUs, the plan is for 8"):
        run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=8, batches=(1,), context=1032,
                             calibrate=str(capture)))


def test_a_capture_of_another_device_is_refused(tp8: tuple[Path, float]) -> None:
    capture, _ = tp8
    with pytest.raises(InputError, match=f"device: captured on {DEVICE}"):
        run_plan(PlanRequest(model="kimi-k2.5", hardware="h200", gpus=8, batches=(1,), context=1032,
                             calibrate=str(capture)))


def test_the_text_says_the_all_reduce_is_the_captures(tp8: tuple[Path, float]) -> None:
    from typer.testing import CliRunner

    from servescope.cli import app
    capture, _ = tp8
    result = CliRunner().invoke(app, ["plan", "--model", "kimi-k2.5", "--hardware", "rtx-pro-6000", "--gpus", "8",
                                      "--batch", "1", "--context", "1032", "--calibrate", str(capture)],
                                env={"COLUMNS": "100"}, terminal_width=100)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert ("all_reduce over 8, 14 KiB: NCCL (custom: not on > 2 PCIe-only GPUs); calibrated: capture.profile.json"
            in text)


def test_the_collectives_come_from_the_document_alone(tmp_path: Path) -> None:
    """The document records each decode collective's sizes, group and kernels (schema version 2), as plain json
    over the traces counts them; with the traces gone, plan prices the all-reduce from it all the same."""
    capture, _ = _capture(tmp_path / "gone", ranks=TP)
    expected: dict[str, dict[int, int]] = {}  # collective name -> nccl-tests bytes -> calls, rank 0
    with gzip.open(tmp_path / "gone" / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        for e in json.load(fh)["traceEvents"]:
            args = e.get("args", {})
            if e["cat"] == "kernel" and "Collective name" in args:
                key = "Out msg nelems" if "allgather" in args["Collective name"] else "In msg nelems"
                sizes = expected.setdefault(args["Collective name"], {})
                sizes[args[key] * 2] = sizes.get(args[key] * 2, 0) + 1  # bf16: 2 bytes
    for trace in (tmp_path / "gone").glob("rank*.pt.trace.json.gz"):
        trace.unlink()
    doc = json.loads(capture.read_bytes())
    decode = doc["ranks"][0]["phases"]["decode"]["collectives"]
    assert {s["bytes"]: s["calls"] for s in decode["comm.all_reduce"]["sizes"]} == expected["allreduce"]
    assert {s["bytes"]: s["calls"] for s in decode["comm.all_gather"]["sizes"]} == expected["_allgather_base"]
    assert decode["comm.all_reduce"]["group"] == decode["comm.all_gather"]["group"] == TP
    assert decode["comm.all_reduce"]["kernels"] == {AR: sum(expected["allreduce"].values())}
    plan = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=TP, batches=(1,), context=1032,
                                calibrate=str(capture), env={"NCCL_PROTO": "LL"}))
    ar = (plan.layouts[0].points[0].collectives_per_step["all_reduce"].paths or [])[0]
    assert ar.origin == "calibrated" and ar.us_each == pytest.approx(_published_us(HIDDEN * 2), rel=1e-6)
    assert any(n.startswith("calibrated all_gather over 8 GPUs (nccl)") for n in plan.notes)


CUSTOM = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, int)"


def test_the_implementation_a_capture_ran_is_told_by_its_kernel_names(tmp_path: Path) -> None:
    """data/comm/vllm-0.26.toml's [[kernel]] entries name vLLM's custom one-shot kernel; on 8 PCIe-only GPUs
    vLLM's rules run NCCL instead (custom all-reduce needs NVLink above 2 GPUs), so the plan says so."""
    capture, _ = _capture(tmp_path / "custom", ar_name=CUSTOM)
    plan = run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=TP, batches=(1,), context=1032,
                                calibrate=str(capture)))
    assert any(n.startswith("calibrated all_reduce: the capture ran custom_1stage where vLLM 0.26's rules pick "
                            "nccl for 14,336 B on 8 GPUs") for n in plan.notes), plan.notes


def test_an_unknown_implementation_in_the_kernel_table_is_an_error(monkeypatch: pytest.MonkeyPatch,
                                                                    tp8: tuple[Path, float]) -> None:
    from servescope.plan import captured

    planted = {**captured.engine_rules(), "kernel": [{"impl": "warp_drive", "pattern": "nccl"}]}
    monkeypatch.setattr(captured, "engine_rules", lambda: planted)
    captured._impl_patterns.cache_clear()
    try:
        with pytest.raises(InputError) as err:
            run_plan(PlanRequest(model="kimi-k2.5", hardware="rtx-pro-6000", gpus=TP, batches=(1,), context=1032,
                                 calibrate=str(tp8[0])))
    finally:
        captured._impl_patterns.cache_clear()
    assert err.value.source == "data/comm/vllm-0.26.toml" and "kernel 1: impl 'warp_drive'" in err.value.problem
