"""The production step of `profile`: the median of its unprofiled runs, each run kept beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.server.timing import ServerTiming, after_profile_note, median_run, step_reference


def _run(itl_ms: float | None) -> ServerTiming:
    return ServerTiming(itl_ms=itl_ms, tpot_ms=itl_ms, itl_metric="vllm:inter_token_latency_seconds",
                        tpot_metric="vllm:request_time_per_output_token_seconds", seconds=0.3)


def test_the_median_run_is_the_middle_one_and_runs_without_a_latency_are_passed_over() -> None:
    runs = [_run(2.8), _run(None), _run(2.2), _run(2.5)]
    middle = median_run(runs)
    assert middle is not None and middle.itl_ms == 2.5
    lower = median_run([_run(3.0), _run(2.0)])  # an even count: the lower middle
    assert lower is not None and lower.itl_ms == 2.0
    assert median_run([]) is None and median_run([_run(None)]) is None


def test_several_runs_give_their_median_with_each_run_and_their_range() -> None:
    runs = [_run(2.8), _run(2.2), _run(2.5)]
    reference = step_reference(median_run(runs), runs)
    assert reference is not None
    assert reference.step_us == pytest.approx(2500.0)
    assert reference.runs_us == (2800.0, 2200.0, 2500.0)
    assert reference.spread == pytest.approx(0.6 / 2.5)
    assert "median of 3 runs" in reference.source and "(2.20–2.80 ms)" in reference.source


def test_one_run_is_the_step_itself_and_no_run_no_reference() -> None:
    one = step_reference(_run(2.4), [_run(2.4)])
    assert one is not None and one.step_us == pytest.approx(2400.0) and one.runs_us == () and one.spread == 0.0
    assert "median" not in one.source
    assert step_reference(None, []) is None and step_reference(_run(None), [_run(None)]) is None


def test_runs_after_the_window_name_a_lasting_slowdown_only_when_every_one_is_slower() -> None:
    """The MoE server of the lent H100 (async scheduling, 1 request): 1.16 ms a step before its first profile, 1.52
    after (h100-vllm/steady/w5); runs that merely scatter around the median before are no slowdown."""
    before = [_run(1.15), _run(1.16), _run(1.18)]
    slower = after_profile_note(before, [_run(1.47), _run(1.52), _run(1.55)])
    assert slower is not None and "1.52 ms, +31% against 1.16 ms" in slower and "restart it" in slower
    assert "pytorch/pytorch#144455" in slower
    scattered = after_profile_note(before, [_run(1.10), _run(1.17), _run(1.30)])
    assert scattered is not None and "no lasting slowdown" in scattered
    assert after_profile_note(before, []) is None and after_profile_note([], before) is None


def test_traces_written_since_the_server_started_say_it_was_profiled_before(tmp_path: Path) -> None:
    """Rank traces in the profiler directory newer than the server's start (files on disk, their mtimes set):
    profiled before; older ones (an earlier server's) or an unknown start: nothing said."""
    import os
    import time

    from servescope.server.earlier import earlier_profile_note

    started = time.time() - 100
    old, new = tmp_path / "a.pt.trace.json.gz", tmp_path / "b.pt.trace.json.gz"
    for path, age in ((old, 200), (new, 50)):
        path.write_bytes(b"x")
        os.utime(path, (time.time() - age, time.time() - age))
    seen = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in (old, new)}
    note = earlier_profile_note(seen, started)
    assert note is not None and "1 trace file(s)" in note and str(tmp_path) in note and "restart it" in note
    assert earlier_profile_note({old: seen[old]}, started) is None
    assert earlier_profile_note(seen, None) is None
    reference = step_reference(_run(2.0), [_run(2.0), _run(2.1)], caveat=note)
    assert reference is not None and reference.source.endswith(note)
