"""nvml.py against a fake pynvml that replays real NVML readings recorded on an H200
(tests/data/gpu/h200-nvml, made by tools/record_gpu_fixtures.py). Expected values come from the
nvidia-smi outputs recorded in the same run, read with csv or a regex here."""

from __future__ import annotations

import copy
import csv
import re
import sys
from typing import Any

import pytest
from fake_pynvml import load_recording, make_fake_pynvml, with_two_gpus
from gpu_inputs import RECORDING, SETS, recorded_file

from servescope.gpu import nvml
from servescope.gpu.errors import GpuQueryError, GpuUnavailable
from servescope.gpu.nvml import nvml_snapshot


def use(monkeypatch: pytest.MonkeyPatch, fake: Any) -> Any:
    """Install `fake` as pynvml, with nvml.py not yet initialised (both undone after the test)."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_nvml", None)
    return fake


def recording(set_name: str) -> dict[str, Any]:
    return load_recording(RECORDING / set_name / "nvml.json")


def query_gpu_row(set_name: str) -> dict[str, str]:
    """The recorded ``--query-gpu`` CSV, by plain csv: field -> value without its unit."""
    rows = list(csv.reader(recorded_file(set_name, "query-gpu.csv").splitlines(), skipinitialspace=True))
    names = [c.split(" [")[0] for c in rows[0]]
    return {n: v.split(" ")[0] if v[:1].isdigit() else v for n, v in zip(names, rows[1], strict=True)}


def test_recording_is_present_and_real() -> None:
    assert RECORDING.is_dir(), f"missing {RECORDING}: run tools/record_gpu_fixtures.py on a GPU host"
    doc = recording("idle")
    assert doc["calls"][0]["fn"] == "nvmlInit" and "error" not in doc["calls"][0]


@pytest.mark.parametrize("recorded_set", SETS)
def test_snapshot_matches_nvidia_smi_of_the_same_run(monkeypatch: pytest.MonkeyPatch, recorded_set: str) -> None:
    use(monkeypatch, make_fake_pynvml(recording(recorded_set)))
    snap = nvml_snapshot()
    smi = query_gpu_row(recorded_set)
    banner = re.search(r"CUDA Version: (\S+)", recorded_file(recorded_set, "nvidia-smi.txt"))
    assert banner
    assert snap.source == "nvml" and snap.topology is None  # one GPU
    (gpu,) = snap.gpus
    assert gpu.index == int(smi["index"])
    assert gpu.name == smi["name"] and gpu.uuid == smi["uuid"] and gpu.pci_bus_id == smi["pci.bus_id"]
    assert gpu.memory_total_mib == int(smi["memory.total"])
    assert gpu.memory_used_mib == int(smi["memory.used"])  # same rounding as nvidia-smi
    assert gpu.pcie_gen_current == int(smi["pcie.link.gen.current"])
    assert gpu.pcie_gen_max == int(smi["pcie.link.gen.max"])
    assert gpu.pcie_width_current == int(smi["pcie.link.width.current"])
    assert gpu.pcie_width_max == int(smi["pcie.link.width.max"])
    assert gpu.power_limit_w == float(smi["enforced.power.limit"])
    assert gpu.driver_version == smi["driver_version"]
    assert gpu.cuda_version == banner.group(1)
    # Read a moment apart from nvidia-smi's: close, not equal.
    assert gpu.power_draw_w is not None and abs(gpu.power_draw_w - float(smi["power.draw"])) < 40
    assert gpu.temperature_c is not None and abs(gpu.temperature_c - int(smi["temperature.gpu"])) <= 3
    assert gpu.utilization_gpu_pct is not None and 0 <= gpu.utilization_gpu_pct <= 100

    apps = [
        r
        for r in csv.reader(
            recorded_file(recorded_set, "query-compute-apps.csv").splitlines()[1:], skipinitialspace=True
        )
        if r
    ]
    assert [(p.gpu_index, str(p.pid), p.process_name, f"{p.used_memory_mib} MiB") for p in snap.processes] == [
        (0, *r) for r in apps
    ]


def test_holding_set_names_the_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    meta = json.loads(recorded_file("holding-10GiB", "set.json"))
    use(monkeypatch, make_fake_pynvml(recording("holding-10GiB")))
    (proc,) = nvml_snapshot().processes
    assert proc.pid == meta["holder_pid"] and proc.process_name == meta["holder_argv0"]
    assert proc.used_memory_mib is not None and proc.used_memory_mib >= meta["holding_gib"] * 1024


def test_initialised_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = use(monkeypatch, make_fake_pynvml(recording("idle")))
    nvml_snapshot()
    nvml_snapshot()
    assert fake.calls.count("nvmlInit") == 1


def test_not_supported_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    not_supported = {"error": "NVMLError_NotSupported"}
    use(
        monkeypatch,
        make_fake_pynvml(
            recording("idle"),
            overrides={
                "nvmlDeviceGetPowerUsage": not_supported,
                "nvmlDeviceGetTemperature": not_supported,
                "nvmlDeviceGetMaxPcieLinkGeneration": not_supported,
                "nvmlDeviceGetUtilizationRates": not_supported,
            },
        ),
    )
    (gpu,) = nvml_snapshot().gpus
    assert gpu.power_draw_w is None and gpu.temperature_c is None
    assert gpu.pcie_gen_max is None and gpu.utilization_gpu_pct is None
    assert gpu.power_limit_w is not None  # the rest still read


def test_bytes_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = copy.deepcopy(recording("idle"))
    for call in doc["calls"]:  # older pynvml returned bytes
        if call["fn"] in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlSystemGetDriverVersion"):
            call["return"] = {"__bytes__": call["return"]}
    use(monkeypatch, make_fake_pynvml(doc))
    (gpu,) = nvml_snapshot().gpus
    assert gpu.name == query_gpu_row("idle")["name"] and gpu.driver_version == query_gpu_row("idle")["driver_version"]


@pytest.mark.parametrize("error", ["NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded"])
def test_no_library_or_driver_is_unavailable(monkeypatch: pytest.MonkeyPatch, error: str) -> None:
    use(monkeypatch, make_fake_pynvml(recording("idle"), overrides={"nvmlInit": {"error": error}}))
    with pytest.raises(GpuUnavailable, match="NVML"):
        nvml_snapshot()


def test_missing_package_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, None)  # import pynvml fails
    with pytest.raises(GpuUnavailable, match="nvidia-ml-py"):
        nvml_snapshot()


def test_real_failure_is_our_error(monkeypatch: pytest.MonkeyPatch) -> None:
    use(
        monkeypatch,
        make_fake_pynvml(recording("idle"), overrides={"nvmlDeviceGetName": {"error": "NVMLError_GpuIsLost"}}),
    )
    with pytest.raises(GpuQueryError, match="nvmlDeviceGetName"):
        nvml_snapshot()


def test_fake_constants_are_pynvml_constants() -> None:
    import pynvml  # nvidia-ml-py, a servescope dependency

    for name, value in recording("idle")["constants"].items():
        assert getattr(pynvml, name) == value, name


def two_gpu_recording() -> dict[str, Any]:
    return with_two_gpus(recording("idle"))


def test_topology_with_two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, make_fake_pynvml(two_gpu_recording()))
    topo = nvml_snapshot().topology
    assert topo is not None
    assert topo.devices == ("GPU0", "GPU1")
    assert topo.p2p_level(0, 1) == topo.p2p_level(1, 0) == "NV18" and topo.has_nvlink
    assert topo.p2p_read == (("X", "OK"), ("OK", "X"))


def test_topology_without_nvlink(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = two_gpu_recording()
    doc["calls"] = [c for c in doc["calls"] if not c["fn"].startswith("nvmlDeviceGetNvLink")]
    for dev in (0, 1):
        doc["calls"].append(
            {
                "fn": "nvmlDeviceGetNvLinkState",
                "args": [{"device": dev}, 0],
                "error": {"name": "NVMLError_NotSupported", "value": 3},
            }
        )
    for call in doc["calls"]:
        if call["fn"] == "nvmlDeviceGetP2PStatus" and call["args"][2] == 2:
            call["return"] = 5
        if call["fn"] == "nvmlDeviceGetTopologyCommonAncestor":
            call["return"] = 30
    use(monkeypatch, make_fake_pynvml(doc))
    topo = nvml_snapshot().topology
    assert topo is not None and topo.p2p_level(0, 1) == "PHB" and not topo.has_nvlink
