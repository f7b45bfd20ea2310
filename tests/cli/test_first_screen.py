"""The first screen at 80 columns and a folder with a damaged trace in it (issue 37).

At 80 columns every wrapped line of the first screen hangs under its block (none restarts at column 0), a path is
cut at its start (the file name whole), and the step time is said once: the traced step, with the cycle (step
plus the host gap before the next) named as such. Expected figures come from the example's trace read with plain
``json``: vLLM's execute_* ranges on the GPU timeline.
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.trace.analyze import example_trace_dir
from tracefiles import TRACES, load_events

WIDTH = 80
_BLOCK_HEADS = ("servescope:", "decode:", "prefill:", "mixed:", "unknown:", "findings")


def _cli(args: Sequence[object], width: int = WIDTH) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)}, terminal_width=width)
    return result.exit_code, result.output


def _first_screen(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[: lines.index("details")] if "details" in lines else lines


def test_the_examples_first_screen_hangs_every_wrapped_line_and_says_one_step_time() -> None:
    code, text = _cli(["analyze", "--example"])
    assert code == 0, text
    screen = [line for line in _first_screen(text) if line.strip()]
    assert all(len(line) <= WIDTH for line in text.splitlines())
    for line in screen:  # a line at column 0 opens a block; every other is indented under one
        assert line.startswith(" ") or line.startswith(_BLOCK_HEADS), line
    assert any(line.startswith("    ") for line in screen)  # something did wrap, and hung
    # the traced step and the cycle, from the GPU timeline's execute_* ranges
    trace = example_trace_dir() / "rank0.pt.trace.json.gz"
    ranges = sorted((e["ts"], e["dur"]) for e in load_events(trace)
                    if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("execute_"))
    step_ms = statistics.mean(d for _, d in ranges) / 1000
    cycle_ms = statistics.mean(b[0] - a[0] for a, b in zip(ranges, ranges[1:], strict=False)) / 1000
    joined = " ".join(line.strip() for line in screen)
    assert f"{step_ms:.2f} ms/step" in joined
    shown_cycle = float(joined.split(" ms/step (")[1].split(" ms cycle with the host gap)")[0])
    assert shown_cycle == pytest.approx(cycle_ms, rel=0.01)
    # the finding says which figure it uses: the cycle, named, and the traced step inside it
    assert "µs a step in the trace" not in joined
    assert "step cycle in the trace (the" in joined and "µs traced step + " in joined


def test_a_path_is_cut_at_its_start(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-" * 3) / "another-level-of-folders"
    deep.mkdir(parents=True)
    name = "rank0.pt.trace.json.gz"
    shutil.copy(example_trace_dir() / name, deep / name)
    code, text = _cli(["analyze", deep])
    assert code == 0, text
    (header,) = [line for line in text.splitlines() if line.startswith("rank 0: ")]
    assert name in header and header.split(" (work")[0].endswith(name)  # the file name whole, on its line
    assert "…" in header and len(header) <= WIDTH


@pytest.mark.needs_shared
def test_a_truncated_trace_in_a_folder_is_left_out_and_the_rest_analysed(tmp_path: Path) -> None:
    good, bad = (TRACES / "hta" / f"sampled_128rank_rank{r}.json.gz" for r in (0, 1))
    shutil.copy(good, tmp_path / good.name)
    (tmp_path / bad.name).write_bytes(bad.read_bytes()[:50_000])  # cut short
    with pytest.raises((EOFError, OSError)):
        with gzip.open(tmp_path / bad.name, "rt") as handle:
            json.load(handle)
    code, text = _cli(["analyze", tmp_path], width=200)
    assert code == 0, text
    assert "rank 0" in text and f"left out {tmp_path / bad.name}: truncated gzip" in text
    code, out = _cli(["analyze", tmp_path, "--json"], width=200)
    doc = json.loads(out[out.index("{"):])
    assert doc["left_out"] == {str(tmp_path / bad.name): "truncated gzip"}
    assert [r["rank"] for r in doc["ranks"]] == [json.loads(gzip.open(good).read())["distributedInfo"]["rank"]]
    # named on its own, the damaged file is an error: one line, exit 2
    code, text = _cli(["analyze", tmp_path / bad.name])
    assert code == 2 and "Traceback" not in text and "truncated gzip" in text
