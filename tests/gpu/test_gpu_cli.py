"""`servescope gpu topo` and `gpu holders`: in-process through typer's CliRunner over real recorded inputs,
and once each as a real subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_pynvml import load_recording, make_fake_pynvml
from gpu_inputs import RECORDING, TOPO, fake_nvidia_smi, recorded_file, snapshot_of, topo_text, two_gpu_xml
from typer.testing import CliRunner

from servescope.cli import app
from servescope.gpu import inventory, nvml

runner = CliRunner()
SERVESCOPE = Path(sys.executable).parent / "servescope"
TOPO_KEYS = {"source", "taken_at", "gpus", "pairs", "topology_known", "verdict", "nics"}
HOLDERS_KEYS = {"source", "taken_at", "gpus", "unplaced"}


def test_topo_json_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = snapshot_of(topo_text("4x3090-nv4-pairs-phb-node"))
    monkeypatch.setattr(inventory, "nvml_snapshot", lambda: snap)
    result = runner.invoke(app, ["gpu", "topo", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == TOPO_KEYS
    assert {(p["a"], p["b"]) for p in doc["pairs"] if p["link"] == "NV4"} == {(0, 2), (1, 3)}
    assert all(set(p) == {"a", "b", "link", "nvlinks", "pcie_path", "p2p_read", "p2p_ok"} for p in doc["pairs"])
    table = runner.invoke(app, ["gpu", "topo"])
    assert table.exit_code == 0
    assert "verdict: mixed: 2 of 6 pairs NVLink" in table.stdout
    assert re.search(r"^ 0-2\s+NV4\s+4\s+N/A\s+N/A", table.stdout, re.MULTILINE)


def test_holders_json_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = json.loads(recorded_file("holding-10GiB", "set.json"))
    fake = make_fake_pynvml(load_recording(RECORDING / "holding-10GiB" / "nvml.json"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_nvml", None)
    result = runner.invoke(app, ["gpu", "holders", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == HOLDERS_KEYS
    (gpu,) = doc["gpus"]
    assert [h["pid"] for h in gpu["holders"]] == [meta["holder_pid"]]
    assert gpu["held_mib"] == gpu["holders"][0]["used_mib"]
    table = runner.invoke(app, ["gpu", "holders"])
    assert table.exit_code == 0
    assert "MiB held by 1 process" in table.stdout and str(meta["holder_pid"]) in table.stdout


@pytest.mark.parametrize("command", ["topo", "holders"])
def test_bad_prefer_is_exit_2(command: str) -> None:
    result = runner.invoke(app, ["gpu", command, "--prefer", "smi"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "servescope: error: prefer='smi': allowed values are nvml, nvidia-smi"


@pytest.mark.parametrize("command", ["topo", "holders"])
def test_without_a_gpu_is_one_line(command: str) -> None:
    result = runner.invoke(app, ["gpu", command])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope: error: no GPU query works here")


@pytest.mark.parametrize("command", ["topo", "holders"])
def test_subprocess_without_a_gpu(command: str) -> None:
    done = subprocess.run([str(SERVESCOPE), "gpu", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope: error: no GPU query works here")
    assert "Traceback" not in done.stderr


@pytest.mark.needs_shared
def test_subprocess_topo_overfake_nvidia_smi(tmp_path: Path) -> None:
    folder = TOPO / "2x5090-phb-p2p-gns"
    fake_nvidia_smi(
        tmp_path,
        {"-q -x": two_gpu_xml(tmp_path), "topo -m": folder / "topo-m.txt", "topo -p2p r": folder / "topo-p2p-rw.txt"},
    )
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    done = subprocess.run(
        [str(SERVESCOPE), "gpu", "topo", "--prefer", "nvidia-smi"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "verdict: PCIe, P2P unavailable (GNS): NCCL will go through shared memory" in done.stdout


def test_subprocess_holders_overfake_nvidia_smi(tmp_path: Path) -> None:
    xml = RECORDING / "holding-10GiB" / "nvidia-smi-q.xml"
    pid = re.search(r"<pid>(\d+)</pid>", xml.read_text(encoding="utf-8"))
    assert pid
    fake_nvidia_smi(tmp_path, {"-q -x": xml, "topo -m": RECORDING / "holding-10GiB" / "topo-m.txt"})
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    done = subprocess.run(
        [str(SERVESCOPE), "gpu", "holders", "--prefer", "nvidia-smi", "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert done.returncode == 0, done.stderr
    (gpu,) = json.loads(done.stdout)["gpus"]
    assert [h["pid"] for h in gpu["holders"]] == [int(pid.group(1))]
