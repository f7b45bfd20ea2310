"""service lint over the real example unit and variants written here; each finding names its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.deploy.lint import lint_unit, parse_unit

from .conftest import EXAMPLE_UNIT, example_text, verify


def _line_of(text: str, prefix: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(prefix))


@pytest.mark.needs_shared
def test_example_unit_findings_name_their_lines() -> None:
    text = example_text()
    result = lint_unit(parse_unit(text, "kimi.service"), topology="nvlink")
    found = {f.rule: f.line for f in result.findings}
    assert found["wait-loop-cannot-fail"] == _line_of(text, "ExecStartPre=")
    assert found["nccl-topology"] == _line_of(text, "Environment=NCCL_P2P_LEVEL=SYS")
    assert "start-limit-cannot-trip" in found
    # Type=simple, no ExecStartPost: systemd counts the start done at once, so its timeout does not bound the load
    assert "no-start-timeout" not in found
    assert "no-max-model-len" not in found  # the example passes --max-model-len


@pytest.mark.needs_shared
def test_pcie_box_does_not_flag_p2p_level_sys() -> None:
    result = lint_unit(parse_unit(example_text(), "kimi.service"), topology="pcie")
    assert "nccl-topology" not in {f.rule for f in result.findings}


@pytest.mark.needs_shared
def test_variant_with_every_problem(tmp_path: Path) -> None:
    text = (example_text()
            .replace("Type=simple", "Type=notify")  # systemd waits for READY=1: the start timeout bounds the load
            .replace("Restart=on-failure", "Restart=always\nKillMode=process\nTimeoutStartSec=600\n"
                     "Environment=HF_TOKEN=hf_secretvalue NCCL_NVLS_ENABLE=1")
            .replace(" --max-model-len 131072", " --api-key sk-live-123"))
    unit = tmp_path / "bad.service"
    unit.write_text(text)
    result = CliRunner().invoke(app, ["service", "lint", str(unit), "--topology", "pcie", "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    rules = {f["rule"]: f["line"] for f in doc["findings"]}
    assert rules["restart-always-no-limit"] == _line_of(text, "Restart=always")
    assert rules["kill-mode-leaves-gpu"] == _line_of(text, "KillMode=process")
    assert rules["start-timeout-short"] == _line_of(text, "TimeoutStartSec=600")
    assert rules["no-max-model-len"] == _line_of(text, "ExecStart=")
    assert rules["nccl-topology"] == _line_of(text, "Environment=HF_TOKEN")
    assert {f["rule"] for f in doc["findings"] if f["rule"] == "inline-secret"} == {"inline-secret"}
    human = CliRunner().invoke(app, ["service", "lint", str(unit), "--topology", "pcie"])
    for out in (result.stdout, human.stdout):
        assert "hf_secretvalue" not in out and "sk-live-123" not in out
    assert f"{unit}:{_line_of(text, 'KillMode=process')} error kill-mode-leaves-gpu" in human.stdout


@pytest.mark.needs_shared
def test_topology_from_a_recorded_topo_file() -> None:
    topo = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h200-nvml" / "idle" / "topo-m.txt"
    result = CliRunner().invoke(app, ["service", "lint", str(EXAMPLE_UNIT),
                                      "--topology", str(topo), "--json"])
    assert json.loads(result.stdout)["topology"] in ("nvlink", "pcie")


def test_malformed_and_missing_units_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart /bin/true\n")
    result = CliRunner().invoke(app, ["service", "lint", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: missing '='" in result.output
    missing = CliRunner().invoke(app, ["service", "lint", str(tmp_path / "none.service")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


# --- issue 37: rules know Type= and the directives they judge --------------------------------------------------

_SERVER = "ExecStart=/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m --max-model-len 4096\n"


@pytest.mark.parametrize(("service", "fires"), [
    # systemd counts Type=simple / exec started at fork / execve: the start timeout never bounds the load
    ("Type=simple\n", False),
    ("", False),
    ("Type=exec\n", False),
    # ...unless an ExecStartPost (a readiness wait) runs inside the start, or systemd waits for READY=1
    ("Type=simple\nExecStartPost=/bin/sh -c 'until curl -sf localhost:8000/health; do sleep 5; done'\n", True),
    ("Type=exec\nExecStartPost=/bin/true\n", True),
    ("Type=notify\n", True),
    ("Type=notify\nTimeoutStartSec=3000\n", False),
    ("Type=notify\nTimeoutSec=3000\n", False),
])
def test_no_start_timeout_fires_only_where_the_start_waits_for_the_load(service: str, fires: bool) -> None:
    result = lint_unit(parse_unit(f"[Service]\n{service}{_SERVER}", "u.service"), host=False)
    assert ("no-start-timeout" in {f.rule for f in result.findings}) == fires


def test_start_timeout_short_is_judged_only_where_the_start_waits() -> None:
    simple = lint_unit(parse_unit(f"[Service]\nType=simple\nTimeoutStartSec=600\n{_SERVER}", "u"), host=False)
    notify = lint_unit(parse_unit(f"[Service]\nType=notify\nTimeoutStartSec=600\n{_SERVER}", "u"), host=False)
    assert "start-timeout-short" not in {f.rule for f in simple.findings}
    (short,) = [f for f in notify.findings if f.rule == "start-timeout-short"]
    assert (short.line, short.detail) == (3, "TimeoutStartSec=600 (600 s) < load 1800 s")


def test_no_readiness_knows_type_exec_too() -> None:
    for kind, line in (("Type=exec\n", 2), ("", 2)):
        result = lint_unit(parse_unit(f"[Service]\n{kind}{_SERVER}", "u"), host=False)
        (finding,) = [f for f in result.findings if f.rule == "no-readiness"]
        assert finding.line == line and finding.detail.endswith("no ExecStartPost")


def test_a_unit_without_exec_start_is_an_error_systemd_agrees(tmp_path: Path) -> None:
    unit = tmp_path / "noexec.service"
    unit.write_text("[Unit]\nDescription=x\n[Service]\nType=simple\nEnvironment=NCCL_ALGO=Ring\n")
    result = CliRunner().invoke(app, ["service", "lint", str(unit), "--no-host", "--json"])
    assert result.exit_code == 1
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["rule"] == "no-exec-start"]
    assert finding["severity"] == "error" and finding["line"] == 4
    checked = verify(tmp_path, "noexec.service")  # the independent judge refuses the same unit
    assert checked.returncode != 0 and "has no ExecStart=" in checked.stdout + checked.stderr


@pytest.mark.parametrize(("env", "said"), [
    ("NCCL_PROTO=LL NCCL_ALGO=Ring", "NCCL: NCCL_PROTO, NCCL_ALGO checked against pcie: none contradicts it"),
    ("OMP_NUM_THREADS=8", "NCCL: the unit sets no NCCL_* variable; no NCCL rule applies on pcie"),
    ("NCCL_PROTO=^LL128", "NCCL: NCCL_PROTO checked against pcie: none contradicts it"),  # ^ excludes LL128
])
def test_topology_without_a_finding_says_so_in_one_line(tmp_path: Path, env: str, said: str) -> None:
    unit = tmp_path / "u.service"
    unit.write_text(f"[Service]\nType=exec\nEnvironment={env}\n{_SERVER}ExecStartPost=/bin/true\nTimeoutSec=3000\n")
    result = CliRunner().invoke(app, ["service", "lint", str(unit), "--no-host", "--topology", "pcie"])
    assert result.exit_code == 0 and said in result.stdout.splitlines(), result.stdout
    shown = CliRunner().invoke(app, ["service", "lint", str(unit), "--no-host", "--topology", "pcie", "--json"])
    assert json.loads(shown.stdout)["notes"] == [said]


def test_forcing_ll128_on_pcie_is_a_finding() -> None:
    text = f"[Service]\nEnvironment=NCCL_PROTO=Simple,LL128\n{_SERVER}"
    pcie = lint_unit(parse_unit(text, "u"), topology="pcie", host=False)
    nvlink = lint_unit(parse_unit(text, "u"), topology="nvlink", host=False)
    (finding,) = [f for f in pcie.findings if f.rule == "nccl-topology"]
    assert finding.line == 2 and finding.detail.startswith("NCCL_PROTO=Simple,LL128 on pcie: ") and not pcie.notes
    assert "nccl-topology" not in {f.rule for f in nvlink.findings}


def test_every_rule_declares_what_it_judges_and_missing_rules_need_no_code() -> None:
    from servescope.deploy import lint

    rules = lint._rules()["rule"]
    assert all(rule["judges"] and all("." in name for name in rule["judges"]) for rule in rules)
    coded = {r["id"] for r in rules if not r.get("missing")}
    assert coded == set(lint._CHECKS)  # each rule is data or data + one check; code names no other id


def test_a_value_systemd_cannot_split_is_one_line_naming_its_line() -> None:
    from servescope.core.errors import InputError

    unit = parse_unit(f"[Service]\nExecStartPre=/bin/sh -c 'oops\n{_SERVER}", "u.service")
    with pytest.raises(InputError, match=r"^u\.service:2: unbalanced quoting"):
        lint_unit(unit, host=False)


@pytest.mark.needs_shared
def test_the_readmes_lint_screen_is_what_lint_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """README's `service lint` block, line by line in order, in the real output at 100 columns (`[…]` left out)."""
    import re

    readme = Path(__file__).resolve().parents[2] / "README.md"
    (block,) = re.findall(r"```\n\$ servescope (service lint [^\n]*)\n(.*?)```", readme.read_text(), re.S)
    shown = [line for line in block[1].splitlines() if not line.startswith("[…")]
    monkeypatch.chdir(EXAMPLE_UNIT.parent)
    result = CliRunner().invoke(app, block[0].split(), env={"COLUMNS": "100"})
    printed = iter(line.rstrip() for line in result.stdout.splitlines())
    assert [line for line in shown if not any(line == p for p in printed)] == []
    assert "no-start-timeout" not in result.stdout  # Type=simple, no ExecStartPost: the timeout bounds no load
