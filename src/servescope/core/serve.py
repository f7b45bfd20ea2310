"""The ``bench serve`` result document: one point per concurrency or request rate of a load sweep.

Metric definitions (after AIPerf's), written beside each figure in every view:

- **TTFT**: request sent → first chunk that carries text.
- **E2E**: request sent → last chunk (the ``[DONE]`` of the stream).
- **TPOT** (per request): ``(E2E − TTFT) / (output tokens − 1)``; output tokens from the server's
  ``usage.completion_tokens``, never from counting chunks. AIPerf calls this *inter-token latency*.
- **ITL** here: the gaps between successive text chunks (AIPerf's *inter-chunk latency*). With
  speculative decoding or merged chunks a chunk carries several tokens, so ITL and TPOT differ.
- **output tok/s**: all output tokens of the point / the point's span (first send → last answer).

Times are milliseconds (``_ms``); ``None`` (``null``) means not available.

Each point carries its findings (``client_bound``, ``front_end_bound``), judged by
:mod:`servescope.bench.serve.bottleneck`.
"""

from __future__ import annotations

import msgspec

from servescope.core.document import Document

__all__ = ["DEFINITIONS", "ClientLag", "Dist", "ServeFinding", "ServeOptions", "ServePoint", "ServeResult",
           "ServerSide", "TokenCounts"]

DEFINITIONS: dict[str, str] = {
    "ttft_ms": "request sent -> first text chunk",
    "tpot_ms": "per request (e2e - ttft) / (usage output tokens - 1)",
    "itl_ms": "gaps between text chunks (a chunk may hold several tokens)",
    "e2e_ms": "request sent -> end of stream",
    "output_tokens_per_s": "usage output tokens / point span",
    "requests_per_s": "completed requests / point span",
    "server.tpot_ms_mean": "server histogram mean over the point (/metrics after - before)",
    "client_lag_ms": "event-loop lag: how late a 1 ms timer fires while streams run (every client process)",
    "workers": "client processes that shared the point's streams (one clock: CLOCK_MONOTONIC)",
}


class Dist(msgspec.Struct, kw_only=True, frozen=True):
    """Mean, median, p90 and p99 of a set of samples (ms); ``None`` when there are no samples."""

    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None
    samples: int = 0


class ServerSide(msgspec.Struct, kw_only=True, frozen=True):
    """The server's own view of one point: histogram means and counter deltas from ``/metrics``.

    ``*_metric`` names the Prometheus series each mean came from (names drift across vLLM versions).
    """

    ttft_ms_mean: float | None = None
    tpot_ms_mean: float | None = None
    itl_ms_mean: float | None = None
    e2e_ms_mean: float | None = None
    ttft_metric: str | None = None
    tpot_metric: str | None = None
    itl_metric: str | None = None
    e2e_metric: str | None = None
    requests: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    max_running: float | None = None
    max_waiting: float | None = None
    scrapes: int = 0


class TokenCounts(msgspec.Struct, kw_only=True, frozen=True):
    """Tokens as the server's ``usage`` reported them, against what was asked for."""

    output_total: int
    output_requested_total: int
    output_mismatched_requests: int
    prompt_mean: float | None
    prompt_requested: int


class ClientLag(msgspec.Struct, kw_only=True, frozen=True):
    """How late the client's event loop ran (ms): a timer that should fire every 1 ms, measured.

    ``client_bound`` is set when the p99 lag exceeds both 5 ms and half the median TPOT (the thresholds of
    ``[client_bound]`` in ``data/findings-serve.toml``, :func:`servescope.bench.serve.bottleneck.is_client_bound`): the
    client's own delays are then as large as what it measures, and its latencies overstate the server's.
    """

    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    client_bound: bool = False


class ServeFinding(msgspec.Struct, kw_only=True, frozen=True):
    """Who is the bottleneck at one point: ``client_bound`` or ``front_end_bound``, with the numbers it cites."""

    id: str
    message: str
    advice: str
    evidence: dict[str, float]
    severity: str | None = None  # "high" | "medium" | "info" (None: a document written before findings had one)


class ServePoint(msgspec.Struct, kw_only=True, frozen=True):
    """One load level: ``concurrency`` (closed loop) or ``rate`` (Poisson arrivals, requests/s).

    ``workers`` client processes shared its streams; ``findings`` name the bottleneck
    (:func:`servescope.bench.serve.bottleneck.judge_point`).
    """

    concurrency: int | None
    rate: float | None
    requests: int
    errors: int
    error_examples: list[str]
    duration_s: float
    ttft_ms: Dist
    tpot_ms: Dist
    itl_ms: Dist
    e2e_ms: Dist
    output_tokens_per_s: float | None
    requests_per_s: float | None
    tokens: TokenCounts
    client_lag: ClientLag
    server: ServerSide
    stopped: str | None = None
    workers: int = 1
    findings: list[ServeFinding] = []


class ServeOptions(msgspec.Struct, kw_only=True, frozen=True):
    """Every option that changes a number."""

    model: str
    input_tokens: int
    output_tokens: int
    concurrency: list[int]
    rate: list[float]
    requests: int | None
    duration_s: float | None
    warmup_requests: int
    max_concurrency: int | None
    seed: int
    prompt_source: str
    timeout_s: float
    workers: int = 0
    cpus: int | None = None


class ServeResult(Document, kw_only=True, frozen=True):
    """A whole sweep. ``aborted`` says why it stopped early (the server died), else ``None``.

    The API key is never part of this document; ``api_key_source`` names where one came from.
    """

    schema: str = "servescope.bench_serve"
    schema_version: int = 1
    servescope_version: str
    created_at: str
    url: str
    platform: dict[str, str]
    options: ServeOptions
    definitions: dict[str, str]
    points: list[ServePoint]
    aborted: str | None = None
    metrics_available: bool = False
    api_key_source: str | None = None
