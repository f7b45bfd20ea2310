"""/metrics parsing and window deltas, on exposition text written by prometheus_client itself."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from servescope.server.metrics import parse_metrics, server_side


def _registry(tpot_name: str, tpots: list[float], ttfts: list[float], tokens: int) -> str:
    reg = CollectorRegistry()
    tpot = Histogram(tpot_name, "tpot", ["model_name"], registry=reg, buckets=(0.001, 0.01, 0.1))
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"], registry=reg)
    gen = Counter("vllm:generation_tokens", "tokens", ["model_name"], registry=reg)
    Gauge("vllm:num_requests_running", "running", ["model_name"], registry=reg).labels("m").set(len(tpots))
    for v in tpots:
        tpot.labels("m").observe(v)
    for v in ttfts:
        ttft.labels("m").observe(v)
    gen.labels("m").inc(tokens)
    return generate_latest(reg).decode()


@pytest.mark.no_server
def test_window_means_are_sum_over_count_deltas() -> None:
    before = parse_metrics(_registry("vllm:request_time_per_output_token_seconds", [0.002], [0.05], 10))
    after = parse_metrics(_registry("vllm:request_time_per_output_token_seconds", [0.002, 0.004, 0.006],
                                    [0.05, 0.01, 0.03], 70))
    side = server_side(before, after, [])
    assert side.tpot_ms_mean == pytest.approx((0.004 + 0.006) / 2 * 1000)  # the two new requests only
    assert side.ttft_ms_mean == pytest.approx((0.01 + 0.03) / 2 * 1000)
    assert side.generation_tokens == 60
    assert side.max_running == 3
    assert side.tpot_metric == "vllm:request_time_per_output_token_seconds"


@pytest.mark.no_server
def test_older_vllm_names_are_found() -> None:
    before = parse_metrics(_registry("vllm:time_per_output_token_seconds", [], [], 0))
    after = parse_metrics(_registry("vllm:time_per_output_token_seconds", [0.01, 0.03], [0.1, 0.1], 2))
    side = server_side(before, after, [])
    assert side.tpot_metric == "vllm:time_per_output_token_seconds"
    assert side.itl_metric == "vllm:time_per_output_token_seconds"
    assert side.tpot_ms_mean == pytest.approx(20.0)


@pytest.mark.no_server
def test_no_metrics_is_not_available_not_zero() -> None:
    side = server_side(None, None, [])
    assert side.tpot_ms_mean is None and side.generation_tokens is None


@pytest.mark.no_server
def test_not_prometheus_text_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_metrics("<html>hello</html>\n")
