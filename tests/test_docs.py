"""The documentation: generated pages match what generates them, the JSON key tables describe real documents,
the README stays a front door, and CI builds the site strictly.

The key tables are checked twice: the committed page equals ``tools/gen_json_keys.py``'s output from the
``core/`` types, and, read back from the Markdown as a user would read it, the tables account for every key of
real documents (a fresh ``analyze --example --json``; recordings of bench serve, settings and bench gemm runs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from tracefiles import tool as load_tool

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.mark.parametrize(("tool", "page"), [("gen_json_keys", "json-keys.md"),
                                            ("gen_cli_reference", "commands.md")])
def test_the_generated_page_is_what_its_script_writes(tool: str, page: str) -> None:
    written = (DOCS / page).read_text(encoding="utf-8")
    assert written == load_tool(tool).render(), f"docs/{page} is out of date: run .venv/bin/python tools/{tool}.py"


# ------------------------------------------------------------------------------------------------ key tables

_HEADING = re.compile(r"^#{2,3} .*\{#([\w-]+)\}\s*$")
_ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| (.*?) \| (.*) \|$")


def _tables() -> dict[str, dict[str, tuple[str, bool]]]:
    """Anchor → {key: (type text, required)}, read from docs/json-keys.md's Markdown."""
    tables: dict[str, dict[str, tuple[str, bool]]] = {}
    current: dict[str, tuple[str, bool]] | None = None
    for line in (DOCS / "json-keys.md").read_text(encoding="utf-8").splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = tables.setdefault(heading[1], {})
        elif current is not None and (row := _ROW.match(line)):
            current[row[1]] = (row[2].replace("\\|", "|"), row[3].strip() == "")
    return tables


def _split_union(text: str) -> list[str]:
    """``A | B`` at the top level (not inside brackets or braces)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if depth == 0 and text.startswith(" | ", i):
            parts.append(text[start:i])
            start = i + 3
    return [*parts, text[start:]]


def _problems(value: Any, type_text: str, tables: dict[str, dict[str, tuple[str, bool]]], path: str) -> list[str]:
    """What in ``value`` the documented type does not account for (empty: it does)."""
    alternatives = _split_union(type_text.strip())
    if value is None:
        return [] if "null" in alternatives or "any" in alternatives else [f"{path}: null, documented {type_text}"]
    best: list[str] | None = None
    for alt in alternatives:
        found = _problems_one(value, alt.strip(), tables, path)
        if not found:
            return []
        best = found if best is None or len(found) < len(best) else best
    return best or [f"{path}: no type"]


def _problems_one(value: Any, text: str, tables: dict[str, dict[str, tuple[str, bool]]], path: str) -> list[str]:
    if (link := re.fullmatch(r"\[\w+\]\(#([\w-]+)\)", text)):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, documented an object ({text})"]
        table = tables[link[1]]
        out = [f"{path}.{key}: not documented in #{link[1]}" for key in value if key not in table]
        for key, (sub, _required) in table.items():
            if key in value:
                out += _problems(value[key], sub, tables, f"{path}.{key}")
        return out
    if text.startswith("list[") and text.endswith("]"):
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, documented {text}"]
        return [p for i, item in enumerate(value) for p in _problems(item, text[5:-1], tables, f"{path}[{i}]")]
    if text.startswith("[") and text.endswith("]"):  # a fixed tuple
        return [] if isinstance(value, list) else [f"{path}: documented {text}"]
    if text.startswith("{") and text.endswith("}"):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, documented {text}"]
        inner = text[1:-1].split(": ", 1)[1]
        return [p for key, item in value.items() for p in _problems(item, inner, tables, f"{path}.{key}")]
    plain = {"int": int, "float": (int, float), "str": str, "bool": bool, "any": object}
    if text in plain:
        ok = isinstance(value, plain[text]) and not (text in ("int", "float") and isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r}, documented {text}"]
    if text.startswith("`"):  # a literal
        return [] if json.dumps(value) in text else [f"{path}: {value!r}, documented {text}"]
    return [f"{path}: cannot read the documented type {text!r}"]


def _check(document: dict[str, Any], anchor: str, *, all_required: bool) -> None:
    tables = _tables()
    assert anchor in tables, f"docs/json-keys.md has no #{anchor}"
    problems = _problems(document, f"[Doc](#{anchor})", tables, "$")
    assert problems == []
    if all_required:  # a fresh document carries every key the page says is required
        missing = [key for key, (_, required) in tables[anchor].items() if required and key not in document]
        assert missing == []


def test_the_key_tables_account_for_a_fresh_analysis() -> None:
    result = CliRunner().invoke(app, ["analyze", "--example-name", "vllm-cpu-tp2", "--json"])
    assert result.exit_code == 0, result.output
    _check(json.loads(result.stdout), "analysisdoc", all_required=True)


@pytest.mark.parametrize(("recording", "anchor", "outside"), [
    ("tests/data/h200-vllm/recorded/settings-dense.json", "settingsdoc", ()),
    ("benchmarks/results/h200-vllm-bench-2026-12-03/bench.json", "serveresult", ()),
    ("tests/data/h200/gemm_bench.json", "gemmbenchdoc", ()),
    # `profile --json` is the analysis plus two keys that no core type declares yet (report/profile.py adds them)
    ("tests/data/vllm-cpu-profile/tp2_b4.analysis.json", "analysisdoc", ("trace_files", "profile")),
])
def test_the_key_tables_account_for_recorded_documents(recording: str, anchor: str, outside: tuple[str, ...]) -> None:
    document = json.loads((ROOT / recording).read_text(encoding="utf-8"))
    for key in outside:
        assert document.pop(key, None) is not None, f"{key} is gone from {recording}: drop it from this list"
    _check(document, anchor, all_required=False)


def test_an_undocumented_key_is_caught() -> None:
    """The check above can fail: a key the tables do not list, or a value of another type, is named."""
    tables = _tables()
    result = CliRunner().invoke(app, ["analyze", "--example", "--json"])
    doc = json.loads(result.stdout)
    doc["ranks"][0]["phases"]["decode"]["no_such_key"] = 1
    doc["traces"][0]["events"] = "many"
    problems = _problems(doc, "[Doc](#analysisdoc)", tables, "$")
    assert sorted(problems) == ["$.ranks[0].phases.decode.no_such_key: not documented in #analysisdoc-phasestats",
                                "$.traces[0].events: 'many', documented int"]


# ------------------------------------------------------------------------------------------------ README, CI

README = ROOT / "README.md"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"


# The README's screens that run here from bundled data; the others come from recordings of the lent H200.
_RUNNABLE = ("servescope analyze --example", "servescope plan --model kimi-k2.5 --hardware rtx-pro-6000 --gpus 8")


def _screens() -> list[tuple[str, list[str]]]:
    """(command, output lines) of each README block that starts with `$ servescope`, `[…]` markers left out."""
    out = []
    for block in re.findall(r"```\n\$ (servescope[^\n]*)\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        out.append((block[0], [line for line in block[1].splitlines() if not line.startswith("[…")]))
    return out


@pytest.mark.parametrize("command", _RUNNABLE)
def test_the_readmes_screen_is_what_the_command_prints(command: str) -> None:
    """Each line the README shows is in the command's output at 100 columns, in order: real output, trimmed."""
    [(shown_command, shown)] = [(c, lines) for c, lines in _screens() if c.startswith(command)]
    result = CliRunner().invoke(app, shown_command.split()[1:], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    printed = iter(line.rstrip() for line in result.stdout.splitlines())
    missing = [line for line in shown if not any(line == p for p in printed)]
    assert missing == [], f"README.md's `{shown_command}` shows lines the command no longer prints: update it"


# The README's screens of recorded GPU runs: each is its document rendered again by `report` (the answer it printed)
_RECORDED = {"servescope bench serve http://127.0.0.1:8012": "tests/data/knee/h100/knee-seqs.json",
             "servescope tune --launch": "tests/data/tune/h100/tune-seqs.json"}


@pytest.mark.parametrize("command", sorted(_RECORDED))
def test_the_readmes_recorded_screens_are_their_documents(command: str) -> None:
    [shown] = [lines for c, lines in _screens() if c.startswith(command)]
    shown = [line for line in shown if not line.startswith("    ")]  # the command's own continuation lines
    result = CliRunner().invoke(app, ["report", str(ROOT / _RECORDED[command])], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    printed = iter(line.rstrip() for line in result.stdout.splitlines())
    missing = [line for line in shown if not any(line == p for p in printed)]
    assert missing == [], f"README.md's `{command}` shows lines its document no longer renders: update it"


def test_the_readmes_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, "the README links to its docs"
    assert [t for t in targets if t and not (ROOT / t).exists()] == []
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"install.md", "commands.md", "json-keys.md", "methods.md", "measurements.md"} <= pages


def test_every_docs_page_is_in_the_nav() -> None:
    """mkdocs.yml's nav lists each page of docs/ (mkdocs build --strict in CI checks links and anchors)."""
    nav = re.findall(r"^\s+- (?:[^:]+: )?([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"),
                     re.M)
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))


def test_ci_builds_the_docs_strictly() -> None:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "'.[docs]'" in text and "mkdocs build --strict" in text
