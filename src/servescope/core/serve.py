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

Each point is judged (:func:`judge_point`, thresholds and messages in ``data/findings-serve.toml``): a late
client is ``client_bound``; a client on time that still measures more than the engine's own histograms says
names the server's API front end (``front_end_bound``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from typing import Any

import msgspec

from servescope.core.document import Document
from servescope.core.messages import format_message

__all__ = [
    "DEFINITIONS",
    "SERVE_SCHEMA",
    "SERVE_SCHEMA_VERSION",
    "ClientLag",
    "Dist",
    "ServeOptions",
    "ServePoint",
    "ServeResult",
    "ServeFinding",
    "ServerSide",
    "TokenCounts",
    "is_client_bound",
    "judge_point",
    "load_serve_rules",
]

SERVE_SCHEMA = "servescope.bench_serve"
SERVE_SCHEMA_VERSION = 1

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
    ``[client_bound]`` in ``data/findings-serve.toml``): the client's own delays are then as large as what it
    measures, and its latencies overstate the server's.
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

    ``workers`` client processes shared its streams; ``findings`` name the bottleneck (see :func:`judge_point`).
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

    schema: str = SERVE_SCHEMA
    schema_version: int = SERVE_SCHEMA_VERSION
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


# ------------------------------------------------------------------------------------------------ findings

SEVERITIES = ("high", "medium", "info")
"""A finding's severities, gravest first."""


def load_serve_rules() -> dict[str, Any]:
    """The bundled ``data/findings-serve.toml``: ``client_bound`` and ``front_end_bound`` thresholds and messages."""
    return _serve_rules()


@cache
def _serve_rules() -> dict[str, Any]:
    return tomllib.loads((files("servescope") / "data" / "findings-serve.toml").read_text(encoding="utf-8"))


def is_client_bound(lag_p99_ms: float | None, tpot_median_ms: float | None,
                    rules: Mapping[str, Any] | None = None) -> bool:
    """Whether the client's own delays rival what it measures (``[client_bound]`` of the rules)."""
    rule = (rules or load_serve_rules())["client_bound"]
    if lag_p99_ms is None:
        return False
    return bool(lag_p99_ms > rule["lag_p99_ms_above"] and
                (tpot_median_ms is None or lag_p99_ms > rule["lag_share_of_tpot_median_above"] * tpot_median_ms))


def judge_point(point: ServePoint, rules: Mapping[str, Any] | None = None) -> list[ServeFinding]:
    """The findings of one point: ``client_bound`` when its client ran late, else ``front_end_bound`` when the
    client was on time but its TTFT/TPOT/ITL means exceed the engine's histogram means by the rules' margins.

    The two exclude each other: a late client's figures say nothing about the server.
    """
    rules = rules or load_serve_rules()
    lag = point.client_lag
    processes = f"{point.workers} client process{'es' if point.workers != 1 else ''}"
    values: dict[str, Any] = {"lag_p99_ms": lag.p99_ms, "lag_max_ms": lag.max_ms, "workers": point.workers,
                              "processes": processes, "tpot_median_ms": point.tpot_ms.median}
    evidence: dict[str, float] = {k: float(v) for k, v in (("lag_p99_ms", lag.p99_ms), ("workers", point.workers),
                                                           ("tpot_median_ms", point.tpot_ms.median)) if v is not None}
    if lag.client_bound or is_client_bound(lag.p99_ms, point.tpot_ms.median, rules):
        rule = rules["client_bound"]
        return [ServeFinding(id="client_bound", message=format_message(rule["message"], values), advice=rule["advice"],
                             evidence=evidence, severity=rule["severity"])]
    rule = rules["front_end_bound"]
    if lag.p99_ms is None or lag.p99_ms > rule["lag_p99_ms_at_most"]:
        return []
    if point.requests - point.errors < rule["min_requests"]:
        return []
    exceeded: list[str] = []
    severities: list[str] = []
    for figure in rule["figure"]:
        name = figure["name"]
        client: float | None = getattr(point, f"{name}_ms").mean
        server: float | None = getattr(point.server, f"{name}_ms_mean")
        if client is None or server is None or server <= 0:
            continue
        ratio = client / server
        values.update({f"client_{name}_ms": client, f"server_{name}_ms": server, f"{name}_ratio": ratio})
        evidence.update({f"client_{name}_ms": client, f"server_{name}_ms": server, f"{name}_ratio": ratio})
        margin = max(figure["excess_ms_above"], figure["lag_factor"] * lag.p99_ms)
        if ratio > figure["ratio_above"] and client - server > margin:
            exceeded.append(f"{figure['label']} {client:.1f} ms vs the engine's {server:.1f} ms ({ratio:.2f}x)")
            severities.append(figure["severity"])
    if not exceeded:
        return []
    values["figures"] = "; ".join(exceeded)
    return [ServeFinding(id="front_end_bound", message=format_message(rule["message"], values), advice=rule["advice"],
                         evidence=evidence, severity=min(severities, key=SEVERITIES.index))]
