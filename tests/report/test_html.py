"""The HTML page: self-contained, escaped, and its charts really render in a headless Chromium."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest
from test_tables import ADD_KERNEL, make_doc

from servescope.core.analysis import AnalysisDoc, Finding, KernelRow
from servescope.core.categories import Category, bundled_categories
from servescope.report.html import category_color, render_analysis_html, shares_phase

CHART_IDS = ("chart-steps-rank0", "chart-steps-rank1", "chart-shares")
NASTY = 'void evil<a & b, c > d>(int&) "quoted" <script>alert(1)</script>'


def _nasty_doc() -> AnalysisDoc:
    doc = make_doc()
    kernel = KernelRow(rank=0, name=NASTY, category="gemm", kind="kernel", count=1, total_us=99_999.0)
    finding = Finding(id="x<y", severity="high", message="a <b>bold</b> & claim", evidence={"k<": "v&"})
    return msgspec.structs.replace(doc, kernels=[kernel, *doc.kernels], findings=[finding])


@pytest.fixture(scope="module")
def page() -> str:
    return render_analysis_html(make_doc())


def test_page_is_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert '<script src="http' not in page and "<script src=" not in page
    assert "<link" not in page
    assert page.count("window.PlotlyConfig") == 1  # plotly.js embedded once for all charts
    assert page.count("<script") >= 1 + len(CHART_IDS)


def test_page_has_chart_ids_version_time_and_inputs(page: str) -> None:
    for chart_id in CHART_IDS:
        assert page.count(f'id="{chart_id}"') == 1
    assert "servescope 0.1.0" in page
    assert "2025-01-02T03:04:05Z" in page
    assert "<td>traces/host_rank0.pt.trace.json.gz</td><td class=\"num\">1,500,000</td>" in page


def test_page_tables_show_phases_kernels_findings(page: str) -> None:
    assert ('<tr class="comm"><td>allreduce</td><td>communication</td><td class="num">50.0%</td>'
            '<td class="num">2000.0</td><td class="num">20.0</td><td class="num">100.0</td></tr>') in page
    assert "tokens N/A; µs per output token N/A" in page
    assert "<td>ncclDevKernel_AllReduce_Sum_bf16_RING_LL</td>" not in page  # the cell has a title
    assert ">ncclDevKernel_AllReduce_Sum_bf16_RING_LL</td>" in page
    assert "share=50.0%, per_step_us=2000.0, calls_per_step=20" in page
    assert page.index("communication-bound") < page.index("collective-wait") < page.index("no-request-counts")


def test_names_are_escaped() -> None:
    page = render_analysis_html(_nasty_doc())
    assert NASTY not in page
    assert "<script>alert(1)</script>" not in page
    assert html.escape(NASTY, quote=True) in page  # the full name, as the kernel cell's title
    assert "evil&lt;a &amp; b, c &gt; d&gt;" in page  # the shortened name shown
    assert "a &lt;b&gt;bold&lt;/b&gt; &amp; claim" in page and "x&lt;y" in page and "k&lt;=v&amp;" in page
    assert html.escape(ADD_KERNEL, quote=True) in page


def test_colors_are_stable_and_communication_is_red() -> None:
    bundled = bundled_categories()
    assert category_color(bundled["comm.all_reduce"]) == "#d62728"
    assert all(c.colour for c in bundled.values())  # every bundled category has its colour (taxonomy.toml)
    new_thing = Category("new_thing", "compute", "new_thing", None, "other")
    assert category_color(new_thing) == category_color(new_thing)
    red_or_orange = {"#ef3b2c", "#fc9272", "#e6550d", "#fdd0a2", "#99000d", "#f768a1"}
    assert category_color(Category("my_collective", "communication", "x", None, "collectives")) in red_or_orange


def test_shares_phase_prefers_decode_then_most_steps() -> None:
    doc = make_doc()
    assert shares_phase(doc) == "decode"
    no_decode = [msgspec.structs.replace(r, phases={p: s for p, s in r.phases.items() if p != "decode"})
                 for r in doc.ranks]
    assert shares_phase(msgspec.structs.replace(doc, ranks=no_decode)) == "prefill"
    assert shares_phase(msgspec.structs.replace(doc, ranks=[])) is None


class _ChartDom(HTMLParser):
    """Per chart div: its ``svg.main-svg`` count, bar traces, and the bar rectangles drawn in its barlayer."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
            "wbr"}

    def __init__(self, chart_ids: tuple[str, ...]) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None, frozenset[str]]] = []
        self.main_svg = dict.fromkeys(chart_ids, 0)
        self.bar_traces = dict.fromkeys(chart_ids, 0)
        self.bars: dict[str, list[tuple[float, float]]] = {c: [] for c in chart_ids}  # (x, height) in px

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = frozenset((a.get("class") or "").split())
        chart = a.get("id") if a.get("id") in self.main_svg else (self.stack[-1][1] if self.stack else None)
        if chart is not None:
            if tag == "svg" and "main-svg" in classes:
                self.main_svg[chart] += 1
            if tag == "g" and {"trace", "bars"} <= classes:
                self.bar_traces[chart] += 1
            in_barlayer = any("barlayer" in c for _, _, c in self.stack)
            if tag == "path" and in_barlayer and self.stack and "point" in self.stack[-1][2]:
                found = re.match(r"M([\d.]+),([\d.]+)V([\d.]+)", a.get("d") or "")
                if found:
                    x, y0, y1 = (float(v) for v in found.groups())
                    self.bars[chart].append((x, abs(y0 - y1)))
        if tag not in self.VOID:
            self.stack.append((tag, chart, classes))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return


def test_charts_render_in_headless_chromium(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium on PATH: install chromium (apt-get install -y chromium)"
    doc = make_doc()
    page = tmp_path / "analysis.html"
    page.write_text(render_analysis_html(doc), encoding="utf-8")
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = _ChartDom(CHART_IDS)
    dom.feed(done.stdout)
    for chart_id in CHART_IDS:
        assert dom.main_svg[chart_id] >= 1, f"{chart_id}: plotly drew no svg.main-svg"
    ranks = {r.rank: r for r in doc.ranks}
    for rank_id, rank in ranks.items():
        chart_id = f"chart-steps-rank{rank_id}"
        drawn = dom.bars[chart_id]
        nonzero = sum(1 for s in rank.steps for us in s.categories.values() if us > 0)
        categories = {c for s in rank.steps for c in s.categories}
        assert dom.bar_traces[chart_id] == len(categories)
        assert len(drawn) == nonzero and all(height > 0 for _, height in drawn), drawn
        assert len({x for x, _ in drawn}) == len(rank.steps)  # at least one bar in every step's column
    shares = dom.bars["chart-shares"]
    expected = sum(len(r.phases["decode"].categories) for r in doc.ranks if "decode" in r.phases)
    assert len(shares) == expected and all(height > 0 for _, height in shares)
