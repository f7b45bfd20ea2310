"""The knee's cause judged again from real recordings: three vLLM 0.26 servers on an H100, each set up so that
one cause bounds its knee (tests/data/knee/h100, README.md there).

What each server was set up with is known independently of servescope (the flags it was started with); the
figures that show it are read here from the document with plain ``json.load``: the cause servescope names must
be the one its configuration and its own /metrics say.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import msgspec
import pytest

from servescope.bench.serve.cause import judge_knee
from servescope.bench.serve.knee import client_explains, knee_of
from servescope.core.serve import ServeResult, ServerSide

DATA = Path(__file__).resolve().parents[1] / "data" / "knee" / "h100"
# the servers' command lines (tools/gpu_vllm/knee_session.sh), what the test knows without servescope
ARGV = {
    "defaults": ["vllm", "serve", "--kv-cache-memory-bytes", "8589934592"],
    "seqs": ["vllm", "serve", "--max-num-seqs", "16", "--kv-cache-memory-bytes", "4294967296"],
    "kv": ["vllm", "serve", "--kv-cache-memory-bytes", "536870912"],
    "prefill": ["vllm", "serve", "--max-num-batched-tokens", "256", "--kv-cache-memory-bytes", "4294967296"],
}


def _raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"knee-{name}.json").read_text())
    return data


def _doc(name: str) -> ServeResult:
    return msgspec.json.decode((DATA / f"knee-{name}.json").read_bytes(), type=ServeResult)


def _load(p: dict[str, Any]) -> float:
    return float(p["concurrency"] if p["concurrency"] is not None else p["rate"])


def _judged(name: str) -> tuple[ServeResult, Any]:
    doc = _doc(name)
    knee = knee_of(doc.points, "streams")
    assert knee is not None
    past = [p for p in doc.points if p.slo and not p.slo.met and (p.concurrency or 0) > knee.load]
    first = min(past, key=lambda p: p.concurrency or 0)
    at_knee = next(p for p in doc.points if p.concurrency == knee.load)
    cause = judge_knee(first, knee=at_knee, first=doc.points[0], prompt_tokens=doc.options.input_tokens,
                       server_argv=ARGV[name], client_explains=client_explains(first))
    return doc, cause


def test_the_knee_is_the_highest_load_that_always_met_by_plain_json() -> None:
    for name in ARGV:
        raw = _raw(name)
        loads: dict[float, list[bool]] = {}
        for p in raw["points"]:
            loads.setdefault(_load(p), []).append(p["slo"]["met"])
        expect = max(load for load, met in loads.items() if all(met))
        assert raw["knee"]["load"] == expect
        again = knee_of(_doc(name).points, "streams")
        # recorded before the knee carried the tokens/s its load delivered: everything else as written then
        assert msgspec.structs.replace(again, tokens_per_s=None, tokens_spread=None,
                                       most_tokens_at=None) == _doc(name).knee
        delivered = [p["output_tokens_per_s"] for p in raw["points"] if _load(p) == expect]
        assert again.tokens_per_s == statistics.median(delivered)
        assert again.tokens_spread == (min(delivered), max(delivered))


def test_near_the_knee_what_a_load_delivers_varies_less_than_its_goodput() -> None:
    """Why tune compares the tokens/s the knee's load delivered, not goodput: a request is good only when its own
    ITL p99 (nearly its largest gap) is within the target, so the good share swings with where prefill chunks fall.
    On every load these servers ran twice near their knees, goodput moved at least as much as the delivered
    tokens/s, and on the defaults server several times more (plain json over the points)."""
    moved = []
    for name in ARGV:
        by_load: dict[float, list[dict[str, Any]]] = {}
        for p in _raw(name)["points"]:
            by_load.setdefault(_load(p), []).append(p)
        for load, twice in by_load.items():
            if len(twice) != 2:
                continue
            good = [p["slo"]["goodput_tokens_per_s"] for p in twice]
            made = [p["output_tokens_per_s"] for p in twice]
            moved.append((name, load, abs(good[0] - good[1]) / max(good), abs(made[0] - made[1]) / max(made)))
    assert len(moved) >= 5
    assert all(g >= m - 0.01 for _, _, g, m in moved), moved
    worst = max(moved, key=lambda m: m[2])
    assert worst[0] == "defaults" and worst[2] > 3 * worst[3], worst


def test_prefill_chunks_that_stall_decode_are_named_on_the_defaults_server() -> None:
    """vLLM's defaults (max_num_batched_tokens 8192 on this H100, its log): no queue, yet ITL p99 missed while the
    median gap held — steps that carry other requests' prefills. The engine's own figures, by plain json."""
    raw = _raw("defaults")
    past = [p for p in raw["points"] if not p["slo"]["met"] and _load(p) > raw["knee"]["load"]]
    first = min(past, key=_load)
    assert "itl_p99" in first["slo"]["missed_by"] and first["server"]["max_waiting"] == 0
    assert first["itl_ms"]["p99"] / first["itl_ms"]["median"] >= 4
    _, cause = _judged("defaults")
    assert cause is not None and cause.id == "prefill_interference" and "smaller" in cause.advice
    assert cause.in_place is False          # the flag is not on its command line: vLLM's default applies


def test_a_scheduler_cap_is_named_with_the_flag_in_place() -> None:
    raw = _raw("seqs")
    past = [p for p in raw["points"] if not p["slo"]["met"] and _load(p) > raw["knee"]["load"]]
    assert past and all(p["server"]["max_running"] <= 16 < _load(p) for p in past)    # pinned at the cap
    assert all(p["server"]["max_waiting"] > 0 for p in past)                          # a queue behind it
    _, cause = _judged("seqs")
    assert cause is not None and cause.id == "scheduler_cap"
    assert cause.setting == "--max-num-seqs" and cause.in_place is True and cause.setting_value == "16"


def test_a_full_kv_cache_is_named_from_preemptions() -> None:
    raw = _raw("kv")
    past = [p for p in raw["points"] if not p["slo"]["met"] and _load(p) > raw["knee"]["load"]]
    assert all(p["server"]["preemptions"] > 0 and p["server"]["kv_cache_usage_max"] >= 0.95 for p in past)
    _, cause = _judged("kv")
    assert cause is not None and cause.id == "kv_cache_full"
    assert "--kv-cache-memory-bytes" in cause.setting


def test_prefill_that_takes_the_steps_is_named_from_the_prompt_and_the_token_budget() -> None:
    raw = _raw("prefill")
    assert raw["options"]["input_tokens"] / 256 == 8          # each prompt needs 8 steps of 256 tokens
    past = [p for p in raw["points"] if not p["slo"]["met"] and _load(p) > raw["knee"]["load"]]
    assert any("ttft_p99" in p["slo"]["missed_by"] and "itl_p99" not in p["slo"]["missed_by"] for p in past)
    _, cause = _judged("prefill")
    assert cause is not None and cause.id == "prefill_interference"
    assert cause.setting == "--max-num-batched-tokens" and cause.setting_value == "256"
    # the same server's figures, the scheduling flag absent: not in place, said so
    other = judge_knee(_doc("prefill").points[-1], knee=None, first=None, prompt_tokens=2048, server_argv=["vllm"])
    assert other is None or other.in_place in (False, None)


@pytest.mark.parametrize("name", list(ARGV))
def test_no_cause_where_nothing_missed_or_nothing_shows_one(name: str) -> None:
    """A point that met the targets has no cause; a missed point of a server without /metrics has no evidence,
    so no rule holds: the knee is given without a named cause, never with a guessed one."""
    doc = _doc(name)
    for point in doc.points:
        if point.slo is not None and point.slo.met:
            assert judge_knee(point, knee=None, first=doc.points[0], prompt_tokens=doc.options.input_tokens,
                              server_argv=ARGV[name]) is None
    missed = next(p for p in doc.points if p.slo is not None and not p.slo.met)
    blind = msgspec.structs.replace(missed, server=ServerSide(), findings=[])
    assert judge_knee(blind, knee=None, first=None, prompt_tokens=doc.options.input_tokens, server_argv=None) is None


def test_a_late_client_explains_a_miss_only_where_the_engine_itself_met_the_limit() -> None:
    """The same real point past the seqs server's knee, its client made late by hand: the engine's own TTFT mean
    (from /metrics) is beyond the limit, so the miss stays the server's; with the engine's mean within the limit
    and a lag larger than the excess, the client could explain it."""
    doc = _doc("seqs")
    knee = knee_of(doc.points, "streams")
    assert knee is not None
    point = next(p for p in doc.points if p.slo and not p.slo.met and (p.concurrency or 0) > knee.load)
    ttft = next(c for c in point.slo.checks if c.target == "ttft_p99") if point.slo else None
    assert ttft is not None and ttft.value_ms is not None
    late = msgspec.structs.replace(point.client_lag, client_bound=True, p99_ms=ttft.value_ms)   # a lag as big
    engine_mean = point.server.ttft_ms_mean
    assert engine_mean is not None
    slow = msgspec.structs.replace(point, client_lag=late)
    assert client_explains(slow) is (engine_mean <= ttft.limit_ms)
    within = msgspec.structs.replace(slow, server=msgspec.structs.replace(point.server, ttft_ms_mean=1.0,
                                                                         itl_ms_mean=1.0))
    assert client_explains(within)
    on_time = msgspec.structs.replace(within, client_lag=msgspec.structs.replace(late, client_bound=False))
    assert not client_explains(on_time)


def test_the_knee_renders_again_from_its_document_text_and_html(tmp_path: Path) -> None:
    """`report` re-renders a saved search: the answer first (the knee, what bounds it, the setting), one row per
    point, and an HTML page with the knee's chart; --compare's line against another search."""
    import subprocess
    import sys

    from servescope.report.knee import knee_change

    raw = _raw("seqs")
    text = subprocess.run([sys.executable, "-m", "servescope", "report", str(DATA / "knee-seqs.json")],
                          capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "100"},
                          timeout=60)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    knee_line = next(i for i, line in enumerate(lines) if line.startswith("knee: "))
    assert lines[knee_line].startswith(f"knee: {raw['knee']['load']:g} streams")
    assert any(line.startswith("bounded by the scheduler's cap") for line in lines[knee_line:knee_line + 3])
    assert sum(1 for line in lines if line.split()[:1] in (["probe"], ["bisect"], ["repeat"])) == len(raw["points"])
    html = tmp_path / "knee.html"
    run = subprocess.run([sys.executable, "-m", "servescope", "report", str(DATA / "knee-seqs.json"), "--html",
                          str(html)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = html.read_text()
    assert 'id="chart-knee"' in page and "Targets and the knee" in page and "--max-num-seqs" in page
    change = knee_change(_doc("kv"), _doc("seqs"))
    assert change is not None and f"{raw['knee']['load']:g} → {_raw('kv')['knee']['load']:g}" in change


def test_tune_compares_what_the_knee_delivered_with_its_spread() -> None:
    """What tune takes from a recorded search: the knee's delivered tokens/s and the spread of its repeats (plain
    json over the points at the knee's load), goodput kept beside it; a document without it falls back to goodput.
    The figure compared is the knee's, unless a lower load that met the targets delivered more than the knee's best
    repeat by over 2% (the kv server: 48 streams over its knee of 52, whose steps preempted)."""
    from servescope.tune.measure import figure_of

    lower_won = set()
    for name in ARGV:
        doc, raw = _doc(name), _raw(name)
        searched = msgspec.structs.replace(doc, knee=knee_of(doc.points, "streams"))
        figure = figure_of(searched, 1.0).figure
        knee_load = raw["knee"]["load"]
        at_knee = [p["output_tokens_per_s"] for p in raw["points"] if _load(p) == knee_load]
        assert figure.tokens_per_s == statistics.median(at_knee)
        better = [t for load, t in _met_by_load(raw).items() if load < knee_load and t > max(at_knee) * 1.02]
        assert figure.delivered == pytest.approx(max(better) if better else statistics.median(at_knee))
        if better:
            lower_won.add(name)
        assert figure.spread == [min(at_knee), max(at_knee)]
        assert figure.goodput_tokens_per_s == _raw(name)["knee"]["goodput_tokens_per_s"]
        # the room the knee leaves under each target: the worst of its repeats, read from the points
        worst: dict[str, float] = {}
        for p in _raw(name)["points"]:
            if _load(p) == _raw(name)["knee"]["load"]:
                for check in p["slo"]["checks"]:
                    worst[check["target"]] = max(worst.get(check["target"], 0.0), check["value_ms"])
        assert {c.target: c.value_ms for c in figure.checks or []} == worst and worst
        assert all(c.value_ms is not None and c.value_ms <= c.limit_ms for c in figure.checks or [])
        old = figure_of(doc, 1.0).figure  # as recorded, before the knee carried it
        assert old.delivered == _raw(name)["knee"]["goodput_tokens_per_s"]
    assert lower_won and lower_won < set(ARGV)  # both cases are among the recorded searches


def test_the_answer_names_a_lower_load_that_delivered_more_than_the_knee() -> None:
    """On the kv server the knee's 52 streams delivered fewer tokens/s than 48 did (its steps preempted): the answer
    names the load with the most within the targets (plain json: loads all of whose points met, the median of their
    tokens/s, above the knee's best repeat by over 2%); where throughput only levelled off, no such line."""
    from servescope.report.knee import knee_lines

    named = set()
    for name in ARGV:
        doc, raw = _doc(name), _raw(name)
        searched = msgspec.structs.replace(doc, knee=knee_of(doc.points, "streams"))
        knee_load = raw["knee"]["load"]
        top = max(p["output_tokens_per_s"] for p in raw["points"] if _load(p) == knee_load)
        better = {load: t for load, t in _met_by_load(raw).items() if load < knee_load and t > top * 1.02}
        lines = [line for _, line in knee_lines(searched) if line.startswith("most tokens within the targets")]
        assert searched.knee is not None
        if better:
            load = max(better, key=lambda k: better[k])
            [line] = lines
            assert f"targets: {load:g} streams, {better[load]:.1f} tok/s" in line
            assert searched.knee.most_tokens_at == pytest.approx((load, better[load]))  # in the document too
            named.add(name)
        else:
            assert lines == [] and searched.knee.most_tokens_at is None
    assert named and named < set(ARGV)


def test_a_knee_with_no_load_measured_above_it_is_a_floor_and_says_so() -> None:
    """A search stopped by its budget before any load missed: the recorded points cut to the knee's load and
    below (as a budget that ran out there leaves them). Its knee has no next load, tune's figure carries the
    search's reason as ``floor`` and both answers say the knee is at least that load; the full search is no floor."""
    from servescope.report.knee import knee_lines
    from servescope.report.tune import _knee
    from servescope.tune.measure import figure_of

    for name in ARGV:
        doc, raw = _doc(name), _raw(name)
        knee_load = raw["knee"]["load"]
        assert raw["knee"]["next_load"] is not None and figure_of(doc, 1.0).figure.floor is None
        kept = [p for p in doc.points if p.load <= knee_load]
        assert len(kept) == sum(1 for p in raw["points"] if _load(p) <= knee_load) < len(raw["points"])
        assert doc.search is not None
        stopped = "the time budget (35 s) ran out"
        cut = msgspec.structs.replace(doc, points=kept, knee=knee_of(kept, "streams"),
                                      search=msgspec.structs.replace(doc.search, stopped=stopped))
        assert cut.knee is not None and cut.knee.load == knee_load and cut.knee.next_load is None
        figure = figure_of(cut, 1.0).figure
        assert figure.floor == stopped and f"{knee_load:g}+ streams" in _knee(figure)
        limits = {c["target"]: c["limit_ms"] for c in raw["points"][0]["slo"]["checks"]}
        assert all(f"{c.target} {c.value_ms:.0f} of {limits[c.target]:g} ms" in _knee(figure)
                   for c in figure.checks or []) and figure.checks
        assert any("the knee is at least this" in line for _, line in knee_lines(cut))


@pytest.mark.parametrize(("stopped", "hint"), [
    ("the time budget (35 s) ran out", "(--budget gives the search more time)"),
    ("the request budget (64) ran out", "(--max-requests gives the search more requests)"),
    ("every load up to 8 streams met the targets", "(--max-load lets the search go further)"),
    ("the server stopped answering at 8: connection refused", None),
])
def test_a_knee_floor_names_the_option_that_lets_the_search_go_further(stopped: str, hint: str | None) -> None:
    """``bench serve``'s answer for a knee with no load measured above it names the option that moves what
    stopped the search (its own flags: --budget, --max-requests, --max-load), and none where no option does."""
    from servescope.report.knee import knee_lines

    name = next(iter(ARGV))
    doc, raw = _doc(name), _raw(name)
    kept = [p for p in doc.points if p.load <= raw["knee"]["load"]]
    assert doc.search is not None
    cut = msgspec.structs.replace(doc, points=kept, knee=knee_of(kept, "streams"),
                                  search=msgspec.structs.replace(doc.search, stopped=stopped))
    [line] = [line for _, line in knee_lines(cut) if line.startswith("knee: ")]
    assert line.endswith("the knee is at least this" + (f" {hint}" if hint else "")), line


def _met_by_load(raw: dict[str, Any]) -> dict[float, float]:
    """Plain json: each load all of whose points met the targets, with the median of their output tokens/s."""
    by_load: dict[float, list[dict[str, Any]]] = {}
    for p in raw["points"]:
        if p["slo"] is not None:
            by_load.setdefault(_load(p), []).append(p)
    return {load: statistics.median(p["output_tokens_per_s"] for p in ps)
            for load, ps in by_load.items() if all(p["slo"]["met"] for p in ps)}


def test_tune_keeps_what_every_load_within_the_targets_delivered() -> None:
    from servescope.tune.measure import figure_of

    for name in ARGV:
        figure = figure_of(_doc(name), 1.0).figure
        assert dict(figure.delivered_at or ()) == _met_by_load(_raw(name)) and figure.delivered_at
        assert [load for load, _ in figure.delivered_at or ()] == sorted(_met_by_load(_raw(name)))


@pytest.mark.parametrize(("reference", "trial"), [("seqs", "kv"), ("kv", "defaults"), ("prefill", "seqs")])
def test_a_shorter_step_is_judged_at_the_reference_knees_load_and_a_larger_cap_at_the_knee(
        reference: str, trial: str) -> None:
    """A change whose range prices the same load (a shorter step) is judged by the trial's tokens/s at the
    reference knee's load; one that prices the knee's move (more requests at once) by the knee's. Two recorded
    searches stand for the reference and the trial; the figures come from their points by plain json."""
    from servescope.core.changes import Candidate, ChangeEdit
    from servescope.core.tune import judge_gain
    from servescope.tune.measure import figure_of

    ref, got = figure_of(_doc(reference), 1.0).figure, figure_of(_doc(trial), 1.0).figure
    load = _raw(reference)["knee"]["load"]
    theirs, ours = _met_by_load(_raw(reference))[load], _met_by_load(_raw(trial)).get(load)
    at_knee = got.delivered / ref.delivered - 1

    def change(at: str, low: float, high: float) -> Candidate:
        return Candidate(id="x", label="x", edit=ChangeEdit(), current=None, value=None, because=[], gain_low=low,
                         gain_high=high, gain_basis="", risk={}, undo="", gain_at=at)

    if ours is None:  # the trial's search never met the targets at that load: judged at its knee
        gain, at, within = judge_gain(change("load", -9, 9), got, ref.delivered, [ref])
        assert at is None and gain == pytest.approx(at_knee)
        return
    same = ours / theirs - 1
    assert abs(same - at_knee) > 0.02  # the two measures differ on these servers: the test tells them apart
    around = (same - 0.01, same + 0.01)
    gain, at, within = judge_gain(change("load", *around), got, ref.delivered, [ref])
    assert gain == pytest.approx(at_knee) and at == (load, pytest.approx(same)) and within is True
    gain, at, within = judge_gain(change("knee", *around), got, ref.delivered, [ref])
    assert at is None and within is False
