"""The warm-up burst against a real SSE server (its own process, real sockets): the server's own log of every
completion it served is the truth — how many came at once, with how many tokens, and before which measured one."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from server.sse import running_sse_server
from servescope.bench.serve.knee import KneeSpec, find_knee
from servescope.bench.serve.sweep import LoadSpec, run_bench_serve
from servescope.core.knee import parse_slo


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_sse_server("--ttft-ms", "5", "--interval-ms", "2") as base:
        yield base


def _log(base: str, since: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/log") as reply:
        records: list[dict[str, Any]] = json.load(reply)
    return records[since:]


def _count(base: str) -> int:
    return len(_log(base, 0))


def _burst_then_points(records: list[dict[str, Any]], warmup: int, burst: int, output: int) -> None:
    """``warmup`` requests one after another, then ``burst`` short ones all in flight at once, then the points."""
    sequential, shots, measured = records[:warmup], records[warmup:warmup + burst], records[warmup + burst:]
    assert [len(r["sent"]) for r in sequential] == [output] * warmup
    assert [len(r["sent"]) for r in shots] == [min(output, 16)] * burst
    assert max(r["arrived"] for r in shots) < min(r["done"] for r in shots)  # all in flight together
    assert max(r["done"] for r in sequential) < min(r["arrived"] for r in shots)
    assert measured and max(r["done"] for r in shots) < min(r["arrived"] for r in measured)
    assert all(len(r["sent"]) == output for r in measured)


def test_a_sweep_sends_the_burst_it_is_given_before_its_first_point(url: str) -> None:
    since = _count(url)
    result = run_bench_serve(LoadSpec(url, concurrency=(2,), requests=4, input_tokens=8, output_tokens=24,
                                      warmup_requests=1, warmup_burst=12))
    _burst_then_points(_log(url, since), warmup=1, burst=12, output=24)
    assert result.options.warmup_burst == 12 and len(result.points) == 1


def test_a_sweep_sends_none_by_default(url: str) -> None:
    since = _count(url)
    result = run_bench_serve(LoadSpec(url, concurrency=(2,), requests=4, input_tokens=8, output_tokens=24,
                                      warmup_requests=1))
    assert [len(r["sent"]) for r in _log(url, since)] == [24] * 5
    assert result.options.warmup_burst == 0


def test_a_knee_search_bursts_its_most_streams_first(url: str) -> None:
    since = _count(url)
    result = find_knee(KneeSpec(load=LoadSpec(url, input_tokens=8, output_tokens=20, warmup_requests=1),
                                slo=parse_slo("ttft_p99=5000"), max_load=6, max_requests=60))
    _burst_then_points(_log(url, since), warmup=1, burst=6, output=20)
    assert result.options.warmup_burst == 6


def test_a_search_measures_a_load_it_was_asked_for_once_below_its_knee(url: str) -> None:
    """``also_at`` (tune's reference load): measured after the search where the search did not measure it and it
    lies below the knee; a load measured already, or above the knee, is not measured again. The server's log
    counts the requests of each point."""
    spec = KneeSpec(load=LoadSpec(url, input_tokens=8, output_tokens=8, warmup_requests=1, warmup_burst=0),
                    slo=parse_slo("ttft_p99=5000"), max_load=6, also_at=(3.0, 4.0, 64.0))
    since = _count(url)
    result = find_knee(spec)
    assert result.knee is not None and result.knee.load == 6
    steps = [(p.load, p.step) for p in result.points]
    assert steps[-1] == (3.0, "reference") and [s for s in steps if s[1] == "reference"] == [(3.0, "reference")]
    assert sorted({load for load, _ in steps}) == [1.0, 2.0, 3.0, 4.0, 6.0]
    assert len(_log(url, since)) == 1 + sum(p.requests for p in result.points)
