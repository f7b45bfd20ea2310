"""The code names only ids the data defines (issue 39): category names, collectives, rule ids, verdict kinds, engine
names, step formats and step sources that a string constant in ``src/`` names are checked against the data files
that declare them; and reading a data file that names an id the others do not define is an error naming the file
and the id.

A string constant names a data id by where it stands: compared with (``==``, ``!=``, ``in``) or assigned by keyword
to something called ``category``, ``collective``, ``engine``, ``serves``, ``step_source`` or ``verdict``; a key of
``rules[...]`` / ``cats[...]``; the argument of ``engine(...)`` / ``.step(...)``; or any ``comm.*`` string (the
communication categories' form). ``test_a_planted_unknown_id_fails`` shows the walk failing on one of each.
"""

from __future__ import annotations

import ast
import copy
import tomllib
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest

from servescope.core.categories import bundled_categories
from servescope.core.engines import engine_ids
from servescope.core.errors import InputError
from servescope.trace.rules.findings import check_categories, load_rules
from servescope.trace.steps.formats import _entry, step_formats

SRC = Path(__file__).resolve().parents[1] / "src" / "servescope"

# what a compared / keyword name says the string is
_BY_NAME = {"category": "category", "top_category": "category", "collective": "collective", "engine": "engine",
            "serves": "engine", "step_source": "step_source", "verdict": "verdict"}
_BY_CONTAINER = {"cats": "category", "categories": "category"}
# in a module that reads the findings data (findings.toml, findings-serve.toml), ``rules[...]`` and ``x.id == ...``
# name rules ("rules" and "id" elsewhere are other files' tables: taxonomy rules, deployment settings)
_RULES_READERS = ("load_rules", "load_serve_rules", "findings.toml")
_BY_CALL = {"engine": "engine", "check_engine": "engine", "step": "step", "engine_words": "engine"}


def vocabulary() -> dict[str, set[str]]:
    """Every id the data files define, by kind."""
    categories = bundled_categories()
    rules = load_rules()
    serve = tomllib.loads((files("servescope") / "data" / "findings-serve.toml").read_text(encoding="utf-8"))
    formats = step_formats()
    return {
        "category": set(categories),
        "collective": {c.collective for c in categories.values() if c.collective},
        "rule": set(rules["rules"]) | {k for k, v in serve.items() if isinstance(v, dict)},
        "verdict": set(rules["verdict"]["kinds"]),
        # "training": steps.toml's [training] ops say a run is one (no serving engine's flags)
        "engine": set(engine_ids()) | {"training"},
        "step": {f.id for f in formats.steps},
        "step_source": {f.step_source for f in formats.steps} | {formats.gaps_source, formats.whole_source},
    }


def _tail(node: ast.AST) -> str | None:
    """The name an expression ends in: ``x.category`` -> category, ``engine`` -> engine."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value  # spec["verdict"]
    return None


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants ``node`` is, or holds as a tuple / list / set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _strings(item)


def named_ids(source: str) -> Iterator[tuple[str, str, int]]:
    """(kind, id, line) of each string constant in ``source`` that names a data id (see the module)."""
    by_name, by_container = dict(_BY_NAME), dict(_BY_CONTAINER)
    if any(word in source for word in _RULES_READERS):
        by_name["id"] = by_container["rules"] = "rule"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            kinds = {by_name[t] for t in map(_tail, sides) if t in by_name}
            for kind in kinds:
                for side in sides:
                    for const in _strings(side):
                        yield kind, const.value, const.lineno
        elif isinstance(node, ast.keyword) and node.arg in _BY_NAME:
            for const in _strings(node.value):
                yield _BY_NAME[node.arg], const.value, const.lineno
        elif isinstance(node, ast.Subscript) and _tail(node.value) in by_container:
            for const in _strings(node.slice):
                yield by_container[str(_tail(node.value))], const.value, const.lineno
        elif isinstance(node, ast.Call) and _tail(node.func) in _BY_CALL and node.args:
            for const in _strings(node.args[0]):
                yield _BY_CALL[str(_tail(node.func))], const.value, const.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("comm."):
            if node.value[5:].replace("_", "").isalpha():
                yield "category", node.value, node.lineno


def unknown_ids(source: str, where: str, vocab: dict[str, set[str]]) -> list[str]:
    """``where:line: kind 'id'`` for each id ``source`` names that the data does not define."""
    return [f"{where}:{line}: {kind} {value!r}" for kind, value, line in sorted(set(named_ids(source)),
                                                                                key=lambda k: (k[2], k[0], k[1]))
            if value not in vocab[kind]]


def test_the_code_names_only_ids_the_data_defines() -> None:
    vocab = vocabulary()
    found: list[str] = []
    named = 0
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        named += sum(1 for _ in named_ids(text))
        found += unknown_ids(text, str(path.relative_to(SRC)), vocab)
    assert not found, "ids no data file defines:\n" + "\n".join(found)
    assert named >= 10  # the walk sees the code's ids (it would pass vacuously on a walk that found none)


@pytest.mark.parametrize(("planted", "kind"), [
    ('if row.category == "comm.all_reduse": pass', "category 'comm.all_reduse'"),
    ('x = cats["atention"].share', "category 'atention'"),
    ('if c.collective in ("all_to_al",): pass', "collective 'all_to_al'"),
    ('spec = load_rules()["rules"]; spec = rules["launch_bonud"]', "rule 'launch_bonud'"),
    ('rules = load_rules()\nif f.id == "host_gapp": pass', "rule 'host_gapp'"),
    ('e = DeploymentInput(source="x", engine="vlm")', "engine 'vlm'"),
    ('if args.engine != "tgi": pass', "engine 'tgi'"),
    ('fmt = step_formats().step("vllm-v2")', "step 'vllm-v2'"),
    ('ok = ra.step_source in ("annotation", "frames")', "step_source 'frames'"),
    ('if spec["verdict"] == "hosted": pass', "verdict 'hosted'"),
])
def test_a_planted_unknown_id_fails(planted: str, kind: str) -> None:
    """The walk that passes on the tree fails on one planted unknown id of each kind, and names it."""
    found = unknown_ids(planted, "planted.py", vocabulary())
    assert found == [f"planted.py:{planted.count(chr(10)) + 1}: {kind}"]


def test_the_tree_passes_with_each_planted_line_removed() -> None:
    """A known id in the same places is no failure: what fails above is the id, not the form."""
    known = ['if row.category == "comm.all_reduce": pass', 'spec = load_rules()["rules"]["launch_bound"]',
             'e = DeploymentInput(engine="vllm")', 'fmt = step_formats().step("vllm")',
             'ok = ra.step_source in ("annotation", "execute_model")', 'if c.collective == "all_to_all": pass']
    assert not unknown_ids("\n".join(known), "known.py", vocabulary())


# -- reading data that names an unknown id is an error naming the file and the id --------------------------------

def test_a_step_format_serving_an_unknown_engine_is_an_error() -> None:
    with pytest.raises(InputError, match=r"data/steps\.toml: \[\[step\]\] x: serves: engine 'tgi' is not defined "
                                         r"in data/engines\.toml"):
        _entry({"id": "x", "serves": "tgi"}, "[[step]]")


def test_a_kernel_family_naming_an_unknown_category_is_an_error() -> None:
    data = copy.deepcopy(load_rules())
    data["kernels"]["unfused"]["categories"].append("elementwize")
    with pytest.raises(InputError, match=r"findings\.toml: kernels\.unfused: category 'elementwize' is not defined"):
        check_categories(data, "data/findings.toml", bundled_categories())


def test_a_catalogue_naming_an_unknown_engine_is_an_error() -> None:
    from servescope.core.engines import check_engine

    with pytest.raises(InputError, match=r"data/changes\.toml: engine: engine 'tgi' is not "
                                         r"defined in data/engines\.toml \(vllm, sglang\)"):
        check_engine("tgi", "data/changes.toml", "engine")


def test_an_engine_default_of_an_unknown_setting_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from servescope.core import engines as engines_module
    from servescope.trace.rules import deployment

    planted = msgspec.structs.replace(engines_module.engine("vllm"), default=(
        engines_module.EngineDefault(setting="async_schedulin", since="0.26.0", value="on"),))
    monkeypatch.setattr(deployment, "engines", lambda: (planted,))
    deployment.load_deployment_rules.cache_clear()
    try:
        with pytest.raises(InputError, match=r"data/engines\.toml: engine vllm: default of setting 'async_schedulin', "
                                             r"which data/deployment\.toml does not define"):
            deployment.load_deployment_rules()
    finally:
        deployment.load_deployment_rules.cache_clear()


def test_a_taxonomy_marking_a_collective_on_a_compute_category_is_an_error() -> None:
    from servescope.core.categories import category_table

    with pytest.raises(InputError, match=r"my\.toml: categories\.mine: collective 'all_reduce'"):
        category_table({"categories": {"mine": {"group": "compute", "collective": "all_reduce"}}}, "my.toml")


def test_every_data_file_naming_an_engine_names_a_defined_one() -> None:
    """steps.toml's serves and changes.toml's engine, as shipped; the engines' defaults name deployment settings."""
    from servescope.core.changes import catalogue_engine
    from servescope.trace.rules.deployment import load_deployment_rules

    ids = set(engine_ids())
    assert {f.serves for f in step_formats().steps if f.serves} <= ids
    from servescope.core.engines import engines

    assert {d.setting for e in engines() for d in e.default} <= set(load_deployment_rules()["settings"])
    assert catalogue_engine() in ids
