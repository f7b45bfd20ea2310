"""The server's own view of a load test: ``/metrics`` (Prometheus text) scraped before, during and after.

A scrape becomes a flat :class:`Snapshot` (sample name → value summed over label sets, histogram
buckets dropped). Two snapshots give counter and histogram deltas; a histogram's mean over a window is
``Δ_sum / Δ_count``. Shell twin: ``curl -s URL/metrics | grep -E '^vllm:(time_to_first|e2e)'``.

vLLM renames series between versions, so each figure lists its candidates, newest first:

- TPOT per request: ``vllm:request_time_per_output_token_seconds`` (0.10+), else the per-token
  ``vllm:inter_token_latency_seconds`` (0.9+), else ``vllm:time_per_output_token_seconds`` (older);
- ITL: ``vllm:inter_token_latency_seconds``, else ``vllm:time_per_output_token_seconds``;
- TTFT ``vllm:time_to_first_token_seconds``; E2E ``vllm:e2e_request_latency_seconds``;
- SGLang's ``sglang:time_to_first_token_seconds`` / ``sglang:inter_token_latency_seconds`` /
  ``sglang:e2e_request_latency_seconds`` likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from servescope.core.serve import ServerSide
from servescope.server.client import ServerClient
from servescope.server.errors import ServerError

__all__ = [
    "E2E_SERIES",
    "ITL_SERIES",
    "KV_USAGE_SERIES",
    "PREEMPTION_SERIES",
    "TPOT_SERIES",
    "TTFT_SERIES",
    "Snapshot",
    "parse_info_gauges",
    "parse_metrics",
    "scrape_metrics",
    "server_side",
]

TTFT_SERIES = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
TPOT_SERIES = ("vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
               "vllm:time_per_output_token_seconds", "sglang:inter_token_latency_seconds",
               "sglang:time_per_output_token_seconds")
ITL_SERIES = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
              "sglang:inter_token_latency_seconds")
E2E_SERIES = ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")
_REQUESTS = ("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count")
_GENERATION = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")
_PROMPT = ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE_SERIES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
PREEMPTION_SERIES = ("vllm:num_preemptions_total", "vllm:num_preemptions")
QUEUE_SERIES = ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds")
PREFILL_SERIES = ("vllm:request_prefill_time_seconds",)
DECODE_SERIES = ("vllm:request_decode_time_seconds",)
STEP_TOKENS_SERIES = ("vllm:iteration_tokens_total",)
PREFIX_HITS_SERIES = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES_SERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")


@dataclass(frozen=True)
class Snapshot:
    """One scrape: sample name → value, summed over label sets (``_bucket`` samples left out)."""

    values: dict[str, float]

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse_metrics(text: str) -> Snapshot:
    """A :class:`Snapshot` of Prometheus exposition ``text``.

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return Snapshot(values)


def parse_info_gauges(text: str) -> dict[str, list[dict[str, str]]]:
    """The label sets of each ``*_info`` series in Prometheus ``text``, e.g. ``vllm:cache_config_info``.

    An info gauge carries its information in labels (its value is 1), which :func:`parse_metrics` drops.
    Shell twin: ``curl -s URL/metrics | grep '_info{'``.

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_info") and family.type in ("gauge", "info", "unknown"):
                found.setdefault(sample.name, []).append(dict(sample.labels))
    return found


async def scrape_metrics(client: ServerClient) -> Snapshot | None:
    """``GET /metrics`` as a snapshot, or ``None`` when the server has none (404, not Prometheus text)."""
    try:
        text = await client.get_text("/metrics")
        return parse_metrics(text)
    except (ServerError, ValueError):
        return None


def _delta(before: Snapshot, after: Snapshot, name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    if a is None:
        return None
    return a - (b or 0.0)


def _first_delta(before: Snapshot, after: Snapshot, names: tuple[str, ...]) -> float | None:
    for name in names:
        value = _delta(before, after, name)
        if value is not None:
            return value
    return None


def _hist_mean_ms(before: Snapshot, after: Snapshot, names: tuple[str, ...]) -> tuple[float | None, str | None]:
    """The mean (ms) over the window of the first histogram in ``names`` that saw observations."""
    for name in names:
        total = _delta(before, after, f"{name}_sum")
        count = _delta(before, after, f"{name}_count")
        if total is not None and count:
            return total / count * 1000.0, name
    return None, None


def server_side(before: Snapshot | None, after: Snapshot | None, during: list[Snapshot]) -> ServerSide:
    """The server's figures for one window: histogram means, counter deltas, peak running/waiting."""
    if before is None or after is None:
        return ServerSide(scrapes=len(during))
    ttft, ttft_name = _hist_mean_ms(before, after, TTFT_SERIES)
    tpot, tpot_name = _hist_mean_ms(before, after, TPOT_SERIES)
    itl, itl_name = _hist_mean_ms(before, after, ITL_SERIES)
    e2e, e2e_name = _hist_mean_ms(before, after, E2E_SERIES)
    window = [before, *during, after]

    def peak(names: tuple[str, ...]) -> float | None:
        seen = [v for snap in window for v in (snap.get(n) for n in names) if v is not None]
        return max(seen) if seen else None

    def mean_during(names: tuple[str, ...]) -> float | None:
        seen = [_first(snap, names) for snap in during]
        values = [v for v in seen if v is not None]
        return sum(values) / len(values) if values else None

    steps_total, _ = _hist_sum_count(before, after, STEP_TOKENS_SERIES)
    hits = _first_delta(before, after, PREFIX_HITS_SERIES)
    queries = _first_delta(before, after, PREFIX_QUERIES_SERIES)
    queue, _ = _hist_mean_ms(before, after, QUEUE_SERIES)
    prefill, _ = _hist_mean_ms(before, after, PREFILL_SERIES)
    decode, _ = _hist_mean_ms(before, after, DECODE_SERIES)
    return ServerSide(
        ttft_ms_mean=ttft, tpot_ms_mean=tpot, itl_ms_mean=itl, e2e_ms_mean=e2e,
        ttft_metric=ttft_name, tpot_metric=tpot_name, itl_metric=itl_name, e2e_metric=e2e_name,
        requests=_first_delta(before, after, _REQUESTS),
        generation_tokens=_first_delta(before, after, _GENERATION),
        prompt_tokens=_first_delta(before, after, _PROMPT),
        max_running=peak(_RUNNING), max_waiting=peak(_WAITING), scrapes=len(window),
        mean_running=mean_during(_RUNNING), mean_waiting=mean_during(_WAITING),
        kv_cache_usage_max=peak(KV_USAGE_SERIES),
        preemptions=_first_delta(before, after, PREEMPTION_SERIES), queue_ms_mean=queue, prefill_ms_mean=prefill,
        decode_ms_mean=decode, step_tokens_mean=(steps_total[0] / steps_total[1]) if steps_total else None,
        steps=steps_total[1] if steps_total else None,
        prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
    )


def _first(snap: Snapshot, names: tuple[str, ...]) -> float | None:
    return next((v for v in (snap.get(n) for n in names) if v is not None), None)


def _hist_sum_count(before: Snapshot, after: Snapshot,
                    names: tuple[str, ...]) -> tuple[tuple[float, float] | None, str | None]:
    """The (sum, count) deltas over the window of the first histogram in ``names`` that saw observations."""
    for name in names:
        total = _delta(before, after, f"{name}_sum")
        count = _delta(before, after, f"{name}_count")
        if total is not None and count:
            return (total, count), name
    return None, None
