"""Every table view fits 80, 120 and 200 columns without cutting a number (issue 16, "must show").

analyze (the bundled example, the vllm-cpu example's two ranks, public traces of ../shared), plan (the Kimi
plan of test_rerender.py) and bench serve (a real vLLM run on an H200, re-rendered as ``servescope report``
does). The expected cells come from the document read back with plain ``json.loads``, formatted as each table
column says it formats; a number cut to ``…``, folded over two lines or dropped fails the row's match.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from deploy.conftest import FakeSystemctl, systemctl  # noqa: F401 (systemctl: the deploy tests' fixture)
from gpu.gpu_inputs import RECORDING, fake_nvidia_smi
from servescope.cli import app
from servescope.core.document import encode, read_document
from servescope.report.rerender import render_document
from servescope.report.tables import render_analysis
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.read.files import example_trace_dir
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
    return doc, json.loads(encode(doc))


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
        rows = _kernel_rows(plain, 15)
        # the table's own title, whole: a wrapped line of prose above it can start with "top " too
        block = _block(details, f"top {len(rows)} of {len(plain['kernels'])} kernels by total time")
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
    narrow = any(line.strip() == plan_plain["layouts"][0]["name"] for line in steps)  # one table a layout
    for layout in plan_plain["layouts"]:
        for i, p in enumerate(layout["points"]):
            name = ([layout["name"]] + ([] if layout["feasible"] else ["✗"])) if i == 0 and not narrow else []
            tps = NA if p["tokens_per_s"] is None else f"{p['tokens_per_s']:,.0f}"
            band = f"{p['step_ms_low']:.1f}–{p['step_ms_high']:.1f}"  # the step with every figure at either side
            tps_band = f"{p['tokens_per_s_low']:,.0f}–{p['tokens_per_s_high']:,.0f}"
            rows.append([*name, str(p["batch"]), f"{p['step_ms']:.2f}", band,
                         *(f"{p['parts_ms'][k]:.2f}" for k in ("weights", "attention", "collectives", "other")),
                         tps, *([] if p["fits_kv"] else ["!kv"]), tps_band])
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


# every other command (issue 23): settings (live and saved), plan at its extremes, health, gpu, service.
# Rendered at each width and on a line so wide that nothing wraps; the narrow text must keep every word of the
# wide one whole (a word broken over two lines leaves pieces the wide text does not have) and every number.

TOKEN_WIDTHS = (80, 100, 120, 200)
WIDE = 100_000
SETTINGS = ROOT / "tests" / "data" / "h200-vllm" / "recorded" / "settings-dense.json"
KIMI_UNIT = ROOT.parent / "shared" / "examples" / "vllm-kimi-k25-int4.service"
_NUMBER = re.compile(r"\d")
_CUT_NUMBER = re.compile(r"\d…")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT[\d:.+]+")  # when a live command ran: each run differs
_RULE = re.compile(r"^[─━═]+$")  # a table's rule is as wide as its table


def _assert_same_words(wide: str, narrow: str, width: int, where: str) -> None:
    """``narrow`` fits ``width``, cuts no number, breaks no word of ``wide`` and drops no number of it."""
    lines = narrow.splitlines()
    _fits([line.rstrip() for line in lines], width)
    assert _CUT_NUMBER.findall(narrow) == _CUT_NUMBER.findall(wide), f"{where}: a number cut at {width} columns"
    wide_words, narrow_words = (Counter(w for w in _TIME.sub("TIME", text).split() if not _RULE.match(w))
                                for text in (wide, narrow))
    longer = [w for w in wide_words if len(w) > width - 4]  # a word longer than the line: the only one folded
    broken = sorted(w for w in set(narrow_words) - set(wide_words) if not any(w.rstrip("…") in x for x in longer))
    assert not broken, f"{where} at {width} columns: words the wide text does not have (broken?): {broken[:8]}"
    numbers = Counter({w: n for w, n in wide_words.items() if _NUMBER.search(w)})
    folded = Counter({w: wide_words[w] for w in longer})  # every occurrence of a word longer than the line
    lost = numbers - Counter({w: n for w, n in narrow_words.items() if _NUMBER.search(w)}) - folded
    assert not lost, f"{where} at {width} columns: numbers not shown whole: {sorted(lost)[:8]}"


def _cli(args: Sequence[object], width: int, code: int = 0) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)}, terminal_width=width)
    assert result.exit_code == code, result.output
    return result.stdout


def _each_width(render: Any, where: str) -> None:
    wide = render(WIDE)
    assert wide.strip(), f"{where}: printed nothing"
    for width in TOKEN_WIDTHS:
        _assert_same_words(wide, render(width), width, where)


def test_settings_report_of_a_saved_document_keeps_every_word() -> None:
    """The recorded H200 vLLM settings: a 170-character command line, 45 rows the server reports."""
    doc = read_document(SETTINGS)
    _each_width(lambda w: render_document(doc, "text", width=w), "settings report")
    narrow = render_document(doc, "text", width=80)
    plain = json.loads(SETTINGS.read_bytes())
    cmdline = next(s["value"] for g in plain["groups"] for s in g["settings"] if s["key"] == "command line")
    lines = narrow.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("command line"))
    end = next(i for i in range(first + 1, len(lines)) if lines[i][:1].strip())  # the next setting
    words = " ".join(lines[first:end]).split()
    for label in ("command", "line", "process", "/proc/855/cmdline"):  # the setting, its source and where
        words.remove(label)
    assert len(cmdline) > 80 and words == cmdline.split()  # the value whole, word by word, in order
    piped = _cli(["report", SETTINGS], 80)  # CliRunner's stdout is not a terminal: a pipe, COLUMNS=80
    _fits(piped.splitlines(), 80)


def test_settings_of_a_live_process_keeps_every_word(tmp_path: Path) -> None:
    """``settings --pid`` of a process of ours with a ~400-character command line and a long environment value."""
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "vllm", "serve", "/models/" + "k" * 40,
            "--max-model-len", "131072", "--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.92",
            "--served-model-name", "kimi-k2.5-int4-" + "x" * 30, "--kv-cache-dtype", "fp8_e4m3",
            "--compilation-config", '{"cudagraph_mode":"FULL_AND_PIECEWISE","max_capture_size":512}',
            "--speculative-config", '{"method":"eagle3","num_speculative_tokens":3}', "--port", "8000"]
    env = {"PATH": os.environ["PATH"], "NCCL_PROTO": "LL,LL128,Simple", "VLLM_USE_V1": "1",
           "LD_LIBRARY_PATH": ":".join(f"/opt/lib{i}/cuda-12.8/lib64" for i in range(12))}
    proc = subprocess.Popen(argv, env=env)
    try:
        assert len(" ".join(argv)) > 350
        _each_width(lambda w: _cli(["settings", "--pid", proc.pid], w), "settings --pid")
    finally:
        proc.kill()
        proc.wait(timeout=10)


PLAN_EXTREMES = [
    ["plan", "--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "64", "--batch", "1,8,1024,65536",
     "--context", "1048576"],  # a 1T-parameter model, 64 GPUs, big batches: 7-digit step times
    ["plan", "--model", "kimi-k2.5", "--hardware", "rtx-pro-6000", "--gpus", "8", "--batch", "1,8,32"],  # README's
]


@pytest.mark.parametrize("args", PLAN_EXTREMES, ids=["64gpus-batch65536-context1M", "readme"])
def test_plan_at_its_extremes_keeps_every_number(args: list[str]) -> None:
    _each_width(lambda w: _cli(args, w), " ".join(args))
    plain = json.loads(_cli([*args, "--json"], 200))
    narrow = _cli(args, 80)
    words = Counter(narrow.split())
    for layout in plain["layouts"]:  # every point's figures, from the document, whole at 80 columns
        for p in layout["points"]:
            for figure in (str(p["batch"]), f"{p['step_ms']:.2f}", *(f"{p['parts_ms'][k]:.2f}" for k in
                                                                        ("weights", "attention", "collectives"))):
                assert words[figure], f"{layout['name']} batch {p['batch']}: {figure} not shown whole at 80 columns"


def test_health_keeps_every_word(tmp_path: Path) -> None:
    """A crashed server: its process, and a log whose last lines are long (a CUDA error with a path)."""
    log = tmp_path / "server.log"
    long_line = ("ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
                 "capacity of 139.81 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has "
                 "138.78 GiB memory in use. /opt/venv/lib/python3.12/site-packages/torch/cuda/memory.py:1234")
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", f"print('INFO loading weights'); print({long_line!r}); "
                                 "raise SystemExit(3)"], stdout=out, stderr=subprocess.STDOUT)
        proc.wait(timeout=30)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    saved = tmp_path / "health.json"
    _cli(["health", f"http://127.0.0.1:{port}", "--pid", proc.pid, "--log", log, "-o", saved], 120, code=1)
    doc = read_document(saved)
    _each_width(lambda w: render_document(doc, "text", width=w), "health")


@pytest.fixture
def recorded_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real H200 holding 10 GiB: its recorded ``nvidia-smi`` outputs first on PATH."""
    recorded = RECORDING / "holding-10GiB"
    fake_nvidia_smi(tmp_path, {"-q -x": recorded / "nvidia-smi-q.xml", "topo -m": recorded / "topo-m.txt"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("command", ["list", "topo", "holders"])
@pytest.mark.usefixtures("recorded_smi")
def test_gpu_keeps_every_word(command: str) -> None:
    _each_width(lambda w: _cli(["gpu", command, "--prefer", "nvidia-smi"], w), f"gpu {command}")


@pytest.mark.needs_shared
def test_service_import_keeps_every_word(tmp_path: Path) -> None:
    """The production Kimi-K2.5 unit this project started from: a long ExecStart, a secret moved out."""
    def run(width: int) -> str:  # each width writes its own files; the wide run's paths are the narrow's
        text = _cli(["service", "import", KIMI_UNIT, "-o", tmp_path / f"w{width}" / "spec.toml", "--mkdir"], width)
        return text.replace(f"/w{width}/", "/wN/")

    _each_width(run, "service import")


@pytest.mark.needs_shared
def test_service_lint_keeps_every_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The production unit's findings: each `file:line severity rule` key on one line, the prose wrapped at
    spaces under it (the key is a path-sized token an editor reads whole: the unit named as a user would)."""
    Path(tmp_path / "vllm-kimi-k25-int4.service").write_text(Path(KIMI_UNIT).read_text())
    monkeypatch.chdir(tmp_path)
    unit = "vllm-kimi-k25-int4.service"

    def run(width: int) -> str:
        return _cli(["service", "lint", unit, "--no-host"], width, code=1)

    _each_width(run, "service lint")
    for width in TOKEN_WIDTHS:
        keys = [line for line in run(width).splitlines() if line.startswith(str(unit))]
        assert keys and all(re.match(rf"{re.escape(str(unit))}:\d+ (info|warning|error) [a-z-]+$", k) for k in keys)


def test_service_status_keeps_every_word(systemctl: FakeSystemctl) -> None:  # noqa: F811 (the fixture)
    systemctl.add_unit("vllm-kimi-k25-int4.service", MainPID="4242", NRestarts="3",
                  ExecMainStartTimestamp="Thu 2026-12-03 09:14:02 UTC")
    _each_width(lambda w: _cli(["service", "status", "vllm-kimi-k25-int4"], w), "service status")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_traces_table_tells_two_files_apart(width: int) -> None:
    """Two ranks of one folder differ only at the end of their paths: the end is what the table keeps."""
    folder = example_trace_dir("vllm-cpu-tp2")
    paths = [folder / "rank0.pt.trace.json.gz", folder / "rank1.pt.trace.json.gz"]
    buffer = io.StringIO()
    render_analysis(analyze(AnalyzeRequest(paths=paths)), Console(file=buffer, width=width, color_system=None))
    lines = buffer.getvalue().splitlines()
    block = _block(lines[lines.index("details"):], "traces", end="inputs:")
    _fits(block, width)
    shown = [line.split()[0] for line in block[3:]]
    assert len(shown) == 2 and len(set(shown)) == 2
    for cell, path in zip(sorted(shown), paths, strict=True):
        assert str(path).endswith(cell.lstrip("…")) and cell.endswith(path.name)
