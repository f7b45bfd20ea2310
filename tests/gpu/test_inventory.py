"""take_snapshot's fallback, memory holders, and wait_until_gpu_memory_free over real recorded outputs."""

from __future__ import annotations

import sys

import pytest
from fake_pynvml import load_recording, make_fake_pynvml
from gpu_inputs import RECORDING, holding_snapshot, plain_numbers, shared_file

from servescope.core.gpu import GpuSnapshot
from servescope.gpu import inventory
from servescope.gpu.errors import GpuUnavailable
from servescope.gpu.inventory import WaitResult, gpu_memory_holders, take_snapshot, wait_until_gpu_memory_free
from servescope.gpu.smi import parse_query_gpu_csv


def free_snapshot() -> GpuSnapshot:
    """The real idle outputs: the query-gpu CSV after topo -m."""
    gpus = parse_query_gpu_csv(shared_file("topo_query.txt").split("---\n", 1)[1])
    return GpuSnapshot(gpus, (), None, "nvidia-smi", "2026-12-02T15:00:01+00:00")


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.needs_shared
def test_holders_from_real_outputs() -> None:
    used, pid, name, mib = plain_numbers()
    (use,) = gpu_memory_holders(holding_snapshot())
    assert (use.gpu_index, use.used_mib) == (0, used)
    assert [(p.pid, p.process_name, p.used_memory_mib) for p in use.processes] == [(pid, name, mib)]
    assert gpu_memory_holders(free_snapshot())[0].processes == ()


@pytest.mark.needs_shared
def test_wait_returns_ready_at_the_first_free_poll() -> None:
    snaps = iter([holding_snapshot(), holding_snapshot(), free_snapshot()])
    clock = FakeTime()
    seen: list[WaitResult] = []
    result = wait_until_gpu_memory_free(
        1024, 60, 5, query=lambda: next(snaps), clock=clock.clock, sleep=clock.sleep, progress=seen.append
    )
    assert result.ready and result.polls == 3 and result.busy == ()
    assert result.waited_s == 10.0 and clock.sleeps == [5, 5]
    assert [r.ready for r in seen] == [False, False, True]  # told after every poll
    assert "free" in result.describe()


@pytest.mark.needs_shared
def test_wait_times_out_naming_gpu_memory_and_holder() -> None:
    used, pid, name, mib = plain_numbers()
    clock = FakeTime()
    result = wait_until_gpu_memory_free(1024, 12, 5, query=holding_snapshot, clock=clock.clock, sleep=clock.sleep)
    assert not result.ready
    assert result.polls == 4 and clock.sleeps == [5, 5, 2] and result.waited_s == 12.0
    (busy,) = result.busy
    assert (busy.gpu_index, busy.used_mib) == (0, used)
    assert [(p.pid, p.process_name, p.used_memory_mib) for p in busy.processes] == [(pid, name, mib)]
    line = result.describe()
    assert f"GPU0 {used} MiB used" in line and f"pid {pid} {name} {mib} MiB" in line


@pytest.mark.needs_shared
def test_wait_threshold_is_strict() -> None:
    used = plain_numbers()[0]
    clock = FakeTime()
    at = wait_until_gpu_memory_free(used, 0, 1, query=holding_snapshot, clock=clock.clock, sleep=clock.sleep)
    above = wait_until_gpu_memory_free(used + 1, 0, 1, query=holding_snapshot, clock=clock.clock, sleep=clock.sleep)
    assert not at.ready and at.polls == 1 and above.ready


def test_wait_over_real_nvml_recordings(monkeypatch: pytest.MonkeyPatch) -> None:
    """holding-10GiB then idle, through nvml_snapshot and the fake pynvml replaying the H200 recording."""
    from servescope.gpu import nvml

    monkeypatch.setattr(nvml, "_nvml", None)
    fakes = iter([make_fake_pynvml(load_recording(RECORDING / s / "nvml.json")) for s in ("holding-10GiB", "idle")])

    def query() -> GpuSnapshot:
        monkeypatch.setitem(sys.modules, "pynvml", next(fakes))
        monkeypatch.setattr(nvml, "_nvml", None)
        return take_snapshot()

    clock = FakeTime()
    seen: list[WaitResult] = []
    result = wait_until_gpu_memory_free(
        1024, 30, 2, query=query, clock=clock.clock, sleep=clock.sleep, progress=seen.append
    )
    assert result.ready and result.polls == 2 and result.last.source == "nvml"
    (busy,) = seen[0].busy
    assert busy.used_mib is not None and busy.used_mib > 10 * 1024 and busy.processes


@pytest.mark.needs_shared
def test_wait_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="poll_s"):
        wait_until_gpu_memory_free(1, 1, 0, query=free_snapshot)
    with pytest.raises(ValueError, match="timeout_s"):
        wait_until_gpu_memory_free(1, -1, 1, query=free_snapshot)
    with pytest.raises(ValueError, match="allowed: \\[0\\]"):
        wait_until_gpu_memory_free(1, 1, 1, gpu_indices=[3], query=free_snapshot)
    with pytest.raises(GpuUnavailable, match="no GPU"):
        wait_until_gpu_memory_free(1, 1, 1, query=lambda: GpuSnapshot((), (), None, "nvml", "t"))


@pytest.mark.needs_shared
def test_take_snapshot_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_nvml() -> GpuSnapshot:
        raise GpuUnavailable("NVML: NVML Shared Library Not Found")

    monkeypatch.setattr(inventory, "nvml_snapshot", no_nvml)
    monkeypatch.setattr(inventory, "smi_snapshot", free_snapshot)
    assert take_snapshot().source == "nvidia-smi"

    def no_smi() -> GpuSnapshot:
        raise GpuUnavailable("nvidia-smi not found on PATH")

    monkeypatch.setattr(inventory, "smi_snapshot", no_smi)
    with pytest.raises(GpuUnavailable, match="Library Not Found.*nvidia-smi not found"):
        take_snapshot()
    with pytest.raises(ValueError, match="nvml, nvidia-smi"):
        take_snapshot(prefer="smi")
