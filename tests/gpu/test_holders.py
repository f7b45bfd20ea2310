"""gpu holders: the H200 recordings (NVML through the fake pynvml, and nvidia-smi's outputs) for who holds
memory, and real processes started here for what /proc says about them."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_pynvml import load_recording, make_fake_pynvml
from gpu_inputs import RECORDING, holding_snapshot, plain_numbers, recorded_file, shared_file

from servescope.core.gpu import GpuInfo, GpuProcess, GpuSnapshot
from servescope.gpu import inventory, nvml
from servescope.gpu.errors import GpuUnavailable
from servescope.gpu.holders import find_gpu_holders, proc_owner, read_gpu_holders

SECRET = "s3cr3t-value-1234"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real python3 process whose command line carries secrets, as a vLLM server's does."""
    # The interpreter itself (PATH may hold a shell shim), started under the name the recording shows.
    proc = subprocess.Popen(
        ["python3", "-c", "import time; print(flush=True); time.sleep(60)",
         "--api-key", SECRET, f"--hf-token={SECRET}"],
        executable=os.path.realpath(sys.executable),
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # it runs: past exec, so /proc shows its own command line
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_nvml_recording_while_holding(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    meta = json.loads(recorded_file("holding-10GiB", "set.json"))
    table = recorded_file("holding-10GiB", "nvidia-smi.txt")
    used = re.search(r"(\d+)MiB /\s+\d+MiB", table)
    proc_mib = re.search(rf"\s{meta['holder_pid']}\s+C\s+\S+\s+(\d+)MiB", table)
    assert used and proc_mib
    fake = make_fake_pynvml(load_recording(RECORDING / "holding-10GiB" / "nvml.json"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_nvml", None)
    # An empty /proc: the recorded pid is not a process of this machine.
    report = read_gpu_holders(proc=tmp_path)
    (gpu,) = report.gpus
    assert report.source == "nvml" and gpu.gpu_index == 0
    assert gpu.used_mib == int(used.group(1))
    (holder,) = gpu.holders
    assert (holder.pid, holder.name) == (meta["holder_pid"], meta["holder_argv0"])
    assert holder.used_mib == int(proc_mib.group(1)) == gpu.held_mib
    assert holder.user is None and holder.cmdline is None  # not local: never another process's details


@pytest.mark.needs_shared
def test_nvidia_smi_outputs_while_holding(tmp_path: Path) -> None:
    used, pid, name, mib = plain_numbers()
    (gpu,) = find_gpu_holders(holding_snapshot(), proc=tmp_path).gpus
    assert (gpu.used_mib, gpu.held_mib) == (used, mib)
    assert [(h.pid, h.name, h.used_mib) for h in gpu.holders] == [(pid, name, mib)]


def test_idle_gpu_holds_nothing(tmp_path: Path) -> None:
    gpus = GpuSnapshot(
        (GpuInfo(index=0, memory_used_mib=0, memory_total_mib=143771),), (), None, "nvidia-smi", "t"
    )
    (gpu,) = find_gpu_holders(gpus, proc=tmp_path).gpus
    assert gpu.holders == () and gpu.held_mib == 0


@pytest.mark.needs_shared
def test_local_process_user_and_redacted_cmdline(sleeper: subprocess.Popen[bytes]) -> None:
    _, _, _, mib = plain_numbers()
    snap = holding_snapshot()
    # The recorded holder was a python3 process; put this host's python3 at its place.
    (recorded,) = snap.processes
    snap = GpuSnapshot(
        snap.gpus, (GpuProcess(recorded.gpu_index, sleeper.pid, recorded.process_name, mib),), None, snap.source, "t"
    )
    (gpu,) = find_gpu_holders(snap).gpus
    (holder,) = gpu.holders
    assert holder.user == pwd.getpwuid(os.getuid()).pw_name
    assert holder.cmdline is not None and SECRET not in holder.cmdline
    assert holder.cmdline.startswith("python3 -c 'import time; print(flush=True); time.sleep(60)' --api-key ***")
    assert "--hf-token=***" in holder.cmdline


def test_pid_of_another_program_is_not_attributed(sleeper: subprocess.Popen[bytes]) -> None:
    # Same pid, but the GPU source names another program: a pid of another namespace (container).
    assert proc_owner(sleeper.pid, "/usr/bin/vllm") == (None, None)
    assert proc_owner(sleeper.pid, "/opt/torch/.venv/bin/python3")[0] is not None  # basename matches
    sleeper.kill()
    sleeper.wait()
    assert proc_owner(sleeper.pid, "python3") == (None, None)  # gone


@pytest.mark.needs_shared
def test_unplaced_and_unreported_memory(tmp_path: Path) -> None:
    text = shared_file("nvidia-smi-holding-10GiB.txt")
    mib = int(re.search(r"python3, (\d+) MiB", text).group(1))  # type: ignore[union-attr]
    two = (GpuInfo(index=0, memory_used_mib=0), GpuInfo(index=1, memory_used_mib=mib + 9))
    procs = (GpuProcess(None, 414, "python3", mib), GpuProcess(1, 415, "python3", None))
    report = find_gpu_holders(GpuSnapshot(two, procs, None, "nvidia-smi", "t"), proc=tmp_path)
    assert [h.pid for h in report.unplaced] == [414]
    assert report.gpus[0].holders == () and report.gpus[0].held_mib == 0
    assert report.gpus[1].held_mib is None  # held, but by how much the driver did not say: not 0


def test_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "nvml_snapshot", lambda: GpuSnapshot((), (), None, "nvml", "t"))
    with pytest.raises(GpuUnavailable, match="no GPU found"):
        read_gpu_holders()
