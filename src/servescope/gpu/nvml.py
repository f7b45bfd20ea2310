"""NVML through nvidia-ml-py (``import pynvml``): the one place servescope calls it.

NVML is initialised lazily, once per process. "Not supported" becomes None, a missing library or
driver becomes GpuUnavailable, any other NVML error GpuQueryError. Each reader names its
``nvidia-smi --query-gpu`` twin so a figure can be checked by hand.

Keep the call sequence in step with tools/record_gpu_fixtures.py: the tests replay its recording.
"""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from servescope.core.gpu import GpuInfo, GpuProcess, GpuSnapshot, Topology
from servescope.gpu.errors import GpuQueryError, GpuUnavailable

__all__ = ["nvml_snapshot"]

T = TypeVar("T")

_MIB = 1 << 20
# pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,), which ctypes rejects: use the plain ints.
_P2P_CAPS_INDEX_READ = 0
_P2P_CAPS_INDEX_NVLINK = 2
# nvmlGpuTopologyLevel_t -> the ``nvidia-smi topo -m`` legend.
_TOPOLOGY_KIND = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlGpuP2PStatus_t -> the ``nvidia-smi topo -p2p r`` legend.
_P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}

_nvml: Any = None  # the initialised pynvml module, once nvmlInit has succeeded


def _library() -> Any:
    """The pynvml module, imported and nvmlInit-ed on first use."""
    global _nvml
    if _nvml is not None:
        return _nvml
    try:
        module: Any = importlib.import_module("pynvml")
    except ImportError as err:
        raise GpuUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from err
    try:
        module.nvmlInit()
    except module.NVMLError as err:
        unavailable = (module.NVML_ERROR_LIBRARY_NOT_FOUND, module.NVML_ERROR_DRIVER_NOT_LOADED)
        if getattr(err, "value", None) in unavailable:
            raise GpuUnavailable(f"NVML: {err}") from err
        raise GpuQueryError(f"NVML nvmlInit: {err}") from err
    _nvml = module
    return module


def _call(nvml: Any, fn: Callable[..., T], *args: Any) -> T | None:
    """fn(*args); None when NVML says "not supported" (NVMLError_NotSupported, NVML_ERROR_NOT_SUPPORTED)."""
    try:
        return fn(*args)
    except nvml.NVMLError as err:
        if getattr(err, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise GpuQueryError(f"NVML {getattr(fn, '__name__', fn)}: {err}") from err


def _text(value: Any) -> str | None:
    """NVML strings: older pynvml gives bytes, newer str."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    return str(value)


def _mib(value: Any) -> int | None:
    """Bytes to MiB, rounded half up as nvidia-smi does (11386290176 B shows as 10859 MiB)."""
    return None if value is None else (int(value) + _MIB // 2) // _MIB


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else int(milliwatts) / 1000.0


def _cuda_version(value: int | None) -> str | None:
    """13000 -> "13.0", as the ``nvidia-smi`` banner shows "CUDA Version: 13.0"."""
    return None if value is None else f"{value // 1000}.{value % 1000 // 10}"


def _gpu(nvml: Any, index: int, handle: Any, driver: str | None, cuda: str | None) -> GpuInfo:
    pci = _call(nvml, nvml.nvmlDeviceGetPciInfo, handle)  # pci.bus_id
    # v2 memory info: "used" leaves out driver-reserved memory, as nvidia-smi's memory.used does.
    memory = _call(nvml, nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2)
    utilization = _call(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)  # utilization.gpu
    return GpuInfo(
        index=index,
        name=_text(_call(nvml, nvml.nvmlDeviceGetName, handle)),  # name
        uuid=_text(_call(nvml, nvml.nvmlDeviceGetUUID, handle)),  # uuid
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        memory_total_mib=_mib(memory.total) if memory is not None else None,  # memory.total
        memory_used_mib=_mib(memory.used) if memory is not None else None,  # memory.used
        pcie_gen_current=_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),  # pcie.link.gen.current
        pcie_gen_max=_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),  # pcie.link.gen.max
        pcie_width_current=_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),  # pcie.link.width.current
        pcie_width_max=_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),  # pcie.link.width.max
        power_draw_w=_watts(_call(nvml, nvml.nvmlDeviceGetPowerUsage, handle)),  # power.draw
        power_limit_w=_watts(_call(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)),  # enforced.power.limit
        temperature_c=_call(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),  # temperature.gpu
        utilization_gpu_pct=utilization.gpu if utilization is not None else None,
        driver_version=driver,
        cuda_version=cuda,
    )


def _process_name(nvml: Any, pid: int) -> str | None:
    """``--query-compute-apps=process_name``; None when the process is gone or not ours to see."""
    try:
        return _text(nvml.nvmlSystemGetProcessName(pid))
    except nvml.NVMLError:
        return None  # NotFound (it exited), NoPermission (another container): the memory still counts


def _processes(nvml: Any, index: int, handle: Any) -> list[GpuProcess]:
    """``--query-compute-apps=pid,used_memory`` for one GPU (names are filled in later, once per pid)."""
    found = _call(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    # pynvml turns NVML_VALUE_NOT_AVAILABLE into usedGpuMemory None.
    return [
        GpuProcess(gpu_index=index, pid=int(p.pid), process_name=None, used_memory_mib=_mib(p.usedGpuMemory))
        for p in found
    ]


def _nvlinks(nvml: Any, handles: list[Any], bus_ids: list[str | None]) -> list[list[int]]:
    """links[a][b]: how many active NVLinks of GPU a end at GPU b; NVSwitch links count under -1."""
    count = len(handles)
    links = [[0] * (count + 1) for _ in range(count)]
    for a, handle in enumerate(handles):
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:
                break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            pci = _call(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            remote = _text(pci.busId) if pci is not None else None
            peer = next((b for b, bus in enumerate(bus_ids) if bus and remote and bus.upper() == remote.upper()), -1)
            links[a][peer] += 1
    return links


def _topology(nvml: Any, handles: list[Any], gpus: list[GpuInfo]) -> Topology:
    """``nvidia-smi topo -m`` (GPU part) and ``nvidia-smi topo -p2p r`` from NVML."""
    count = len(handles)
    nvlinks = _nvlinks(nvml, handles, [g.pci_bus_id for g in gpus])
    kinds = [["X"] * count for _ in range(count)]
    paths = [["X"] * count for _ in range(count)]
    p2p = [["X"] * count for _ in range(count)]
    for a in range(count):
        for b in range(a + 1, count):
            level = _call(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            read = _call(nvml, nvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], _P2P_CAPS_INDEX_READ)
            over_nvlink = _call(nvml, nvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], _P2P_CAPS_INDEX_NVLINK)
            direct = nvlinks[a][b]
            if direct == 0 and over_nvlink == nvml.NVML_P2P_STATUS_OK:
                direct = nvlinks[a][-1]  # through NVSwitch: nvidia-smi shows all of a GPU's switch links (NV18)
            path = _TOPOLOGY_KIND.get(level, "SYS") if level is not None else "SYS"
            paths[a][b] = paths[b][a] = path
            kinds[a][b] = kinds[b][a] = f"NV{direct}" if direct else path
            p2p[a][b] = p2p[b][a] = _P2P_STATUS.get(read, "U") if read is not None else "NS"
    return Topology(
        devices=tuple(f"GPU{i}" for i in range(count)),
        links=tuple(tuple(row) for row in kinds),
        p2p_read=tuple(tuple(row) for row in p2p),
        pcie_paths=tuple(tuple(row) for row in paths),
    )


def nvml_snapshot() -> GpuSnapshot:
    """A GpuSnapshot from NVML: every GPU, its compute processes, and (with > 1 GPU) the topology.

    Raises:
        GpuUnavailable: nvidia-ml-py, the NVML library or the driver is missing.
        GpuQueryError: another NVML failure.
    """
    nvml = _library()
    taken_at = datetime.datetime.now(datetime.UTC).isoformat()
    driver = _text(_call(nvml, nvml.nvmlSystemGetDriverVersion))  # driver_version
    cuda = _cuda_version(_call(nvml, nvml.nvmlSystemGetCudaDriverVersion))
    count = _call(nvml, nvml.nvmlDeviceGetCount) or 0
    gpus: list[GpuInfo] = []
    handles: list[Any] = []
    procs: list[GpuProcess] = []
    for index in range(count):
        handle = _call(nvml, nvml.nvmlDeviceGetHandleByIndex, index)
        handles.append(handle)
        gpus.append(_gpu(nvml, index, handle, driver, cuda))
        procs.extend(_processes(nvml, index, handle))
    names: dict[int, str | None] = {}
    for proc in procs:
        if proc.pid not in names:
            names[proc.pid] = _process_name(nvml, proc.pid)
    procs = [
        GpuProcess(gpu_index=p.gpu_index, pid=p.pid, process_name=names[p.pid], used_memory_mib=p.used_memory_mib)
        for p in procs
    ]
    topology = _topology(nvml, handles, gpus) if count > 1 else None
    return GpuSnapshot(gpus=tuple(gpus), processes=tuple(procs), topology=topology, source="nvml", taken_at=taken_at)
