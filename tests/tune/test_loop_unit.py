"""The tune loop against a systemd unit: each trial one drop-in, confirmed before each restart, systemd's own
``systemd-analyze verify`` accepting every drop-in tune installs (and every change of the catalogue as one)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from deploy.conftest import fake_bin, verify
from servescope.core.changes import ChangeEdit, load_catalogue
from servescope.deploy.unitfile import load_unit, split_command_line
from servescope.tune.api import TuneSetup, tune_server
from servescope.tune.edit import apply_edits, render_dropin
from servescope.tune.unit import DROPIN_NAME

from .conftest import OTHER_DROPIN, ToyUnit
from .toy import toy_measure


def _exec_argv(unit_file: Path, dropins: Path) -> list[str]:
    return split_command_line(load_unit(unit_file, dropin_dirs=[dropins]).get("Service", "ExecStart") or "").argv


def _verify_dropin(tmp_path: Path, unit_text: str, dropin: str, name: str) -> None:
    """systemd-analyze verify of the unit with ``dropin`` installed beside another drop-in."""
    folder = tmp_path / f"verify-{name}"
    (folder / "toy.service.d").mkdir(parents=True)
    (folder / "toy.service").write_text(unit_text)
    (folder / "toy.service.d" / "10-env.conf").write_bytes(OTHER_DROPIN)
    (folder / "toy.service.d" / DROPIN_NAME).write_text(dropin)
    out = verify(folder, "toy.service")
    assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}\n{dropin}"
    assert "toy.service" not in out.stdout + out.stderr, f"{name}: {out.stdout}{out.stderr}"


def test_unit_loop_installs_what_systemd_accepts(toy_unit: ToyUnit, tmp_path: Path) -> None:
    installed: list[str] = []
    asked: list[str] = []
    dropin = toy_unit.dropin_dir / DROPIN_NAME

    def seqs_of(url: str) -> int:
        installed.append(dropin.read_text())
        argv = _exec_argv(toy_unit.unit_file, toy_unit.dropin_dir)
        return int(argv[argv.index("--max-num-seqs") + 1])

    setup = TuneSetup(unit="toy", unit_file=toy_unit.unit_file, url=f"http://127.0.0.1:{toy_unit.port}",
                      journal=tmp_path / "j.json", ready_timeout_s=30)
    doc = tune_server(setup, measure=toy_measure(seqs_of=seqs_of),
                      confirm=lambda text: asked.append(text) is None)
    kept = [t.change.value for t in doc.trials if t.outcome == "kept"]
    assert kept == ["2", "4", "8"]
    # what stays installed is the kept configuration, and the document's drop-in is that file
    assert _exec_argv(toy_unit.unit_file, toy_unit.dropin_dir)[-2:] == ["--max-num-seqs", "8"]
    assert doc.keep.dropin == dropin.read_text()
    # the earlier drop-in's environment lives on in tune's (it replaced that file)
    assert "Environment=EARLIER=yes" in dropin.read_text()
    assert (toy_unit.dropin_dir / "10-env.conf").read_bytes() == OTHER_DROPIN
    # each restart was shown first, with the drop-in it would install
    assert len(asked) == len([c for c in toy_unit.systemctl.calls() if c[0] == "start"])
    assert all("restart toy.service with" in text for text in asked)
    unit_text = toy_unit.unit_file.read_text()
    for number, text in enumerate(dict.fromkeys(installed)):
        _verify_dropin(tmp_path, unit_text, text, f"installed-{number}")


def _edit_of(cid: str, entry: dict[str, object]) -> ChangeEdit:
    """The entry's edit with a value of the kind it sets (the catalogue's own where it names one)."""
    value = entry.get("value")
    to = str(value["to"]) if isinstance(value, dict) and value.get("rule") == "set" else "/srv/moe" \
        if cid == "fused-moe-config" else "2"
    if "env_from_input" in entry:
        return ChangeEdit(env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    if entry.get("flag"):
        return ChangeEdit(set_flags={str(entry["flag"]): to})
    if entry.get("env"):
        return ChangeEdit(env={str(entry["env"]): to})
    return ChangeEdit(add=list(entry.get("add", [])), remove=list(entry.get("remove", [])))  # type: ignore[arg-type]


@pytest.mark.parametrize("cid", list(load_catalogue()))
def test_every_change_as_a_drop_in_systemd_accepts(cid: str, tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: apt-get install systemd"
    bins = fake_bin(tmp_path / "bin", "python3")
    unit_text = ("[Unit]\nDescription=vllm\n[Service]\nType=simple\nEnvironment=NCCL_P2P_LEVEL=SYS\n"
                 f"ExecStart={bins}/python3 -m vllm.entrypoints.openai.api_server --model /m/x --port 8000 "
                 "--enforce-eager --no-async-scheduling --disable-custom-all-reduce --max-num-seqs 4 "
                 "--chat-template '{% for m in messages %}$HOME 100%%{% endfor %}'\n")
    folder = tmp_path / "unit"
    folder.mkdir()
    (folder / "toy.service").write_text(unit_text)
    unit = load_unit(folder / "toy.service")
    from servescope.deploy.unitfile import parse_environment
    from servescope.tune.edit import ServerConfig

    original = ServerConfig(tuple(split_command_line(unit.get("Service", "ExecStart") or "").argv),
                            parse_environment(unit.get_all("Service", "Environment")))
    edit = _edit_of(cid, load_catalogue()[cid])
    wanted = apply_edits(original, [edit])
    text = render_dropin(original, wanted, header=f"servescope tune: {cid}")
    _verify_dropin(tmp_path, unit_text, text, cid)
    # read back as systemd reads it (the parser tests/deploy checks against systemd): the same command line
    (folder / "toy.service.d").mkdir()
    (folder / "toy.service.d" / DROPIN_NAME).write_text(text)
    again = load_unit(folder / "toy.service")
    assert split_command_line(again.get("Service", "ExecStart") or "").argv == list(wanted.argv)
    assert parse_environment(again.get_all("Service", "Environment")) == dict(wanted.env)
    assert json.dumps(list(wanted.argv)) != json.dumps(list(original.argv)) or wanted.env != original.env
    assert sys.executable  # the fake python3 is only for verify's executable check


def test_no_restart_without_a_yes(toy_unit: ToyUnit, tmp_path: Path) -> None:
    before = toy_unit.files()
    asked: list[str] = []
    setup = TuneSetup(unit="toy", unit_file=toy_unit.unit_file, url=f"http://127.0.0.1:{toy_unit.port}",
                      journal=tmp_path / "j.json", ready_timeout_s=30)

    def seqs_of(url: str) -> int:
        argv = _exec_argv(toy_unit.unit_file, toy_unit.dropin_dir)
        return int(argv[argv.index("--max-num-seqs") + 1])

    doc = tune_server(setup, measure=toy_measure(seqs_of=seqs_of), confirm=lambda text: bool(asked.append(text)))
    assert doc.stopped == "not confirmed" and doc.trials == []
    assert len(asked) == 1 and "--max-num-seqs 2" in asked[0]  # the change was shown, then refused
    assert toy_unit.files() == before
    assert [c for c in toy_unit.systemctl.calls() if c[0] in ("start", "stop", "restart")] == []


def test_a_unit_that_fails_to_start_is_put_back_byte_for_byte(toy_unit: ToyUnit, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from servescope.core.errors import InputError
    from servescope.tune.journal import read_journal

    before = toy_unit.files()
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "start")  # systemctl start fails, as a unit that cannot start does
    setup = TuneSetup(unit="toy", unit_file=toy_unit.unit_file, url=f"http://127.0.0.1:{toy_unit.port}",
                      journal=tmp_path / "j.json", ready_timeout_s=30)

    def seqs_of(url: str) -> int:
        argv = _exec_argv(toy_unit.unit_file, toy_unit.dropin_dir)
        return int(argv[argv.index("--max-num-seqs") + 1])

    with pytest.raises(InputError, match="did not start again"):
        tune_server(setup, measure=toy_measure(seqs_of=seqs_of), confirm=lambda text: True)
    assert toy_unit.files() == before
    assert read_journal(tmp_path / "j.json").state == "restored"
    assert ["start", "toy.service"] in toy_unit.systemctl.calls()


def test_a_unit_without_a_dropin_folder_gets_one_and_loses_it_again(toy_unit: ToyUnit, tmp_path: Path) -> None:
    """Most units have no ``NAME.service.d/`` yet: tune makes the folder for its drop-in, and a run that keeps
    nothing (``keep=False``, `--no-keep`) leaves the unit as it found it — no drop-in, no folder."""
    shutil.rmtree(toy_unit.dropin_dir)
    seen: list[bool] = []

    def seqs_of(url: str) -> int:
        seen.append((toy_unit.dropin_dir / DROPIN_NAME).is_file())
        argv = _exec_argv(toy_unit.unit_file, toy_unit.dropin_dir)
        return int(argv[argv.index("--max-num-seqs") + 1])

    setup = TuneSetup(unit="toy", unit_file=toy_unit.unit_file, url=f"http://127.0.0.1:{toy_unit.port}",
                      journal=tmp_path / "j.json", ready_timeout_s=30, max_restarts=2, keep=False)
    doc = tune_server(setup, measure=toy_measure(seqs_of=seqs_of), confirm=lambda text: True)
    assert any(t.outcome == "kept" for t in doc.trials) and True in seen
    assert not toy_unit.dropin_dir.exists()
