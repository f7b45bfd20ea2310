"""Real vLLM 0.26 decode captures from the lent H200, checked against vLLM's own numbers.

Each folder of ``tests/data/h200-vllm/`` is one ``servescope profile`` window on a real server
(``tools/gpu_vllm/device_session.sh``): the worker's trace, the front end's trace, and
``profiler_out_0.txt``, the table vLLM's worker printed from the *live* torch profiler at
``/stop_profile`` (``key_averages().table(sort_by="self_cuda_time_total")``: 100 rows, names cut at 55
characters). That table is parsed here, independently of servescope, and taken as the truth for every
kernel it lists; the step annotations are read from the trace with plain ``json``.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from servescope.core.analysis import AnalysisDoc
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-vllm"
CAPTURES = sorted(p for p in DATA.iterdir() if (p / "profiler_out_0.txt").is_file()) if DATA.is_dir() else []
# the A/B pairs (issue 22): servers that differ in one setting, windows from step 20 (some still admitting at 64)
AB = (sorted(p for p in (DATA / "ab").iterdir() if (p / "profiler_out_0.txt").is_file())
      if (DATA / "ab").is_dir() else [])
# the steady windows (issue 24, plan --calibrate pairs): engine steps 64..75, python frames removed on collection
STEADY = sorted(p for p in DATA.glob("steady/*/*") if (p / "profiler_out_0.txt").is_file())
# windows from the first engine step with python stacks on (plan word `admit`): prefill, mixed and decode steps
# the same payload on a lent H100 (2026-12-05): bf16 and fp8 pairs (w4; w5 and w6 with timed batches), an async batch
# sweep, long context; stacks off
H100 = sorted(p.parent for p in (DATA.parent / "h100-vllm").glob("*/**/rank0.pt.trace.json.gz")
              if (p.parent / "profiler_out_0.txt").is_file())
ADMISSION = [p for p in CAPTURES if "-admit-" in p.name]
DECODE = [p for p in CAPTURES if p not in ADMISSION]
NAME_WIDTH = 55  # torch's key_averages table: longer names are cut to 52 characters + "..."
REL = 0.005
_UNITS = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}
_TIME = re.compile(r"^(-?[0-9.]+)(s|ms|us|ns)$")


def _us(text: str) -> float:
    m = _TIME.match(text.strip())
    assert m, f"not a time: {text!r}"
    return float(m.group(1)) * _UNITS[m.group(2)]


def _cut(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."


class Table:
    """``profiler_out_0.txt``: its rows (name, self CUDA µs, calls) and the 'Self CUDA time total' line."""

    def __init__(self, text: str) -> None:
        lines = text.splitlines()
        rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
        width = len(lines[rule].split("  ")[0])  # the name column; the others are single tokens
        header = re.split(r"\s{2,}", lines[rule + 1][width:].strip())
        col = {h: i for i, h in enumerate(header)}
        self.rows: list[tuple[str, float, float, int]] = []  # name, self cpu, self cuda, calls
        for line in lines[rule + 3:]:
            if line.startswith("---"):
                break
            cells = line[width:].split()
            assert len(cells) == len(header), line
            self.rows.append((line[:width].strip(), _us(cells[col["Self CPU"]]), _us(cells[col["Self CUDA"]]),
                              int(cells[col["# of Calls"]])))
        totals = {m.group(1): _us(m.group(2)) for m in re.finditer(r"^Self (\w+) time total: (\S+)$", text, re.M)}
        self.self_cuda_total_us = totals["CUDA"]


@cache
def _table(capture: Path) -> Table:
    return Table((capture / "profiler_out_0.txt").read_text())


@cache
def _doc(capture: Path) -> AnalysisDoc:
    return analyze(AnalyzeRequest(paths=[capture]))


@cache
def _annotations(capture: Path) -> list[tuple[str, float, float]]:
    """vLLM's step annotations on the GPU timeline (name, ts, dur), in time order, by plain json."""
    with gzip.open(capture / "rank0.pt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    out = [(e["name"], float(e["ts"]), float(e["dur"])) for e in events
           if e.get("cat") == "gpu_user_annotation" and e.get("name", "").startswith("execute_")]
    return sorted(out, key=lambda a: a[1])


def _provenance(capture: Path) -> dict[str, object]:
    return json.loads((capture / "provenance.json").read_text())  # type: ignore[no-any-return]


def _ids(p: Path) -> str:
    return p.relative_to(DATA.parent).as_posix()


def test_the_captures_are_here() -> None:
    names = {p.name for p in CAPTURES}
    for must in ("dense-graphs-b1", "dense-graphs-b16", "dense-graphs-b64", "moe-graphs-b16", "dense-admit-b16",
                 "moe-admit-b64"):
        assert must in names, f"{must} missing from {DATA}"
    total = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file())
    # the A/B pairs of issue 22 (11 MB, 5 of them with python stacks) took it from 8 to 19 MB, the steady windows of
    # issue 24 (20 captures, python frames removed: 3.9 MB; 15 MB with them) and one server's repeats (6, 1.2 MB) to
    # 23.9 MB, the five-run steady windows (8, stacks off, 1.7 MB) to 25.6 MB; a device call carries the tree beside
    # a payload part (64 MiB in all; `tools/gpu_vllm_run.py stage` sizes the parts to fit), so it stays bounded
    assert total < 27e6, f"{total / 1e6:.1f} MB of captures: keep the test data small (it travels to the device)"
    h100 = sum(f.stat().st_size for f in (DATA.parent / "h100-vllm").rglob("*") if f.is_file())
    assert len(H100) == 64 and h100 < 14.5e6, f"{h100 / 1e6:.1f} MB of H100 captures (64 windows, 13.8 MB)"
    for capture in CAPTURES:
        prov = _provenance(capture)
        assert str(prov["vllm_version"]).startswith("0.26"), capture
        assert prov["batch"] == int(capture.name.rsplit("-b", 1)[1])
        assert (capture / "rank0.pt.trace.json.gz").is_file()


@pytest.mark.parametrize("capture", CAPTURES + AB + STEADY + H100, ids=_ids)
def test_every_kernel_in_vllms_profiler_table(capture: Path) -> None:
    """Calls exact and self CUDA time within 0.5% for every device row of vLLM's own table."""
    table, doc = _table(capture), _doc(capture)
    by_name: dict[str, tuple[int, float]] = {}  # servescope splits a kernel's row by launch; the table by name
    for k in doc.kernels:
        count, total = by_name.get(k.name, (0, 0.0))
        by_name[k.name] = (count + k.count, total + k.total_us)
    ours: dict[str, list[tuple[int, float]]] = defaultdict(list)  # the table cuts names: same cut, several rows
    for name, row in by_name.items():
        ours[_cut(name)].append(row)
    device_rows = [(n, cuda, calls) for n, cpu, cuda, calls in table.rows if cuda > 0 and cpu == 0]
    assert len(device_rows) >= 20, "the table lists few device rows: not a decode window?"
    matched = 0
    for name, cuda, calls in device_rows:
        if name.startswith("execute_"):  # the step annotations' own device rows (checked below)
            continue
        candidates = ours.get(name, [])
        hit = next((c for c in candidates if c[0] == calls and c[1] == pytest.approx(cuda, rel=REL, abs=0.002)), None)
        assert hit is not None, f"{name}: table {calls} calls {cuda:.3f} us; servescope {candidates}"
        candidates.remove(hit)
        matched += 1
    # what the 100-row table left out can only be smaller than its smallest device row
    floor = min(cuda for _, _, cuda, _ in table.rows if cuda > 0)
    rest = [(n, c) for n, cs in ours.items() for c in cs]
    for name, (_count, total_us) in rest:
        assert total_us <= floor * (1 + REL) + 0.002, f"{name}: {total_us:.3f} us is not in the table (floor {floor})"
    # and the table's grand total covers all of them
    ours_total = sum(k.total_us for k in doc.kernels)
    assert ours_total == pytest.approx(table.self_cuda_total_us, rel=REL)  # the total line leaves the annotations out
    assert matched >= 20


@pytest.mark.parametrize("capture", CAPTURES + AB + H100, ids=_ids)
def test_each_step_equals_vllms_step_annotation(capture: Path) -> None:
    """Every execute_context_* step: servescope's device span equals the annotation's GPU-side duration."""
    doc = _doc(capture)
    rank = doc.ranks[0]
    assert rank.work_kind == "device" and rank.step_source == "annotation"
    gpu = _annotations(capture)
    steps = [s for s in rank.steps if s.name.startswith("execute_")]
    assert [s.name for s in steps] == [name for name, _, _ in gpu]
    for step, (name, _ts, dur) in zip(steps, gpu, strict=True):
        assert step.span_us == pytest.approx(dur, rel=REL, abs=1.0), name


@pytest.mark.parametrize("capture", DECODE, ids=_ids)
def test_the_window_is_decode_at_the_batch(capture: Path) -> None:
    """8 engine steps from the 20th after /start_profile: decode steps of all B requests (a late admission at
    most once)."""
    prov = _provenance(capture)
    rank = _doc(capture).ranks[0]
    decode = rank.phases["decode"]
    assert decode.steps >= 7 and len(rank.steps) == 8
    assert decode.tokens_per_step == prov["batch"]
    assert all(s.decode_requests == prov["batch"] for s in rank.steps if s.phase == "decode")


_RUNNER_CALL = re.compile(r"model_runner\.py\(\d+\): execute_model$")
_STEP = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\(\d+\)$")


@pytest.mark.parametrize("capture", ADMISSION, ids=_ids)
def test_steps_without_vllms_annotation_are_the_model_runners_calls(capture: Path, tmp_path: Path) -> None:
    """The same window with vLLM's execute_context annotations removed, as builds without them write it: the
    steps are the model runner's execute_model calls, and the decode steps are the ones vLLM marked decode.

    Truth, by plain json on the original trace: each annotation's prefill and decode request counts; each runner
    call's range, stretched to the end of the device work its runtime or driver calls launched (correlation ids)."""
    with gzip.open(capture / "rank0.pt.trace.json.gz", "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    marked = sorted((e["ts"], _STEP.match(e["name"])) for e in events
                    if e.get("cat") == "user_annotation" and _STEP.match(e.get("name", "")))
    decode_truth = [int(m.group(1)) == 0 for _ts, m in marked]  # no prefill request: a decode step
    calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "python_function" and _RUNNER_CALL.search(e.get("name", "")))
    assert len(calls) == len(marked) >= 12 and any(decode_truth) and not all(decode_truth)
    launched_at = {e["args"]["correlation"]: e["ts"] for e in events
                   if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ends = [end for _start, end in calls]
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            at = launched_at.get(e["args"].get("correlation"))
            for i, (start, end) in enumerate(calls):
                if at is not None and start <= at <= end:
                    ends[i] = max(ends[i], e["ts"] + e["dur"])
    spans = [end - start for (start, _), end in zip(calls, ends, strict=True)]

    trace["traceEvents"] = [e for e in events if not _STEP.match(str(e.get("name", "")))]
    stripped = tmp_path / "rank0.pt.trace.json"
    stripped.write_text(json.dumps(trace))
    rank = analyze(AnalyzeRequest(paths=[stripped])).ranks[0]
    assert rank.step_source == "execute_model"
    assert len(rank.steps) == len(calls)
    assert [s.phase == "decode" for s in rank.steps] == decode_truth
    assert {s.phase for s in rank.steps if s.phase != "decode"} == {"prefill"}  # prompt work: prefill or mixed
    for step, (start, _end), span in zip(rank.steps, calls, spans, strict=True):
        assert step.start_us == pytest.approx(start, abs=1.0)
        assert step.span_us == pytest.approx(span, rel=REL, abs=1.0)
    decode_spans = [span for span, is_decode in zip(spans, decode_truth, strict=True) if is_decode]
    assert rank.phases["decode"].step_us.mean == pytest.approx(sum(decode_spans) / len(decode_spans), rel=0.03)


@pytest.mark.parametrize("capture", ADMISSION, ids=_ids)
def test_the_admission_window_phases_are_vllms(capture: Path) -> None:
    """With the annotation: prefill, mixed and decode steps as vLLM counted their requests."""
    rank = _doc(capture).ranks[0]
    truth = []
    prompt_tokens: dict[str, list[int]] = defaultdict(list)
    for name, _ts, _dur in _annotations(capture):
        m = _STEP.match(name)
        assert m, name
        prefills, decodes = int(m.group(1)), int(m.group(3))
        phase = "mixed" if prefills and decodes else "prefill" if prefills else "decode"
        truth.append((prefills, decodes, phase))
        prompt_tokens[phase].append(int(m.group(2)))
    assert [(s.prefill_requests, s.decode_requests, s.phase) for s in rank.steps] == truth
    assert {"prefill", "decode"} <= {phase for _p, _d, phase in truth}
    for phase, tokens in prompt_tokens.items():  # the prompt tokens a step computed: none in a decode step
        expected = sum(tokens) / len(tokens) if phase != "decode" else None
        assert rank.phases[phase].prompt_tokens_per_step == expected, phase
