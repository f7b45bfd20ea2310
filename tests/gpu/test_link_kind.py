"""gpu.topology.link_kind: what `service lint --topology` checks the NCCL rules against, from a word, a recorded
``nvidia-smi topo -m`` file, or this machine (here a snapshot made from one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_inputs import TOPO, snapshot_of, topo_text

from servescope.core.errors import InputError
from servescope.gpu import topology
from servescope.gpu.errors import GpuUnavailable
from servescope.gpu.topology import link_kind


def test_a_word_is_itself() -> None:
    assert (link_kind("nvlink"), link_kind("pcie")) == ("nvlink", "pcie")


@pytest.mark.parametrize(("folder", "kind"), [("4xh100-nv6-nics-pix", "nvlink"), ("8xh100-nv18-spaces", "nvlink"),
                                              ("2x3090-sys-numa-na", "pcie"), ("8x4090-all-sys-nics", "pcie")])
def test_a_recorded_topo_file(folder: str, kind: str) -> None:
    assert link_kind(str(TOPO / folder / "topo-m.txt")) == kind


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    missing = tmp_path / "none.txt"
    with pytest.raises(InputError) as caught:
        link_kind(str(missing))
    assert caught.value.source == str(missing) and "cannot read" in str(caught.value)


def test_a_file_that_is_not_a_topo_matrix_is_one_line(tmp_path: Path) -> None:
    """Any text without the matrix (here a settings-like file) is refused naming the file, not a traceback."""
    other = tmp_path / "notes.txt"
    other.write_text("hello\nworld\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        link_kind(str(other))
    assert caught.value.source == str(other) and "not `nvidia-smi topo -m` output" in str(caught.value)


def test_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "take_snapshot", lambda: snapshot_of(topo_text("4xh100-nv6-nics-pix")))
    assert link_kind(None) == "nvlink"

    def no_gpu() -> None:
        raise GpuUnavailable("no GPU query works here")

    monkeypatch.setattr(topology, "take_snapshot", no_gpu)
    assert link_kind(None) is None
