"""Classification by evidence on real traces: what launched a kernel decides before its name does.

Expected values come from the traces read with plain ``json.load`` (which op launched what, which collective a
wait follows), never from servescope's output.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from servescope.core.analysis import BASES
from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.classify.taxonomy import load_taxonomy
from tracefiles import ROOT, TRACES, load_events

FALLBACK = ROOT / "tests" / "data" / "vllm-cpu-fallback"
REPLAY = TRACES / "tracelens" / "vllm_decode_full_graph_replay.json.gz"
CAPTURE = TRACES / "tracelens" / "vllm_decode_full_graph_capture_rank0.pt.trace.json.gz"
HF_EAGER = TRACES / "public" / "hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz"


def _self_times(events: list[dict]) -> dict[int, float]:
    """Self time of every cpu_op (its duration less its direct children's on the thread), by event index."""
    by_thread: dict[tuple, list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            by_thread[(e["pid"], e["tid"])].append(i)
    out: dict[int, float] = {}
    for rows in by_thread.values():
        rows.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack: list[int] = []
        for i in rows:
            e = events[i]
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= e["ts"]:
                stack.pop()
            out[i] = float(e["dur"])
            if stack:
                out[stack[-1]] -= float(e["dur"])
            stack.append(i)
    return {i: max(v, 0.0) for i, v in out.items()}


def test_a_wait_on_a_functional_collective_is_that_collectives_time() -> None:
    """vLLM's CPU shm communicator fell back to torch.distributed (this capture's server log says so): each
    all-reduce is `_c10d_functional::all_reduce_` then `_c10d_functional::wait_tensor`, where the rank waits."""
    for rank in (0, 1):
        events = load_events(FALLBACK / f"rank{rank}.pt.trace.json.gz")
        self_us = _self_times(events)
        ops = sorted((i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                     key=lambda i: events[i]["ts"])
        waited: Counter[str] = Counter()
        wait_us = 0.0
        last: dict[tuple, str] = {}
        for i in ops:
            e = events[i]
            thread = (e["pid"], e["tid"])
            if e["name"].startswith("_c10d_functional::") and e["name"] != "_c10d_functional::wait_tensor":
                last[thread] = e["name"]
            elif e["name"] == "_c10d_functional::wait_tensor":
                waited[last.get(thread, "")] += 1
                wait_us += self_us[i]
        assert set(waited) == {"_c10d_functional::all_reduce_"} and wait_us > 0
        doc = analyze(AnalyzeRequest(paths=[FALLBACK / f"rank{rank}.pt.trace.json.gz"]))
        rows = [k for k in doc.kernels if k.name == "_c10d_functional::wait_tensor"]
        assert {(k.category, k.basis) for k in rows} == {("comm.all_reduce", "op")}
        assert sum(k.total_us for k in rows) == pytest.approx(wait_us, rel=1e-6)
        assert sum(k.count for k in rows) == sum(waited.values())


def test_the_fallback_is_named_and_the_fix_offered() -> None:
    doc = analyze(AnalyzeRequest(paths=[FALLBACK]))
    comm = [f for f in doc.findings if f.id == "communication_bound"]
    assert comm and len({f.phase for f in comm}) == len(comm)  # one per phase it holds in
    for f in comm:
        assert "VLLM_CPU_OMP_THREADS_BIND" in f.message and "torch.distributed" in f.message


@pytest.mark.needs_shared
def test_a_capture_beside_its_replay_lends_it_the_launching_ops() -> None:
    capture_events = load_events(CAPTURE)
    named = Counter(e["args"]["kernel"] for e in capture_events
                    if e.get("ph") == "X" and "kernel" in e.get("args", {}) and e.get("cat", "").endswith("runtime"))
    replay_events = load_events(REPLAY)
    kernels = [e for e in replay_events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    device_names = {e["name"] for e in replay_events
                    if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    in_capture = sum(e["dur"] for e in kernels if e["name"] in named) / sum(e["dur"] for e in kernels)
    assert in_capture > 0.9  # the capture launched (almost) every kernel the replay runs
    doc = analyze(AnalyzeRequest(paths=[REPLAY, CAPTURE]))
    assert [t.role for t in doc.traces] == ["worker", "capture"]
    assert len(doc.ranks) == 1
    share = doc.ranks[0].basis_share
    assert share.get("graph", 0.0) >= in_capture - 0.05
    assert {k.name for k in doc.kernels} == device_names
    assert all(k.launch_op for k in doc.kernels if k.basis == "graph")
    # without the capture the same kernels are decided by their names
    alone = analyze(AnalyzeRequest(paths=[REPLAY]))
    assert alone.ranks[0].basis_share.get("graph", 0.0) == 0.0


@pytest.mark.needs_shared
def test_decomposed_norm_is_norm_by_the_module_that_launched_it() -> None:
    """HF eager RMSNorm runs as aten::pow / mean / add / rsqrt / mul inside `nn.Module: Qwen2RMSNorm_*`."""
    doc = analyze(AnalyzeRequest(paths=[HF_EAGER]))
    norm_ops = [k for k in doc.kernels if k.basis == "op" and k.launch_op and "RMSNorm" in k.launch_op]
    assert norm_ops and {k.category for k in norm_ops} == {"norm"}
    assert sum(doc.ranks[0].basis_share.values()) == pytest.approx(1.0)
    assert set(doc.ranks[0].basis_share) <= set(BASES)


def test_a_user_launch_rule_decides_before_the_bundled_ones(tmp_path: Path) -> None:
    rules = tmp_path / "mine.toml"
    rules.write_text('[[launch]]\ncategory = "sampling"\nregex = ["^_c10d_functional::wait_tensor$"]\n'
                     'kinds = ["cpu_op"]\n', encoding="utf-8")
    doc = analyze(AnalyzeRequest(paths=[FALLBACK / "rank0.pt.trace.json.gz"], taxonomy=rules))
    rows = [k for k in doc.kernels if k.name == "_c10d_functional::wait_tensor"]
    assert {k.category for k in rows} == {"sampling"}


@pytest.mark.parametrize(("text", "problem"), [
    ('[[launch]]\ncategory = "gemm"\nregex = ["x"]\nkinds = ["kernel"]\n', "launch 1: kinds"),
    ('[[launch]]\ncategory = "gemm"\nregex = ["x"]\ninherit = "nope"\n', "launch 1: inherit"),
    ('[[sequence]]\ncategory = "norm"\nregex = ["("]\n', "sequence 1: bad regex"),
    ('[[launch]]\ncategory = "gemm"\nregex = ["x"]\nrefines = "nope"\n', "launch 1: refines"),
])
def test_bad_launch_and_sequence_rules_are_one_line_naming_the_rule(tmp_path: Path, text: str,
                                                                      problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_taxonomy(path)
    assert str(path) in str(err.value) and problem in str(err.value)
