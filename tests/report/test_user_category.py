"""A category added as data alone (one entry and its rule in a user taxonomy, ``analyze --taxonomy FILE``): its
label, colour, planner role and words reach the printed text, the verdict, the HTML page and the planner, with no
change of code."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.analysis import decode_analysis
from servescope.core.categories import categories_of
from servescope.plan import captured
from tracefiles import ROOT

EXAMPLE = ROOT / "src" / "servescope" / "data" / "examples" / "h200-vllm-moe-b16"
USER_TAXONOMY = """
[categories.expert_gemm]
group = "compute"
label = "MoE expert GEMMs"
colour = "#123abc"
role = "weights"
words = "the experts' GEMMs"

[[rule]]
category = "expert_gemm"
regex = '^fused_moe_kernel$'
outranks_launch = true
"""


def test_a_category_added_as_data_reaches_the_text_the_html_and_the_planner(tmp_path: Path) -> None:
    taxonomy, out_json, out_html = tmp_path / "mine.toml", tmp_path / "a.json", tmp_path / "a.html"
    taxonomy.write_text(USER_TAXONOMY, encoding="utf-8")
    result = CliRunner().invoke(app, ["analyze", str(EXAMPLE), "--taxonomy", str(taxonomy), "-o", str(out_json),
                                      "--html", str(out_html)],
                                env={"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    doc = decode_analysis(out_json.read_bytes(), str(out_json))
    decode = doc.ranks[0].phases["decode"]
    assert doc.categories["expert_gemm"] == "compute" and decode.categories["expert_gemm"].share > 0.5

    # the text: the summary's top categories and the phase table name it by its label
    assert "device time: MoE expert GEMMs" in result.stdout
    assert any(line.split("  ")[0].strip() == "MoE expert GEMMs" for line in result.stdout.splitlines())
    # the verdict's sentence calls its kernels by its words
    verdict = next(v for v in doc.verdicts if v.phase == "decode")
    assert verdict.what == "expert_gemm" and verdict.sentence.startswith("The experts' GEMMs take the most device")
    # the HTML: its bars in its colour, its label in the legend and the tables
    page = out_html.read_text(encoding="utf-8")
    assert '"color":"#123abc"' in page and '"name":"MoE expert GEMMs"' in page
    assert "<td>MoE expert GEMMs</td><td>compute</td>" in page
    # the planner: its role, and its time in the weights part of the measured step
    categories = categories_of(doc)
    assert categories["expert_gemm"].role == "weights"
    parts = captured.phase_parts(decode, captured.Streaming(time={}, calls={}, categories=categories))
    weights = sum(c.per_step_us for name, c in decode.categories.items() if categories[name].role == "weights")
    assert parts["weights"] == pytest.approx(weights)
    assert parts["weights"] >= decode.categories["expert_gemm"].per_step_us


def test_a_saved_analysis_renders_its_categories_with_the_taxonomy_gone(tmp_path: Path) -> None:
    """The document keeps the resolved table (schema version 2): ``report`` shows the user category's label and
    colour after its taxonomy file is deleted, as the JSON's own category_table (plain json) says them."""
    import json

    taxonomy, out_json, page = tmp_path / "mine.toml", tmp_path / "a.json", tmp_path / "again.html"
    taxonomy.write_text(USER_TAXONOMY, encoding="utf-8")
    env = {"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"}
    made = CliRunner().invoke(app, ["analyze", str(EXAMPLE), "--taxonomy", str(taxonomy), "-o", str(out_json)],
                              env=env)
    assert made.exit_code == 0, made.output
    taxonomy.unlink()
    entry = json.loads(out_json.read_bytes())["category_table"]["expert_gemm"]
    assert (entry["label"], entry["colour"], entry["role"]) == ("MoE expert GEMMs", "#123abc", "weights")
    text = CliRunner().invoke(app, ["report", str(out_json)], env=env)
    assert text.exit_code == 0, text.output
    assert "device time: MoE expert GEMMs" in text.stdout
    html = CliRunner().invoke(app, ["report", str(out_json), "--html", str(page)], env=env)
    assert html.exit_code == 0, html.output
    assert '"color":"#123abc"' in page.read_text(encoding="utf-8")
