"""``servescope report`` round-trips documents: each command is run on a real input for its text and its saved
JSON, then ``report FILE`` must print the same text; its HTML carries what the text shows (checked in Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from server.sse import running_sse_server
from servescope.cli import app
from servescope.core.document import KINDS, decode, read_header
from servescope.core.errors import InputError

runner = CliRunner()
TESTS = Path(__file__).parent.parent
H200 = TESTS / "data" / "h200"


def _ok(args: list[str]) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _report(path: Path, *extra: str) -> str:
    return _ok(["report", str(path), *extra])


@pytest.fixture(scope="module")
def front_end_bound_server() -> Iterator[str]:
    """The test SSE server whose /metrics say the engine was 4x faster than its socket: front_end_bound."""
    with running_sse_server("--ttft-ms", "150", "--interval-ms", "30", "--engine-scale", "0.25") as url:
        yield url


def test_analysis_plan_and_diff_round_trip(tmp_path: Path) -> None:
    saved = tmp_path / "analysis.json"
    text = _ok(["analyze", H200 / "dense_b16_rank0.pt.trace.json.gz", "-o", saved])
    assert read_header(saved.read_bytes(), "a")[0].schema == "servescope.analysis"
    assert _report(saved) == text
    assert json.loads(_report(saved, "--json")) == json.loads(saved.read_bytes())

    plan = tmp_path / "plan.json"
    args = ["plan", "--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8", "--batch", "1,8,128",
            "--context", "131072"]
    text = _ok([*args, "-o", plan])
    assert "!kv" in text and _report(plan) == text
    assert json.loads(_report(plan, "--json")) == json.loads(plan.read_bytes())

    other = tmp_path / "other.json"
    _ok(["analyze", H200 / "dense_b16_graphs_rank0.pt.trace.json.gz", "-o", other])
    diff = tmp_path / "diff.json"
    diff.write_text(_ok(["diff", saved, other, "--json"]))
    assert _report(diff) == _ok(["diff", saved, other])


def test_bench_serve_round_trip_and_front_end_bound(front_end_bound_server: str, tmp_path: Path) -> None:
    saved = tmp_path / "serve.json"
    text = _ok(["bench", "serve", front_end_bound_server, "--concurrency", "4", "--requests", "12",
                "--input-tokens", "4", "--output-tokens", "12", "--warmup", "1", "--workers", "1", "-o", saved])
    assert _report(saved) == text
    ids = [f["id"] for p in json.loads(saved.read_bytes())["points"] for f in p["findings"]]
    assert "front_end_bound" in ids


def test_every_kind_is_registered_once_and_bad_input_is_one_line(tmp_path: Path) -> None:
    assert len({k.schema for k in KINDS}) == len(KINDS) == 11
    assert "servescope.tune" in {k.schema for k in KINDS}  # tune's document re-renders too
    bad = tmp_path / "x.json"
    for text, detail in (("", "empty file"), ("[1]", "Expected `object`"), ('{"schema": "servescope.nope"}',
                                                                          "'servescope.nope'"),
                         ('{"schema": "servescope.plan", "schema_version": 9}', "schema_version 9"),
                         ('{"schema": "servescope.plan/1"}', "servescope_version")):
        bad.write_text(text)
        with pytest.raises(InputError, match=re.escape(detail)):
            decode(bad.read_bytes(), str(bad))
        result = runner.invoke(app, ["report", str(bad)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1 and str(bad) in result.output


def test_a_plan_saved_with_the_older_schema_renders_as_a_new_one(tmp_path: Path) -> None:
    """Plans written before the versioned header say ``"schema": "servescope.plan/1"`` and no schema_version: they
    read, and `report` prints and pages them as it does the same plan saved today (text, HTML)."""
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    _ok(["plan", "--model", "llama-3-70b", "--hardware", "h200", "--gpus", "2", "--batch", "1", "-o", new])
    data = json.loads(new.read_bytes())
    data["schema"] = "servescope.plan/1"
    del data["schema_version"]
    old.write_text(json.dumps(data), encoding="utf-8")
    assert _report(old) == _report(new)
    _report(old, "--html", tmp_path / "old.html")
    _report(new, "--html", tmp_path / "new.html")
    assert (tmp_path / "old.html").read_bytes() == (tmp_path / "new.html").read_bytes()


def test_every_kind_has_its_views_and_only_kinds_do() -> None:
    """Adding a kind is an entry in core's KINDS and one in report's VIEWS; a view of no kind is a leftover."""
    from servescope.report.rerender import VIEWS

    assert set(VIEWS) == {k.schema for k in KINDS}


def test_plan_and_serve_html_in_headless_chromium(front_end_bound_server: str, tmp_path: Path) -> None:
    """The plan page shows the tok/s column and the KV-fit marks, the bench-serve page the front-end warning, in
    the same style (one stylesheet); Chromium renders both (one launch, the two pages framed in one)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium on PATH: install chromium (apt-get install -y chromium)"
    plan = tmp_path / "plan.json"
    _ok(["plan", "--model", "kimi-k2.5", "--hardware", "h200", "--gpus", "8", "--batch", "1,128",
         "--context", "131072", "-o", plan])
    serve = tmp_path / "serve.json"
    _ok(["bench", "serve", front_end_bound_server, "--concurrency", "4", "--requests", "8",
         "--input-tokens", "4", "--output-tokens", "12", "--warmup", "1", "--workers", "1", "-o", serve])
    pages = {}
    for name, src in (("plan", plan), ("serve", serve)):
        pages[name] = tmp_path / f"{name}.html"
        _report(src, "--html", str(pages[name]))
    styles = {name: re.search(r"<style>(.*?)</style>", p.read_text(), re.DOTALL) for name, p in pages.items()}
    assert all(styles.values()) and len({m.group(1) for m in styles.values() if m}) == 1
    doms = []
    for page in pages.values():
        done = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=1000", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        doms.append(done.stdout)
    plan_dom, serve_dom = doms
    plan_doc = json.loads(plan.read_bytes())
    short = [p for x in plan_doc["layouts"] for p in x["points"] if not p["fits_kv"]]
    assert "<th>tok/s</th>" in plan_dom and len(short) > 0
    assert plan_dom.count('<span class="mark">!kv</span>') == len(short)
    serve_doc = json.loads(serve.read_bytes())
    finding = next(f for p in serve_doc["points"] for f in p["findings"] if f["id"] == "front_end_bound")
    assert finding["severity"] in ("high", "medium")
    warning = f'{finding["severity"]}: {finding["message"][:40]}'
    assert re.search(r'<p class="warn">concurrency 4: ' + re.escape(warning), serve_dom)
