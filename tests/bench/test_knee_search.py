"""The knee search's parts without a server: targets, the next load, a point against targets, the knee."""

from __future__ import annotations

import pytest

from servescope.bench.serve.knee import knee_of, next_load
from servescope.bench.serve.slo import judge_slo
from servescope.bench.serve.streams import Sample
from servescope.core.errors import InputError
from servescope.core.knee import DEFAULT_SLO, parse_slo
from servescope.core.serve import ClientLag, Dist, PointSlo, ServePoint, ServerSide, TokenCounts


def test_targets_parse_with_vllm_names_and_defaults() -> None:
    targets = parse_slo("ttft_p99=2000, itl_p95=50,tpot_mean=30ms,e2e_median=9000")
    assert [(t.metric, t.stat, t.limit_ms) for t in targets] == [
        ("ttft", "p99", 2000.0), ("itl", "p95", 50.0), ("tpot", "mean", 30.0), ("e2e", "p50", 9000.0)]
    assert "gaps between successive tokens" in targets[1].definition
    assert "per request" in targets[2].definition
    assert [t.name for t in parse_slo(None)] == [t.split("=")[0] for t in DEFAULT_SLO.split(",")]


@pytest.mark.parametrize(("text", "says"), [
    ("ttft=abc", "not a number"), ("ttft_p99=-5", "positive"), ("latency_p99=5", "unknown metric"),
    ("ttft_p42=5", "unknown statistic"), ("ttft_p99", "no '='"), ("ttft_p99=1,,itl_p99=2", "empty target"),
    ("ttft_p99=1,ttft_p99=2", "given twice"), ("ttft_p99=nan", "positive"), ("ttft_p99=inf", "positive"),
])
def test_bad_targets_are_one_line(text: str, says: str) -> None:
    with pytest.raises(InputError, match=says) as caught:
        parse_slo(text)
    assert "\n" not in str(caught.value) and "--slo" in str(caught.value)


def test_next_load_probes_then_bisects_to_the_tolerance() -> None:
    kw = {"mode": "concurrency", "start": 1.0, "max_load": 1024.0, "tolerance": 0.1}
    assert next_load(None, None, **kw) == 1.0
    assert next_load(8.0, None, **kw) == 16.0
    assert next_load(1024.0, None, **kw) is None
    assert next_load(16.0, 32.0, **kw) == 24.0
    assert next_load(24.0, 26.0, **kw) is None            # 2 / 24 < 10%
    assert next_load(2.0, 3.0, **kw) is None              # one stream apart
    assert next_load(None, 1.0, **kw) is None             # the first load missed
    rate = {**kw, "mode": "rate"}
    assert next_load(2.0, 4.0, **rate) == 3.0
    assert next_load(3.0, 3.2, **rate) is None


def _sample(ttft: float, gaps: list[float], tokens: int, error: str | None = None, sent: float = 0.0) -> Sample:
    chunks = [ttft]
    for gap in gaps:
        chunks.append(chunks[-1] + gap)
    return Sample(error=error, ttft_s=ttft, e2e_s=chunks[-1], chunk_s=chunks, output_tokens=tokens,
                  sent_at=sent, done_at=sent + chunks[-1])


def test_a_point_against_targets_counts_good_requests_by_their_own_figures() -> None:
    targets = parse_slo("ttft_p99=100,itl_p99=20")
    fast = [_sample(0.05, [0.01] * 9, 10) for _ in range(8)]
    slow_first = _sample(0.3, [0.01] * 9, 10)            # TTFT 300 ms: not good
    stall = _sample(0.05, [0.01] * 8 + [0.2], 10)         # one 200 ms gap: its own p99 gap > 20 ms
    failed = _sample(0.05, [], 0, error="HTTP 500")
    judged = judge_slo([*fast, slow_first, stall, failed], targets, span_s=2.0)
    assert judged.attainment == pytest.approx(8 / 11)
    assert judged.goodput_requests_per_s == pytest.approx(8 / 2.0)
    assert judged.goodput_tokens_per_s == pytest.approx(8 * 10 / 2.0)
    assert not judged.met and "errors" in judged.missed_by
    # the point's TTFT p99 over 10 successful requests (numpy's linear percentile, by hand)
    ttfts = sorted([50.0] * 9 + [300.0])
    rank = 0.99 * (len(ttfts) - 1)
    expect = ttfts[int(rank)] + (ttfts[int(rank) + 1] - ttfts[int(rank)]) * (rank - int(rank))
    assert judged.checks[0].value_ms == pytest.approx(expect)
    ok = judge_slo(fast, targets, span_s=1.0)
    assert ok.met and ok.attainment == 1.0 and ok.missed_by == []


def _point(load: int, met: bool, goodput: float, step: str = "probe") -> ServePoint:
    dist = Dist(mean=1.0, median=1.0, p90=1.0, p99=1.0, samples=1)
    return ServePoint(concurrency=load, rate=None, requests=8, errors=0, error_examples=[], duration_s=1.0,
                      ttft_ms=dist, tpot_ms=dist, itl_ms=dist, e2e_ms=dist, output_tokens_per_s=goodput,
                      requests_per_s=1.0, tokens=TokenCounts(output_total=8, output_requested_total=8,
                                                             output_mismatched_requests=0, prompt_mean=1.0,
                                                             prompt_requested=1),
                      client_lag=ClientLag(p50_ms=0.1, p99_ms=0.2, max_ms=0.3), server=ServerSide(), step=step,
                      slo=PointSlo(met=met, checks=[], attainment=1.0 if met else 0.5,
                                   goodput_requests_per_s=goodput / 10, goodput_tokens_per_s=goodput,
                                   missed_by=[] if met else ["itl_p99"]))


def test_the_knee_is_the_highest_load_every_repeat_of_which_met() -> None:
    points = [_point(1, True, 10), _point(2, True, 19), _point(4, True, 35), _point(8, False, 30),
              _point(6, True, 50, "bisect"), _point(7, False, 45, "bisect"), _point(6, True, 54, "repeat"),
              _point(7, False, 44, "repeat")]
    knee = knee_of(points, "streams")
    assert knee is not None
    assert (knee.load, knee.repeats, knee.met, knee.next_load) == (6.0, 2, 2, 7.0)
    assert knee.spread == (50.0, 54.0) and knee.goodput_tokens_per_s == pytest.approx(52.0)
    assert knee.missed_by == ["itl_p99"]
    # a repeat that misses takes the load out: the knee falls to the next load that always met
    flaky = [*points, _point(6, False, 20, "repeat")]
    fallen = knee_of(flaky, "streams")
    assert fallen is not None and fallen.load == 4.0
    assert knee_of([_point(1, False, 1)], "streams") is None


@pytest.mark.parametrize("args", [["--slo", "ttft=abc"], ["--slo", "ttft_p99=-1"], ["--slo", "speed_p99=5"],
                                  ["--budget", "soon"], ["--rate", "auto", "--concurrency", "4"]])
def test_bad_search_options_are_one_line_exit_2_before_any_request(args: list[str]) -> None:
    import subprocess
    import sys

    # port 9 (discard) has no server: the options must be refused before anything is sent
    run = subprocess.run([sys.executable, "-m", "servescope", "bench", "serve", "http://127.0.0.1:9", *args],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope: error:") and "Traceback" not in run.stderr
