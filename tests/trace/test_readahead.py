"""ReadAhead: traces decoded in forked children equal the same traces decoded here, errors included, and
a child that dies or cannot be forked changes nothing but where the work happens."""

from __future__ import annotations

import gzip
import os
import threading
import time
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import servescope.trace.read.readahead as readahead
from servescope.core.errors import InputError
from servescope.server.sessions import group_pids
from servescope.trace.read.readahead import ReadAhead
from servescope.trace.read.table import TraceData
from servescope.trace.read.trace_json import decode_trace
from tracefiles import TRACES, load_events

FILES = [TRACES / "vllm-cpu/tp2_b4_16tok_rank0.pt.trace.json.gz",
         TRACES / "vllm-cpu/tp2_b4_16tok_rank1.pt.trace.json.gz",
         TRACES / "hta/nccl_allreduce_2rank_rank0.json.gz"]


def _same(a: TraceData, b: TraceData) -> None:
    """Equal row by row: names and threads compared by what they are (their ids depend on decoding order)."""
    assert (a.path, a.size_bytes, a.event_count) == (b.path, b.size_bytes, b.event_count)
    for table in ("device", "cpu_ops", "launches", "frames", "annotations"):
        x, y = getattr(a, table), getattr(b, table)
        assert (x.kind.tolist(), x.ts_us.tolist(), x.dur_us.tolist(), x.correlation.tolist(), x.msg_bytes) == (
            y.kind.tolist(), y.ts_us.tolist(), y.dur_us.tolist(), y.correlation.tolist(), y.msg_bytes), table
        assert [a.names[i] for i in x.name] == [b.names[i] for i in y.name], table
        assert [a.threads[i] for i in x.thread] == [b.threads[i] for i in y.thread], table
        assert {r: a.names[n] for r, n in x.kernel.items()} == {r: b.names[n] for r, n in y.kernel.items()}, table
    assert (a.distributed, a.metadata) == (b.distributed, b.metadata)


@pytest.fixture(autouse=True)
def _no_threads() -> None:
    if threading.active_count() > 1:  # something earlier in this process left a thread: forking is refused
        pytest.skip("another thread runs in this test process; ReadAhead rightly refuses to fork")


@pytest.mark.needs_shared
def test_children_decode_what_this_process_decodes() -> None:
    with ReadAhead(FILES, jobs=2) as ahead:
        assert ahead.forked == 2
        got = [ahead.take(path) for path in reversed(FILES)]  # in any order
    for path, trace in zip(reversed(FILES), got, strict=True):
        _same(trace, decode_trace(path))


@pytest.mark.needs_shared
def test_one_file_is_read_ahead_only_when_asked() -> None:
    with ReadAhead(FILES[:1]) as default:
        assert default.forked == 0
        _same(default.take(FILES[0]), decode_trace(FILES[0]))
    with ReadAhead(FILES[:1], min_files=1, jobs=1) as ahead:
        assert ahead.forked == 1
        _same(ahead.take(FILES[0]), decode_trace(FILES[0]))


@pytest.mark.needs_shared
def test_a_bad_file_raises_the_same_error_from_a_child(tmp_path: Path) -> None:
    bad = tmp_path / "cut.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(FILES[0].read_bytes())[:5000])  # a gzip of a gzip, cut short
    with pytest.raises(InputError) as here:
        decode_trace(bad)
    with ReadAhead([FILES[0], bad], jobs=2) as ahead:
        assert ahead.forked == 2
        with pytest.raises(InputError) as there:
            ahead.take(bad)
        _same(ahead.take(FILES[0]), decode_trace(FILES[0]))
    assert (there.value.source, there.value.problem) == (here.value.source, here.value.problem)


@pytest.mark.needs_shared
def test_a_child_that_dies_leaves_its_files_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def die(paths: list[Path], pipes: object) -> None:
        os._exit(3)

    monkeypatch.setattr(readahead, "_decode_files", die)  # the forked children run this and die at once
    with ReadAhead(FILES, jobs=2) as ahead:
        assert ahead.forked == 2
        for path in FILES:
            _same(ahead.take(path), decode_trace(path))


@pytest.mark.needs_shared
def test_no_fork_while_other_threads_run() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with ReadAhead(FILES, jobs=2) as ahead:
            assert ahead.forked == 0
            _same(ahead.take(FILES[1]), decode_trace(FILES[1]))
    finally:
        stop.set()
        thread.join()


@pytest.mark.needs_shared
def test_children_are_reaped_even_when_nothing_is_taken() -> None:
    with ReadAhead(FILES, jobs=2) as ahead:
        pids = [child.pid for child in ahead._children]
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped: no such child any more


# --- one big plain file, decoded in parts by several children ------------------------------------------------

def _plain(tmp_path: Path, source: Path, name: str = "big.pt.trace.json") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.decompress(source.read_bytes()))
    return path


@pytest.mark.needs_shared
@pytest.mark.parametrize("parts", [2, 3, 5])
def test_a_big_plain_file_decoded_in_parts_equals_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        parts: int) -> None:
    path = _plain(tmp_path, TRACES / "hta/nccl_allreduce_2rank_rank0.json.gz")
    monkeypatch.setattr(readahead, "SPLIT_BYTES", 1 << 10)
    monkeypatch.setattr(readahead, "_PART_BYTES", path.stat().st_size // parts)
    with ReadAhead([path], jobs=parts, min_files=1) as ahead:
        assert ahead.forked == 1  # one child; it forks a helper per further part
        got = ahead.take(path)
        assert len(ahead._parts) == parts  # every part came from its child
    _same(got, decode_trace(path))


@pytest.mark.needs_shared
@pytest.mark.parametrize("parts", [2, 3])
def test_a_gzip_file_decoded_in_parts_equals_whole(monkeypatch: pytest.MonkeyPatch, parts: int) -> None:
    """Each part inflates the whole gzip file and decodes its share of the JSON."""
    path = TRACES / "hta/nccl_allreduce_2rank_rank0.json.gz"
    monkeypatch.setattr(readahead, "SPLIT_BYTES", 1 << 10)
    monkeypatch.setattr(readahead, "_PART_BYTES", len(gzip.decompress(path.read_bytes())) // parts)
    with ReadAhead([path], jobs=parts, min_files=1) as ahead:
        assert ahead.forked == 1
        got = ahead.take(path)
        assert len(ahead._parts) == parts
    _same(got, decode_trace(path))


@pytest.mark.needs_shared
def test_closing_before_taking_stops_the_child_and_its_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each helper sends its part straight to this process, so its pipe ends only when it does: close() stops the
    child's whole process group, and nothing of it is left running."""
    path = _plain(tmp_path, TRACES / "hta/a100_8rank_rank3_nccl.json.gz")
    monkeypatch.setattr(readahead, "SPLIT_BYTES", 1 << 10)
    monkeypatch.setattr(readahead, "_PART_BYTES", path.stat().st_size // 3)
    statuses: dict[int, int] = {}
    waitpid = os.waitpid

    def reaped(pid: int, options: int) -> tuple[int, int]:
        got = waitpid(pid, options)
        statuses[got[0]] = got[1]
        return got

    monkeypatch.setattr(os, "waitpid", reaped)
    with ReadAhead([path], jobs=3, min_files=1) as ahead:
        assert ahead.forked == 1
        (child,) = ahead._children
        assert len(child.fds) == 3  # one pipe per part, the helpers' too
        assert os.getpgid(child.pid) == child.pid  # the leader of its own group
    assert os.WIFSIGNALED(statuses[child.pid])  # stopped, not left to finish its part
    deadline = time.monotonic() + 10
    while group_pids(child.pid) and time.monotonic() < deadline:  # the killed helpers' ends are init's to reap
        time.sleep(0.05)
    assert group_pids(child.pid) == []


@pytest.mark.needs_shared
def test_which_files_are_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gz = TRACES / "hta/a100_8rank_rank3_nccl.json.gz"  # 1.8 MB of gzip, 35 MB of JSON
    json_bytes = len(gzip.decompress(gz.read_bytes()))
    plain = _plain(tmp_path, gz)
    for path in (gz, plain):  # by the JSON's size, gzip or not
        assert readahead._parts_for([path], 2) == 2
        assert readahead._parts_for([path], 8) == json_bytes // readahead._PART_BYTES
        assert readahead._parts_for([path], 1) == 1
    assert readahead._parts_for([plain, gz], 8) == 1  # several files: one child each instead
    small = FILES[2]  # under SPLIT_BYTES of JSON
    assert len(gzip.decompress(small.read_bytes())) <= readahead.SPLIT_BYTES
    assert readahead._parts_for([small], 8) == 1
    monkeypatch.setattr(readahead, "_WHOLE_GZ_BYTES", json_bytes - 1)  # a gzip the decoder would stream
    assert readahead._parts_for([gz], 8) == 1
    assert readahead._parts_for([plain], 8) > 1


def test_parts_that_do_not_decode_leave_the_file_to_this_process(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Names holding `},{` make the cut land inside a string: the parts fail, the whole file is decoded here."""
    import json

    events = [{"ph": "X", "cat": "kernel", "name": f"k}},{{{i}" * 40, "ts": float(i), "dur": 1.0,
               "args": {"correlation": i}} for i in range(3000)]
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps({"traceEvents": events}, separators=(",", ":")))
    monkeypatch.setattr(readahead, "SPLIT_BYTES", 1 << 10)
    monkeypatch.setattr(readahead, "_PART_BYTES", 1 << 10)
    with ReadAhead([path], jobs=2, min_files=1) as ahead:
        assert ahead.forked == 1
        got = ahead.take(path)
    _same(got, decode_trace(path))
    assert len(got.device) == 3000


@cache
def _events() -> list[dict[str, object]]:
    return load_events(TRACES / "hta/nccl_allreduce_2rank_rank0.json.gz")


@pytest.mark.needs_shared
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 5000), st.integers(50, 3000), st.sampled_from([None, 0, 1, 2]),
       st.sampled_from([(",", ":"), (", ", ": ")]), st.integers(2, 6))
def test_parts_join_to_the_whole_however_the_json_is_laid_out(tmp_path: Path, first: int, count: int,
                                                               indent: int | None, separators: tuple[str, str],
                                                               parts: int) -> None:
    """Any slice of a real trace, in any layout, cut into 2-6 parts: the joined parts equal the whole decode."""
    import json

    from servescope.trace.read.parts import decode_part, join_parts

    events = _events()[first : first + count]
    path = tmp_path / "laid_out.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "x"}, indent=indent,
                               separators=separators))
    whole = decode_trace(path)
    _same(join_parts(path, [decode_part(path, i, parts) for i in range(parts)]), whole)
