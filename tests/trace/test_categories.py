"""A category's group, label, colour and planner role are data (``[categories]`` of taxonomy.toml), read once by
servescope.core.categories for the analysis, the reports and the planner alike."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from servescope.core.analysis import AnalysisDoc
from servescope.core.categories import (
    GROUPS,
    ROLES,
    Category,
    bundled_categories,
    categories_of,
    category_entries,
    category_table,
)
from servescope.core.errors import InputError
from servescope.trace.classify.taxonomy import load_taxonomy


def test_every_bundled_category_has_a_colour_and_the_planners_roles() -> None:
    bundled = bundled_categories()
    assert list(bundled) == list(load_taxonomy().categories)  # one table, in display order
    for category in bundled.values():
        assert category.group in GROUPS and category.role in ROLES
        assert category.label == category.name  # the reports show the bundled names as they always did
        assert category.colour is not None and category.colour.startswith("#")
    assert bundled["comm.all_reduce"].colour == "#d62728"
    roles = {role: sorted(n for n, c in bundled.items() if c.role == role) for role in ROLES}
    assert roles["weights"] == ["gemm", "moe", "quantize"]
    assert roles["attention"] == ["attention"]
    assert roles["collectives"] == sorted(n for n in bundled if n.startswith("comm."))


USER = """
[categories]
widgets = { group = "compute", label = "fused widgets", colour = "#123abc", role = "weights", words = "widget kernels" }
norm = { group = "compute", label = "norms", colour = "#000000" }
plain = "memory"
"""


def test_a_user_file_adds_categories_and_relabels_a_bundled_one() -> None:
    import tomllib

    table = category_table(tomllib.loads(USER), "mine.toml", under=bundled_categories())
    assert table["widgets"] == Category("widgets", "compute", "fused widgets", "#123abc", "weights", "widget kernels")
    assert table["plain"] == Category("plain", "memory", "plain", None, "other")
    assert table["plain"].said == "plain"  # no words: a sentence uses its label
    # its role and its words kept
    assert table["norm"] == Category("norm", "compute", "norms", "#000000", "other", "norms")
    names = list(table)
    assert names[-3:] == ["widgets", "plain", "other"]  # new ones before "other"
    assert names.index("norm") == list(bundled_categories()).index("norm")  # a bundled one keeps its place


BAD = {
    "colour": ('x = { group = "compute", colour = "red" }', "categories.x: colour 'red' is not #rrggbb"),
    "role": ('x = { group = "compute", role = "kv" }', "categories.x: role 'kv' is not one of"),
    "field": ('x = { group = "compute", color = "#000000" }', "categories.x: unknown field 'color'"),
    "label": ('x = { group = "compute", label = "" }', "categories.x: label"),
    "group": ('x = { label = "x" }', "categories.x: group None"),
    "moved": ('gemm = { group = "memory" }', "categories.gemm: the bundled taxonomy puts it in group 'compute'"),
    "type": ("x = 3", "categories.x: a group, or a table"),
    "words": ('x = { group = "compute", words = "" }', "categories.x: words must be a line of text"),
}


@pytest.mark.parametrize(("entry", "problem"), BAD.values(), ids=BAD.keys())
def test_a_bad_category_entry_is_one_line_naming_it(tmp_path: Path, entry: str, problem: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(f"[categories]\n{entry}\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_taxonomy(path)
    assert caught.value.source == str(path)
    assert problem in caught.value.problem


def _doc(taxonomy: str, categories: dict[str, str], version: int = 1) -> AnalysisDoc:
    return AnalysisDoc(servescope_version="0", created_at="", platform={}, options={"taxonomy": taxonomy},
                       inputs=[], traces=[], ranks=[], kernels=[], device_totals={}, categories=categories,
                       across_ranks=[], findings=[], schema_version=version)


def test_a_version_1_document_gets_its_categories_from_the_taxonomy_it_names(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(USER, encoding="utf-8")
    groups = dict(load_taxonomy(path).categories)
    mine = categories_of(_doc(str(path), groups).upgraded())
    assert mine["widgets"].label == "fused widgets" and mine["widgets"].role == "weights"
    assert mine["gemm"] == bundled_categories()["gemm"]
    gone = categories_of(_doc(str(tmp_path / "moved-away.toml"), groups).upgraded())  # its file gone
    assert gone["widgets"] == Category("widgets", "compute", "widgets", None, "other")
    assert gone["gemm"] == bundled_categories()["gemm"]
    builtin = categories_of(_doc("builtin", {"gemm": "compute"}).upgraded())
    assert builtin == {"gemm": bundled_categories()["gemm"]}


def test_a_current_document_reads_its_categories_from_itself_alone(tmp_path: Path) -> None:
    """Schema version 2 keeps the resolved table: the taxonomy file moved away, the document still says it."""
    path = tmp_path / "mine.toml"
    path.write_text(USER, encoding="utf-8")
    taxonomy = load_taxonomy(path)
    doc = msgspec.structs.replace(_doc(str(path), dict(taxonomy.categories), version=2),
                                  category_table=category_entries(taxonomy.table))
    path.unlink()
    mine = categories_of(doc)
    assert mine == dict(taxonomy.table) and mine["widgets"].label == "fused widgets"
    assert doc.upgraded() is doc
    # without a table (a document made by hand), a category takes its group's defaults, no taxonomy read
    assert categories_of(_doc(str(path), {"widgets": "compute"}, version=2))["widgets"] == Category(
        "widgets", "compute", "widgets", None, "other")
