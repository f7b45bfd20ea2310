"""1,024 concurrent streams from one `bench serve` against a real vLLM 0.26 server on an H100 (issue 35, item 4):
tests/data/knee/h100/scale (README.md of tests/data/knee/h100). Every expected figure comes from outside
servescope's summary: the engine's own /metrics counters and `vllm bench serve` on the same server, read with plain
json / text parsing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "knee" / "h100" / "scale"
STREAMS, REQUESTS, OUTPUT_TOKENS = 1024, 3072, 256  # what tools/gpu_vllm/tune_session.sh asked for


def _point() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / "scale-1024.json").read_text())
    [point] = doc["points"]
    return dict(point)


def _counter(name: str, when: str) -> float:
    text = (DATA / f"metrics-scale-c1024-{when}.txt").read_text()
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


def test_a_thousand_streams_ran_with_the_client_on_time() -> None:
    point = _point()
    assert point["concurrency"] == STREAMS and point["requests"] == REQUESTS and point["errors"] == 0
    # the bar: the client's own 1 ms timer at most 5 ms late (p99) over all its processes
    assert point["client_lag"]["p99_ms"] < 5.0 and point["workers"] > 1
    assert point["client_lag"]["client_bound"] is False


def test_every_token_asked_for_reached_the_engine_and_the_client() -> None:
    point = _point()
    # the engine's counter right after the point (before vLLM's own bench ran): every request's output tokens, plus
    # the few of the warm-up requests before the point
    generated = _counter("vllm:generation_tokens_total", "before")
    assert REQUESTS * OUTPUT_TOKENS <= generated < REQUESTS * OUTPUT_TOKENS + 64 * OUTPUT_TOKENS
    assert point["tokens"]["output_total"] == REQUESTS * OUTPUT_TOKENS


def test_the_throughput_agrees_with_vllms_own_bench_on_the_same_server() -> None:
    point = _point()
    anchor: dict[str, Any] = json.loads((DATA / "vbench-scale-c1024.json").read_text())
    assert anchor["completed"] == REQUESTS and anchor["max_concurrency"] == STREAMS
    # vLLM's bench generated exactly its requests' tokens by the engine's counter (after - before)
    delta = _counter("vllm:generation_tokens_total", "after") - _counter("vllm:generation_tokens_total", "before")
    assert delta == anchor["total_output_tokens"] == REQUESTS * OUTPUT_TOKENS
    assert abs(point["output_tokens_per_s"] / anchor["output_throughput"] - 1) < 0.03


def test_the_front_end_is_named_where_the_engine_was_faster_than_the_stream() -> None:
    point = _point()
    # the engine's own TPOT (its histogram over the point) against the client's: the time went between them
    engine_tpot, client_tpot = point["server"]["tpot_ms_mean"], point["tpot_ms"]["mean"]
    assert client_tpot > 1.5 * engine_tpot
    assert [f["id"] for f in point["findings"]] == ["front_end_bound"]
