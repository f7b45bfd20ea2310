"""Mangled kernel names of real traces (CUDA CUTLASS, ROCm CK / CK-tile, aiter, sgl_hip) read as C++ (issue 23).

The names come from the traces themselves (plain ``json.load``); what each should read as comes from binutils'
``c++filt --no-recurse-limit`` run here (skipped where it is not installed). The two demanglers space nested
templates differently (``> >`` / ``>>``), so the comparison ignores whitespace.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
from rich.console import Console

from servescope.core import kernel_names
from servescope.core.kernel_names import demangle, demangle_all
from servescope.report.tables import render_analysis
from servescope.trace.analyze import AnalyzeRequest, analyze
from tracefiles import ROOT, TRACES, load_events

SOURCES = (
    TRACES / "public" / "xdit_sd35_mi300x_compiled.json.gz",  # CK grouped convolutions (MI300X)
    TRACES / "tracelens" / "sglang_qwen3-8b_decode_graph_replay.json.gz",  # aiter, ck_tile, sgl_hip (ROCm)
    TRACES / "tracelens" / "vllm_decode_full_graph_replay.json.gz",  # ck_tile (ROCm)
    ROOT / "tests" / "data" / "h200" / "moe_b16_rank0.pt.trace.json.gz",  # CUTLASS grouped GEMM (H200)
)
CXXFILT = shutil.which("c++filt")
needs_cxxfilt = pytest.mark.skipif(CXXFILT is None, reason="binutils' c++filt is not installed")


@cache
def mangled(path: Path) -> tuple[str, ...]:
    return tuple(sorted({e["name"] for e in load_events(path)
                         if isinstance(e.get("name"), str) and e["name"].startswith("_Z")}))


def binutils(names: tuple[str, ...]) -> list[str]:
    assert CXXFILT is not None
    done = subprocess.run([CXXFILT, "--no-recurse-limit"], input="\n".join(names) + "\n", capture_output=True,
                          text=True, check=True)
    return done.stdout.splitlines()


def squeeze(text: str) -> str:
    return "".join(text.split())


@needs_cxxfilt
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name.split(".")[0])
def test_corpus_names_read_as_binutils_reads_them(path: Path) -> None:
    names = mangled(path)
    assert names, f"{path.name} carries no mangled name"
    mine = demangle_all(names)
    for name, theirs in zip(names, binutils(names), strict=True):
        if theirs == name:  # binutils 2.40 cannot read it either: checked by hand below
            continue
        assert squeeze(mine[name]) == squeeze(theirs), name
        assert demangle(name) == mine[name]


@pytest.mark.needs_shared
def test_rocm_names_the_system_demangler_missed() -> None:
    """The names issue 23 saw stay mangled: aiter's and CK-tile's (``DF16b``), sgl_hip's (``Tn``)."""
    names = mangled(SOURCES[1]) + mangled(SOURCES[2])

    def by_start(prefix: str) -> str:
        return next((demangle(n) for n in names if n.startswith(prefix)), "")

    aiter = by_start("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0")
    assert aiter.startswith("void aiter::add_rmsnorm_quant_kernel<std::bfloat16_t, std::bfloat16_t, ")
    assert by_start("_ZN7ck_tile6kentry").startswith(
        "void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<ck_tile::Rmsnorm2dFwdPipelineOnePass<")
    # _ZN 7sgl_hip 10activation 18act_and_mul_kernel I 14__hip_bfloat16 <a pointer to silu<…>> E v PS3_ PS4_ i,
    # read by hand: binutils 2.40 does not know the Tn (typed template parameter) mangling
    hip = by_start("_ZN7sgl_hip")
    assert hip.startswith("void sgl_hip::activation::act_and_mul_kernel<__hip_bfloat16, ")
    assert "silu<__hip_bfloat16>" in hip
    assert hip.endswith(">(__hip_bfloat16*, __hip_bfloat16 const*, int)")
    assert not any(demangle(n).startswith("_Z") for n in names)


@pytest.mark.needs_shared
@needs_cxxfilt
def test_binutils_reads_what_llvm_cannot_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    names = mangled(SOURCES[0])
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return real_run(args, **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(kernel_names, "_llvm_demangle", lambda name: None)
    monkeypatch.setattr(kernel_names, "_DEMANGLED", {})
    monkeypatch.setattr(subprocess, "run", run)
    mine = demangle_all(names)
    assert len(calls) == 1
    assert [mine[n] for n in names] == binutils(names)
    assert all(not mine[n].startswith("_Z") for n in names)


def test_a_name_no_demangler_reads_is_shown_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_names, "_DEMANGLED", {})
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert demangle("_ZN3foo") == "_ZN3foo"  # cut short: no demangler reads it
    assert demangle("_ZN5aiter3fooEv") == "aiter::foo()"
    assert demangle("rocm_kernel") == "rocm_kernel"


@pytest.mark.needs_shared
def test_analyze_of_a_rocm_trace_shows_no_mangled_name() -> None:
    doc = analyze(AnalyzeRequest(paths=[SOURCES[1]]))
    assert any(k.name.startswith("_ZN5aiter") for k in doc.kernels)  # the document keeps the recorded name
    buffer = io.StringIO()
    render_analysis(doc, Console(file=buffer, width=200, color_system=None), top=len(doc.kernels))
    text = buffer.getvalue()
    assert "_ZN" not in text
    assert "aiter::add_rmsnorm_q" in text and "sgl_hip::activation::act_and_mul_kernel" in text
