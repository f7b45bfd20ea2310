"""The one-pass pattern indexes answer as the regexes do, name for name.

The taxonomy's rule index (:class:`~servescope.trace.classify.taxonomy.Taxonomy`'s ``name_rule`` / ``launch_rule``)
gives the rule that trying each rule's own joined regex in order gives, and :func:`~servescope.core.needle.any_of`
says whether one of a pattern set's regexes is found, for every pattern set of the findings, deployment and
precision rules: on every name of the bundled examples' and the test data's traces (kernels, operators,
annotations, python frames), on the names of ``known_names.txt``, and on made-up names that mix the rules' own
plain text with other characters (some not ASCII, where lower-casing is not what IGNORECASE does)."""

from __future__ import annotations

import re
import string
from functools import cache
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.needle import any_of
from servescope.trace.classify.taxonomy import Taxonomy, load_taxonomy
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.rules.deployment import load_deployment_rules
from servescope.trace.rules.findings import load_rules

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted([*(ROOT / "tests" / "data").rglob("*.pt.trace.json.gz"),
                 *(ROOT / "src" / "servescope" / "data" / "examples").rglob("*.pt.trace.json.gz")])


def _by_each_rule(tax: Taxonomy, name: str, kind: str, frame: bool) -> object:
    """The rule the index must give: the first whose whole pattern (its joined regex) is found in ``name``."""
    rules = tax.launch_rules if frame else tax.rules
    return next((r for r in rules if kind in r.kinds and r.pattern.search(name) is not None), None)


def _pattern_sets() -> list[tuple[tuple[str, ...], int]]:
    """Every pattern set the rules test with :func:`any_of` (findings, deployment, precision), with its flags."""
    sets: list[tuple[tuple[str, ...], int]] = []
    for table in ("kernels", "conditions"):
        for spec in load_rules().get(table, {}).values():
            sets += [(tuple(spec[k]), 0) for k in ("patterns", "exclude", "kernels") if isinstance(spec.get(k), list)]
    for spec in load_deployment_rules()["settings"].values():
        sets += [(tuple(spec[k]), 0) for k in ("frames_on", "frames_off", "kernels") if spec.get(k)]
    sets += [(rule.patterns, re.IGNORECASE if rule.ignore_case else 0) for rule in load_taxonomy().precision_rules]
    return sets


_SETS = _pattern_sets()


def _check(tax: Taxonomy, names: list[str]) -> int:
    compared = 0
    for name in names:
        for kind in ("kernel", "cpu_op"):
            assert tax.name_rule(name, kind) is _by_each_rule(tax, name, kind, frame=False), (kind, name)
            compared += 1
        for kind in ("cpu_op", "annotation", "python"):
            assert tax.launch_rule(name, kind) is _by_each_rule(tax, name, kind, frame=True), (kind, name)
            compared += 1
        for patterns, flags in _SETS:
            by_each = any(re.compile(p, flags).search(name) is not None for p in patterns)  # re's own cache
            assert any_of(patterns, flags).found(name) == by_each, (patterns, name)
    return compared


@cache
def _trace_names() -> list[str]:
    names: set[str] = set()
    for path in TRACES:
        names.update(n for n in decode_trace(path).names if isinstance(n, str))
    return sorted(names)


def test_every_name_of_the_test_traces() -> None:
    names = _trace_names()
    assert len(TRACES) > 20 and len(names) > 1000  # the traces are there: kernels, ops, frames of many runs
    assert _check(load_taxonomy(), names) == 5 * len(names)
    # sets with enough needles for the automaton are among them (the rest test each needle with ``in``)
    assert len(_SETS) > 20 and sum(any_of(p, f)._plain is not None or any_of(p, f)._folded is not None
                                   for p, f in _SETS) >= 3


def test_the_known_names() -> None:
    lines = (ROOT / "tests" / "trace" / "known_names.txt").read_text(encoding="utf-8").splitlines()
    names = [line.split(None, 2)[2].split("  # ")[0] for line in lines if line and not line.startswith("#")]
    assert len(names) > 100
    _check(load_taxonomy(), names)


def _rule_words() -> list[str]:
    """Plain text the bundled rules look for (cut out of their patterns): the made-up names are built from it."""
    tax = load_taxonomy()
    words: set[str] = set()
    for rule in (*tax.rules, *tax.launch_rules):
        for text in rule.patterns:
            words.update(w for w in "".join(c if c.isalnum() or c in "_:" else " " for c in text).split() if len(w) > 2)
    return sorted(words)


_WORDS = _rule_words()
_OTHER = st.text(alphabet=string.ascii_letters + string.digits + "_<>:,()* ." + "éßİ", max_size=6)


_FOLDS = str.maketrans({"s": "\u017f", "k": "\u212a", "i": "\u0130"})  # ſ, the Kelvin sign, İ: IGNORECASE folds
# ſ and K onto s and k, where lower() leaves them as they are


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_WORDS), st.sampled_from(_WORDS).map(str.upper),
                          st.sampled_from(_WORDS).map(lambda w: w.translate(_FOLDS)), _OTHER), max_size=8))
def test_made_up_names(parts: list[str]) -> None:
    _check(load_taxonomy(), ["".join(parts), "_".join(parts), " ".join(parts).lower()])
