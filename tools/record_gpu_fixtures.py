#!/usr/bin/env python3
"""Record real NVML readings and nvidia-smi outputs for servescope's gpu tests.

Standalone (stdlib + pynvml from nvidia-ml-py), to run on a GPU machine:

    python3 tools/record_gpu_fixtures.py --out /tmp/h200-nvml --hold-gib 10

It writes one folder per set, ``idle/`` and, with ``--hold-gib N``, ``holding-NGiB/`` recorded while a
child process (torch) holds N GiB on GPU 0:

- ``nvml.json``: every NVML call that ``servescope.gpu.nvml`` makes, in order, with its arguments
  (a device handle is written ``{"device": index}``) and its raw return value (ctypes structures as
  ``{"__struct__": name, "fields": {...}}``, bytes as ``{"__bytes__": latin-1 text}``) or the NVML error
  (``{"name": "NVMLError_NotSupported", "value": 3}``), plus the pynvml constants the fake replays;
- ``nvidia-smi.txt``, ``nvidia-smi-q.xml``, ``topo-m.txt``, ``query-gpu.csv``, ``query-compute-apps.csv``:
  the raw stdout of the matching nvidia-smi command (``commands.json`` lists each command, its exit
  status and stderr).

Keep the NVML call sequence here in step with src/servescope/gpu/nvml.py: the tests' fake pynvml
fails on any call that is not in the recording.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The fields src/servescope/gpu/smi.py knows (QUERY_GPU_FIELDS there).
QUERY_GPU_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,memory.used,pcie.link.gen.current,pcie.link.gen.max,"
    "pcie.link.width.current,pcie.link.width.max,power.draw,enforced.power.limit,temperature.gpu,"
    "utilization.gpu,driver_version"
)
SMI_COMMANDS = {
    "nvidia-smi.txt": ["nvidia-smi"],
    "nvidia-smi-q.xml": ["nvidia-smi", "-q", "-x"],
    "topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "query-gpu.csv": ["nvidia-smi", f"--query-gpu={QUERY_GPU_FIELDS}", "--format=csv"],
    "query-compute-apps.csv": ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
}
# pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,), which ctypes rejects: pass the plain ints.
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_NVLINK = 2
CONSTANTS = (
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_UNKNOWN",
    "NVML_TEMPERATURE_GPU",
    "NVML_FEATURE_ENABLED",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_P2P_STATUS_OK",
    "nvmlMemory_v2",
)


class Device:
    """A device argument, written to JSON as {"device": index}."""

    def __init__(self, index: int) -> None:
        self.index = index


def encode(value: Any) -> Any:
    """A JSON form of a pynvml return value that the tests' fake turns back into the same shape."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return {"__bytes__": value.decode("latin-1")}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:  # a ctypes Structure
        return {"__struct__": type(value).__name__, "fields": {f[0]: encode(getattr(value, f[0])) for f in fields}}
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):  # a ctypes array
        return [encode(value[i]) for i in range(len(value))]
    if hasattr(value, "__dict__"):  # pynvml's nvmlFriendlyObject (process lists)
        return {"__struct__": type(value).__name__, "fields": {k: encode(v) for k, v in vars(value).items()}}
    return repr(value)


class Recorder:
    """Calls pynvml and writes down each call, its arguments and its result or error."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.calls: list[dict[str, Any]] = []
        self.handles: dict[int, Any] = {}

    def call(self, fn: str, *args: Any) -> tuple[bool, Any]:
        real = [self.handles[a.index] if isinstance(a, Device) else a for a in args]
        shown = [{"device": a.index} if isinstance(a, Device) else a for a in args]
        entry: dict[str, Any] = {"fn": fn, "args": shown}
        try:
            value = getattr(self.nvml, fn)(*real)
        except self.nvml.NVMLError as err:
            entry["error"] = {"name": type(err).__name__, "value": err.value}
            self.calls.append(entry)
            return False, None
        if fn == "nvmlDeviceGetHandleByIndex":
            self.handles[args[0]] = value
            entry["return"] = {"device": args[0]}
        else:
            entry["return"] = encode(value)
        self.calls.append(entry)
        return True, value


def record_nvml(out: Path) -> None:
    """nvml.json: the same calls, in the same order, as servescope.gpu.nvml.nvml_snapshot."""
    import pynvml

    rec = Recorder(pynvml)
    started = time.time()
    ok, _ = rec.call("nvmlInit")
    if ok:
        rec.call("nvmlSystemGetDriverVersion")
        rec.call("nvmlSystemGetCudaDriverVersion")
        ok, count = rec.call("nvmlDeviceGetCount")
        count = count if ok else 0
        pids: list[int] = []
        for index in range(count):
            rec.call("nvmlDeviceGetHandleByIndex", index)
            dev = Device(index)
            rec.call("nvmlDeviceGetName", dev)
            rec.call("nvmlDeviceGetUUID", dev)
            rec.call("nvmlDeviceGetPciInfo", dev)
            rec.call("nvmlDeviceGetMemoryInfo", dev, pynvml.nvmlMemory_v2)
            rec.call("nvmlDeviceGetCurrPcieLinkGeneration", dev)
            rec.call("nvmlDeviceGetMaxPcieLinkGeneration", dev)
            rec.call("nvmlDeviceGetCurrPcieLinkWidth", dev)
            rec.call("nvmlDeviceGetMaxPcieLinkWidth", dev)
            rec.call("nvmlDeviceGetPowerUsage", dev)
            rec.call("nvmlDeviceGetEnforcedPowerLimit", dev)
            rec.call("nvmlDeviceGetTemperature", dev, pynvml.NVML_TEMPERATURE_GPU)
            rec.call("nvmlDeviceGetUtilizationRates", dev)
            ok, procs = rec.call("nvmlDeviceGetComputeRunningProcesses", dev)
            for proc in procs or []:
                if proc.pid not in pids:
                    pids.append(proc.pid)
        for pid in pids:
            rec.call("nvmlSystemGetProcessName", pid)
        if count > 1:
            for a in range(count):
                for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                    ok, state = rec.call("nvmlDeviceGetNvLinkState", Device(a), link)
                    if not ok:
                        break
                    if state == pynvml.NVML_FEATURE_ENABLED:
                        rec.call("nvmlDeviceGetNvLinkRemotePciInfo", Device(a), link)
            for a in range(count):
                for b in range(a + 1, count):
                    rec.call("nvmlDeviceGetTopologyCommonAncestor", Device(a), Device(b))
                    rec.call("nvmlDeviceGetP2PStatus", Device(a), Device(b), P2P_CAPS_INDEX_READ)
                    rec.call("nvmlDeviceGetP2PStatus", Device(a), Device(b), P2P_CAPS_INDEX_NVLINK)
        rec.call("nvmlShutdown")
    doc = {
        "format": "servescope-nvml-recording/1",
        "recorded_at": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(),
        "host": platform.node(),
        "python": platform.python_version(),
        "pynvml_file": getattr(pynvml, "__file__", None),
        "constants": {name: getattr(pynvml, name) for name in CONSTANTS if hasattr(pynvml, name)},
        "calls": rec.calls,
    }
    (out / "nvml.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def record_smi(out: Path) -> None:
    """The raw stdout of each nvidia-smi command, plus commands.json with exit codes and stderr."""
    log = []
    for name, argv in SMI_COMMANDS.items():
        t0 = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.append({"file": name, "argv": argv, "error": repr(err)})
            continue
        (out / name).write_text(done.stdout, encoding="utf-8")
        log.append(
            {
                "file": name,
                "argv": argv,
                "returncode": done.returncode,
                "stderr": done.stderr,
                "seconds": round(time.monotonic() - t0, 3),
            }
        )
    (out / "commands.json").write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")


def record_set(out: Path, extra: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record_nvml(out)
    record_smi(out)
    (out / "set.json").write_text(json.dumps(extra, indent=1) + "\n", encoding="utf-8")
    print(f"recorded {out}", flush=True)


HOLD_CODE = """
import sys, torch
gib = int(sys.argv[1])
block = torch.ones(gib << 30, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def record_holding(out: Path, gib: int) -> None:
    """A set recorded while a child process holds `gib` GiB on GPU 0 (so memory holders are real)."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_CODE, str(gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"holding child failed (exit {child.wait()}): no 'ready' line")
        time.sleep(1.0)  # let the driver's accounting settle
        record_set(out, {"holding_gib": gib, "holder_pid": child.pid, "holder_argv0": sys.executable})
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--hold-gib", type=int, default=0, help="also record a set while holding N GiB on GPU 0")
    args = parser.parse_args(argv)
    record_set(args.out / "idle", {"holding_gib": 0})
    if args.hold_gib > 0:
        record_holding(args.out / f"holding-{args.hold_gib}GiB", args.hold_gib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
