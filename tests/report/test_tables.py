"""Terminal tables of an analysis: exact text at a fixed width, N/A for None, order and name shortening.

``make_doc`` builds a small analysis by hand (2 ranks; decode on both, prefill on rank 0; one None token
count; findings of every severity). Its numbers are chosen so the expected text can be worked out by hand:
rank 0 decode spends 2000 + 1500 + 500 = 4000 µs of device time per step, so allreduce is 50.0%.
The other report tests import it from here.
"""

from __future__ import annotations

import io

import msgspec
import pytest
from rich.console import Console

from servescope.core.analysis import (
    AnalysisDoc,
    CategoryStats,
    CrossRankCategory,
    CrossRankStats,
    DeviceTotal,
    Finding,
    InputFile,
    KernelRow,
    PhaseStats,
    RankAnalysis,
    StepRow,
    Summary,
    TraceInfo,
    Verdict,
)
from servescope.report.kernel_names import distinct_kernel_names, shorten_kernel_name
from servescope.report.tables import format_evidence, render_analysis

GEMM_KERNEL = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
               "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)")
ADD_KERNEL = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::"
              "CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)"
              "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl<at::native::CUDAFunctor_add<float> >"
              "(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1})")
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
MEMCPY = "Memcpy HtoD (Pinned -> Device)"


def _step(index: int, phase: str, span: float, busy: float, cats: dict[str, float]) -> StepRow:
    return StepRow(index=index, name=f"step{index}", phase=phase, start_us=index * 20_000.0, span_us=span,
                   busy_us=busy, decode_requests=8 if phase == "decode" else None, categories=cats)


def _categories(**rows: tuple[float, float, float, float, float]) -> dict[str, CategoryStats]:
    """Per category: total_us, share, per_step_us, calls_per_step, mean_call_us."""
    return {name: CategoryStats(total_us=total, share=share, per_step_us=per_step, calls_per_step=calls,
                                mean_call_us=mean)
            for name, (total, share, per_step, calls, mean) in rows.items()}


def make_doc() -> AnalysisDoc:
    decode0 = PhaseStats(
        steps=3, step_us=Summary(mean=4200.0, median=4100.0), busy_us_per_step=3600.0,
        idle_us_per_step=600.0, device_us_per_step=4000.0, tokens_per_step=8.0, us_per_output_token=525.0,
        categories=_categories(gemm=(4500.0, 0.375, 1500.0, 30.0, 50.0),
                               allreduce=(6000.0, 0.5, 2000.0, 20.0, 100.0),
                               attention=(1500.0, 0.125, 500.0, 10.0, 50.0)))
    prefill0 = PhaseStats(
        steps=1, step_us=Summary(mean=10000.0, median=10000.0), busy_us_per_step=9500.0,
        idle_us_per_step=500.0, device_us_per_step=10000.0, tokens_per_step=None, us_per_output_token=None,
        categories=_categories(gemm=(6000.0, 0.6, 6000.0, 40.0, 150.0),
                               attention=(2000.0, 0.2, 2000.0, 10.0, 200.0),
                               allreduce=(1500.0, 0.15, 1500.0, 20.0, 75.0),
                               memcpy=(500.0, 0.05, 500.0, 2.0, 250.0)))
    decode1 = PhaseStats(
        steps=3, step_us=Summary(mean=4100.0, median=4100.0), busy_us_per_step=3700.0,
        idle_us_per_step=400.0, device_us_per_step=3600.0, tokens_per_step=8.0, us_per_output_token=512.5,
        categories=_categories(allreduce=(4800.0, 1600 / 3600, 1600.0, 20.0, 80.0),
                               gemm=(4500.0, 1500 / 3600, 1500.0, 30.0, 50.0),
                               attention=(1500.0, 500 / 3600, 500.0, 10.0, 50.0)))
    d0 = {"allreduce": 2000.0, "gemm": 1500.0, "attention": 500.0}
    d1 = {"allreduce": 1600.0, "gemm": 1500.0, "attention": 500.0}
    rank0 = RankAnalysis(
        rank=0, path="traces/host_rank0.pt.trace.json.gz", work_kind="device", step_source="annotation",
        unattributed_us=120.0, phases={"prefill": prefill0, "decode": decode0},
        steps=[
            _step(0, "prefill", 10000.0, 9500.0,
                  {"gemm": 6000.0, "attention": 2000.0, "allreduce": 1500.0, "memcpy": 500.0}),
            _step(1, "decode", 4000.0, 3600.0, d0),
            _step(2, "decode", 4500.0, 3600.0, d0),
            _step(3, "decode", 4100.0, 3600.0, d0),
        ])
    rank1 = RankAnalysis(
        rank=1, path="traces/host_rank1.pt.trace.json.gz", work_kind="device", step_source="annotation",
        unattributed_us=0.0, phases={"decode": decode1},
        steps=[_step(i, "decode", 4100.0, 3700.0, d1) for i in range(3)])
    return AnalysisDoc(
        servescope_version="0.1.0", created_at="2025-01-02T03:04:05Z",
        platform={"python": "3.11.9", "os": "Linux"},
        options={"top": 15, "step_gap_us": None},
        inputs=[InputFile(path="traces/host_rank0.pt.trace.json.gz", size_bytes=1_500_000),
                InputFile(path="traces/host_rank1.pt.trace.json.gz", size_bytes=1_000_000)],
        traces=[
            TraceInfo(path="traces/host_rank0.pt.trace.json.gz", rank=0, role="worker", events=123456,
                      rank_source="distributedInfo", world_size=2),
            TraceInfo(path="traces/host_rank1.pt.trace.json.gz", rank=1, role="worker", events=120000,
                      rank_source="distributedInfo", world_size=2),
            TraceInfo(path="traces/host.async_llm.1.pt.trace.json.gz", rank=None, role="frontend", events=789,
                      rank_source="none"),
        ],
        ranks=[rank1, rank0],
        kernels=[
            KernelRow(rank=0, name=GEMM_KERNEL, category="gemm", kind="kernel", count=130, total_us=10500.0),
            KernelRow(rank=0, name=NCCL_KERNEL, category="allreduce", kind="kernel",
                      count=80, total_us=7500.0),
            KernelRow(rank=1, name=NCCL_KERNEL, category="allreduce", kind="kernel",
                      count=60, total_us=4800.0),
            KernelRow(rank=0, name=ADD_KERNEL, category="attention", kind="kernel",
                      count=40, total_us=3500.0),
            KernelRow(rank=0, name=MEMCPY, category="memcpy", kind="gpu_memcpy", count=2, total_us=500.0),
        ],
        device_totals={"0": {"kernel": DeviceTotal(count=250, total_us=21500.0)}},
        categories={"allreduce": "communication", "gemm": "compute", "attention": "compute",
                    "memcpy": "memory"},
        across_ranks=[CrossRankStats(
            phase="decode", ranks=[0, 1], steps_compared=3,
            categories={
                "allreduce": CrossRankCategory(min_us=1600.0, median_us=1800.0, max_us=2000.0, min_rank=1,
                                               max_rank=0),
                "gemm": CrossRankCategory(min_us=1500.0, median_us=1500.0, max_us=1500.0, min_rank=0,
                                          max_rank=1),
                "attention": CrossRankCategory(min_us=500.0, median_us=500.0, max_us=500.0, min_rank=0,
                                               max_rank=1),
            },
            step_us=CrossRankCategory(min_us=4100.0, median_us=4150.0, max_us=4200.0, min_rank=1, max_rank=0),
            collective_us_per_step={"0": 2000.0, "1": 1600.0},
            collective_wait_us_per_step={"0": 400.0, "1": 0.0},
            collective_wait_share={"0": 0.2, "1": 0.0},
            collective_start_skew_us=Summary(mean=35.5, median=30.0),
        )],
        findings=[
            Finding(id="no-request-counts", severity="info", message="prefill steps carry no request counts",
                    evidence={}, rank=0, phase="prefill"),
            Finding(id="communication-bound", severity="high",
                    message="allreduce takes 50.0% of decode device time on rank 0",
                    evidence={"share": 0.5, "per_step_us": 2000.0, "calls_per_step": 20}, rank=0,
                    phase="decode"),
            Finding(id="collective-wait", severity="medium", message="rank 0 waits on rank 1 in collectives",
                    evidence={"wait_us": 400.0, "slowest_rank": 1, "tokens": None}, phase="decode"),
        ],
        # the summary shows the stored verdict, never one of its own
        verdicts=[Verdict(phase="decode", rank=0, kind="communication", what="communication", share=0.5,
                          base="device time", sentence="Communication bounds the decode step on rank 0: collectives "
                          "take 50.0% of its device time (2.00 ms a step).", finding="communication-bound", steps=3)],
    )


def _render(doc: AnalysisDoc, *, top: int = 15, phases: list[str] | None = None, width: int = 120) -> str:
    """The rendered text, each line without the padding rich adds up to the column width."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    render_analysis(doc, console, top=top, phases=phases)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


EXPECTED_DECODE_TOP3 = """\
servescope: 2 trace files, ranks 0, 1
decode: 3 steps · 4.20 ms/step · 8 tokens/step · 525 µs/token · slowest rank 0
  device time: allreduce 50% (2.00 ms) · gemm 38% (1.50 ms) · attention 12% (500 µs)
  idle 14% of the step (600 µs)
  bottleneck: Communication bounds the decode step on rank 0: collectives take 50.0% of its device time (2.00 ms a
    step).
findings: none

details
servescope 0.1.0 analysis, created 2025-01-02T03:04:05Z
traces
path                                       rank   role        events   rank source
──────────────────────────────────────────────────────────────────────────────────────
traces/host_rank0.pt.trace.json.gz            0   worker     123,456   distributedInfo
traces/host_rank1.pt.trace.json.gz            1   worker     120,000   distributedInfo
traces/host.async_llm.1.pt.trace.json.gz    N/A   frontend       789   none
inputs: 2 file(s), 2.5 MB

rank 0: traces/host_rank0.pt.trace.json.gz (work: device, steps from annotation, unattributed 0.120 ms)

rank 0 · decode: 3 steps, step mean 4.200 ms, median 4.100 ms
  per step: busy 3.600 ms, idle 0.600 ms, device 4.000 ms, tokens 8.0; µs per output token 525.0
category    group           share   µs/step   calls/step   µs/call
──────────────────────────────────────────────────────────────────
allreduce   communication   50.0%    2000.0         20.0     100.0
gemm        compute         37.5%    1500.0         30.0      50.0
attention   compute         12.5%     500.0         10.0      50.0
  by group: communication 50.0%, compute 50.0%

rank 1: traces/host_rank1.pt.trace.json.gz (work: device, steps from annotation, unattributed 0.000 ms)

rank 1 · decode: 3 steps, step mean 4.100 ms, median 4.100 ms
  per step: busy 3.700 ms, idle 0.400 ms, device 3.600 ms, tokens 8.0; µs per output token 512.5
category    group           share   µs/step   calls/step   µs/call
──────────────────────────────────────────────────────────────────
allreduce   communication   44.4%    1600.0         20.0      80.0
gemm        compute         41.7%    1500.0         30.0      50.0
attention   compute         13.9%     500.0         10.0      50.0
  by group: compute 55.6%, communication 44.4%

across ranks · decode: ranks 0, 1; 3 steps compared
per step      min µs   rank   median µs   max µs   rank
───────────────────────────────────────────────────────
step (span)   4100.0      1      4150.0   4200.0      0

allreduce     1600.0      1      1800.0   2000.0      0
gemm          1500.0      0      1500.0   1500.0      1
attention      500.0      0       500.0    500.0      1
rank   collective µs/step   wait µs/step   wait share
─────────────────────────────────────────────────────
   0               2000.0          400.0        20.0%
   1               1600.0            0.0         0.0%
  collective start skew: mean 35.5 µs, median 30.0 µs

top 3 of 5 kernels by total time
rank   category    count   total ms   mean µs   by     name
───────────────────────────────────────────────────────────────────────────────────────────────────────────────────
   0   gemm          130     10.500      80.8   name   Kernel2<cutlass_80_tensorop_bf16_s16816…4x64_64x4_tn_align8>
   0   allreduce      80      7.500      93.8   name   ncclDevKernel_AllReduce_Sum_bf16_RING_LL
   1   allreduce      60      4.800      80.0   name   ncclDevKernel_AllReduce_Sum_bf16_RING_LL

findings: none
"""


def test_decode_view_exact_text() -> None:
    doc = msgspec.structs.replace(make_doc(), findings=[])
    assert _render(doc, phases=["decode"], top=3) == EXPECTED_DECODE_TOP3


EXPECTED_FINDINGS = """\
findings
high  communication-bound  rank 0 · decode
  allreduce takes 50.0% of decode device time on rank 0
  evidence: share=50.0%, per_step_us=2000.0, calls_per_step=20
medium  collective-wait  all ranks · decode
  rank 0 waits on rank 1 in collectives
  evidence: wait_us=400.0, slowest_rank=1, tokens=N/A
info  no-request-counts  rank 0 · prefill
  prefill steps carry no request counts
"""


def test_findings_exact_text_high_first() -> None:
    text = _render(make_doc(), width=100)
    assert text.endswith("\n\n" + EXPECTED_FINDINGS)


EXPECTED_PREFILL_SECTION = """\
rank 0 · prefill: 1 step, step mean 10.000 ms, median 10.000 ms
  per step: busy 9.500 ms, idle 0.500 ms, device 10.000 ms, tokens N/A; µs per output token N/A
category    group           share   µs/step   calls/step   µs/call
──────────────────────────────────────────────────────────────────
gemm        compute         60.0%    6000.0         40.0     150.0
attention   compute         20.0%    2000.0         10.0     200.0
allreduce   communication   15.0%    1500.0         20.0      75.0
memcpy      memory           5.0%     500.0          2.0     250.0
  by group: compute 80.0%, communication 15.0%, memory 5.0%
"""


def test_prefill_table_exact_and_none_is_na() -> None:
    text = _render(make_doc(), phases=["prefill"], top=0)
    assert EXPECTED_PREFILL_SECTION in text
    assert "rank 1: traces/host_rank1.pt.trace.json.gz" in text
    assert "  no steps in the selected phases\n" in text  # rank 1 has no prefill
    assert "across ranks" not in text  # only decode was compared
    assert "kernels by total time" not in text  # top=0


def test_phases_come_decode_first_whatever_the_dict_order() -> None:
    text = _render(make_doc())  # rank 0 stores prefill before decode
    assert text.index("rank 0 · decode:") < text.index("rank 0 · prefill:") < text.index("rank 1 · decode:")


def test_categories_sorted_by_time_not_by_insertion() -> None:
    doc = make_doc()
    stored = list(doc.ranks[1].phases["decode"].categories)  # rank 0 is stored second
    assert stored == ["gemm", "allreduce", "attention"]
    section = _render(doc, phases=["decode"]).split("rank 0 · decode:")[1].split("by group")[0]
    rows = [line.split()[0] for line in section.splitlines()[4:] if line.strip()]
    assert rows == ["allreduce", "gemm", "attention"]  # 2000, 1500, 500 µs per step


def test_none_values_show_as_na() -> None:
    doc = make_doc()
    cross = msgspec.structs.replace(doc.across_ranks[0], collective_start_skew_us=None)
    text = _render(msgspec.structs.replace(doc, across_ranks=[cross]))
    assert "tokens N/A; µs per output token N/A" in text  # prefill: no request counts
    assert "traces/host.async_llm.1.pt.trace.json.gz    N/A   frontend" in text  # no rank
    assert "tokens=N/A" in text  # None evidence
    assert "collective start skew: N/A" in text
    kernel = KernelRow(rank=0, name="empty", category="gemm", kind="kernel", count=0, total_us=0.0)
    shown = _render(msgspec.structs.replace(doc, kernels=[kernel]))
    assert 'gemm           0      0.000       N/A   name   empty' in shown  # no calls: no mean


def test_long_kernel_names_are_shortened_in_the_table() -> None:
    text = _render(make_doc(), top=5)
    assert GEMM_KERNEL not in text and ADD_KERNEL not in text
    assert "void " not in text
    assert "Kernel2<cutlass_80_tensorop_b" in text  # namespaces that every CUTLASS kernel repeats are gone
    assert "ncclDevKernel_AllReduce_Sum_bf16_RING_LL\n" in text  # argument list gone
    assert "Memcpy HtoD (Pinned -> Device)" in text  # a description, not an argument list
    assert max(len(line) for line in text.splitlines()) <= 120


@pytest.mark.parametrize(("name", "short"), [
    ("void foo<int>(float*, int)", "foo<int>"),
    (NCCL_KERNEL, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
    ("void at::native::(anonymous namespace)::softmax<float>(float const*)", "softmax<float>"),
    ("void k<(cutlass::Arch)80, 4>(Params)", "k<(Arch)80, 4>"),
    ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversalEEEEEvNT_6ParamsE",
     "device_kernel<enable_3x_kernel_for_sm9x<…>>"),  # demangled (LLVM's >>); namespaces gone; inner folded
    (MEMCPY, MEMCPY),
    ("aten::mm", "aten::mm"),
    ("(weird)", "(weird)"),
])
def test_shorten_kernel_name(name: str, short: str) -> None:
    assert shorten_kernel_name(name) == short


def test_shorten_keeps_the_start_and_marks_the_cut() -> None:
    short = shorten_kernel_name("void " + "a" * 100 + "<int>(int)", max_chars=20)
    assert len(short) == 20 and short.startswith("a" * 13) and "…" in short and short.endswith("<int>")
    assert len(shorten_kernel_name(ADD_KERNEL)) <= 60
    assert shorten_kernel_name(ADD_KERNEL).startswith("elementwise_kernel<128, 4, ")


def test_distinct_kernels_stay_distinct_and_one_kernel_stays_one() -> None:
    """Tensile names differ in the middle (tile sizes); the same kernel on two ranks keeps one display name."""
    a = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x96x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_WG32_8_1"
    b = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x64x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_WG32_8_1"
    shown = distinct_kernel_names([a, b, a], max_chars=40)
    assert shown[0] != shown[1] and shown[0] == shown[2]
    assert "MT128x96x128" in shown[0] and "MT64x64x128" in shown[1]
    assert all(len(x) <= 40 for x in shown)


def test_evidence_formats_by_key_suffix() -> None:
    evidence: dict[str, float | int | str | None] = {
        "share": 0.125, "wait_us": 12.34, "step_ms": 1.5, "ratio": 2.0, "n": 3, "algo": "Ring", "x": None,
    }
    assert format_evidence(evidence) == (
        "share=12.5%, wait_us=12.3, step_ms=1.500, ratio=2, n=3, algo=Ring, x=N/A")


def test_names_are_not_read_as_markup() -> None:
    kernel = KernelRow(rank=0, name="foo[bold]bar[/bold]", category="[red]x", kind="kernel", count=1,
                       total_us=1.0)
    text = _render(msgspec.structs.replace(make_doc(), kernels=[kernel]))
    assert "foo[bold]bar[/bold]" in text and "[red]x" in text


def test_communication_rows_are_red() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system="standard", force_terminal=True)
    render_analysis(make_doc(), console, phases=["decode"], top=0)
    lines = buffer.getvalue().splitlines()
    comm = [line for line in lines if line.startswith("\x1b[31mallreduce")]
    assert len(comm) == 3  # decode on both ranks, and across ranks
    assert not [line for line in lines if line.startswith("\x1b[31mgemm")]
    assert len([line for line in lines if line.startswith("gemm ")]) == 3


def test_no_findings_says_none() -> None:
    assert _render(msgspec.structs.replace(make_doc(), findings=[])).endswith("\nfindings: none\n")


def test_bad_options_raise_value_error() -> None:
    with pytest.raises(ValueError, match="'decoding'; allowed: decode, mixed, prefill, unknown, empty"):
        _render(make_doc(), phases=["decoding"])
    with pytest.raises(ValueError, match="top must be 0 or more, not -1"):
        _render(make_doc(), top=-1)


def test_a_phase_with_prompt_work_shows_its_tokens_in_and_out() -> None:
    doc = make_doc()
    rank0 = next(r for r in doc.ranks if r.rank == 0)
    prefill = rank0.phases["prefill"]
    rank0.phases["prefill"] = msgspec.structs.replace(prefill, prompt_tokens_per_step=512.0,
                                                             tokens_per_step=4.0, us_per_output_token=2500.0)
    text = _render(doc)
    # no time per output token where the step computes prompt tokens too (512 in, 4 out: 2.5 ms "per token"
    # would charge the prompt's work to the 4)
    (line,) = [x for x in text.splitlines() if x.startswith("prefill: ")]
    assert line == "prefill: 1 step · 10.00 ms/step · 512 in + 4 out tokens/step · slowest rank 0"
    assert "device 10.000 ms, prompt tokens 512.0, tokens 4.0; µs per output token 2500.0" in text
    assert "decode: 3 steps · 4.20 ms/step · 8 tokens/step · 525 µs/token" in text  # no prompt work: as before
