"""service lint over the real example unit and variants written here; each finding names its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.deploy.lint import lint_unit, parse_unit

from .conftest import EXAMPLE_UNIT, example_text


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
