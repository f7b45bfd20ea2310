"""nvidia-smi, the fallback: parsers over its real text outputs, and one function that runs it.

The parsers are pure functions over text (tests feed them recorded outputs); ``run_nvidia_smi`` is
the only place that starts the binary.
"""

from __future__ import annotations

import csv
import datetime
import re
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import msgspec

from servescope.core.gpu import GpuInfo, GpuProcess, GpuSnapshot, Topology
from servescope.gpu.errors import GpuQueryError, GpuUnavailable

__all__ = [
    "P2P_STATUS",
    "QUERY_GPU_FIELDS",
    "parse_compute_apps_csv",
    "parse_query_gpu_csv",
    "parse_smi_xml",
    "parse_topo_matrix",
    "parse_topo_p2p",
    "run_nvidia_smi",
    "smi_snapshot",
]

# --query-gpu field -> (GpuInfo attribute, type). Aliases nvidia-smi accepts map to the same attribute.
_GPU_FIELDS: dict[str, tuple[str, type]] = {
    "index": ("index", int),
    "name": ("name", str),
    "gpu_name": ("name", str),
    "uuid": ("uuid", str),
    "gpu_uuid": ("uuid", str),
    "pci.bus_id": ("pci_bus_id", str),
    "gpu_bus_id": ("pci_bus_id", str),
    "memory.total": ("memory_total_mib", int),
    "memory.used": ("memory_used_mib", int),
    "pcie.link.gen.current": ("pcie_gen_current", int),
    "pcie.link.gen.max": ("pcie_gen_max", int),
    "pcie.link.width.current": ("pcie_width_current", int),
    "pcie.link.width.max": ("pcie_width_max", int),
    "power.draw": ("power_draw_w", float),
    "enforced.power.limit": ("power_limit_w", float),
    "temperature.gpu": ("temperature_c", int),
    "utilization.gpu": ("utilization_gpu_pct", int),
    "driver_version": ("driver_version", str),
}

#: The ``--query-gpu`` fields ``smi_snapshot`` would ask for; one per GpuInfo attribute it can fill.
QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "power.draw",
    "enforced.power.limit",
    "temperature.gpu",
    "utilization.gpu",
    "driver_version",
)

# What nvidia-smi prints for "not available": None in our records, never 0.
# "[Not Found]": the process name of a pid from another container.
_NOT_AVAILABLE = frozenset(
    {"", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Not Available", "Not Found", "[Not Found]"}
)
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:[A-Za-z%]+(?:/s)?)?$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NO_DRIVER = ("couldn't communicate with the NVIDIA driver", "No devices were found", "driver/library version mismatch")


def run_nvidia_smi(args: Sequence[str], *, timeout_s: float = 15.0, binary: str = "nvidia-smi") -> str:
    """The stdout of ``nvidia-smi ARGS``.

    Raises:
        GpuUnavailable: nvidia-smi is not on PATH, or it says it cannot reach a driver or a GPU.
        GpuQueryError: it timed out or exited non-zero for another reason.
    """
    argv = [binary, *args]
    shown = " ".join(argv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as err:
        raise GpuUnavailable(f"{binary} not found on PATH (no NVIDIA driver here?)") from err
    except subprocess.TimeoutExpired as err:
        raise GpuQueryError(f"`{shown}` gave no answer within {timeout_s:g} s") from err
    except OSError as err:
        raise GpuUnavailable(f"cannot run {binary}: {err}") from err
    if done.returncode != 0:
        said = next((ln.strip() for ln in (done.stdout + "\n" + done.stderr).splitlines() if ln.strip()), "")
        if any(marker in said for marker in _NO_DRIVER):
            raise GpuUnavailable(f"`{shown}`: {said}")
        raise GpuQueryError(f"`{shown}` exited {done.returncode}: {said or 'no output'}")
    return done.stdout


def _value(raw: str, kind: type, what: str) -> Any:
    """One nvidia-smi value as `kind`, None when not available; "[Unknown Error]" and the like raise."""
    text = raw.strip()
    if text in _NOT_AVAILABLE:
        return None
    if text.startswith("[") and text.endswith("]"):
        raise GpuQueryError(f"nvidia-smi reported {text} for {what}")
    if kind is str:
        return text
    match = _NUMBER.match(text)
    if match is None:
        raise GpuQueryError(f"nvidia-smi value {text!r} for {what} is not a number")
    number = float(match.group(1))
    return int(number) if kind is int else number


def _csv_rows(text: str, fields: Sequence[str] | None) -> tuple[list[str], list[list[str]]]:
    """(field names without units, data rows) of a ``--format=csv`` output, with or without a header."""
    rows = [row for row in csv.reader(text.splitlines(), skipinitialspace=True) if any(c.strip() for c in row)]
    if fields is None:
        if not rows:
            raise GpuQueryError("nvidia-smi CSV output is empty: no header line")
        names = [cell.split(" [", 1)[0].strip() for cell in rows[0]]
        rows = rows[1:]
    else:
        names = list(fields)
    return names, rows


def parse_query_gpu_csv(text: str, *, fields: Sequence[str] | None = None) -> tuple[GpuInfo, ...]:
    """GPUs from ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Args:
        fields: the ``--query-gpu`` list, needed with ``noheader``; None reads the header line.
            Fields we do not know are ignored; ``index`` must be among them.

    Raises:
        GpuQueryError: a row with the wrong number of cells, no ``index`` field, or a value that is
            neither a number nor "not available".
    """
    names, rows = _csv_rows(text, fields)
    if "index" not in names:
        raise GpuQueryError(f"nvidia-smi --query-gpu output has no index field (fields: {', '.join(names)})")
    gpus = []
    for row in rows:
        if len(row) != len(names):
            raise GpuQueryError(f"nvidia-smi --query-gpu row has {len(row)} cells for {len(names)} fields: {row}")
        values: dict[str, Any] = {}
        for name, cell in zip(names, row, strict=True):
            if name in _GPU_FIELDS:
                attr, kind = _GPU_FIELDS[name]
                values[attr] = _value(cell, kind, name)
        if values.get("index") is None:
            raise GpuQueryError(f"nvidia-smi --query-gpu row without an index: {row}")
        gpus.append(GpuInfo(**values))
    return tuple(gpus)


def _gpu_index_for(bus_id: str | None, uuid: str | None, gpus: Sequence[GpuInfo]) -> int | None:
    for gpu in gpus:
        if bus_id is not None and gpu.pci_bus_id is not None and gpu.pci_bus_id.upper() == bus_id.upper():
            return gpu.index
        if uuid is not None and gpu.uuid == uuid:
            return gpu.index
    if bus_id is None and uuid is None and len(gpus) == 1:
        return gpus[0].index  # one GPU: the only place the memory can be
    return None


def parse_compute_apps_csv(
    text: str, *, gpus: Sequence[GpuInfo] = (), fields: Sequence[str] | None = None
) -> tuple[GpuProcess, ...]:
    """Processes from ``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv``.

    Args:
        gpus: the GPUs of the same host, to place each process: by its ``gpu_bus_id`` or ``gpu_uuid``
            field when the query had one, else on the only GPU when there is one (else gpu_index None).
        fields: the query's field list, needed with ``noheader``; None reads the header line.
    """
    names, rows = _csv_rows(text, fields)
    # The header says "used_gpu_memory [MiB]" for the query field "used_memory".
    names = ["used_memory" if n == "used_gpu_memory" else n for n in names]
    if "pid" not in names:
        raise GpuQueryError(f"nvidia-smi --query-compute-apps output has no pid field (fields: {', '.join(names)})")
    procs = []
    for row in rows:
        if len(row) != len(names):  # e.g. "No running processes found"
            continue
        cells = dict(zip(names, row, strict=True))
        pid = _value(cells["pid"], int, "pid")
        if pid is None:
            continue
        bus = _value(cells["gpu_bus_id"], str, "gpu_bus_id") if "gpu_bus_id" in cells else None
        uuid = _value(cells["gpu_uuid"], str, "gpu_uuid") if "gpu_uuid" in cells else None
        procs.append(
            GpuProcess(
                gpu_index=_gpu_index_for(bus, uuid, gpus),
                pid=pid,
                process_name=_value(cells.get("process_name", ""), str, "process_name"),
                used_memory_mib=_value(cells.get("used_memory", ""), int, "used_memory"),
            )
        )
    return tuple(procs)


def _text(node: ET.Element | None, path: str) -> str:
    found = node.find(path) if node is not None else None
    return (found.text or "").strip() if found is not None else ""


def _first(node: ET.Element, paths: Sequence[str], kind: type, what: str) -> Any:
    """The first of `paths` that holds a value (older drivers name power fields differently)."""
    for path in paths:
        value = _value(_text(node, path), kind, what)
        if value is not None:
            return value
    return None


def parse_smi_xml(text: str) -> tuple[tuple[GpuInfo, ...], tuple[GpuProcess, ...]]:
    """(GPUs, processes) from ``nvidia-smi -q -x``; GPUs are numbered in the order the XML lists them.

    Raises:
        GpuQueryError: the text is not nvidia-smi's XML.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise GpuQueryError(f"nvidia-smi -q -x output is not XML: {err}") from err
    if root.tag != "nvidia_smi_log":
        raise GpuQueryError(f"nvidia-smi -q -x output has root <{root.tag}>, not <nvidia_smi_log>")
    driver = _value(_text(root, "driver_version"), str, "driver_version")
    cuda = _value(_text(root, "cuda_version"), str, "cuda_version")
    gpus: list[GpuInfo] = []
    procs: list[GpuProcess] = []
    link = "pci/pci_gpu_link_info/"
    for index, node in enumerate(root.findall("gpu")):
        gpus.append(
            GpuInfo(
                index=index,
                name=_value(_text(node, "product_name"), str, "name"),
                uuid=_value(_text(node, "uuid"), str, "uuid"),
                pci_bus_id=_value(_text(node, "pci/pci_bus_id") or node.get("id", ""), str, "pci.bus_id"),
                memory_total_mib=_value(_text(node, "fb_memory_usage/total"), int, "memory.total"),
                memory_used_mib=_value(_text(node, "fb_memory_usage/used"), int, "memory.used"),
                pcie_gen_current=_value(_text(node, link + "pcie_gen/current_link_gen"), int, "pcie.link.gen.current"),
                pcie_gen_max=_value(_text(node, link + "pcie_gen/max_link_gen"), int, "pcie.link.gen.max"),
                pcie_width_current=_value(
                    _text(node, link + "link_widths/current_link_width"), int, "pcie.link.width.current"
                ),
                pcie_width_max=_value(_text(node, link + "link_widths/max_link_width"), int, "pcie.link.width.max"),
                # Drivers >= 535 write gpu_power_readings (average_power_draw is power.draw on Ampere+);
                # older ones power_readings/power_draw.
                power_draw_w=_first(
                    node,
                    (
                        "gpu_power_readings/average_power_draw",
                        "power_readings/power_draw",
                        "gpu_power_readings/power_draw",
                    ),
                    float,
                    "power.draw",
                ),
                power_limit_w=_first(
                    node,
                    (
                        "gpu_power_readings/current_power_limit",
                        "power_readings/enforced_power_limit",
                        "gpu_power_readings/enforced_power_limit",
                    ),
                    float,
                    "enforced.power.limit",
                ),
                temperature_c=_value(_text(node, "temperature/gpu_temp"), int, "temperature.gpu"),
                utilization_gpu_pct=_value(_text(node, "utilization/gpu_util"), int, "utilization.gpu"),
                driver_version=driver,
                cuda_version=cuda,
            )
        )
        for proc in node.findall("processes/process_info"):
            pid = _value(_text(proc, "pid"), int, "pid")
            if pid is None:
                continue
            procs.append(
                GpuProcess(
                    gpu_index=index,
                    pid=pid,
                    process_name=_value(_text(proc, "process_name"), str, "process_name"),
                    used_memory_mib=_value(_text(proc, "used_memory"), int, "used_memory"),
                )
            )
    return tuple(gpus), tuple(procs)


_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_GPU_LABEL = re.compile(r"^GPU\d+$")


def _cells(line: str) -> list[str]:
    """The non-empty cells of one matrix line: nvidia-smi separates them with tabs; a copy pasted from a
    terminal has the tabs turned into runs of spaces, so without a tab, two or more spaces split."""
    clean = _ANSI.sub("", line)
    parts = clean.split("\t") if "\t" in clean else re.split(r"\s{2,}", clean)
    # nvidia-smi writes an empty cell before "GPU NUMA ID" (and before an N/A NUMA Affinity): drop empties.
    return [c.strip() for c in parts if c.strip()]


def _matrix_lines(text: str, what: str) -> tuple[list[str], list[list[str]]]:
    """(column labels, rows of cells) of the first matrix in `text`, up to its blank line or legend."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if _ANSI.sub("", ln)[:1].isspace() and "GPU0" in ln), None)
    if start is None:
        raise GpuQueryError(f"{what} output has no header line with GPU0")
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        rows.append(_cells(line))
    return _cells(lines[start]), rows


def parse_topo_matrix(text: str) -> Topology:
    """The link matrix of ``nvidia-smi topo -m``, its affinity columns and its NIC legend.

    Reads nvidia-smi's tab-separated text, and the same text pasted with spaces instead of tabs.

    Raises:
        GpuQueryError: no matrix header, or a row that does not fit it.
    """
    columns, lines = _matrix_lines(text, "nvidia-smi topo -m")
    split = next((i for i, c in enumerate(columns) if c in _AFFINITY_COLUMNS), len(columns))
    devices, extras = columns[:split], columns[split:]
    rows = {cells[0]: cells[1:] for cells in lines if cells}
    links: list[tuple[str, ...]] = []
    affinity: dict[str, list[str | None]] = {name: [] for name in _AFFINITY_COLUMNS}
    for label in devices:
        row = rows.get(label)
        if row is None or len(row) < len(devices):
            raise GpuQueryError(f"nvidia-smi topo -m: row {label} missing or shorter than its {len(devices)} columns")
        links.append(tuple(row[: len(devices)]))
        if label.startswith("GPU"):
            rest = row[len(devices) :]
            for i, name in enumerate(extras):
                if name in affinity:
                    affinity[name].append(_value(rest[i], str, name) if i < len(rest) else None)
    nics: list[tuple[str, str]] = []
    for line in text.splitlines():
        match = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if match:
            nics.append((match.group(1), match.group(2)))
    return Topology(
        devices=tuple(devices),
        links=tuple(links),
        cpu_affinity=tuple(affinity["CPU Affinity"]),
        numa_affinity=tuple(affinity["NUMA Affinity"]),
        gpu_numa_id=tuple(affinity["GPU NUMA ID"]),
        nic_names=tuple(nics),
    )


#: The status codes of ``nvidia-smi topo -p2p`` (its legend): OK, or why peer access is not possible.
P2P_STATUS = {
    "X": "self",
    "OK": "status OK",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}


def parse_topo_p2p(text: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(GPU labels, square status matrix) from ``nvidia-smi topo -p2p r`` (or ``w``, ``rw``, ``n``, ...).

    Each cell is a code of P2P_STATUS ("X" on the diagonal).

    Raises:
        GpuQueryError: no header, a row missing or of the wrong length, or a code not in the legend.
    """
    what = "nvidia-smi topo -p2p"
    labels, lines = _matrix_lines(text, what)
    if not labels or not all(_GPU_LABEL.match(c) for c in labels):
        raise GpuQueryError(f"{what}: header is not a list of GPUs: {labels}")
    rows = {cells[0]: cells[1:] for cells in lines if cells}
    matrix = []
    for label in labels:
        row = rows.get(label)
        if row is None or len(row) != len(labels):
            raise GpuQueryError(f"{what}: row {label} missing or not {len(labels)} cells long")
        unknown = [c for c in row if c not in P2P_STATUS]
        if unknown:
            raise GpuQueryError(f"{what}: row {label} has codes not in the legend: {', '.join(unknown)}")
        matrix.append(tuple(row))
    return tuple(labels), tuple(matrix)


def _with_p2p(topology: Topology, timeout_s: float) -> Topology:
    """`topology` with ``p2p_read`` from ``nvidia-smi topo -p2p r``; unchanged when that fails or disagrees."""
    try:
        labels, matrix = parse_topo_p2p(run_nvidia_smi(["topo", "-p2p", "r"], timeout_s=timeout_s))
    except GpuQueryError:
        return topology  # older drivers lack -p2p; P2P stays unknown (None), never guessed
    gpus = tuple(d for d in topology.devices if d.startswith("GPU"))
    if labels != gpus:
        return topology
    return msgspec.structs.replace(topology, p2p_read=matrix)


def smi_snapshot(*, timeout_s: float = 15.0) -> GpuSnapshot:
    """A GpuSnapshot from ``nvidia-smi -q -x``, ``nvidia-smi topo -m`` (topology None if that fails) and,
    with several GPUs, ``nvidia-smi topo -p2p r`` (P2P read status; None if that fails).

    Raises:
        GpuUnavailable: no nvidia-smi, or it cannot reach the driver.
        GpuQueryError: nvidia-smi failed otherwise or printed what we cannot read.
    """
    taken_at = datetime.datetime.now(datetime.UTC).isoformat()
    gpus, procs = parse_smi_xml(run_nvidia_smi(["-q", "-x"], timeout_s=timeout_s))
    try:
        topology: Topology | None = parse_topo_matrix(run_nvidia_smi(["topo", "-m"], timeout_s=timeout_s))
    except GpuQueryError:
        topology = None  # some virtualised GPUs have no topology; inventory still stands
    if topology is not None and topology.gpu_count > 1:
        topology = _with_p2p(topology, timeout_s)
    return GpuSnapshot(gpus=gpus, processes=procs, topology=topology, source="nvidia-smi", taken_at=taken_at)
