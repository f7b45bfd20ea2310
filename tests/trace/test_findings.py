"""Each finding rule fires on a real trace where it should and stays silent where it should not.

Expected outcomes come from the trace by a plain route (``json.load``, sums over the raw events, kernels put in
a step by where their launch falls), never from servescope's own output; thresholds are read from
``findings.toml``, so moving a threshold moves the expectation with it.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from servescope.core.analysis import AnalysisDoc, Finding, SettingEvidence
from servescope.core.kernel_names import shorten_kernel_name
from servescope.trace.analyze import AnalyzeRequest, analyze, example_trace_dir
from servescope.trace.rules.findings import find_bottlenecks, load_rules
from tracefiles import TRACES, load_events

H200 = Path(__file__).resolve().parents[1] / "data" / "h200"
LLAMA_TP4 = TRACES / "public" / "vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz"
HF_QWEN = TRACES / "public" / "hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz"
H100_QWEN = TRACES / "tracelens" / "h100_qwen1.5-0.5b_inference.json.gz"
SGLANG_REPLAY = TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz"
VLLM_REPLAY = TRACES / "tracelens" / "vllm_decode_full_graph_replay.json.gz"
HTA_NCCL = TRACES / "hta" / "nccl_allreduce_2rank_rank0.json.gz"
HTA_A100 = TRACES / "hta" / "a100_8rank_rank3_nccl.json.gz"
XDIT = TRACES / "public" / "xdit_sd35_mi300x_compiled.json.gz"
CPU_TP1 = TRACES / "vllm-cpu" / "tp1_b1_32tok_rank0.pt.trace.json.gz"
EXAMPLE_TP2 = example_trace_dir("vllm-cpu-tp2")
GRAPH_TRACES = sorted(H200.glob("*_graphs_*.pt.trace.json.gz"))
EAGER_TRACES = sorted(p for p in H200.glob("*.pt.trace.json.gz") if "_graphs_" not in p.name)
RULES = load_rules()["rules"]
CUDA_GRAPHS_ADVICE = "CUDA graphs (do not pass --enforce-eager)"
CUSTOM_AR_ADVICE = "custom all-reduce"

_RUNTIME = {"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"}
_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}


# ---------------------------------------------------------------------------------------------------------
# The plain route
# ---------------------------------------------------------------------------------------------------------

@cache
def _doc(*paths: Path) -> AnalysisDoc:
    return analyze(AnalyzeRequest(paths=list(paths)))


@cache
def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in load_events(path) if e.get("ph") == "X"]


def _device(path: Path) -> list[dict[str, Any]]:
    return [e for e in _events(path) if e.get("cat") in _DEVICE]


def _share(path: Path, pick: Callable[[dict[str, Any]], bool]) -> float:
    ops = _device(path)
    return sum(e["dur"] for e in ops if pick(e)) / sum(e["dur"] for e in ops)


def _graph_share(path: Path) -> float:
    graph_corr = {e["args"]["correlation"] for e in _events(path) if e.get("cat") in _RUNTIME
                  and "GraphLaunch" in e["name"] and "correlation" in e.get("args", {})}
    return _share(path, lambda e: e.get("args", {}).get("correlation") in graph_corr)


def _phase(name: str) -> str:
    m = re.match(r"execute_context_(\d+)\(\d+\)_generation_(\d+)\(\d+\)", name)
    if m is None:
        return "unknown"
    ctx, gen = int(m[1]), int(m[2])
    return "mixed" if ctx and gen else "prefill" if ctx else "decode" if gen else "empty"


def _steps(path: Path) -> list[tuple[str, float, float]]:
    """(phase, start, end) of each step annotation: vLLM's execute_context_*, SGLang's, ProfilerStep#."""
    marks = [e for e in _events(path) if e.get("cat") == "user_annotation"
             and re.match(r"execute_context_|execute_\d+_context|ProfilerStep#", e["name"])]
    if any(m["name"].startswith("execute_") for m in marks):
        marks = [m for m in marks if m["name"].startswith("execute_")]
    out = []
    for m in sorted(marks, key=lambda m: m["ts"]):
        phase = "decode" if re.match(r"execute_\d+_context_0\(", m["name"]) else _phase(m["name"])
        out.append((phase, float(m["ts"]), float(m["ts"] + m["dur"])))
    return out


def _device_steps(path: Path) -> list[tuple[str, list[tuple[float, float, str]]]]:
    """Each step's device intervals: the ops whose launch (runtime call, by correlation id) lies in the step."""
    launch = {e["args"]["correlation"]: e["ts"] for e in _events(path)
              if e.get("cat") in _RUNTIME and "correlation" in e.get("args", {})}
    steps = _steps(path)
    per: list[list[tuple[float, float, str]]] = [[] for _ in steps]
    for e in _device(path):
        at = launch.get(e.get("args", {}).get("correlation"))
        for i, (_, lo, hi) in enumerate(steps):
            if at is not None and lo <= at <= hi:
                per[i].append((float(e["ts"]), float(e["ts"] + e["dur"]), e["name"]))
                break
    return [(steps[i][0], sorted(per[i])) for i in range(len(steps)) if per[i]]


def _idle(ops: list[tuple[float, float, str]], lo: float | None = None,
          hi: float | None = None) -> tuple[float, float, float]:
    """(span, idle, largest gap) of intervals sorted by start; the span is [lo, hi] or first..last op."""
    lo = ops[0][0] if lo is None else lo
    hi = max(e for _, e, _ in ops) if hi is None else hi
    busy, reach, largest = 0.0, lo, 0.0
    for s, e, _ in ops:
        s, e = max(s, lo), min(e, hi)
        if e <= reach:
            continue
        largest = max(largest, s - reach)
        busy += e - max(s, reach)
        reach = e
    largest = max(largest, hi - reach)
    return hi - lo, (hi - lo) - busy, largest


def _phase_idle(steps: list[tuple[str, float, float, float]], phase: str) -> tuple[float, float]:
    """Median idle share of a phase's steps, and its longest gap as a share of the phase's idle time."""
    rows = [(span, idle, gap) for p, span, idle, gap in steps if p == phase]
    median = statistics.median(idle / span for span, idle, _ in rows)
    idle_total = sum(idle for _, idle, _ in rows)
    return median, max(gap for _, _, gap in rows) / idle_total if idle_total else 0.0


def _gpu_idle(path: Path) -> list[tuple[str, float, float, float]]:
    return [(phase, *_idle(ops)) for phase, ops in _device_steps(path)]


def _found(doc: AnalysisDoc, rule: str) -> list[Finding]:
    return [f for f in doc.findings if f.id == rule or str(f.evidence.get("rule", "")).split("+")[0] == rule]


def _phases_of(f: Finding) -> set[str]:
    return set(str(f.evidence.get("phases") or f.phase or "").split(","))


# ---------------------------------------------------------------------------------------------------------
# Facts the rules check
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [*GRAPH_TRACES[:3], EAGER_TRACES[0], LLAMA_TP4, SGLANG_REPLAY, VLLM_REPLAY],
                         ids=lambda p: p.name[:40])
def test_graph_replay_share_is_the_share_of_device_time_graph_launches_started(path: Path) -> None:
    assert _doc(path).ranks[0].graph_replay_share == pytest.approx(_graph_share(path), abs=1e-5)


# ---------------------------------------------------------------------------------------------------------
# launch_bound / host_gap / cpu_overhead
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [*GRAPH_TRACES, *EAGER_TRACES], ids=lambda p: p.name[:40])
def test_launch_bound_fires_on_steady_idle_decode_and_never_offers_graphs_to_a_graph_replay(path: Path) -> None:
    doc = _doc(path)
    median, one_gap = _phase_idle(_gpu_idle(path), "decode")
    expected = median >= RULES["launch_bound"]["medium"] and one_gap < 0.5
    fired = [f for f in _found(doc, "launch_bound") if "decode" in _phases_of(f)]
    assert bool(fired) == expected, (median, one_gap)
    if _graph_share(path) >= 0.05:
        assert all(CUDA_GRAPHS_ADVICE not in f.message for f in doc.findings)
        assert all("enforce-eager" not in f.message for f in _found(doc, "launch_bound"))
    elif expected:
        assert CUDA_GRAPHS_ADVICE in fired[0].message


def test_eager_h200_decode_is_launch_bound_high_and_told_to_use_graphs() -> None:
    path = H200 / "dense_b16_rank0.pt.trace.json.gz"
    median, _ = _phase_idle(_gpu_idle(path), "decode")
    assert median >= RULES["launch_bound"]["high"]
    (f,) = [f for f in _found(_doc(path), "launch_bound") if "decode" in _phases_of(f)]
    assert f.severity == "high" and CUDA_GRAPHS_ADVICE in f.message


@pytest.mark.needs_shared
def test_one_long_host_pause_is_a_host_gap_not_launch_bound() -> None:
    """SGLang's replayed decode step: the device waits once, for ~0.46 s, then runs the whole graph."""
    steps = _gpu_idle(SGLANG_REPLAY)
    median, one_gap = _phase_idle(steps, "decode")
    assert median >= RULES["launch_bound"]["high"] and one_gap >= 0.5  # the mean idle alone would say launch-bound
    doc = _doc(SGLANG_REPLAY)
    assert _found(doc, "launch_bound") == []
    (gap,) = _found(doc, "host_gap")
    assert gap.severity == "info"
    assert gap.evidence["largest_gap_us"] == pytest.approx(max(g for *_, g in steps), rel=1e-3)


def test_host_gap_stays_silent_where_idle_is_spread_over_many_gaps() -> None:
    path = H200 / "dense_b1_rank0.pt.trace.json.gz"
    assert all(_phase_idle(_gpu_idle(path), p)[1] < 0.5 for p in ("decode", "prefill"))
    assert _found(_doc(path), "host_gap") == []


def _cpu_idle(path: Path) -> list[tuple[str, float, float, float]]:
    """CPU traces: each step annotation's span, and the union of the cpu_ops inside it."""
    ops = sorted((float(e["ts"]), float(e["ts"] + e["dur"]), e["name"]) for e in _events(path)
                 if e.get("cat") == "cpu_op")
    out = []
    for phase, lo, hi in _steps(path):
        inside = [op for op in ops if lo <= op[0] <= hi]
        if inside:
            out.append((phase, *_idle(inside, lo, hi)))
    return out


@pytest.mark.needs_shared
def test_cpu_overhead_fires_on_vllm_cpu_decode_and_not_on_gpu_traces() -> None:
    median, one_gap = _phase_idle(_cpu_idle(CPU_TP1), "decode")
    assert median >= RULES["cpu_overhead"]["medium"] and one_gap < 0.5
    (f,) = [f for f in _found(_doc(CPU_TP1), "cpu_overhead") if f.phase == "decode"]  # one finding per phase
    assert _phases_of(f) == {"decode"}
    assert f.severity == ("high" if median >= RULES["cpu_overhead"]["high"] else "medium")
    for path in (EAGER_TRACES[0], GRAPH_TRACES[0]):
        assert _found(_doc(path), "cpu_overhead") == []


# ---------------------------------------------------------------------------------------------------------
# communication_bound / collective_wait
# ---------------------------------------------------------------------------------------------------------

_NCCL = re.compile(r"^nccl|ncclDevKernel|ncclKernel")
_DTYPE_BYTES = {"Float": 4, "float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1}


@pytest.mark.needs_shared
def test_communication_bound_fires_on_the_hta_nccl_trace_with_training_advice() -> None:
    """HTA's NCCL trace is a training run (backward ops, ProfilerSteps, no engine's marks): the collectives are
    named with their base (device time) and the advice is for data-parallel gradients, never a serving flag."""
    steps = _device_steps(HTA_NCCL)
    comm = sum(e - s for _, ops in steps for s, e, name in ops if _NCCL.search(name))
    total = sum(e - s for _, ops in steps for s, e, _ in ops)
    assert comm / total >= RULES["communication_bound"]["medium"]
    assert not any("cross_device_reduce" in e["name"] for e in _device(HTA_NCCL))
    assert any(str(e.get("name", "")).startswith("autograd::engine::evaluate_function: ") for e in _events(HTA_NCCL))
    doc = _doc(HTA_NCCL)
    assert doc.deployment["engine"].value == "training"
    (f,) = _found(doc, "communication_bound")
    assert f.evidence["comm_share"] == pytest.approx(comm / total, abs=0.01)
    assert f"{100 * comm / total:.1f}% of the step's device time" in f.message
    assert CUSTOM_AR_ADVICE not in f.message and "--" not in f.message and "vLLM" not in f.message
    assert "data-parallel gradients" in f.message
    sizes = [e["args"]["In msg nelems"] * _DTYPE_BYTES[e["args"]["dtype"]] for e in _device(HTA_NCCL)
             if "In msg nelems" in e.get("args", {})]
    small = statistics.median(sizes) < load_rules()["conditions"]["large_messages"]["at_least"]
    assert ("NCCL_PROTO" in f.message) == small  # protocol tuning is for small messages only


def _lowered(rule: str, medium: float) -> dict[str, Any]:
    data = copy.deepcopy(load_rules())
    data["rules"][rule].update(medium=medium, high=max(medium, data["rules"][rule]["high"]))
    return data


def _refind(doc: AnalysisDoc, data: dict[str, Any],
            deployment: dict[str, SettingEvidence] | None = None) -> list[Finding]:
    """Findings of ``doc`` under other thresholds (the same facts; servescope's own call, other data), with the
    document's own deployment evidence unless ``deployment`` is given."""
    comm = [c for c, g in doc.categories.items() if g == "communication"]
    from servescope.trace.read.trace_json import decode_trace
    from servescope.trace.rules.facts import rank_facts
    facts = {r.rank: rank_facts(decode_trace(r.path), r.rank, r.steps) for r in doc.ranks}
    return find_bottlenecks(doc.ranks, doc.across_ranks, doc.kernels, comm, {}, facts, data,
                            deployment=doc.deployment if deployment is None else deployment)


@pytest.mark.needs_shared
def test_a_trace_running_cross_device_reduce_gets_no_custom_all_reduce_advice() -> None:
    """vLLM's custom all-reduce already runs on the Llama TP=4 trace: even where the collectives cross a
    threshold, the advice leaves it out, while a trace with NCCL all-reduce only gets it."""
    assert any("cross_device_reduce" in e["name"] for e in _device(LLAMA_TP4))
    comm = _share(LLAMA_TP4, lambda e: bool(_NCCL.search(e["name"]) or "cross_device_reduce" in e["name"]))
    assert comm < RULES["communication_bound"]["medium"]
    assert _found(_doc(LLAMA_TP4), "communication_bound") == []
    data = _lowered("communication_bound", comm / 2)
    (f,) = [f for f in _refind(_doc(LLAMA_TP4), data) if f.id == "communication_bound"]
    assert CUSTOM_AR_ADVICE not in f.message
    assert CUDA_GRAPHS_ADVICE not in f.message and "CUDA graphs" not in f.message  # it replays graphs
    (other,) = [f for f in _refind(_doc(HTA_NCCL), data) if f.id == "communication_bound"]
    assert CUSTOM_AR_ADVICE not in other.message  # a training run: no serving engine's flag
    # the same trace, where a settings document says vLLM serves it: NCCL all-reduce only, so the advice comes
    served = {"engine": SettingEvidence(value="vllm", source="settings", detail="a settings document")}
    (told,) = [f for f in _refind(_doc(HTA_NCCL), data, served) if f.id == "communication_bound"]
    assert CUSTOM_AR_ADVICE in told.message and "--disable-custom-all-reduce" in told.message


def _self_times(path: Path) -> list[tuple[str, float, float]]:
    """(name, start, self µs) of every cpu_op: its duration less its direct children's on the same thread."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in _events(path):
        if e.get("cat") == "cpu_op":
            by_thread[(e["pid"], e["tid"])].append(e)
    out = []
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        selfs = {id(e): float(e["dur"]) for e in ops}
        stack: list[dict[str, Any]] = []
        for e in ops:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                selfs[id(stack[-1])] -= e["dur"]
            stack.append(e)
        out.extend((e["name"], float(e["ts"]), max(selfs[id(e)], 0.0)) for e in ops)
    return out


_CPU_COMM = re.compile(r"shm_all|all_reduce|allreduce|all_gather|c10d")


def _cpu_comm(path: Path, phase: str) -> tuple[float, float]:
    """(collectives' share of the phase's operator time, their µs per step), by hand."""
    ops = _self_times(path)
    comm = total = 0.0
    steps = 0
    for p, lo, hi in _steps(path):
        if p != phase:
            continue
        steps += 1
        inside = [(n, t) for n, s, t in ops if lo <= s <= hi]
        comm += sum(t for n, t in inside if _CPU_COMM.search(n))
        total += sum(t for _, t in inside)
    return comm / total, comm / steps


def _cpu_comm_share(path: Path, phase: str) -> float:
    return _cpu_comm(path, phase)[0]


def _wait_share(paths: list[Path], phase: str) -> dict[int, float]:
    """Per rank: the share of its collective time beyond the shortest rank's, collective by collective."""
    per_rank = []
    for path in paths:
        ops = sorted((float(e["ts"]), float(e["dur"])) for e in _events(path)
                     if e.get("cat") == "cpu_op" and _CPU_COMM.search(e["name"]) and "::" in e["name"]
                     and e["name"].startswith("_C"))
        per_rank.append([[d for s, d in ops if lo <= s <= hi] for p, lo, hi in _steps(path) if p == phase])
    out = {}
    for r, steps in enumerate(per_rank):
        wait = total = 0.0
        for k, durs in enumerate(steps):
            others = [per_rank[o][k] for o in range(len(per_rank))]
            if len({len(d) for d in others}) != 1:
                continue
            wait += sum(d - min(col) for d, col in zip(durs, zip(*others, strict=True), strict=True))
            total += sum(durs)
        out[r] = wait / total if total else 0.0
    return out


def test_vllm_cpu_tp2_fires_communication_bound_merged_with_collective_wait() -> None:
    ranks = [EXAMPLE_TP2 / "rank0.pt.trace.json.gz", EXAMPLE_TP2 / "rank1.pt.trace.json.gz"]
    share = _cpu_comm_share(ranks[0], "prefill")
    assert share >= RULES["communication_bound"]["medium"]
    wait = _wait_share(ranks, "prefill")
    assert max(wait.values()) >= RULES["collective_wait"]["medium"]
    doc = _doc(EXAMPLE_TP2)
    (f,) = [f for f in doc.findings if f.id == "communication_bound" and f.phase == "prefill"]
    assert f.evidence["rule"] == "communication_bound+collective_wait"
    assert _phases_of(f) == {"prefill"} and "waiting" in f.message
    # one finding for one cause: no collective_wait beside communication_bound in the same phase
    assert [g for g in doc.findings if g.id == "collective_wait" and g.phase == "prefill"] == []
    assert CUSTOM_AR_ADVICE not in f.message  # a CPU run: shared-memory all-reduce, no such advice
    # the headline's numbers are the finding's worst rank's, the merged finding keeping them: its share and its
    # collectives' time a step, by hand from that rank's trace (a merged finding once lost the latter: "0 µs")
    (verdict,) = [v for v in doc.verdicts if v.phase == "prefill"]
    assert verdict.finding == "communication_bound" and verdict.kind == "communication"
    by_hand = max((_cpu_comm(r, "prefill") for r in ranks), key=lambda sc: sc[0])
    assert verdict.share == pytest.approx(by_hand[0], abs=0.01)
    said = re.search(r"\(([\d.]+) (ms|µs) a step\)", verdict.sentence)
    assert said is not None, verdict.sentence
    assert float(said[1]) * (1000 if said[2] == "ms" else 1) == pytest.approx(by_hand[1], rel=0.02)


def test_findings_of_one_cause_merge_across_ranks_not_phases() -> None:
    """One finding per rule and phase: its ranks merged, its steps those of its phase alone (a phase's advice
    speaks of that phase's steps)."""
    doc = _doc(EXAMPLE_TP2)
    keys = [(f.id, f.phase) for f in doc.findings]
    assert len(set(keys)) == len(keys)  # no rule repeats per rank within a phase
    found = _found(doc, "cpu_overhead")
    assert found and all(f.evidence["ranks"] == "0,1" and f.rank is None for f in found)
    for f in found:
        assert f.evidence["phases"] == f.phase and f.evidence["instances"] == 2
        by_phase = {s.index for r in doc.ranks for s in r.steps if s.phase == f.phase}
        assert f.steps and set(f.steps) <= by_phase


# ---------------------------------------------------------------------------------------------------------
# rank_imbalance
# ---------------------------------------------------------------------------------------------------------

def _step_ratio(paths: list[Path], phase: str) -> float:
    means = [statistics.mean(hi - lo for p, lo, hi in _steps(path) if p == phase) for path in paths]
    return max(means) / min(means)


@pytest.mark.needs_shared
def test_rank_imbalance_fires_on_the_uneven_shared_tp2_run_and_not_on_the_example(tmp_path: Path) -> None:
    ranks = sorted((TRACES / "vllm-cpu").glob("tp2_b4_16tok_rank*.pt.trace.json.gz"))
    for r in ranks:
        shutil.copy(r, tmp_path / r.name)
    ratio = _step_ratio(ranks, "decode")
    assert ratio >= RULES["rank_imbalance"]["medium"]
    (f,) = _found(analyze(AnalyzeRequest(paths=[tmp_path])), "rank_imbalance")
    assert f.phase == "decode" and f.evidence["ratio"] == pytest.approx(ratio, rel=0.02)
    example = [EXAMPLE_TP2 / "rank0.pt.trace.json.gz", EXAMPLE_TP2 / "rank1.pt.trace.json.gz"]
    expected = any(_step_ratio(example, p) >= RULES["rank_imbalance"]["medium"] for p in ("decode", "prefill"))
    assert bool([f for f in _found(_doc(EXAMPLE_TP2), "rank_imbalance") if f.phase in ("decode", "prefill")]) == (
        expected)


# ---------------------------------------------------------------------------------------------------------
# cast_bound / host_transfer / unfused_elementwise
# ---------------------------------------------------------------------------------------------------------

# A dtype conversion: PyTorch's typed copy kernels (float -> bf16 ...) and its dynamic-cast copy paths. Its
# vectorized / _nocast copy paths copy within one dtype (layout copies), and memcpy is a transfer.
_CAST = re.compile(r"(bfloat16|float16|half|float8\w*|float)_copy_kernel|LoadWithCast|StoreWithCast", re.I)
_DYN_COPY = re.compile(r"direct_copy_kernel")


def _is_cast(e: dict[str, Any]) -> bool:
    name = e["name"]
    if e["cat"] != "kernel" or name.startswith("triton_"):
        return False
    return bool(_CAST.search(name)) or (bool(_DYN_COPY.search(name)) and "nocast" not in name
                                        and "vectorized_elementwise_kernel" not in name)


@pytest.mark.parametrize("path", [H100_QWEN, HF_QWEN, HTA_A100, EAGER_TRACES[0], LLAMA_TP4],
                         ids=lambda p: p.name[:40])
def test_cast_bound_counts_real_dtype_conversions_only(path: Path) -> None:
    share = _share(path, _is_cast)
    found = _found(_doc(path), "cast_bound")
    assert bool(found) == (share >= RULES["cast_bound"]["medium"]), share
    if found:
        assert found[0].evidence["cast_share"] == pytest.approx(share, abs=1e-4)
        casts: dict[str, float] = defaultdict(float)
        for e in _device(path):
            if _is_cast(e):
                casts[e["name"]] += e["dur"]
        top = max(casts, key=lambda n: casts[n])
        assert str(found[0].evidence["top_cast"]) == shorten_kernel_name(top, max_chars=100)  # shown short
        assert "Memcpy" not in str(found[0].evidence["top_cast"])


@pytest.mark.needs_shared
def test_cast_bound_fires_on_hf_qwen_h100() -> None:
    assert _share(H100_QWEN, _is_cast) >= RULES["cast_bound"]["medium"]
    assert _found(_doc(H100_QWEN), "cast_bound")


_HOST_COPY = re.compile(r"HtoD|DtoH|Pinned|Pageable")


@pytest.mark.needs_shared
@pytest.mark.parametrize("path", [HTA_A100, EAGER_TRACES[0], LLAMA_TP4], ids=lambda p: p.name[:40])
def test_host_transfer_is_its_own_finding(path: Path) -> None:
    share = _share(path, lambda e: e["cat"] == "gpu_memcpy" and bool(_HOST_COPY.search(e["name"])))
    found = _found(_doc(path), "host_transfer")
    assert bool(found) == (share >= RULES["host_transfer"]["medium"]), share
    if found:
        assert found[0].evidence["host_transfer_share"] == pytest.approx(share, abs=1e-4)
        assert "Memcpy" in str(found[0].evidence["top_transfer"])
    assert path != HTA_A100 or found  # the A100 training trace copies its batches every step


_ATEN_POINTWISE = re.compile(r"^(void )?at::native::.*(elementwise_kernel|reduce_kernel)")


def _unfused_share(path: Path) -> float:
    return _share(path, lambda e: e["cat"] == "kernel" and bool(_ATEN_POINTWISE.search(e["name"]))
                  and "index" not in e["name"] and not _is_cast(e))


def _compiled_share(path: Path) -> float:
    return _share(path, lambda e: bool(re.match(r"triton_(poi|red|per)_fused", e["name"])))


@pytest.mark.parametrize("path", [HF_QWEN, H100_QWEN, EAGER_TRACES[0], GRAPH_TRACES[0]], ids=lambda p: p.name[:40])
def test_unfused_elementwise_fires_on_eager_pytorch_pointwise_kernels(path: Path) -> None:
    assert _unfused_share(path) >= RULES["unfused_elementwise"]["medium"] + 0.05
    assert _compiled_share(path) == 0
    (f,) = _found(_doc(path), "unfused_elementwise")
    assert "torch.compile" in f.message


@pytest.mark.parametrize("path", [LLAMA_TP4, VLLM_REPLAY, SGLANG_REPLAY], ids=lambda p: p.name[:40])
def test_unfused_elementwise_silent_where_the_pointwise_work_is_compiled_or_fused(path: Path) -> None:
    assert _unfused_share(path) < RULES["unfused_elementwise"]["medium"]
    assert _found(_doc(path), "unfused_elementwise") == []


@pytest.mark.needs_shared
def test_unfused_elementwise_does_not_offer_torch_compile_to_a_compiled_run() -> None:
    assert _compiled_share(LLAMA_TP4) > 0.02
    data = _lowered("unfused_elementwise", 1e-4)
    data["conditions"]["mostly_fused"]["at_least"] = 2.0  # never: show the advice that would be given
    data["conditions"]["many_unfused_calls"]["at_least"] = 0
    (f,) = [f for f in _refind(_doc(LLAMA_TP4), data) if f.id == "unfused_elementwise"]
    assert "torch.compile" not in f.message


# ---------------------------------------------------------------------------------------------------------
# attention_heavy
# ---------------------------------------------------------------------------------------------------------

_ATTN = re.compile(r"(?i)attn|attention|flash|fmha|sdpa")


@pytest.mark.needs_shared
def test_attention_heavy_fires_where_attention_crosses_its_threshold() -> None:
    shares = {p: _share(p, lambda e: e["cat"] == "kernel" and bool(_ATTN.search(e["name"])))
              for p in (SGLANG_REPLAY, LLAMA_TP4, HF_QWEN)}
    for path, share in shares.items():
        assert bool(_found(_doc(path), "attention_heavy")) == (share >= RULES["attention_heavy"]["medium"])
    data = _lowered("attention_heavy", 0.15)
    for path, share in shares.items():
        assert bool([f for f in _refind(_doc(path), data) if f.id == "attention_heavy"]) == (share >= 0.15), path


# ---------------------------------------------------------------------------------------------------------
# unclassified_time
# ---------------------------------------------------------------------------------------------------------

_CAPTURE = """
import sys, time
import torch
from torch.profiler import ProfilerActivity, profile

def mystery(x):
    time.sleep(0.003)
    return x.clone()

mystery.__annotations__ = {"x": torch.Tensor, "return": torch.Tensor}
torch.library.custom_op("servescope_test::mystery_op", mutates_args=())(mystery)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(4):
        x = torch.randn(128, 128)
        torch.ops.servescope_test.mystery_op(x @ x)
prof.export_chrome_trace(sys.argv[1])
"""


def _capture_unknown_op(path: Path) -> None:
    """A real torch.profiler CPU capture (its own process) whose main work is an op no taxonomy knows."""
    pytest.importorskip("torch")
    subprocess.run([sys.executable, "-c", _CAPTURE, str(path)], check=True, cwd=path.parent, capture_output=True)


@pytest.fixture(scope="module")
def unknown_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("unknown") / "rank0.pt.trace.json"
    _capture_unknown_op(path)
    return path


def test_unclassified_time_names_the_op_and_the_taxonomy_rule_that_files_it(unknown_trace: Path,
                                                                             tmp_path: Path) -> None:
    ops = _self_times(unknown_trace)
    share = sum(t for n, _, t in ops if n == "servescope_test::mystery_op") / sum(t for _, _, t in ops)
    assert share >= RULES["unclassified_time"]["medium"]
    doc = analyze(AnalyzeRequest(paths=[unknown_trace]))
    (f,) = _found(doc, "unclassified_time")
    assert "servescope_test::mystery_op" in f.message
    snippet = f.message.split("e.g.:\n", 1)[1]
    (tmp_path / "mine.toml").write_text(snippet)
    filed = analyze(AnalyzeRequest(paths=[unknown_trace], taxonomy=tmp_path / "mine.toml"))
    assert _found(filed, "unclassified_time") == []
    assert {k.category for k in filed.kernels if k.name == "servescope_test::mystery_op"} != {"other"}


@pytest.mark.needs_shared
@pytest.mark.parametrize("name", ["vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz",
                                  "hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz"])
def test_unclassified_time_silent_where_the_independent_labels_file_everything(name: str) -> None:
    import json

    labels = json.loads((TRACES / "public" / "labels.json").read_text())["traces"][name]
    assert labels["category_share"].get("other", 0.0) < RULES["unclassified_time"]["medium"]
    assert _found(_doc(TRACES / "public" / name), "unclassified_time") == []


@pytest.mark.needs_shared
def test_compiled_kernels_mean_graphs_expected_only_for_an_engine_that_captures_them() -> None:
    """xDiT's SD3.5 run (torch.profiler's ProfilerStep marks its steps) is compiled (Inductor's triton kernels, by
    plain json.load) and replays no graph: nothing says it ever captured one, so graphs are "off" and no advice to
    raise vLLM's capture size fires (it once said "a step of 77 tokens is above the largest captured size"). A vLLM
    trace that compiles and replays none keeps the capture-size advice: tests/trace/test_advice_ab.py."""
    names = [e["name"] for e in _events(XDIT)]
    assert any(re.match(r"triton_(poi|red|per)_fused", n) for n in names)
    assert not any(n in ("cudaGraphLaunch", "hipGraphLaunch") for n in names)
    assert not any(n.startswith("execute_context_") or n.startswith("step[") for n in names)
    doc = _doc(XDIT)
    graphs = doc.deployment["cuda_graphs"]
    assert graphs.value == "off" and graphs.source == "trace" and "compiled kernels" in graphs.detail
    assert "max_cudagraph_capture_size" not in doc.deployment
    texts = [a.text for f in doc.findings for a in f.advice]
    assert not [t for t in texts if "--max-cudagraph-capture-size" in t]
    assert [t for t in texts if t.startswith("CUDA graphs")]  # the host-bound steps still hear of graphs



# ---------------------------------------------------------------------------------------------------------
# graph_capture
# ---------------------------------------------------------------------------------------------------------

CAPTURES = [TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_capture_bs32.json.gz",
            TRACES / "tracelens" / "vllm_decode_full_graph_capture_rank0.pt.trace.json.gz"]


def _captured_by_hand(path: Path) -> tuple[int, int, int]:
    """(stream captures, kernel launches inside them, kernels run), by plain json.load: the runtime calls in time
    order, a window per thread from *StreamBeginCapture to *StreamEndCapture."""
    events = _events(path)
    runtime = sorted((e for e in events if e.get("cat") in _RUNTIME), key=lambda e: float(e["ts"]))
    capturing: dict[Any, bool] = {}
    captures = launched = 0
    for e in runtime:
        if e["name"].endswith("StreamBeginCapture"):
            capturing[e["tid"]] = True
            captures += 1
        elif e["name"].endswith("StreamEndCapture"):
            capturing[e["tid"]] = False
        elif "LaunchKernel" in e["name"] and capturing.get(e["tid"]):
            launched += 1
    return captures, launched, sum(1 for e in events if e.get("cat") == "kernel")


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name.split(".")[0])
def test_a_graph_capture_trace_says_so_and_judges_no_step(path: Path) -> None:
    """TraceLens' capture traces (SGLang at batch 32, vLLM's full-graph decode) record the capture of a graph: its
    launches ran nowhere, so the headline names the capture, not the few kernels that did run."""
    captures, launched, run = _captured_by_hand(path)
    assert captures >= 1 and launched > run  # the trace is mostly capture
    doc = _doc(path)
    (f,) = _found(doc, "graph_capture")
    assert (f.evidence["graph_captures"], f.evidence["captured_launches"], f.evidence["kernels_run"]) == (
        captures, launched, run)
    assert f.severity == "high" and f"{launched} kernel launches" in f.message
    assert doc.verdicts and all(v.finding == "graph_capture" and "graph capture" in v.sentence for v in doc.verdicts)


@pytest.mark.parametrize("path", [TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz", VLLM_REPLAY,
                                  example_trace_dir() / "rank0.pt.trace.json.gz"], ids=lambda p: p.name.split(".")[0])
def test_replays_and_served_steps_are_no_graph_capture(path: Path) -> None:
    captures, _, _ = _captured_by_hand(path)
    doc = _doc(path)
    assert _found(doc, "graph_capture") == [] and captures == 0
    assert all(v.finding != "graph_capture" for v in doc.verdicts)


@pytest.mark.needs_shared
def test_an_engines_step_marks_rule_graph_capture_out(tmp_path: Path) -> None:
    """The SGLang capture trace with one vLLM step annotation laid over the whole of it (a trace whose engine marks
    its served steps, start-up capture beside them): the steps are the engine's, so no graph_capture finding."""
    path = CAPTURES[0]
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    timed = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    launch = next(e for e in timed if e.get("cat") in _RUNTIME and "LaunchKernel" in e["name"])
    start = min(float(e["ts"]) for e in timed)
    end = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)",
                                 "pid": launch["pid"], "tid": launch["tid"], "ts": start, "dur": end - start})
    marked = tmp_path / "marked.pt.trace.json.gz"
    with gzip.open(marked, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    doc = _doc(marked)
    assert [r.step_source for r in doc.ranks] == ["annotation"]
    assert _found(doc, "graph_capture") == [] and _found(_doc(path), "graph_capture")
