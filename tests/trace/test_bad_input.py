"""Broken or foreign input is one InputError that names the file and says what is wrong with it.

Every broken file is made in tmp_path from the bytes of a real trace (truncated, corrupted, cut), so the
errors are the ones users meet, not ones a hand-written toy provokes. The fuzz tests then check the
contract itself: whatever the bytes, ``decode_trace`` and ``analyze`` return a result or raise InputError,
never anything else.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servescope.core.errors import InputError
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.read.table import KIND_KERNEL, TraceData
from servescope.trace.read.trace_json import decode_trace
from tracefiles import TRACES, load_events

SMALL = TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz"  # 36 KB gz, 0.6 MB JSON
VLLM = TRACES / "tracelens" / "vllm_decode_full_graph_replay.json.gz"
CPU_ONLY = TRACES / "hta" / "cpu_only.pt.trace.json.gz"

GZ_BYTES = SMALL.read_bytes() if SMALL.is_file() else gzip.compress(b'{"traceEvents": []}')  # else: skipped
JSON_BYTES = gzip.decompress(GZ_BYTES)
_SMALL_DOC = json.loads(JSON_BYTES)
_SMALL_EVENTS: list[dict[str, Any]] = _SMALL_DOC["traceEvents"]
_SMALL_HEADER = {k: v for k, v in _SMALL_DOC.items() if k != "traceEvents"}
_SMALL_LIST_BYTES = json.dumps(_SMALL_EVENTS).encode()


def _kernel_count_plain(events: list[dict[str, Any]]) -> int:
    """Kernels by the independent route: a plain json.load and a filter."""
    return sum(1 for ev in events if ev.get("ph") == "X" and ev.get("cat") == "kernel")


def _kernel_count(data: TraceData) -> int:
    return int((data.device.kind == KIND_KERNEL).sum())


def _read_error(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        decode_trace(path)
    err = info.value
    assert err.source == str(path)
    assert str(err) == f"{path}: {err.problem}"
    return err


def _assert_names(err: InputError, path: Path, *words: str) -> None:
    message = str(err)
    assert str(path) in message
    for word in words:
        assert word in err.problem, f"{word!r} not in {err.problem!r}"


# --- files that are not there or not files -------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "rank0.pt.trace.json.gz"
    _assert_names(_read_error(path), path, "no such file")


def test_directory_given_to_decode_trace(tmp_path: Path) -> None:
    _assert_names(_read_error(tmp_path), tmp_path, "directory")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    _assert_names(_read_error(path), path, "empty")


def test_whitespace_only_file(tmp_path: Path) -> None:
    path = tmp_path / "blank.json"
    path.write_bytes(b"  \n\t\n")
    _assert_names(_read_error(path), path, "empty")


# --- broken gzip ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [SMALL, VLLM, CPU_ONLY], ids=lambda p: p.name)
def test_truncated_gzip(tmp_path: Path, source: Path) -> None:
    raw = source.read_bytes()
    path = tmp_path / source.name
    path.write_bytes(raw[: len(raw) // 2])
    _assert_names(_read_error(path), path, "truncated gzip")


@pytest.mark.needs_shared
def test_gzip_header_only(tmp_path: Path) -> None:
    path = tmp_path / "head.json.gz"
    path.write_bytes(GZ_BYTES[:10])
    _assert_names(_read_error(path), path, "gzip")


@pytest.mark.needs_shared
def test_gzip_with_corrupted_middle(tmp_path: Path) -> None:
    mid = len(GZ_BYTES) // 2
    broken = GZ_BYTES[:mid] + bytes(b ^ 0xFF for b in GZ_BYTES[mid : mid + 64]) + GZ_BYTES[mid + 64 :]
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(broken)
    _assert_names(_read_error(path), path, "corrupt gzip")


@pytest.mark.needs_shared
def test_gzip_with_bad_crc(tmp_path: Path) -> None:
    # The deflate stream is intact; only the CRC32 in the 8-byte trailer is wrong.
    crc = bytes(b ^ 0xFF for b in GZ_BYTES[-8:-4])
    path = tmp_path / "crc.json.gz"
    path.write_bytes(GZ_BYTES[:-8] + crc + GZ_BYTES[-4:])
    _assert_names(_read_error(path), path, "corrupt gzip")


def test_gzip_of_nothing(tmp_path: Path) -> None:
    path = tmp_path / "nothing.json.gz"
    path.write_bytes(gzip.compress(b""))
    _assert_names(_read_error(path), path, "empty")


@pytest.mark.needs_shared
def test_gzip_with_zero_padding_reads(tmp_path: Path) -> None:
    """Zero bytes after the gzip member (tape/block padding) are valid gzip; zlib ignores them."""
    path = tmp_path / "padded.json.gz"
    path.write_bytes(GZ_BYTES + b"\0" * 16)
    assert _kernel_count(decode_trace(path)) == _kernel_count_plain(_SMALL_EVENTS)


@pytest.mark.needs_shared
def test_gzip_with_zeroed_trailer_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "trailer.json.gz"
    path.write_bytes(GZ_BYTES[:-8] + b"\0" * 8)
    _assert_names(_read_error(path), path, "corrupt gzip")


@pytest.mark.needs_shared
def test_multi_member_gzip_reads(tmp_path: Path) -> None:
    """``cat a.gz b.gz`` is one valid gzip file; every member is part of the trace."""
    cut = len(JSON_BYTES) // 3
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(JSON_BYTES[:cut]) + gzip.compress(JSON_BYTES[cut:]))
    assert _kernel_count(decode_trace(path)) == _kernel_count_plain(_SMALL_EVENTS)


@pytest.mark.needs_shared
def test_multi_member_gzip_larger_first_member_reads(tmp_path: Path) -> None:
    cut = 2 * len(JSON_BYTES) // 3
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(JSON_BYTES[:cut]) + gzip.compress(JSON_BYTES[cut:]))
    assert _kernel_count(decode_trace(path)) == _kernel_count_plain(_SMALL_EVENTS)


@pytest.mark.needs_shared
def test_garbage_after_gzip_member_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "tail.json.gz"
    path.write_bytes(GZ_BYTES + b"junk")
    _assert_names(_read_error(path), path, "corrupt gzip")


# --- not JSON ------------------------------------------------------------------------------------------


@pytest.mark.needs_shared
@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.99])
def test_truncated_json_object(tmp_path: Path, fraction: float) -> None:
    path = tmp_path / "cut.json"
    path.write_bytes(JSON_BYTES[: int(len(JSON_BYTES) * fraction)])
    _assert_names(_read_error(path), path, "invalid JSON")


@pytest.mark.needs_shared
def test_truncated_gzip_inside_a_valid_gzip(tmp_path: Path) -> None:
    """A capture killed mid-write and then compressed: the gzip is fine, the JSON inside is cut."""
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(JSON_BYTES[: len(JSON_BYTES) // 2]))
    _assert_names(_read_error(path), path, "invalid JSON")


@pytest.mark.needs_shared
def test_trailing_garbage_after_trace(tmp_path: Path) -> None:
    path = tmp_path / "tail.json"
    path.write_bytes(JSON_BYTES + b"\x00garbage")
    _assert_names(_read_error(path), path, "invalid JSON")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(bytes(range(256)) * 4)
    _assert_names(_read_error(path), path, "invalid JSON")


@pytest.mark.needs_shared
def test_invalid_utf8_in_event_name(tmp_path: Path) -> None:
    events = load_events(SMALL)[:50]
    text = json.dumps({"traceEvents": events}).encode()
    at = text.index(b'"name": "') + len(b'"name": "')
    path = tmp_path / "latin1.json"
    path.write_bytes(text[:at] + b"\xff\xfe" + text[at:])
    _assert_names(_read_error(path), path, "invalid JSON")


@pytest.mark.needs_shared
@pytest.mark.parametrize("cut", ["after_comma", "after_brace", "before_bracket"])
def test_truncated_bare_list(tmp_path: Path, cut: str) -> None:
    """A bare-list trace cut between two events must not read as a shorter, valid trace."""
    text = json.dumps(load_events(SMALL)).encode()
    boundary = text.index(b"}, {", len(text) // 2)
    ends = {"after_comma": boundary + 2, "after_brace": boundary + 1, "before_bracket": len(text) - 1}
    path = tmp_path / "cut_list.json"
    path.write_bytes(text[: ends[cut]])
    _assert_names(_read_error(path), path, "invalid JSON")


# --- JSON, but not a trace -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "word"),
    [
        (b'{"a": 1}', "traceEvents"),
        (b"[1, 2, 3]", "object"),
        (b"[[1], [2]]", "object"),
        (b"42", ""),
        (b'"text"', ""),
        (b"null", ""),
        (b"true", ""),
        (b'{"traceEvents": {}}', "array"),
        (b'{"traceEvents": null}', "traceEvents"),
        (b'{"traceEvents": "events"}', "array"),
        (b'{"traceEvents": [1, 2]}', "object"),
    ],
    ids=lambda v: v.decode() if isinstance(v, bytes) else None,
)
def test_json_that_is_not_a_trace(tmp_path: Path, text: bytes, word: str) -> None:
    path = tmp_path / "other.json"
    path.write_bytes(text)
    _assert_names(_read_error(path), path, "not a profiler trace", word)


@pytest.mark.needs_shared
@pytest.mark.parametrize("form", ["object", "list"])
def test_events_with_string_ts(tmp_path: Path, form: str) -> None:
    events = [dict(ev, ts=str(ev.get("ts", 0))) for ev in load_events(SMALL)]
    path = tmp_path / "string_ts.json"
    path.write_text(json.dumps({"traceEvents": events} if form == "object" else events))
    err = _read_error(path)
    _assert_names(err, path, "not a profiler trace")
    assert "ts" in err.problem  # names the field at fault


@pytest.mark.needs_shared
def test_header_field_of_wrong_type(tmp_path: Path) -> None:
    doc = json.loads(JSON_BYTES)
    doc["distributedInfo"] = [0, 2]
    path = tmp_path / "dist.json"
    path.write_text(json.dumps(doc))
    err = _read_error(path)
    _assert_names(err, path, "not a profiler trace", "distributedInfo")


@pytest.mark.needs_shared
@pytest.mark.parametrize("streamed", [False, True])
def test_correlation_beyond_int64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streamed: bool) -> None:
    import servescope.trace.read.jsonscan as jsonscan

    events = load_events(SMALL)
    kernel = next(i for i, ev in enumerate(events) if ev.get("cat") == "kernel")
    events[kernel] = dict(events[kernel], args={**events[kernel].get("args", {}), "correlation": 2**64 - 1})
    path = tmp_path / "corr.json"
    path.write_text(json.dumps({"traceEvents": events}))
    if streamed:  # as a trace too big to hold whole is read
        monkeypatch.setattr(jsonscan, "_CHUNK_BYTES", 1 << 10)
        monkeypatch.setattr(jsonscan, "_WHOLE_LIMIT", 1 << 12)
        assert path.stat().st_size > 1 << 12
    _assert_names(_read_error(path), path, "not a profiler trace")


# --- empty traces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [b'{"traceEvents": []}', b"[]", b" [ ] \n", b'{"traceEvents":[ ]}'])
def test_empty_trace(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "empty_trace.json"
    path.write_bytes(text)
    _assert_names(_read_error(path), path, "empty")


@pytest.mark.needs_shared
def test_empty_trace_with_real_header(tmp_path: Path) -> None:
    doc = json.loads(JSON_BYTES)
    doc["traceEvents"] = []
    path = tmp_path / "header_only.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    _assert_names(_read_error(path), path, "empty")


# --- the two valid forms -------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [SMALL, VLLM, CPU_ONLY], ids=lambda p: p.name)
def test_object_and_bare_list_forms_read_alike(tmp_path: Path, source: Path) -> None:
    events = load_events(source)
    as_object = tmp_path / "object.json"
    as_object.write_text(json.dumps({"traceEvents": events}))
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps(events))
    from_object, from_list = decode_trace(as_object), decode_trace(as_list)
    assert _kernel_count(from_object) == _kernel_count(from_list) == _kernel_count_plain(events)
    assert from_object.event_count == from_list.event_count == len(events)
    assert len(from_object.cpu_ops) == len(from_list.cpu_ops)


@pytest.mark.needs_shared
def test_tiny_valid_trace(tmp_path: Path) -> None:
    """A one-event trace (an events array shorter than 64 bytes) still reads."""
    kernel = next(ev for ev in load_events(SMALL) if ev.get("cat") == "kernel")
    small = {k: kernel[k] for k in ("ph", "cat", "ts", "dur")}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"traceEvents": [small]}))
    assert _kernel_count(decode_trace(path)) == 1


# --- analyze over directories --------------------------------------------------------------------------


@pytest.mark.needs_shared
def test_analyze_directory_without_traces(tmp_path: Path) -> None:
    """Traces are known by content: a gzipped JSON named like a trace that holds none is no trace either."""
    (tmp_path / "notes.txt").write_text("no traces here")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(b'{"model": "m", "steps": 3}'))
    with pytest.raises(InputError) as info:
        analyze(AnalyzeRequest(paths=[tmp_path]))
    _assert_names(info.value, tmp_path, "no trace files", "notes.txt: not JSON",
                  "rank0.pt.trace.json.gz: JSON without traceEvents")


def test_analyze_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        analyze(AnalyzeRequest(paths=[tmp_path]))
    _assert_names(info.value, tmp_path, "no trace files")


def test_analyze_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "run1"
    with pytest.raises(InputError) as info:
        analyze(AnalyzeRequest(paths=[missing]))
    _assert_names(info.value, missing, "no such file")


@pytest.mark.needs_shared
def test_a_bad_file_inside_a_directory_is_left_out_with_its_reason(tmp_path: Path) -> None:
    """Issue 37: the damaged file of a folder is left out, named with why, and the rest analysed; a folder whose
    every file is damaged is an error naming the file."""
    (tmp_path / "rank0.json.gz").write_bytes(GZ_BYTES)
    bad = tmp_path / "rank1.json.gz"
    bad.write_bytes(GZ_BYTES[: len(GZ_BYTES) // 3])
    doc = analyze(AnalyzeRequest(paths=[tmp_path]))
    assert doc.left_out == {str(bad): "truncated gzip"}
    assert [i.path for i in doc.inputs] == [str(tmp_path / "rank0.json.gz")]
    (tmp_path / "rank0.json.gz").unlink()
    with pytest.raises(InputError) as info:
        analyze(AnalyzeRequest(paths=[tmp_path]))
    assert info.value.source == str(bad)
    _assert_names(info.value, bad, "truncated gzip")


# --- fuzz: whatever the bytes, a result or an InputError -----------------------------------------------



@st.composite
def _mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """A real trace (decompressed JSON or the .gz itself) after a few random cuts and edits."""
    suffix = draw(st.sampled_from([".json", ".json.gz"]))
    data = bytearray(JSON_BYTES if suffix == ".json" else GZ_BYTES)
    for _ in range(draw(st.integers(1, 4))):
        if len(data) < 2:
            break
        op = draw(st.sampled_from(["truncate", "replace", "delete", "insert", "digits"]))
        pos = draw(st.integers(1, len(data) - 1))  # not 0: an empty file has its own test above
        if op == "truncate":
            del data[pos:]
        elif op == "digits":  # numbers change but the JSON stays valid, so analysis sees the result
            for at in draw(st.lists(st.integers(pos, len(data) - 1), min_size=1, max_size=8)):
                if 0x30 <= data[at] <= 0x39:
                    data[at] = draw(st.integers(0x30, 0x39))
        elif op == "replace":
            for at in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
                data[at] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 256))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
    return suffix, bytes(data)


_EVENT_FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args")
_ARG_FIELDS = ("correlation", "External id", "stream", "Collective name", "In msg nelems", "dtype")
_ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-10, 10),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(-1e6, 1e6),
    st.sampled_from(["X", "i", "kernel", "cpu_op", "cuda_runtime", "gpu_user_annotation", "ProfilerStep#1",
                     "gpu_memcpy", "float", ""]),
    st.text(max_size=4),
    st.just([]),
    st.just({}),
)


@st.composite
def _mutated_events(draw: st.DrawFn) -> bytes:
    """Valid JSON whose events have odd values: a field of the wrong type, out of range, deleted."""
    events = [dict(ev) for ev in _SMALL_EVENTS]
    for _ in range(draw(st.integers(1, 6))):
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        op = draw(st.sampled_from(["set", "arg", "drop_field", "copy", "drop_events"]))
        if op == "set":
            events[i][draw(st.sampled_from(_EVENT_FIELDS))] = draw(_ODD_VALUES)
        elif op == "arg":
            args = events[i].get("args")
            events[i]["args"] = {**(args if isinstance(args, dict) else {}),
                                 draw(st.sampled_from(_ARG_FIELDS)): draw(_ODD_VALUES)}
        elif op == "drop_field":
            events[i].pop(draw(st.sampled_from(_EVENT_FIELDS)), None)
        elif op == "copy":
            events.insert(i, dict(events[i]))
        else:
            del events[i : draw(st.integers(i, len(events)))]
    if draw(st.booleans()):
        return json.dumps(events).encode()
    return json.dumps({**_SMALL_HEADER, "traceEvents": events}).encode()


_FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for all examples (hypothesis runs many examples per call of a function fixture)."""
    return tmp_path_factory.mktemp("fuzz")


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def _result_or_input_error(run: Callable[[Path], object], path: Path) -> object | None:
    """What ``run`` returns, or None for an InputError naming ``path``; any other exception fails."""
    try:
        result = run(path)
    except InputError as exc:
        assert str(path) in str(exc), f"error does not name the file: {exc}"
        assert exc.problem.strip(), "error says nothing about what is wrong"
        event(exc.problem.split(" (")[0])  # --hypothesis-show-statistics: which errors the inputs reach
        return None
    event("read")
    return result


@pytest.mark.needs_shared
@_FUZZ
@given(_mutated())
def test_fuzz_decode_trace_bytes(fuzz_dir: Path, case: tuple[str, bytes]) -> None:
    suffix, data = case
    result = _result_or_input_error(decode_trace, _write(fuzz_dir, "bytes" + suffix, data))
    assert result is None or isinstance(result, TraceData)


@pytest.mark.needs_shared
@settings(_FUZZ, max_examples=100)
@given(_mutated(), st.sampled_from([(1 << 10, 1 << 40), (1 << 10, 0)]))
def test_fuzz_decode_trace_bytes_in_small_blocks(fuzz_dir: Path, case: tuple[str, bytes],
                                               sizes: tuple[int, int]) -> None:
    """The same mutations with 1 KB blocks, held whole (cut in place) or streamed: every block boundary,
    in-place decode and fallback is reached."""
    import servescope.trace.read.jsonscan as jsonscan

    chunk, whole_limit = sizes
    suffix, data = case
    with mock.patch.object(jsonscan, "_CHUNK_BYTES", chunk), mock.patch.object(jsonscan, "_WHOLE_LIMIT", whole_limit):
        result = _result_or_input_error(decode_trace, _write(fuzz_dir, "blocks" + suffix, data))
    assert result is None or isinstance(result, TraceData)


@pytest.mark.needs_shared
@_FUZZ
@given(_mutated_events())
def test_fuzz_decode_trace_values(fuzz_dir: Path, data: bytes) -> None:
    result = _result_or_input_error(decode_trace, _write(fuzz_dir, "values.json", data))
    assert result is None or isinstance(result, TraceData)


@pytest.mark.needs_shared
@settings(_FUZZ, max_examples=60)
@given(st.sampled_from([".json", ".json.gz"]), st.data())
def test_fuzz_truncation_is_never_a_trace(fuzz_dir: Path, suffix: str, data: st.DataObject) -> None:
    """A real trace cut anywhere short of its end (object or bare list, plain or .gz) is an error."""
    form = data.draw(st.sampled_from(["object", "list"]))
    text = JSON_BYTES.rstrip() if form == "object" else _SMALL_LIST_BYTES
    whole = text if suffix == ".json" else gzip.compress(text, mtime=0)
    cut = data.draw(st.integers(0, len(whole) - 1))
    path = _write(fuzz_dir, "cut" + suffix, whole[:cut])
    with pytest.raises(InputError) as info:
        decode_trace(path)
    assert info.value.source == str(path)



def _analyze_one(path: Path) -> object:
    return analyze(AnalyzeRequest(paths=[path]))


@pytest.mark.needs_shared
@settings(_FUZZ, max_examples=60)
@given(_mutated())
def test_fuzz_analyze_bytes(fuzz_dir: Path, case: tuple[str, bytes]) -> None:
    suffix, data = case
    _result_or_input_error(_analyze_one, _write(fuzz_dir, "analyze" + suffix, data))


@pytest.mark.needs_shared
@settings(_FUZZ, max_examples=100)
@given(_mutated_events())
def test_fuzz_analyze_values(fuzz_dir: Path, data: bytes) -> None:
    _result_or_input_error(_analyze_one, _write(fuzz_dir, "analyze_values.json", data))
