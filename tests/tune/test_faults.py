"""Nothing lost: ctrl-c and SIGTERM during a load, and kill -9 of servescope mid-trial then ``tune --restore`` or
``--resume``; the original configuration byte for byte each time (unit files and modes), no server left behind.

tune runs in its own process (tests/tune/run_toy_tune.py) against the toy server; ``tune --restore`` is the real
CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from children import default_signals
from servescope.core.document import decode_as
from servescope.core.tune import TuneDoc
from servescope.tune.journal import read_journal

from .conftest import OLD_DROPIN, ToyUnit
from .toy import HERE, free_port, toy_measure

RUNNER = HERE / "run_toy_tune.py"


def _run(tmp_path: Path, spec: dict[str, object], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, str(RUNNER), str(path)], env={**os.environ, **(env or {})},
                            stdout=(tmp_path / "runner.out").open("wb"), stderr=subprocess.STDOUT,
                            preexec_fn=default_signals)


def _wait_for(marker: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if marker.exists() and text in marker.read_text():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in {marker}: {(marker.parent / 'runner.out').read_text()[-2000:]}")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _unit_spec(toy_unit: ToyUnit, tmp_path: Path, **more: object) -> dict[str, object]:
    return {"mode": "unit", "unit": "toy", "unit_file": str(toy_unit.unit_file),
            "dropin_dir": str(toy_unit.dropin_dir), "port": toy_unit.port, "journal": str(tmp_path / "j.json"),
            "marker": str(tmp_path / "marker"), "out": str(tmp_path / "doc.json"), **more}


def test_ctrl_c_during_a_trials_load_restores_the_unit_byte_for_byte(toy_unit: ToyUnit, tmp_path: Path) -> None:
    before = toy_unit.files()
    proc = _run(tmp_path, _unit_spec(toy_unit, tmp_path, delay_s=30.0), toy_unit.env)
    marker = tmp_path / "marker"
    # the baseline's two loads, then the first trial (max-num-seqs 1 -> 2) is measured: the drop-in is in place
    _wait_for(marker, "measuring 2", proc)
    assert b"--max-num-seqs 2" in (toy_unit.dropin_dir / "zz-servescope-tune.conf").read_bytes()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert toy_unit.files() == before
    doc = decode_as((tmp_path / "doc.json").read_bytes(), "doc", TuneDoc)
    assert doc.stopped == "interrupted" and doc.restored
    assert doc.trials[-1].outcome == "interrupted" and doc.trials[-1].change.id == "max-num-seqs"
    assert read_journal(tmp_path / "j.json").state == "restored"
    calls = toy_unit.systemctl.calls()
    # after the files went back: systemd reloaded and the unit restarted on them
    assert calls[-3:] == [["daemon-reload"], ["stop", "toy.service"], ["start", "toy.service"]]


def test_sigterm_during_a_load_stops_the_launched_server(tmp_path: Path) -> None:
    port = free_port()
    spec = {"mode": "launch", "port": port, "flags": ["--max-num-seqs", "1"], "journal": str(tmp_path / "j.json"),
            "marker": str(tmp_path / "marker"), "out": str(tmp_path / "doc.json"), "delay_s": 30.0}
    proc = _run(tmp_path, spec)
    _wait_for(tmp_path / "marker", "measuring 2", proc)
    pid = read_journal(tmp_path / "j.json").process.pid  # type: ignore[union-attr]
    assert _alive(pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert not _alive(pid)
    assert read_journal(tmp_path / "j.json").state == "restored"


def test_restore_after_kill_9_puts_the_unit_back(toy_unit: ToyUnit, tmp_path: Path) -> None:
    before = toy_unit.files()
    proc = _run(tmp_path, _unit_spec(toy_unit, tmp_path, delay_s=60.0), toy_unit.env)
    _wait_for(tmp_path / "marker", "measuring 2", proc)
    proc.kill()
    proc.wait(timeout=30)
    assert toy_unit.files() != before  # the trial's drop-in is left behind: servescope had no chance to undo
    assert read_journal(tmp_path / "j.json").state == "running"
    done = subprocess.run([sys.executable, "-m", "servescope", "tune", "--restore", "--yes", "--journal",
                           str(tmp_path / "j.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **toy_unit.env})
    assert done.returncode == 0, done.stderr
    assert toy_unit.files() == before
    # with --yes the unit is restarted on its files, by service restart's path (stop, then start)
    assert toy_unit.systemctl.calls()[-3:] == [["daemon-reload"], ["stop", "toy.service"], ["start", "toy.service"]]
    assert (toy_unit.dropin_dir / "zz-servescope-tune.conf").read_bytes() == OLD_DROPIN
    assert "put back as it was" in done.stdout and "systemd reloaded" in done.stdout
    assert read_journal(tmp_path / "j.json").state == "restored"
    # a second run refuses nothing now, and a second restore says it is done already
    again = subprocess.run([sys.executable, "-m", "servescope", "tune", "--restore", "--journal",
                            str(tmp_path / "j.json")], capture_output=True, text=True, timeout=60)
    assert "already in place" in again.stdout


def _killed_while_measuring(tmp_path: Path) -> int:
    """A launched tune run killed with SIGKILL while it measures its first trial: its server's pid (the journal's)."""
    spec = {"mode": "launch", "port": free_port(), "flags": ["--max-num-seqs", "1"],
            "journal": str(tmp_path / "j.json"), "marker": str(tmp_path / "marker"),
            "out": str(tmp_path / "doc.json"), "delay_s": 60.0}
    proc = _run(tmp_path, spec)
    _wait_for(tmp_path / "marker", "measuring 2", proc)
    proc.kill()
    proc.wait(timeout=30)
    process = read_journal(tmp_path / "j.json").process
    assert process is not None
    return process.pid


def test_restore_after_kill_9_stops_the_orphaned_server(tmp_path: Path) -> None:
    pid = _killed_while_measuring(tmp_path)
    assert _alive(pid)  # the trial's server outlived servescope (its own session)
    done = subprocess.run([sys.executable, "-m", "servescope", "tune", "--restore", "--journal",
                           str(tmp_path / "j.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not _alive(pid)
    assert f"pid {pid}" in done.stdout


def test_resume_after_kill_9_continues_where_it_stopped(tmp_path: Path) -> None:
    from servescope.tune.api import resume_tune

    orphan = _killed_while_measuring(tmp_path)
    doc = resume_tune(tmp_path / "j.json", measure=toy_measure())
    assert not _alive(orphan)
    # the baseline of the first run is kept; the interrupted trial is tried again and pays
    assert [b.goodput_tokens_per_s for b in doc.baseline] == [100.0, 100.0]
    assert "--max-num-seqs 8" in doc.keep.command_line
    assert doc.stopped == "no candidate left"
