"""servescope's load client and vLLM's own bench on one real vLLM 0.26 server at the same load (tests/data/bench/
h100-agree, README.md there): each client's per-request figures against the server's own /metrics over its run,
read here with plain parsing, and where the gap between the two benches comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_metrics import served, server_mean_ms

DATA = Path(__file__).resolve().parents[1] / "data" / "bench" / "h100-agree"
RUNS = ("vllm-1", "ss-count-1", "vllm-2", "ss-count-2", "ss-timed")
TPOT = "vllm:request_time_per_output_token_seconds"


def _served(run: str) -> dict[str, float]:
    return served(DATA, run)


def _server_tpot_ms(run: str) -> float:
    return server_mean_ms(DATA, run, TPOT)


def _client(run: str) -> tuple[float, float, dict[str, Any]]:
    """(mean TPOT ms, output tokens/s) as the client reported them, and its document."""
    doc: dict[str, Any] = json.loads((DATA / f"{run}.json").read_text())
    if run.startswith("vllm"):
        return doc["mean_tpot_ms"], doc["output_throughput"], doc
    point = doc["points"][0]
    return point["tpot_ms"]["mean"], point["output_tokens_per_s"], doc


@pytest.mark.parametrize("run", RUNS)
def test_each_client_agrees_with_the_servers_own_tpot(run: str) -> None:
    """Each request's time per output token as the client saw it, averaged, lies within 2% of the server's own
    histogram over the same run: neither client adds or hides time of its own at 128 streams."""
    client_tpot, _, _ = _client(run)
    assert client_tpot == pytest.approx(_server_tpot_ms(run), rel=0.02)


@pytest.mark.parametrize("run", [r for r in RUNS if r.startswith("ss-")])
def test_servescope_counted_what_the_server_served(run: str) -> None:
    """The document's requests and tokens, its warm-up (and burst) included, are what the server's counters moved
    by: every request sent was served and counted once, with the prompt and output lengths asked for."""
    _, _, doc = _client(run)
    point, options = doc["points"][0], doc["options"]
    served = _served(run)
    burst_out = min(options["output_tokens"], 16)  # the warm-up burst's short requests
    extra = options["warmup_requests"] + options["warmup_burst"]
    assert served["vllm:request_success_total"] == point["requests"] + extra
    assert point["errors"] == 0 and point["tokens"]["prompt_mean"] == options["input_tokens"]
    assert served["vllm:prompt_tokens_total"] == options["input_tokens"] * (point["requests"] + extra)
    assert served["vllm:generation_tokens_total"] == (point["tokens"]["output_total"]
                                                      + options["output_tokens"] * options["warmup_requests"]
                                                      + burst_out * options["warmup_burst"])


def test_the_gap_to_vllms_bench_is_the_servers_own_step() -> None:
    """At the same 128 streams and 512 requests servescope's runs delivered more tokens/s than vLLM's bench; on the
    warm pair (each bench's second run) the throughputs differ by what the server's own time per output token
    differs by under the two loads, within 2%: the server ran its decode steps faster under servescope's load, and
    neither client mismeasured it."""
    _, ours, _ = _client("ss-count-2")
    _, theirs, _ = _client("vllm-2")
    assert ours > theirs * 1.05
    assert ours / theirs == pytest.approx(_server_tpot_ms("vllm-2") / _server_tpot_ms("ss-count-2"), rel=0.02)
