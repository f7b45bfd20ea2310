"""The answer first: the summary names the bottleneck in the first lines, at any width, with numbers that hold."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from servescope.report.summary import bottleneck
from servescope.report.tables import render_analysis
from servescope.trace.analyze import AnalyzeRequest, analyze
from tracefiles import ROOT, load_events

H200_VLLM = ROOT / "tests" / "data" / "h200-vllm"
EXAMPLE_CPU = ROOT / "src" / "servescope" / "data" / "examples" / "vllm-cpu-tp2"


def _render(path: Path, width: int) -> list[str]:
    buffer = io.StringIO()
    render_analysis(analyze(AnalyzeRequest(paths=[path])), Console(file=buffer, width=width, color_system=None))
    return buffer.getvalue().splitlines()


def _idle_share(trace: Path) -> float:
    """Mean over vLLM's decode steps of 1 - (union of the kernels inside the step's GPU annotation) / its span."""
    events = load_events(trace)
    steps = [e for e in events if e.get("cat") == "gpu_user_annotation"
             and e["name"].startswith("execute_context_0(0)_generation_")]
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    shares = []
    for step in steps:
        lo, hi = step["ts"], step["ts"] + step["dur"]
        busy, reach = 0.0, lo
        for start, end in kernels:
            if end <= lo or start >= hi:
                continue
            start, end = max(start, reach), min(end, hi)
            if end > start:
                busy += end - start
                reach = end
        shares.append(1 - busy / step["dur"])
    return sum(shares) / len(shares)


@pytest.mark.parametrize("width", [80, 100, 120, 200])
@pytest.mark.parametrize("path", [H200_VLLM / "dense-eager-b16", H200_VLLM / "moe-graphs-b64", EXAMPLE_CPU],
                         ids=lambda p: p.name)
def test_the_bottleneck_comes_first_at_every_width(path: Path, width: int) -> None:
    lines = _render(path, width)
    first = "\n".join(lines[:15])
    assert "bottleneck:" in first
    assert lines.index("details") > 0
    assert all(len(line) <= width for line in lines[: lines.index("details")])


@pytest.mark.parametrize("capture", ["dense-eager-b16", "dense-eager-b1", "moe-eager-b16"])
def test_an_eager_decode_step_that_mostly_idles_is_named_host_bound(capture: str) -> None:
    trace = H200_VLLM / capture / "rank0.pt.trace.json.gz"
    idle = _idle_share(trace)
    assert idle > 0.5  # eager vLLM on an H200 with a small model: the host cannot keep up (plain json)
    neck = bottleneck(analyze(AnalyzeRequest(paths=[trace])), "decode")
    assert neck is not None and neck.kind == "host"
    assert neck.base == "step" and neck.share == pytest.approx(idle, abs=0.03)
    shown = re.search(r"idle (\d+\.\d)% of it", neck.sentence)
    assert shown is not None and float(shown.group(1)) == pytest.approx(100 * neck.share, abs=0.051)


def test_a_step_spent_in_collectives_is_named_communication_bound() -> None:
    """The fallback capture: over 40% of a decode step's operator time in the all-reduce (vLLM's own log says
    the shm communicator fell back to torch.distributed)."""
    doc = analyze(AnalyzeRequest(paths=[ROOT / "tests" / "data" / "vllm-cpu-fallback"]))
    neck = bottleneck(doc, "decode")
    assert neck is not None and neck.kind == "communication"
    assert "collectives take" in neck.sentence


def test_the_verdict_travels_in_json_report_and_html(tmp_path: Path) -> None:
    """analyze --json stores the verdict; report re-renders the same bottleneck line; the HTML shows it."""
    import json

    from typer.testing import CliRunner

    from servescope.cli import app

    saved = tmp_path / "a.json"
    first = CliRunner().invoke(app, ["analyze", "--example", "-o", str(saved), "--html", str(tmp_path / "a.html")],
                               env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    (verdict,) = json.loads(saved.read_text())["verdicts"]
    assert verdict["phase"] == "decode" and verdict["sentence"]
    again = CliRunner().invoke(app, ["report", str(saved)], env={"COLUMNS": "200"})
    line = " ".join(f"bottleneck: {verdict['sentence']}".split())
    assert line in " ".join(first.stdout.split()) and line in " ".join(again.stdout.split())
    import html

    assert html.escape(verdict["sentence"]) in (tmp_path / "a.html").read_text()
