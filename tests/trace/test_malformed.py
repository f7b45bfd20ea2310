"""Malformed events in a real trace are left out, counted and named; the analysis goes on.

Each test mutates the project's own real vLLM capture (a few events made malformed), and checks against plain
``json`` what must be left out: the count, the kernels that remain, the position named.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.read.trace_json import decode_trace
from tracefiles import ROOT

CAPTURE = ROOT / "tests" / "data" / "h200-vllm" / "dense-graphs-b16" / "rank0.pt.trace.json.gz"


def _doc() -> dict[str, Any]:
    with gzip.open(CAPTURE, "rt", encoding="utf-8") as handle:
        loaded: dict[str, Any] = json.load(handle)
    return loaded


def _kernel_positions(doc: dict[str, Any]) -> list[int]:
    return [i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X" and e.get("cat") == "kernel"]


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("dur", None, "dur"),
    ("dur", "12", "dur"),
    ("ts", "1.5", "ts"),
    ("dur", -5.0, "negative duration"),
    ("ts", 1e20, "time out of range"),
])
def test_one_malformed_kernel_is_left_out_and_named(tmp_path: Path, field: str, value: Any, problem: str) -> None:
    doc = _doc()
    kernels = _kernel_positions(doc)
    at = kernels[len(kernels) // 2]
    doc["traceEvents"][at][field] = value
    path = _write(tmp_path, doc)
    data = decode_trace(path)
    assert data.malformed == 1
    assert problem in data.malformed_examples[0]
    if problem in ("dur", "ts"):  # a field of the wrong type: the event's position in traceEvents is named
        assert data.malformed_examples[0].startswith(f"event {at}:")
    kinds = {"kernel": 0}
    assert int((data.device.kind == kinds["kernel"]).sum()) == len(kernels) - 1
    result = analyze(AnalyzeRequest(paths=[path]))
    [trace] = [t for t in result.traces if t.role == "worker"]
    assert trace.malformed_events == 1 and trace.events == len(doc["traceEvents"])
    assert sum(k.count for k in result.kernels if k.kind == "kernel") == len(kernels) - 1


@pytest.mark.parametrize("category", ["cpu_op", "cuda_runtime", "user_annotation", "gpu_user_annotation",
                                      "gpu_memcpy"])
def test_a_negative_duration_is_left_out_and_counted_in_every_table(tmp_path: Path, category: str) -> None:
    """Like a null or string duration (above): one event left out, counted and named, whatever table it is in
    (an annotation's passed without a word)."""
    doc = _doc()
    events = doc["traceEvents"]
    positions = [i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") == category]
    at = positions[len(positions) // 2]
    events[at]["dur"] = -3.0
    name = events[at]["name"]
    data = decode_trace(_write(tmp_path, doc))
    assert data.malformed == 1 and len(data.malformed_examples) == 1
    assert f"{name!r}" in data.malformed_examples[0] and "negative duration (dur -3.0)" in data.malformed_examples[0]
    table, cats = {"cpu_op": (data.cpu_ops, {"cpu_op"}),
                   "cuda_runtime": (data.launches, {"cuda_runtime", "cuda_driver"}),
                   "user_annotation": (data.annotations, {"user_annotation", "gpu_user_annotation"}),
                   "gpu_user_annotation": (data.annotations, {"user_annotation", "gpu_user_annotation"}),
                   "gpu_memcpy": (data.device, {"kernel", "gpu_memcpy", "gpu_memset"})}[category]
    # the table holds every event of its categories named so but the one, counted with plain json (runtime
    # calls: those with a correlation id, the only ones the decoder keeps)
    expected = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in cats and e["name"] == name
                   and (category != "cuda_runtime" or (e.get("args") or {}).get("correlation") is not None))
    assert [data.names[n] for n in table.name.tolist()].count(name) == expected - 1
    assert min(table.dur_us.tolist()) >= 0


def test_the_same_events_are_left_out_when_the_trace_is_read_as_a_stream(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import servescope.trace.read.jsonscan as jsonscan

    doc = _doc()
    kernels = _kernel_positions(doc)
    for at in kernels[::400][:3]:
        doc["traceEvents"][at]["dur"] = None
    path = _write(tmp_path, doc)
    whole = decode_trace(path)
    monkeypatch.setattr(jsonscan, "_CHUNK_BYTES", 1 << 12)
    monkeypatch.setattr(jsonscan, "_WHOLE_LIMIT", 1 << 14)
    streamed = decode_trace(path)
    assert whole.malformed == streamed.malformed == 3
    assert whole.malformed_examples == streamed.malformed_examples
    assert whole.device.dur_us.tolist() == streamed.device.dur_us.tolist()


def test_more_than_the_stated_share_fails_the_trace(tmp_path: Path) -> None:
    from servescope.trace.read.collect import MALFORMED_SHARE

    doc = _doc()
    kernels = _kernel_positions(doc)
    bad = int(MALFORMED_SHARE * len(doc["traceEvents"])) + 2
    assert bad < len(kernels)
    for at in kernels[:bad]:
        doc["traceEvents"][at]["dur"] = "x"
    path = _write(tmp_path, doc)
    with pytest.raises(InputError) as err:
        decode_trace(path)
    assert str(path) in str(err.value) and f"{bad} of {len(doc['traceEvents'])} events malformed" in str(err.value)


def test_broken_json_is_still_one_error_not_a_skip(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(_doc())[:-5000], encoding="utf-8")
    with pytest.raises(InputError):
        decode_trace(path)
