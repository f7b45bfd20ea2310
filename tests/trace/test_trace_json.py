"""The reader keeps every device event, and every number matches a plain json.load + sum."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from servescope.trace.read.table import KIND_NAMES
from servescope.trace.read.trace_json import decode_trace
from tracefiles import TRACES, all_shared_traces, load_events

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _plain_device_totals(path: Path) -> dict[tuple[str, str], tuple[int, float]]:
    counts: Counter[tuple[str, str]] = Counter()
    totals: defaultdict[tuple[str, str], float] = defaultdict(float)
    for ev in load_events(path):
        if ev.get("ph") == "X" and ev.get("cat") in DEVICE_CATS:
            key = (ev["cat"], ev["name"])
            counts[key] += 1
            totals[key] += float(ev.get("dur", 0))
    return {k: (counts[k], totals[k]) for k in counts}


@pytest.mark.parametrize("path", all_shared_traces(), ids=lambda p: p.name)
def test_device_events_match_plain_json(path: Path) -> None:
    data = decode_trace(path)
    expected = _plain_device_totals(path)
    got_counts: Counter[tuple[str, str]] = Counter()
    got_totals: defaultdict[tuple[str, str], float] = defaultdict(float)
    table = data.device
    for kind, name, dur in zip(table.kind.tolist(), table.name.tolist(), table.dur_us.tolist(), strict=True):
        key = (KIND_NAMES[kind], data.names[name])
        got_counts[key] += 1
        got_totals[key] += dur
    assert set(got_counts) == set(expected)
    for key, (count, total) in expected.items():
        assert got_counts[key] == count, key
        assert got_totals[key] == pytest.approx(total, rel=1e-6, abs=1e-6), key


@pytest.mark.parametrize("path", all_shared_traces(), ids=lambda p: p.name)
def test_event_count_and_cpu_ops_match(path: Path) -> None:
    events = load_events(path)
    data = decode_trace(path)
    assert data.event_count == len(events)
    plain_cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert len(data.cpu_ops) == len(plain_cpu)
    # the step markers among them are marked, not dropped (steps decide what they mean)
    assert int(data.step_markers.sum()) == sum(e["name"].startswith("ProfilerStep#") for e in plain_cpu)
    assert float(data.cpu_ops.dur_us.sum()) == pytest.approx(sum(float(e["dur"]) for e in plain_cpu), rel=1e-9)
    # rows keep the trace's order, and each row's thread is its event's (pid, tid)
    assert [data.threads[t] for t in data.cpu_ops.thread.tolist()] == [(e["pid"], e["tid"]) for e in plain_cpu]
    plain_device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    assert [data.threads[t] for t in data.device.thread.tolist()] == [(e["pid"], e["tid"]) for e in plain_device]


@pytest.mark.needs_shared
def test_bare_list_form_reads_like_object_form(tmp_path: Path) -> None:
    source = all_shared_traces()[0].parent.parent / "tracelens" / "vllm_decode_full_graph_replay.json.gz"
    events = load_events(source)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    a, b = decode_trace(source), decode_trace(bare)
    assert len(a.device) == len(b.device) > 0
    assert float(a.device.dur_us.sum()) == pytest.approx(float(b.device.dur_us.sum()))
    assert [a.names[n] for n in a.annotations.name] == [b.names[n] for n in b.annotations.name]


@pytest.mark.needs_shared
def test_chunked_decoding_equals_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large traces are decoded in chunks; forcing tiny chunks must not change a single number."""
    import servescope.trace.read.jsonscan as reader

    path = all_shared_traces()[0].parent.parent / "hta" / "nccl_allreduce_2rank_rank0.json.gz"
    whole = decode_trace(path)
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 64 << 10)
    chunked = decode_trace(path)
    assert chunked.event_count == whole.event_count
    assert (chunked.device.dur_us == whole.device.dur_us).all()
    assert (chunked.launches.correlation == whole.launches.correlation).all()
    assert chunked.device.msg_bytes == whole.device.msg_bytes


def test_minified_trace_with_tricky_strings_falls_back_to_whole_decode(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import servescope.trace.read.jsonscan as reader

    events = [{"ph": "X", "cat": "kernel", "name": f"k}},{{{i}", "ts": float(i), "dur": 1.0,
               "args": {"correlation": i}} for i in range(4000)]
    path = tmp_path / "tricky.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}, separators=(",", ":")).encode()))
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 1 << 10)
    data = decode_trace(path)
    assert len(data.device) == 4000
    assert sorted(data.names) == sorted(e["name"] for e in events)


@pytest.mark.needs_shared
def test_collective_message_bytes_from_kineto_args() -> None:
    path = all_shared_traces()[0].parent.parent / "hta" / "nccl_allreduce_2rank_rank0.json.gz"
    width = {"Float": 4, "Long": 8}  # the element sizes of the two dtypes this trace records
    expected = [e["args"]["In msg nelems"] * width[e["args"]["dtype"]] for e in load_events(path)
                if e.get("cat") == "kernel" and "In msg nelems" in e.get("args", {})]
    data = decode_trace(path)
    assert sorted(data.device.msg_bytes.values()) == sorted(expected)
    assert expected


@pytest.mark.needs_shared
@pytest.mark.parametrize("name", ["hta/nccl_allreduce_2rank_rank0.json.gz",
                                  "vllm-cpu/tp2_b4_16tok_rank1.pt.trace.json.gz",
                                  "tracelens/vllm_decode_full_graph_replay.json.gz"])
@pytest.mark.parametrize("compressed", [True, False])
@pytest.mark.parametrize("inflate_as_stream", [True, False])
def test_streamed_reading_equals_whole(name: str, compressed: bool, inflate_as_stream: bool, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Big traces are decoded block by block from the file; tiny blocks must not change a number."""
    import servescope.trace.read.jsonscan as reader
    import servescope.trace.read.trace_json as trace_json

    source = TRACES / name
    path = source if compressed else tmp_path / "plain.pt.trace.json"
    if not compressed:
        path.write_bytes(gzip.decompress(source.read_bytes()))
    whole = decode_trace(path)
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 32 << 10)
    monkeypatch.setattr(reader, "_WHOLE_LIMIT", 64 << 10)
    monkeypatch.setattr(reader, "_STREAM_GZ_BYTES", 0 if inflate_as_stream else 1 << 40)
    assert trace_json._read_streamed(path, path.stat().st_size) is not None  # the streaming path was taken
    streamed = decode_trace(path)
    assert streamed.event_count == whole.event_count == len(load_events(source))
    for table in ("device", "cpu_ops", "launches", "annotations"):
        a, b = getattr(whole, table), getattr(streamed, table)
        assert (a.ts_us == b.ts_us).all() and (a.dur_us == b.dur_us).all()
        assert [whole.names[i] for i in a.name] == [streamed.names[i] for i in b.name]
    assert streamed.distributed == whole.distributed


@pytest.mark.needs_shared
def test_streaming_a_truncated_gzip_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servescope.trace.read.jsonscan as reader
    from servescope.core.errors import InputError

    raw = (TRACES / "hta/nccl_allreduce_2rank_rank0.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(raw[: len(raw) // 2])
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 32 << 10)
    monkeypatch.setattr(reader, "_WHOLE_LIMIT", 64 << 10)
    monkeypatch.setattr(reader, "_STREAM_GZ_BYTES", 0)
    with pytest.raises(InputError, match="truncated gzip"):
        decode_trace(path)
