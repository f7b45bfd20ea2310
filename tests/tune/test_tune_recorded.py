"""`tune --launch` on three real vLLM 0.26 servers on an H100, each started with one weak setting (issue 36, item 5;
tests/data/tune/h100, README.md there). The test knows each server's weak setting without servescope (the command
line tools/gpu_vllm/tune_session.sh gave it) and reads the documents with plain ``json.load``: tune must have kept
the change that undoes the weak setting, every decision must follow from the measured knees and the noise as
docs/tune.md defines them, and the anchor (`vllm bench serve` on the server tune left running) must have run the
kept configuration at the final knee's load."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import msgspec
import pytest

from servescope.core.changes import ChangeEvidence
from servescope.core.document import decode_as
from servescope.core.tune import TuneDoc
from servescope.report.rerender import render_document

DATA = Path(__file__).resolve().parents[1] / "data" / "tune" / "h100"
# the weak setting each server started with, and the flag whose change must be kept
WEAK = {"seqs": ("--max-num-seqs", "16"), "async": ("--no-async-scheduling", None),
        "kv": ("--kv-cache-memory-bytes", "536870912")}


def _raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"tune-{name}.json").read_text())
    return data


def _value(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


@pytest.mark.parametrize("name", sorted(WEAK))
def test_the_weak_setting_is_undone_and_kept(name: str) -> None:
    doc = _raw(name)
    flag, weak = WEAK[name]
    original, kept = shlex.split(doc["target"]["original"]), shlex.split(doc["keep"]["command_line"])
    if weak is None:  # a switch: the original has it, the kept line has its opposite
        assert flag in original and flag not in kept and "--async-scheduling" in kept
    else:
        assert _value(original, flag) == weak and _value(kept, flag) not in (None, weak)
    assert doc["keep"]["changes"] and doc["final"]["goodput_tokens_per_s"] > max(
        b["goodput_tokens_per_s"] for b in doc["baseline"])


# the second session (README.md there): vLLM's defaults, the MoE model without a tuned config, a capture size of 8
SECOND = ("defaults", "moe", "capture")


def _decisions_follow(doc: dict[str, Any], figure: str) -> tuple[float, float, float]:
    """Re-derives every trial's decision from the knees' ``figure`` and the baseline's noise, as docs/tune.md
    defines them; the baseline's mean, the noise and the last kept figure."""
    first, second = (b[figure] for b in doc["baseline"])
    mean = (first + second) / 2
    noise = max(abs(first - second) / mean, doc["options"]["min_noise"])
    assert doc["noise"] == pytest.approx(noise)
    reference = mean
    for trial in doc["trials"]:
        got = trial["knee"][figure]
        assert trial["reference_tokens_per_s"] == pytest.approx(reference)
        assert trial["measured_gain"] == pytest.approx(got / reference - 1)
        low, high = trial["change"]["gain_low"], trial["change"]["gain_high"]
        assert high > noise  # tried: a change predicted within the noise is not (tune.loop.beyond_noise)
        judged = trial.get("same_load_gain")  # a range that prices the same load is judged there, where measured
        judged = got / reference - 1 if judged is None else judged
        assert trial["within_prediction"] == (low <= judged <= high)
        assert trial["outcome"] == ("kept" if got > reference * (1 + noise) else "rolled_back")
        if trial["outcome"] == "kept":
            reference = got
    if any(t["outcome"] == "kept" for t in doc["trials"]):
        assert doc["final"][figure] == pytest.approx(reference)
    else:  # nothing kept: the original configuration's last measurement
        assert doc["final"] == doc["baseline"][1]
    return mean, noise, reference


@pytest.mark.parametrize("name", sorted(WEAK) + list(SECOND))
def test_every_decision_follows_from_the_knees_and_the_noise(name: str) -> None:
    # these documents were written when tune compared goodput
    _decisions_follow(_raw(name), "goodput_tokens_per_s")


@pytest.mark.parametrize("name", sorted(WEAK))
def test_the_anchor_ran_on_the_server_left_running_at_the_final_knee(name: str) -> None:
    doc = _raw(name)
    load = int(doc["final"]["load"])
    anchor: dict[str, Any] = json.loads((DATA / "anchors" / f"vbench-tune-{name}-c{load}.json").read_text())
    assert anchor["max_concurrency"] == load and anchor["completed"] == anchor["num_prompts"] == 4 * load
    pid = doc["target"]["left_running"]
    assert pid
    # the server the anchor measured is the kept configuration: vLLM's own log line of the process left running
    # (server-args.txt: each start's "non-default args") holds the kept value
    [line] = [x for x in (DATA / "server-args.txt").read_text().splitlines()
              if x.startswith(f"tune-{name} ") and f"(APIServer pid={pid})" in x]
    kept = shlex.split(doc["keep"]["command_line"])
    expected = {"seqs": f"'max_num_seqs': {_value(kept, '--max-num-seqs')}",
                "async": "'async_scheduling': True",
                "kv": f"'kv_cache_memory_bytes': {_value(kept, '--kv-cache-memory-bytes')}"}[name]
    assert expected in line


@pytest.mark.parametrize("name", sorted(WEAK) + list(SECOND) + ["capture-3", "capture-4", "seqs-4"])
def test_the_documents_read_and_render(name: str) -> None:
    doc = decode_as((DATA / f"tune-{name}.json").read_bytes(), name, TuneDoc)
    text = render_document(doc, "text", width=100)
    assert "left running: process" in text and ("keep:" in text) == bool(doc.keep.changes)


def _args_line(name: str, pid: int) -> str:
    [line] = [x for x in (DATA / "server-args.txt").read_text().splitlines()
              if x.startswith(f"tune-{name} ") and f"(APIServer pid={pid})" in x]
    return line


def test_vllms_defaults_keep_nothing_and_the_server_left_up_is_the_original() -> None:
    """The server with vLLM's defaults: every change the evidence called for is in place already or has no value
    to try, so nothing restarts it and the original stays; vLLM's own log of the process left running says so."""
    doc = _raw("defaults")
    assert doc["trials"] == [] and doc["keep"]["changes"] == [] and doc["keep"]["command_line"] == doc["target"][
        "original"]
    assert {n["reason"] for n in doc["not_tried"]} <= {"in_place", "no_value", "not_allowed"}
    line = _args_line("defaults", doc["target"]["left_running"])
    for flag in ("max_num_seqs", "async_scheduling", "max_cudagraph_capture_size", "api_server_count"):
        assert f"'{flag}'" not in line  # vLLM's non-default args: none of the catalogue's settings was changed


def test_the_moe_server_without_a_tuned_config_keeps_the_one_searched_for_it() -> None:
    """vLLM's own log is the evidence both ways: the first server says it runs the default MoE config; the kept
    one says it read the file the search wrote (named as vLLM names it), from the folder tune set."""
    doc = _raw("moe")
    lines = (DATA / "moe" / "server-moe-lines.txt").read_text().splitlines()
    assert "Using default MoE config" in lines[0]
    [file] = (DATA / "moe").glob("E=*.json")
    assert lines[0].endswith(file.name)  # the file vLLM looked for is the one the search wrote
    kept = [t for t in doc["trials"] if t["outcome"] == "kept"]
    assert [t["change"]["id"] for t in kept] == ["fused-moe-config"]
    folder = kept[0]["change"]["edit"]["env"]["VLLM_TUNED_CONFIG_FOLDER"]
    assert lines[-1].split("] ", 1)[1] == f"Using configuration from {folder}/{file.name} for MoE layer."
    assert any("Using default MoE config" in b for b in kept[0]["change"]["because"][0:1])
    assert doc["keep"]["command_line"].startswith(f"VLLM_TUNED_CONFIG_FOLDER={folder} ")


def test_the_moe_search_kept_no_config_slower_than_vllms_default() -> None:
    """The search's own log (one line per batch size: the fastest timed and vLLM's default) against the file it
    wrote: every batch size is in the file with the fastest config, never slower than the default."""
    [file] = (DATA / "moe").glob("E=*.json")
    written = json.loads(file.read_text())
    timed = {}
    for line in (DATA / "moe" / "moe-search.txt").read_text().splitlines():
        if found := re.match(r"M=(\d+): ([\d.]+) us \(default ([\d.]+) us, [\d.]+x\) (\{.*\})$", line):
            timed[int(found[1])] = (float(found[2]), float(found[3]), found[4])
    assert sorted(timed) == sorted(int(m) for m in written)
    for m, (best, default, config) in timed.items():
        assert best <= default
        assert written[str(m)] == json.loads(config.replace("'", '"'))
    assert len({tuple(sorted(c)) for c in written.values()}) == 1  # the keys of vLLM's own default config, each



def test_the_search_s_own_timings_predict_what_the_moe_config_can_gain(tmp_path: Path) -> None:
    """The prediction from evidence: the search timed the kernel at each batch size against vLLM's default; at the
    batch nearest the knee's load (256 streams: 256 tokens a decode step) the two are equal, so the config can gain
    the knee ~nothing, and the +30% tune measured then (by goodput, its noise 18%) was not the config's doing."""
    from servescope.core.changes import match_changes
    from servescope.tune.evidence import moe_search_facts
    from servescope.tune.loop import beyond_noise

    timed = {}
    for line in (DATA / "moe" / "moe-search.txt").read_text().splitlines():
        if found := re.match(r"M=(\d+): ([\d.]+) us \(default ([\d.]+) us", line):
            timed[int(found[1])] = [float(found[2]), float(found[3])]
    [file] = (DATA / "moe").glob("E=*.json")
    folder = tmp_path / "moe-configs"
    folder.mkdir()
    (folder / file.name).write_text(file.read_text())
    (folder / (file.name + ".timings.json")).write_text(json.dumps(timed))
    doc = _raw("moe")
    load = doc["baseline"][0]["load"]
    nearest = min(timed, key=lambda m: abs(m - load))
    expect = timed[nearest][1] / timed[nearest][0] - 1
    lines = (DATA / "moe" / "server-moe-lines.txt").read_text().splitlines()[:1]
    facts = moe_search_facts({"moe_config_dir": str(folder)}, lines, load)
    assert facts == {"moe_kernel_gain": pytest.approx(expect)} and expect < 0.01
    ev = ChangeEvidence(log_lines=lines, load=load, platform="cuda", facts=facts,
                        inputs={"moe_config_dir": str(folder)}, argv=shlex.split(doc["target"]["original"]))
    [cand] = [c for c in match_changes(ev).candidates if c.id == "fused-moe-config"]
    assert (cand.gain_low, cand.gain_high) == (0.0, pytest.approx(expect))
    measured = next(t["measured_gain"] for t in doc["trials"] if t["change"]["id"] == "fused-moe-config")
    assert measured > cand.gain_high + doc["noise"] / 2  # what was measured lies far outside what the kernel allows
    # without the search's timings: the catalogue's general range
    blind = moe_search_facts({"moe_config_dir": str(tmp_path)}, lines, load)
    assert blind == {}
    [general] = [c for c in match_changes(msgspec.structs.replace(ev, facts={})).candidates
                 if c.id == "fused-moe-config"]
    assert (general.gain_low, general.gain_high) == (0.0, 0.3)
    # tune tries neither blind: a predicted gain within the baseline's noise is never tried (no trial could keep
    # it), one beyond it is (the recorded run's noise, re-derived from its two baseline knees)
    first, second = (b["goodput_tokens_per_s"] for b in doc["baseline"])
    noise = max(abs(first - second) / ((first + second) / 2), doc["options"]["min_noise"])
    assert cand.gain_high < noise < general.gain_high
    tried, below = beyond_noise([cand, general], noise)
    assert tried == [general] and [(b.id, b.reason) for b in below] == [("fused-moe-config", "below_noise")]
    assert f"±{noise:.0%}" in below[0].detail


@pytest.mark.parametrize("name", ["capture-3", "capture-4"])
def test_the_capture_fix_is_kept_when_tune_compares_the_tokens_delivered(name: str) -> None:
    """Third and fourth sessions (README.md there): the capture-size-8 server again, tune comparing the tokens/s
    each knee's load delivered. The decisions follow from those figures and the noise; the kept capture size covers
    the final knee's load; vLLM's own bench at that load, on the server left running, shows the step the fix
    shortened against the same bench on the original server (second session): mean TPOT and throughput."""
    doc = _raw(name)
    mean, noise, reference = _decisions_follow(doc, "tokens_per_s")
    original, kept = shlex.split(doc["target"]["original"]), shlex.split(doc["keep"]["command_line"])
    assert _value(original, "--max-cudagraph-capture-size") == "8"
    load = int(doc["final"]["load"])
    assert int(_value(kept, "--max-cudagraph-capture-size") or 0) >= load
    assert reference > mean * (1 + noise)
    fixed = json.loads((DATA / "anchors" / f"vbench-tune-{name}-c{load}.json").read_text())
    before = json.loads((DATA / "anchors" / f"vbench-tune-capture-c{load}.json").read_text())
    assert fixed["completed"] == fixed["num_prompts"] == before["completed"] == 4 * load
    assert fixed["mean_tpot_ms"] < 0.6 * before["mean_tpot_ms"]
    assert fixed["output_throughput"] > 1.5 * before["output_throughput"]
    text = render_document(decode_as((DATA / f"tune-{name}.json").read_bytes(), name, TuneDoc), "text", width=100)
    assert "keep:" in text and "--max-cudagraph-capture-size" in text


def _sweep_runs() -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in sorted((DATA / "anchors" / "sweep-4").glob("*/run=0.json"))]


def _targets(doc: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in (t.split("=") for t in doc["options"]["slo"])}


def test_tune_on_the_seqs_server_against_vllms_own_sweep() -> None:
    """Fourth session: `tune` on the --max-num-seqs 16 server and, on the same machine, vLLM's `vllm bench sweep
    serve` over --max-num-seqs {16, 64, 256} x concurrency {16, 64, 128, 256} on the same base command, load and
    targets. The sweep's best run within the targets is read from its own result files; tune's final knee
    delivers more, in less wall time, and vLLM's bench on the server tune left running beats the sweep's best run
    at the same concurrency."""
    doc = _raw("seqs-4")
    _decisions_follow(doc, "tokens_per_s")
    assert _value(shlex.split(doc["target"]["original"]), "--max-num-seqs") == "16"
    runs = _sweep_runs()
    grid = json.loads((DATA / "anchors" / "sweep-4" / "serve.json").read_text())
    assert {r["max_num_seqs"] for r in runs} == {g["max_num_seqs"] for g in grid} and len(runs) == 12
    targets = _targets(doc)
    within = [r for r in runs if r["failed"] == 0 and r["p99_ttft_ms"] <= targets["ttft_p99"]
              and r["p99_itl_ms"] <= targets["itl_p99"]]
    best = max(within, key=lambda r: r["output_throughput"])
    assert doc["final"]["tokens_per_s"] > best["output_throughput"]
    load = int(doc["final"]["load"])
    anchor = json.loads((DATA / "anchors" / f"vbench-tune-seqs-4-c{load}.json").read_text())
    at_load = [r["output_throughput"] for r in within if r["max_concurrency"] == load]
    assert anchor["completed"] == 4 * load and at_load and anchor["output_throughput"] > max(at_load)
    session = (DATA / "session-4.txt").read_text()
    sweep_s = int(re.search(r"vllm bench sweep serve rc=0 in (\d+)s", session)[1])  # type: ignore[index]
    assert doc["seconds"] < sweep_s


def test_a_baseline_knee_that_is_a_floor_is_marked_in_the_answer() -> None:
    """The fourth capture run's baselines sat at 64 streams; a figure with ``floor`` (no load above it measured)
    reads as 64+ with the reason on its own line; without it, as recorded, neither appears."""
    doc = decode_as((DATA / "tune-capture-4.json").read_bytes(), "capture-4", TuneDoc)
    assert "64+" not in render_document(doc, "text", width=100)
    why = "the time budget (35 s) ran out"
    floors = [msgspec.structs.replace(b, floor=why) for b in doc.baseline]
    text = render_document(msgspec.structs.replace(doc, baseline=floors), "text", width=200)
    assert "tok/s at 64+ streams" in text and f"64+ streams: no higher load was measured ({why})" in text
    assert "tok/s at 64 streams  (+" in text  # the final knee saw 96 miss: no floor
    assert "--measure-budget gives each search more time" in text
    limit = "every load up to 64 streams met the targets"
    text = render_document(msgspec.structs.replace(doc, baseline=[msgspec.structs.replace(b, floor=limit)
                                                                  for b in doc.baseline]), "text", width=200)
    assert f"({limit}); the knee may lie higher (--max-load lets the search go further)" in text
    spent = "the request budget (32) ran out"  # a request budget names its own option, not the time's
    text = render_document(msgspec.structs.replace(doc, baseline=[msgspec.structs.replace(b, floor=spent)
                                                                  for b in doc.baseline]), "text", width=200)
    assert f"({spent}); the knee may lie higher (--max-requests gives each search more requests)" in text


@pytest.mark.parametrize("path", sorted(DATA.glob("tune-*.json")), ids=lambda p: p.stem)
def test_a_gain_outside_its_range_says_whether_the_noise_covers_it(path: Path) -> None:
    """A measured gain outside its predicted range is said to be so; by less than the noise where it is (a single
    measurement cannot tell it from one inside), from the document's own figures read with plain json. A range
    that prices the same load is judged at that load where the trial measured it (``same_load_gain``)."""
    doc = json.loads(path.read_text())
    text = render_document(decode_as(path.read_bytes(), path.name, TuneDoc), "text", width=2000)
    for trial in doc["trials"]:
        measured = trial["measured_gain"]
        if measured is None:
            continue
        gain = trial.get("same_load_gain")
        gain = measured if gain is None else gain
        low, high = trial["change"]["gain_low"], trial["change"]["gain_high"]
        line = next(ln for ln in text.splitlines()
                    if f"measured {measured:+.0%}" in ln and f"predicted {low:+.0%}" in ln)
        assert trial["within_prediction"] == (low <= gain <= high)
        by = low - gain if gain < low else gain - high
        if low <= gain <= high:
            assert "outside" not in line
        elif by <= doc["noise"]:
            assert f"less than the noise (±{doc['noise']:.0%})" in line
        else:
            assert line.endswith("outside the prediction")
