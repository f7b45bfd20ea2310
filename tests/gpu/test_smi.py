"""nvidia-smi parsers against real H200 outputs; expected values come from the plain table or a regex."""

from __future__ import annotations

import csv
import re
import stat
from pathlib import Path

import pytest
from gpu_inputs import SETS, recorded_file, shared_file

from servescope.gpu.errors import GpuQueryError, GpuUnavailable
from servescope.gpu.smi import (
    QUERY_GPU_FIELDS,
    parse_compute_apps_csv,
    parse_query_gpu_csv,
    parse_smi_xml,
    parse_topo_matrix,
    run_nvidia_smi,
)

# The GPU line pair of the plain ``nvidia-smi`` table.
TABLE_GPU = re.compile(
    r"\|\s+(?P<index>\d+)\s+(?P<name>NVIDIA [\w ]+?)\s+(?:On|Off)\s+\|\s+(?P<bus>[0-9A-F:.]+)\s.*?\n"
    r"\|\s+\S+\s+(?P<temp>\d+)C\s+P\d+\s+(?P<power>\d+)W\s+/\s+(?P<cap>\d+)W\s+\|\s+(?P<used>\d+)MiB\s+/\s+"
    r"(?P<total>\d+)MiB\s+\|\s+(?P<util>\d+)%"
)
TABLE_PROC = re.compile(r"\|\s+(?P<gpu>\d+)\s+\S+\s+\S+\s+(?P<pid>\d+)\s+C\S*\s+(?P<name>\S+)\s+(?P<mib>\d+)MiB \|")
BANNER = re.compile(r"Driver Version: (?P<driver>\S+)\s+CUDA Version: (?P<cuda>\S+)")


def table(text: str) -> dict[str, str]:
    match = TABLE_GPU.search(text)
    assert match, "no GPU row in the plain nvidia-smi table"
    banner = BANNER.search(text)
    assert banner
    return match.groupdict() | banner.groupdict()


def xml_tag(text: str, tag: str) -> str:
    """The first <tag>value</tag> of the XML, read with a plain regex."""
    match = re.search(rf"<{tag}>([^<]*)</{tag}>", text)
    assert match, tag
    return match.group(1).strip()


@pytest.mark.needs_shared
def test_xml_matches_the_plain_table_taken_with_it() -> None:
    xml, plain = shared_file("nvidia-smi-q.xml"), table(shared_file("nvidia-smi.txt"))
    (gpu,), procs = parse_smi_xml(xml)
    assert procs == ()
    assert gpu.index == int(plain["index"]) == 0
    assert gpu.name == plain["name"]
    assert gpu.pci_bus_id == plain["bus"]
    assert gpu.memory_used_mib == int(plain["used"])
    assert gpu.memory_total_mib == int(plain["total"])
    assert gpu.temperature_c == int(plain["temp"])
    assert gpu.utilization_gpu_pct == int(plain["util"])
    assert gpu.power_limit_w == float(plain["cap"])
    assert gpu.driver_version == plain["driver"]
    assert gpu.cuda_version == plain["cuda"]
    assert gpu.uuid == xml_tag(xml, "uuid")
    assert gpu.pcie_gen_current == int(xml_tag(xml, "current_link_gen"))
    assert gpu.pcie_gen_max == int(xml_tag(xml, "max_link_gen"))
    assert gpu.pcie_width_current == int(xml_tag(xml, "current_link_width").rstrip("x"))
    assert gpu.pcie_width_max == int(xml_tag(xml, "max_link_width").rstrip("x"))
    assert gpu.power_draw_w == float(xml_tag(xml, "average_power_draw").split()[0])


def test_xml_processes_while_holding_memory() -> None:
    xml, text = recorded_file("holding-10GiB", "nvidia-smi-q.xml"), recorded_file("holding-10GiB", "nvidia-smi.txt")
    (gpu,), (proc,) = parse_smi_xml(xml)
    row = TABLE_PROC.search(text)
    assert row
    assert (proc.gpu_index, proc.pid, proc.process_name, proc.used_memory_mib) == (
        int(row["gpu"]),
        int(row["pid"]),
        row["name"],
        int(row["mib"]),
    )
    assert gpu.memory_used_mib == int(table(text)["used"])


@pytest.mark.needs_shared
def test_query_gpu_csv_with_header_and_units() -> None:
    text = shared_file("topo_query.txt").split("---\n", 1)[1]
    plain = table(shared_file("nvidia-smi.txt"))
    (gpu,) = parse_query_gpu_csv(text)
    assert (gpu.index, gpu.name, gpu.pci_bus_id) == (0, plain["name"], plain["bus"])
    assert gpu.memory_used_mib == int(plain["used"])
    assert gpu.memory_total_mib == int(plain["total"])
    xml = shared_file("nvidia-smi-q.xml")
    assert gpu.pcie_gen_current == int(xml_tag(xml, "current_link_gen"))
    assert gpu.pcie_width_current == int(xml_tag(xml, "current_link_width").rstrip("x"))
    assert gpu.power_draw_w is None  # not asked for: not available, never 0


@pytest.mark.parametrize("recorded_set", SETS)
def test_query_gpu_csv_all_fields_match_table_and_xml(recorded_set: str) -> None:
    text = recorded_file(recorded_set, "query-gpu.csv")
    plain = table(recorded_file(recorded_set, "nvidia-smi.txt"))
    xml = recorded_file(recorded_set, "nvidia-smi-q.xml")
    header = [c.strip().split(" [")[0] for c in text.splitlines()[0].split(",")]
    assert header == list(QUERY_GPU_FIELDS)  # the recorder asked for every field we know
    (gpu,) = parse_query_gpu_csv(text)
    assert gpu.name == plain["name"] and gpu.pci_bus_id == plain["bus"]
    assert gpu.uuid == xml_tag(xml, "uuid")
    assert gpu.memory_total_mib == int(plain["total"])
    assert gpu.memory_used_mib == int(plain["used"])
    assert gpu.power_limit_w == float(plain["cap"])
    assert gpu.driver_version == plain["driver"]
    assert gpu.pcie_gen_max == int(xml_tag(xml, "max_link_gen"))
    assert gpu.pcie_width_max == int(xml_tag(xml, "max_link_width").rstrip("x"))
    assert gpu.power_draw_w is not None and abs(gpu.power_draw_w - float(plain["power"])) < 40
    assert gpu.temperature_c is not None and abs(gpu.temperature_c - int(plain["temp"])) <= 3


@pytest.mark.needs_shared
def test_query_gpu_noheader_nounits_while_holding() -> None:
    text = shared_file("nvidia-smi-holding-10GiB.txt")
    block = text.split("--format=csv,noheader,nounits\n", 1)[1].split("\n\n", 1)[0]
    plain = table(text)
    (gpu,) = parse_query_gpu_csv(block, fields=["index", "memory.used", "memory.total"])
    assert (gpu.index, gpu.memory_used_mib, gpu.memory_total_mib) == (0, int(plain["used"]), int(plain["total"]))
    assert gpu.name is None


@pytest.mark.needs_shared
def test_compute_apps_csv_while_holding() -> None:
    text = shared_file("nvidia-smi-holding-10GiB.txt")
    block = text.split("--format=csv\n", 1)[1].split("\n\n", 1)[0]
    gpus = parse_query_gpu_csv(
        text.split("nounits\n", 1)[1].split("\n\n", 1)[0], fields=["index", "memory.used", "memory.total"]
    )
    row = TABLE_PROC.search(text)
    assert row
    (proc,) = parse_compute_apps_csv(block, gpus=gpus)
    assert (proc.gpu_index, proc.pid, proc.process_name, proc.used_memory_mib) == (
        int(row["gpu"]),
        int(row["pid"]),
        row["name"],
        int(row["mib"]),
    )
    # Without the host's GPUs we cannot say which GPU it is on.
    assert parse_compute_apps_csv(block)[0].gpu_index is None


@pytest.mark.parametrize("recorded_set", SETS)
def test_compute_apps_csv_recorded(recorded_set: str) -> None:
    text = recorded_file(recorded_set, "query-compute-apps.csv")
    expected = [r for r in csv.reader(text.splitlines()[1:], skipinitialspace=True) if r]
    procs = parse_compute_apps_csv(text)
    assert [(str(p.pid), p.process_name, f"{p.used_memory_mib} MiB") for p in procs] == [tuple(r) for r in expected]
    assert bool(procs) == (recorded_set != "idle")


@pytest.mark.needs_shared
def test_not_available_is_none_never_zero() -> None:
    header, row = recorded_file("idle", "query-gpu.csv").splitlines()[:2]
    cells = [c.strip() for c in row.split(",")]
    names = [c.strip().split(" [")[0] for c in header.split(",")]
    cells[names.index("power.draw")] = "[N/A]"
    cells[names.index("pcie.link.gen.max")] = "[Not Supported]"
    cells[names.index("temperature.gpu")] = "N/A"
    (gpu,) = parse_query_gpu_csv(header + "\n" + ", ".join(cells) + "\n")
    assert gpu.power_draw_w is None and gpu.pcie_gen_max is None and gpu.temperature_c is None
    assert gpu.memory_total_mib == int(cells[names.index("memory.total")].split()[0])

    xml = shared_file("nvidia-smi-q.xml")
    xml = re.sub(r"<gpu_temp>[^<]*</gpu_temp>", "<gpu_temp>N/A</gpu_temp>", xml)
    xml = re.sub(r"<average_power_draw>[^<]*</average_power_draw>", "<average_power_draw>N/A</average_power_draw>", xml)
    (gpu,), _ = parse_smi_xml(xml)
    assert gpu.temperature_c is None and gpu.power_draw_w is None

    apps = "pid, process_name, used_gpu_memory [MiB]\n414, python3, [N/A]\n"
    assert parse_compute_apps_csv(apps)[0].used_memory_mib is None


def test_errors_in_cells_raise_our_error() -> None:
    header, row = recorded_file("idle", "query-gpu.csv").splitlines()[:2]
    bad = row.split(", ")
    bad[4] = "[Unknown Error]"
    with pytest.raises(GpuQueryError, match="Unknown Error"):
        parse_query_gpu_csv(header + "\n" + ", ".join(bad))
    with pytest.raises(GpuQueryError, match="cells"):
        parse_query_gpu_csv(header + "\n0, NVIDIA H200\n")
    with pytest.raises(GpuQueryError, match="not XML"):
        parse_smi_xml("NVIDIA-SMI has failed")


@pytest.mark.needs_shared
@pytest.mark.parametrize("recorded_set", SETS)
def test_topo_matrix_single_gpu(recorded_set: str) -> None:
    for text in (shared_file("topo_query.txt").split("---", 1)[0], recorded_file(recorded_set, "topo-m.txt")):
        row = next(ln for ln in text.splitlines() if ln.startswith("GPU0\t"))
        cells = [c.strip() for c in row.split("\t")]  # ["GPU0", "X", "0-15", "0", "", "N/A"]
        topo = parse_topo_matrix(text)
        assert topo.devices == ("GPU0",)
        assert topo.links == ((cells[1],),)
        assert topo.cpu_affinity == (cells[2],) and topo.numa_affinity == (cells[3],)
        assert topo.gpu_numa_id == (None,)  # "N/A"
        assert topo.p2p_level(0, 0) == "X" and not topo.has_nvlink


# The layout of `nvidia-smi topo -m` on a host with NVLink and NICs (no such host recorded yet): two
# GPUs, two NICs, the NIC rows without affinity cells, and the NIC legend.
TWO_GPUS_TWO_NICS = (
    "\t\x1b[4mGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tPXB\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tPXB\t56-111,168-223\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\t X \tSYS\t\t\t\t\n"
    "NIC1\tSYS\tPXB\tSYS\t X \t\t\t\t\n"
    "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
    "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n"
)


def test_topo_matrix_nvlink_and_nics() -> None:
    topo = parse_topo_matrix(TWO_GPUS_TWO_NICS)
    assert topo.devices == ("GPU0", "GPU1", "NIC0", "NIC1")
    assert topo.p2p_level(0, 1) == topo.p2p_level(1, 0) == "NV18" and topo.has_nvlink
    assert topo.links[0][2] == "PXB" and topo.links[3][1] == "PXB"
    assert topo.cpu_affinity == ("0-55,112-167", "56-111,168-223") and topo.numa_affinity == ("0", "1")
    assert topo.nic_names == (("NIC0", "mlx5_0"), ("NIC1", "mlx5_1"))
    assert topo.gpu_count == 2
    with pytest.raises(ValueError, match="GPU0, GPU1"):
        topo.p2p_level(0, 7)
    with pytest.raises(GpuQueryError, match="GPU0"):
        parse_topo_matrix("Legend:\n  X = Self\n")


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_run_nvidia_smi_errors(tmp_path: Path) -> None:
    with pytest.raises(GpuUnavailable, match="not found"):
        run_nvidia_smi(["-q"], binary=str(tmp_path / "no-such-nvidia-smi"))
    # The real message nvidia-smi prints when the driver is not loaded.
    no_driver = _script(
        tmp_path,
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        'Make sure that the latest NVIDIA driver is installed and running."; exit 9',
    )
    with pytest.raises(GpuUnavailable, match="couldn't communicate"):
        run_nvidia_smi(["-q", "-x"], binary=no_driver)
    failing = _script(
        tmp_path, "echo 'Unable to determine the device handle for GPU0000:00:06.0: Unknown Error' >&2; exit 15"
    )
    with pytest.raises(GpuQueryError, match="exited 15: Unable to determine"):
        run_nvidia_smi(["-q"], binary=failing)
    slow = _script(tmp_path, "exec sleep 5")
    with pytest.raises(GpuQueryError, match="within 0.2 s"):
        run_nvidia_smi(["-q"], binary=slow, timeout_s=0.2)
    ok = _script(tmp_path, "echo hello")
    assert run_nvidia_smi(["-q"], binary=ok) == "hello\n"
