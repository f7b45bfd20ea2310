"""The unit parser against the real example unit, variants of it, and `systemd-analyze verify` as referee."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from servescope.core.errors import InputError
from servescope.deploy.unitfile import (
    load_unit,
    parse_environment,
    parse_systemctl_cat,
    parse_unit_text,
    split_command_line,
    split_command_lines,
)

from .conftest import EXAMPLE_UNIT, example_text, verify


def _systemd_argv0(tmp_path: Path, exec_value: str) -> str:
    """The executable systemd itself reads from ``ExecStart=exec_value`` (from verify's 'not executable' line)."""
    unit = tmp_path / "probe.service"
    unit.write_text(f"[Unit]\nDescription=probe\n[Service]\nExecStart={exec_value}\n")
    out = verify(tmp_path, "probe.service")
    found = re.search(r"Command (.+) is not executable", out.stdout + out.stderr)
    assert found, out.stdout + out.stderr
    return found.group(1)


@pytest.mark.parametrize("value", [
    "'/nonexistent/with space\\x41' arg",
    '"/nonexistent/a\\sb"c --flag',
    "@/nonexistent/at argv0 x",
    "/nonexistent/cont\\\n  # a comment between continued lines\n  --x",
    "   /nonexistent/padded   ",
    "/nonexistent/pct%%s x",
])
def test_executable_matches_systemd(tmp_path: Path, value: str) -> None:
    ours = split_command_line(parse_unit_text(f"[Service]\nExecStart={value}\n", "t")[0].value)
    assert ours.argv[0] == _systemd_argv0(tmp_path, value)


@pytest.mark.needs_shared
def test_example_unit_reads_as_written() -> None:
    unit = load_unit(EXAMPLE_UNIT)
    text = example_text()
    assert unit.sections() == ["Unit", "Service", "Install"]
    assert unit.dropins == ()
    assert unit.get("Service", "Type") == "simple"
    # independent route: shlex on the raw line, then systemd's `$$` → `$`
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert split_command_line(unit.get("Service", "ExecStart") or "").argv == shlex.split(exec_line[10:])
    pre_line = next(line for line in text.splitlines() if line.startswith("ExecStartPre="))
    pre = split_command_line(unit.get_all("Service", "ExecStartPre")[0])
    assert pre.argv == [w.replace("$$", "$") for w in shlex.split(pre_line[13:])]
    assert "$(seq 1 30)" in pre.argv[2] and "$$" not in pre.argv[2]
    assert parse_environment(unit.get_all("Service", "Environment")) == {
        "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}


@pytest.mark.needs_shared
def test_dropins_apply_in_name_order_and_reset_lists(tmp_path: Path) -> None:
    unit_path = tmp_path / "vllm.service"
    unit_path.write_text(example_text())
    dropdir = tmp_path / "vllm.service.d"
    dropdir.mkdir()
    (dropdir / "20-env.conf").write_text("[Service]\nEnvironment=\nEnvironment=\"NCCL_ALGO=Tree x\" A=1\n")
    (dropdir / "10-exec.conf").write_text("[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m vllm \\\n  --port 9\n")
    (dropdir / "ignored.txt").write_text("not a drop-in")
    unit = load_unit(unit_path)
    assert unit.dropins == (str(dropdir / "10-exec.conf"), str(dropdir / "20-env.conf"))
    assert unit.get_all("Service", "ExecStart") == ["/usr/bin/python3 -m vllm    --port 9"]
    assert parse_environment(unit.get_all("Service", "Environment")) == {"NCCL_ALGO": "Tree x", "A": "1"}
    decided = unit.last_entry("Service", "ExecStart")
    assert decided is not None and decided.source.endswith("10-exec.conf") and decided.line == 3
    systemd = verify(tmp_path, "vllm.service")  # systemd reads the same files and finds no syntax problem
    assert not re.search(r"Invalid|Unbalanced|Missing '='|ignoring", systemd.stdout + systemd.stderr)


@pytest.mark.needs_shared
def test_systemctl_cat_output() -> None:
    text = ("# /etc/systemd/system/vllm.service\n" + example_text()
            + "\n# /etc/systemd/system/vllm.service.d/override.conf\n[Service]\nEnvironment=NCCL_PROTO=Simple\n")
    unit = parse_systemctl_cat(text, "systemctl cat vllm")
    assert unit.path == "/etc/systemd/system/vllm.service"
    assert unit.dropins == ("/etc/systemd/system/vllm.service.d/override.conf",)
    assert parse_environment(unit.get_all("Service", "Environment"))["NCCL_PROTO"] == "Simple"
    with pytest.raises(InputError, match="no '# /path' header"):
        parse_systemctl_cat("", "systemctl cat x")


def test_command_lines_and_prefixes() -> None:
    first, second = split_command_lines("-@/bin/a argv0 '$$HOME' ${X} ; +/bin/b \\; %%i")
    assert (first.prefixes, first.argv) == ("-@", ["/bin/a", "argv0", "$HOME", "${X}"])
    assert (second.prefixes, second.argv) == ("+", ["/bin/b", ";", "%i"])
    with pytest.raises(InputError, match="2 commands"):
        split_command_line("/bin/a ; /bin/b")
    with pytest.raises(InputError, match="unbalanced quoting"):
        split_command_line('/bin/a "open')


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("[Unit]\nDescription=x\n[Service\nExecStart=/bin/true\n", 3, "invalid section header"),
    ("Description=x\n[Service]\nExecStart=/bin/true\n", 1, "assignment .Description. before any"),
    ("[Unit]\nDescription=x\n[Service]\nGarbage line\nExecStart=/bin/true\n", 4, "missing '='"),
])
def test_malformed_lines_name_the_line_systemd_names(tmp_path: Path, text: str, line: int, problem: str) -> None:
    (tmp_path / "bad.service").write_text(text)
    systemd = verify(tmp_path, "bad.service")
    assert f"bad.service:{line}:" in systemd.stdout + systemd.stderr
    with pytest.raises(InputError, match=rf"bad\.service:{line}: {problem}"):
        load_unit(tmp_path / "bad.service")


def test_an_unreadable_unit_file_is_one_line_saying_why(tmp_path: Path) -> None:
    (tmp_path / "latin1.service").write_bytes(b"[Unit]\nDescription=caf\xe9\n")
    with pytest.raises(InputError, match=r"latin1\.service: not UTF-8 text; not a unit file$"):
        load_unit(tmp_path / "latin1.service")
    (tmp_path / "dir.service").mkdir()
    with pytest.raises(InputError, match=r"dir\.service: is a directory, not a unit file$"):
        load_unit(tmp_path / "dir.service")


def test_missing_unit_and_bad_environment(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such unit file"):
        load_unit(tmp_path / "absent.service")
    with pytest.raises(InputError, match="invalid environment assignment 'bad'"):
        parse_environment(["A=1 bad"])
