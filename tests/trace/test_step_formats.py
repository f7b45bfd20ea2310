"""Step and rank-name formats are data (``servescope/data/steps.toml``): every entry is run on the real trace it
names, and what it finds there is checked against a plain ``json.load`` of that trace (its marked events counted
and parsed by the test's own reading), never against the analyzer's output."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.classify.work import select_work
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.steps.find import find_steps, steps_by
from servescope.trace.steps.formats import StepFormat, step_formats
from servescope.trace.steps.ranks import is_frontend, rank_from_name
from tracefiles import ROOT, SHARED, load_events

FORMATS = step_formats()


def _path(trace: str) -> Path:
    """An entry's ``trace``: ``../shared/…`` is the corpus beside the checkout, else a path in the repository."""
    return SHARED / trace.removeprefix("../shared/") if trace.startswith("../shared/") else ROOT / trace


def _cpu_annotations(path: Path) -> list[dict[str, Any]]:
    return [e for e in load_events(path) if e.get("ph") == "X" and e.get("cat") == "user_annotation"]


def test_every_entry_names_its_source_examples_and_a_real_trace() -> None:
    entries = [*FORMATS.steps, *FORMATS.rank_names, *FORMATS.frontends]
    assert len({e.id for e in entries}) == len(entries)
    for entry in entries:
        assert entry.source and entry.examples and entry.trace, entry.id
        assert (_path(entry.trace).exists() or not SHARED.is_dir()), entry.id


@pytest.mark.parametrize("fmt", FORMATS.steps, ids=lambda f: f.id)
def test_a_step_format_marks_its_examples(fmt: StepFormat) -> None:
    for example in fmt.examples:
        assert fmt.parse(example) is not None, example


@pytest.mark.parametrize(("fmt", "path"), [(f, _path(f.trace)) for f in FORMATS.steps],
                         ids=[f.id for f in FORMATS.steps])
def test_a_step_format_marks_the_steps_of_its_real_trace(fmt: StepFormat, path: Path) -> None:
    """The entry alone, on its trace: one step per range it marks, each holding the work launched inside it."""
    data = decode_trace(path)
    steps = steps_by(data, select_work(data), fmt)
    assert steps is not None and steps.steps
    assert steps.source == fmt.step_source
    assert all(fmt.pattern.search(s.name) for s in steps.steps)
    assert (steps.step_of >= 0).any()


def _vllm_counts(name: str) -> tuple[int, int | None, int, int | None]:
    """The test's own reading of vLLM's step name: the two request counts and, of each token count, its
    leading number (after newer vLLM's ``sq``)."""
    (x, y), (z, w) = re.findall(r"_(\d+)\(([^)]*)\)", name)

    def lead(text: str) -> int | None:
        digits = re.match(r"(?:sq)?(\d+)", text)
        return int(digits.group(1)) if digits else None

    return int(x), lead(y), int(z), lead(w)


@pytest.mark.parametrize("path", [ROOT / FORMATS.step("vllm").trace,
                                  SHARED / "traces/tracelens/vllm_decode_full_graph_replay.json.gz",
                                  SHARED / "traces/vllm-cpu/tp2_b4_16tok_rank0.pt.trace.json.gz"],
                         ids=lambda p: p.name)
def test_vllm_steps_are_its_annotations_with_their_request_mix(path: Path) -> None:
    marked = sorted((e for e in _cpu_annotations(path) if e["name"].startswith("execute_")), key=lambda e: e["ts"])
    data = decode_trace(path)
    steps = find_steps(data, select_work(data))
    assert steps.source == "annotation"
    assert [s.name for s in steps.steps] == [e["name"] for e in marked]
    for step, event in zip(steps.steps, marked, strict=True):
        x, y, z, w = _vllm_counts(event["name"])
        assert (step.prefill_requests, step.prefill_tokens, step.decode_requests, step.decode_tokens) == (x, y, z, w)
        assert step.phase == ("mixed" if x and z else "prefill" if x else "decode" if z else "empty")


@pytest.mark.needs_shared
def test_sglang_step_marks_its_mode_and_batch_on_the_real_sglang_trace() -> None:
    """SGLang writes both marks on this trace; vLLM's form comes first in the file and holds SGLang's step (the
    batch's preparation and sampling around it too)."""
    path = _path(FORMATS.step("sglang").trace)
    (marked,) = [e for e in _cpu_annotations(path) if e["name"].startswith("step[")]
    mode, batch = re.match(r"step\[(\w+) bs=(\d+)\]", marked["name"]).groups()  # type: ignore[union-attr]
    data = decode_trace(path)
    work = select_work(data)
    sglang = steps_by(data, work, FORMATS.step("sglang"))
    assert sglang is not None
    (step,) = sglang.steps
    assert (mode, step.phase, step.decode_requests, step.prefill_requests) == ("DECODE", "decode", int(batch), None)
    chosen = find_steps(data, work)
    assert chosen.steps[0].name.startswith("execute_")
    assert ((sglang.step_of >= 0) <= (chosen.step_of >= 0)).all() and (sglang.step_of >= 0).sum() > 0


@pytest.mark.needs_shared
def test_execute_model_frames_are_the_steps_where_vllm_wrote_no_annotation() -> None:
    """The Llama TP=4 trace's independent labels: 10 steps, 1 prefill and 9 decode (11 frames, one empty)."""
    fmt = FORMATS.step("vllm-execute-model")
    path = _path(fmt.trace)
    labels = json.loads((path.parent / "labels.json").read_text())["traces"][path.name]["expected_steps"]
    assert not [e for e in _cpu_annotations(path) if e["name"].startswith("execute_")]
    doc = analyze(AnalyzeRequest(paths=[path]))
    rank = doc.ranks[0]
    assert rank.step_source == "execute_model"
    assert len(rank.steps) == labels["steps"]
    assert {p: sum(s.phase == p for s in rank.steps) for p in labels["phases"]} == labels["phases"]


@pytest.mark.needs_shared
def test_profiler_step_ranges_are_the_steps_of_a_scheduled_training_trace() -> None:
    fmt = FORMATS.step("profiler-step")
    path = _path(fmt.trace)
    marked = sorted(e["name"] for e in load_events(path) if e.get("ph") == "X"
                    and str(e.get("name", "")).startswith("ProfilerStep#"))
    data = decode_trace(path)
    steps = find_steps(data, select_work(data))
    assert steps.source == "profiler_step"
    assert sorted(s.name for s in steps.steps) == marked


@pytest.mark.needs_shared
def test_xdit_marks_its_request_where_no_profiler_schedule_marked_steps(tmp_path: Path) -> None:
    """The new engine, as data only: xDiT's ``execute_diffusion_…`` range on the real SD3.5 trace. There a
    ProfilerStep range holds the same request and, first in the file, decides (the stored documents stand); the
    same trace without that range (a capture made without torch.profiler's schedule) takes xDiT's own mark."""
    fmt = FORMATS.step("xdit-diffusion")
    path = _path(fmt.trace)
    doc = json.loads(gzip.open(path).read())
    (marked,) = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
                 and e["name"].startswith("execute_diffusion_")]
    kernels = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                              "gpu_memset"))
    assert analyze(AnalyzeRequest(paths=[path])).ranks[0].step_source == "profiler_step"
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    unscheduled = tmp_path / path.name
    unscheduled.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=1))
    rank = analyze(AnalyzeRequest(paths=[unscheduled])).ranks[0]
    assert rank.step_source == "annotation"
    (step,) = rank.steps
    assert step.name == marked["name"]
    assert rank.unattributed_us == 0.0
    assert sum(c.calls_per_step for p in rank.phases.values() for c in p.categories.values()) == kernels


@pytest.mark.needs_shared
def test_rank_names_agree_with_the_ranks_real_traces_state() -> None:
    for fmt in FORMATS.rank_names:
        for example in fmt.examples:
            assert fmt.pattern.search(example), example
    for name in ("hta/a100_8rank_rank3_nccl.json.gz", "vllm-cpu/tp2_b4_16tok_rank1.pt.trace.json.gz"):
        path = SHARED / "traces" / name
        assert rank_from_name(path.name) == (decode_trace(path).distributed or {})["rank"]


@pytest.mark.needs_shared
def test_an_sglang_file_name_gives_the_rank_of_a_trace_that_states_none(tmp_path: Path) -> None:
    """A real trace without distributedInfo, under SGLang's file name for tensor-parallel rank 3."""
    source = SHARED / "traces/public/hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz"
    assert "distributedInfo" not in json.loads(gzip.open(source).read())
    renamed = tmp_path / FORMATS.rank_names[1].examples[0]
    shutil.copy(source, renamed)
    (trace,) = analyze(AnalyzeRequest(paths=[renamed])).traces
    assert (trace.rank, trace.rank_source) == (3, "filename")


@pytest.mark.needs_shared
def test_vllm_front_end_trace_is_told_by_its_name() -> None:
    (fmt,) = FORMATS.frontends
    path = _path(fmt.trace)
    assert is_frontend(path) and all(fmt.contains in e for e in fmt.examples)
    assert not [e for e in load_events(path) if e.get("cat") in ("kernel", "cpu_op", "user_annotation")]
