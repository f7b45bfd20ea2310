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

With latency targets (``--slo``) each point also carries :class:`PointSlo`: whether the point met every target
(each target's statistic over the point's requests), its attainment (the share of requests that met every
target, each judged on its own figures) and its goodput (those requests per second, their output tokens per
second). A search for the knee (:mod:`servescope.bench.serve.knee`) adds :class:`Knee`, the most load that met
the targets, and :class:`KneeCause`, what bounds it, judged from the engine's own ``/metrics``.
"""

from __future__ import annotations

import msgspec

from servescope.core.document import Document

__all__ = ["DEFINITIONS", "ClientLag", "Dist", "Knee", "KneeCause", "KneeSearch", "PointSlo", "ServeFinding",
           "ServeOptions", "ServePoint", "ServeResult", "ServerSide", "SloTarget", "TargetCheck", "TokenCounts"]

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
    ``mean_running`` / ``mean_waiting`` average the gauges sampled while the point ran; ``kv_cache_usage_max``
    the highest KV-cache usage sampled (0..1); ``preemptions`` the requests preempted; ``queue_ms_mean`` /
    ``prefill_ms_mean`` / ``decode_ms_mean`` the engine's per-request phase means; ``step_tokens_mean`` the mean
    tokens per engine step over ``steps`` steps; ``prefix_cache_hit_rate`` the share of prompt tokens the
    prefix cache answered (near 0 when every request brings a prompt of its own).
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
    mean_running: float | None = None
    mean_waiting: float | None = None
    kv_cache_usage_max: float | None = None
    preemptions: float | None = None
    queue_ms_mean: float | None = None
    prefill_ms_mean: float | None = None
    decode_ms_mean: float | None = None
    step_tokens_mean: float | None = None
    steps: float | None = None
    prefix_cache_hit_rate: float | None = None


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


class SloTarget(msgspec.Struct, kw_only=True, frozen=True):
    """One latency target: ``metric`` (ttft, itl, tpot, e2e) at ``stat`` (p50, p90, p95, p99, mean) at most
    ``limit_ms``. ``definition`` says what the metric measures, as vLLM names it (ITL: gaps between tokens;
    TPOT: per request, (E2E - TTFT) / (tokens - 1))."""

    metric: str
    stat: str
    limit_ms: float
    definition: str = ""

    @property
    def name(self) -> str:
        """``ttft_p99``."""
        return f"{self.metric}_{self.stat}"


class TargetCheck(msgspec.Struct, kw_only=True, frozen=True):
    """One target at one point: the point's statistic, and whether it is within the limit."""

    target: str
    value_ms: float | None
    limit_ms: float
    met: bool


class PointSlo(msgspec.Struct, kw_only=True, frozen=True):
    """A point judged against the targets: ``met`` when every target's statistic is within its limit and no
    request failed; ``attainment`` the share of requests that met every target on their own figures;
    ``goodput_*`` those requests per second and their output tokens per second over the point's span."""

    met: bool
    checks: list[TargetCheck]
    attainment: float | None
    goodput_requests_per_s: float | None
    goodput_tokens_per_s: float | None
    missed_by: list[str] = []


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
    slo: PointSlo | None = None
    step: str | None = None   # the knee search's step that ran it: "probe", "bisect", "repeat"

    @property
    def load(self) -> float:
        """The point's load: its streams, or its request rate."""
        return float(self.concurrency if self.concurrency is not None else self.rate or 0.0)


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
    warmup_burst: int = 0
    prompt_form: str | None = None  # ids or text as sent (None: a document from before the option)


class KneeCause(msgspec.Struct, kw_only=True, frozen=True):
    """What bounds the knee, judged from the engine's ``/metrics`` over the points around it and the client's lag
    (``data/knee.toml``). ``setting`` is what moves it; ``in_place`` whether the server already has it (``None``:
    the server's settings were not readable); ``setting_value`` the value the server runs with, where known."""

    id: str
    title: str
    message: str
    evidence: dict[str, float]
    setting: str
    advice: str
    in_place: bool | None = None
    setting_value: str | None = None
    at_load: float | None = None


class Knee(msgspec.Struct, kw_only=True, frozen=True):
    """The most load (``load``: streams, or requests/s with ``--rate auto``) whose points met every target,
    with its goodput (the median over its repeats) and ``spread`` (the lowest and highest goodput tokens/s of
    the repeats), and ``met`` / ``repeats`` (how many of the repeats met the targets). ``next_load`` is the
    least load seen to miss them (``None``: none missed within the search's limits). ``tokens_per_s``: the output
    tokens/s of all the knee's requests (the median over its repeats; ``tokens_spread`` their lowest and highest):
    the load met the targets as a whole, so it is what the server delivers there; steadier than goodput, whose
    per-request test (each request's own ITL p99, nearly its largest gap) counts a share of the requests that
    swings with where prefill chunks fall. ``most_tokens_at``: (load, tokens/s) of a lower load that met the targets
    and delivered clearly more output tokens/s than the knee's (:func:`servescope.core.knee.most_delivered`);
    ``None`` where the knee's load delivered the most."""

    unit: str
    load: float
    goodput_requests_per_s: float
    goodput_tokens_per_s: float
    spread: tuple[float, float]
    met: int
    repeats: int
    next_load: float | None = None
    missed_by: list[str] = []
    tokens_per_s: float | None = None
    tokens_spread: tuple[float, float] | None = None
    most_tokens_at: tuple[float, float] | None = None


class KneeSearch(msgspec.Struct, kw_only=True, frozen=True):
    """How the knee was searched: on what (``unit``), the bracket tolerance, the budget, and why it stopped."""

    unit: str
    tolerance: float
    repeats: int
    start: float
    max_load: float | None
    budget_s: float | None
    max_requests: int | None
    stopped: str
    requests: int = 0
    seconds: float = 0.0


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
    slo: list[SloTarget] = []
    slo_default: bool = False
    search: KneeSearch | None = None
    knee: Knee | None = None
    cause: KneeCause | None = None
    # the catalogue's next steps for this server (what `tune` would try), absent where none applies
    next_steps: list[str] | msgspec.UnsetType = msgspec.UNSET
