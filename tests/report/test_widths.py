"""Every table view fits 80, 120 and 200 columns without cutting a number (issue 16, "must show").

analyze (the bundled example, the vllm-cpu example's two ranks, public traces of ../shared), plan (the Kimi
plan of test_rerender.py) and bench serve (a real vLLM run on an H200, re-rendered as ``servescope report``
does). The expected cells come from the document read back with plain ``json.loads``, formatted as each table
column says it formats; a number cut to ``…``, folded over two lines or dropped fails the row's match.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.document import read_document
from servescope.report.jsonout import encode_analysis
from servescope.report.rerender import render_document
from servescope.report.tables import render_analysis
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.files import example_trace_dir
from tracefiles import ROOT, TRACES

WIDTHS = (80, 120, 200)
NA = "N/A"
ANALYZED = (
    example_trace_dir(),  # what `analyze --example` reads
    example_trace_dir("vllm-cpu-tp2"),  # two ranks: the across-ranks and collective tables
    TRACES / "public" / "vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz",  # long CUTLASS names, 178k events
    TRACES / "public" / "hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz",  # ROCm names, no vLLM annotations
)
SERVE = ROOT / "benchmarks" / "results" / "h200-vllm-load-2026-12-04" / "anchor" / "bench-dense-api1.json"
PLAN_ARGS = ["plan", "--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8", "--batch", "1,8,128",
             "--context", "131072"]


def _fixed(value: float | None, digits: int) -> str:
    return NA if value is None else f"{value:.{digits}f}"


def _share(value: float | None) -> str:
    return NA if value is None else f"{value * 100:.1f}%"


def _fits(lines: Sequence[str], width: int) -> None:
    wide = [line for line in lines if len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}: {wide[:3]}"


def _find_row(lines: Sequence[str], cells: Sequence[str]) -> int:
    """The index of the first line whose whitespace-separated tokens hold ``cells`` one after another, or -1."""
    want = [token for cell in cells for token in cell.split()]
    for i, line in enumerate(lines):
        tokens = line.split()
        if any(tokens[j : j + len(want)] == want for j in range(len(tokens) - len(want) + 1)):
            return i
    return -1


def _assert_rows(lines: Sequence[str], rows: Sequence[Sequence[str]], where: str) -> None:
    missing = [row for row in rows if _find_row(lines, row) < 0]
    assert not missing, f"{where}: {len(missing)} of {len(rows)} rows not shown whole, e.g. {missing[:2]}"


def _block(lines: Sequence[str], start: str, *, end: str | None = None) -> list[str]:
    """The lines from the first one starting with ``start`` up to (not including) the next one starting with
    ``end`` (or a blank line when ``end`` is None)."""
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    for i in range(first + 1, len(lines)):
        if (end is None and not lines[i].strip()) or (end is not None and lines[i].startswith(end)):
            return list(lines[first:i])
    return list(lines[first:])


# analyze


@cache
def _analysis(path: Path) -> tuple[Any, dict[str, Any]]:
    """The document (rendered by the tests) and its JSON read back plain (where the expected cells come from)."""
    doc = analyze(AnalyzeRequest(paths=[path]))
    return doc, json.loads(encode_analysis(doc))


def _analysis_lines(path: Path, width: int) -> list[str]:
    buffer = io.StringIO()
    render_analysis(_analysis(path)[0], Console(file=buffer, width=width, color_system=None, highlight=False))
    return buffer.getvalue().splitlines()


def _phase_rows(plain: dict[str, Any], phase: dict[str, Any]) -> list[list[str]]:
    return [[name, plain["categories"].get(name, NA), _share(c["share"]), _fixed(c["per_step_us"], 1),
             _fixed(c["calls_per_step"], 1), _fixed(c["mean_call_us"], 1)] for name, c in phase["categories"].items()]


def _kernel_rows(plain: dict[str, Any], top: int) -> list[list[str]]:
    kernels = plain["kernels"]
    many = len({k["rank"] for k in kernels}) > 1
    picked = sorted(kernels, key=lambda k: (-k["total_us"], k["rank"], k["name"]))[:top]
    return [[*([str(k["rank"])] if many else []), k["category"], f"{k['count']:,}", f"{k['total_us'] / 1000:.3f}",
             _fixed(k["total_us"] / k["count"] if k["count"] else None, 1), k["basis"]] for k in picked]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", ANALYZED, ids=lambda p: p.name.split(".")[0])
def test_analyze_fits_and_keeps_every_number(path: Path, width: int) -> None:
    lines = _analysis_lines(path, width)
    plain = _analysis(path)[1]
    _fits(lines, width)
    assert "bottleneck" in "\n".join(lines[:15])
    details = lines[lines.index("details"):]

    _assert_rows(details, [[NA if t["rank"] is None else str(t["rank"]), t["role"], f"{t['events']:,}"]
                           for t in plain["traces"]], "traces")
    for rank in plain["ranks"]:
        for name, phase in rank["phases"].items():
            block = _block(details, f"rank {rank['rank']} · {name}:", end="  by group:")
            _assert_rows(block, _phase_rows(plain, phase), f"rank {rank['rank']} · {name}")
    for cross in plain["across_ranks"]:
        block = _block(details, f"across ranks · {cross['phase']}:", end="  collective start skew")
        stats = [("step (span)", cross["step_us"]), *cross["categories"].items()]
        _assert_rows(block, [[name, _fixed(s["min_us"], 1), str(s["min_rank"]), _fixed(s["median_us"], 1),
                              _fixed(s["max_us"], 1), str(s["max_rank"])] for name, s in stats],
                     f"across ranks · {cross['phase']}")
        keys = {*cross["collective_us_per_step"], *cross["collective_wait_us_per_step"],
                *cross["collective_wait_share"]}
        _assert_rows(block, [[key, _fixed(cross["collective_us_per_step"].get(key), 1),
                              _fixed(cross["collective_wait_us_per_step"].get(key), 1),
                              _share(cross["collective_wait_share"].get(key))] for key in keys],
                     f"collectives · {cross['phase']}")
    if plain["kernels"]:
        block = _block(details, "top ")
        rows = _kernel_rows(plain, 15)
        assert len(block) == 3 + len(rows)  # title, header, rule, one line per kernel: no name folds
        _assert_rows(block, rows, "top kernels")


# plan


@pytest.fixture(scope="module")
def plan_plain() -> dict[str, Any]:
    result = CliRunner().invoke(app, [*PLAN_ARGS, "--json"])
    assert result.exit_code == 0, result.output
    plain: dict[str, Any] = json.loads(result.stdout)
    return plain


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_fits_and_keeps_every_number(plan_plain: dict[str, Any], width: int) -> None:
    result = CliRunner().invoke(app, PLAN_ARGS, env={"COLUMNS": str(width)}, terminal_width=width)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    _fits(lines, width)
    legend = next(i for i, line in enumerate(lines) if line.startswith("✗ does not fit"))
    steps = lines[:legend]
    rows = []
    for layout in plan_plain["layouts"]:
        for i, p in enumerate(layout["points"]):
            name = ([layout["name"]] + ([] if layout["feasible"] else ["✗"])) if i == 0 else []
            tps = NA if p["tokens_per_s"] is None else f"{p['tokens_per_s']:,.0f}"
            rows.append([*name, str(p["batch"]), f"{p['step_ms']:.2f}",
                         *(f"{p['parts_ms'][k]:.2f}" for k in ("weights", "attention", "collectives", "other")),
                         tps, *([] if p["fits_kv"] else ["!kv"])])
    _assert_rows(steps, rows, "predicted decode step")
    memory = _block(lines[legend:], "✗ does not fit", end="crossover")
    _assert_rows(memory, [[x["name"], f"{x['memory_gib_per_gpu']['weights']:.1f}",
                           f"{x['memory_gib_per_gpu']['kv_cache']:.1f}", f"{x['kv_tokens_per_gpu']:,}"]
                          for x in plan_plain["layouts"]], "memory per GPU")


# bench serve


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_serve_report_fits_keeps_every_number_and_warns(width: int) -> None:
    plain = json.loads(SERVE.read_bytes())
    lines = render_document(read_document(SERVE), "text", width=width).splitlines()
    _fits(lines, width)
    assert [p["concurrency"] for p in plain["points"]] == [1, 8, 32, 128, 256]
    for point in plain["points"]:
        block = _block(lines, f"concurrency {point['concurrency']} ", end="concurrency ")
        rows = [[label, *(_fixed(point[key][stat], 2) for stat in ("mean", "median", "p90", "p99")),
                 _fixed(point["server"][server_key], 2)]
                for label, key, server_key in (("TTFT", "ttft_ms", "ttft_ms_mean"), ("TPOT", "tpot_ms", "tpot_ms_mean"),
                                               ("ITL", "itl_ms", "itl_ms_mean"), ("E2E", "e2e_ms", "e2e_ms_mean"))]
        _assert_rows(block, rows, f"concurrency {point['concurrency']}")
        prose = " ".join(" ".join(block).split())  # the lines under the table wrap at word boundaries
        assert f"output {point['output_tokens_per_s']:.1f} tok/s, {point['requests_per_s']:.2f} req/s" in prose
        assert f"client lag p99 {point['client_lag']['p99_ms']:.2f} ms" in prose
        for finding in point["findings"]:  # printed whole, folded over lines: message; try: advice
            assert " ".join(f"{finding['message']}; try: {finding['advice']}".split()) in prose
        if point["concurrency"] in (128, 256):  # the anchor's one API front end falls behind (its README)
            assert [f["id"] for f in point["findings"]] == ["front_end_bound"]
            assert "server front end: the client ran on time" in prose
