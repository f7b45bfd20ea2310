"""Kernel and operator names → categories (``gemm``, ``comm.all_reduce``, …), by ordered rules kept as data.

The rules live in ``servescope/data/taxonomy.toml``, whose header documents the schema (read and checked by
:mod:`servescope.trace.classify.taxonomy_file`). Each rule lists regular expressions searched in the operation's
name; the first rule that matches names the category, and a name no rule matches is ``other``. Memory copies and sets
are categorised by their event kind, not their name. A user file in the same schema is tried before the bundled rules,
so it can correct a misclassification or add categories without editing the package. Its ``[[precision]]`` rules
say, apart from the category, which kernels quantize, dequantize or cast (:mod:`servescope.trace.classify.precision`).

Example:
    >>> tax = load_taxonomy()
    >>> tax.classify("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(...)", "kernel")
    'comm.all_reduce'
    >>> tax.is_communication("comm.all_reduce")
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from servescope.core.bundled import code_stamp, data_stamp, read_derived, write_derived
from servescope.core.categories import (
    BUILTIN_SOURCE,
    CATEGORY_OTHER,
    COMMUNICATION,
    Category,
    bundled_taxonomy,
    read_taxonomy,
)
from servescope.core.needle import AnyOf, Needled, automaton, keep_needles
from servescope.trace.classify import taxonomy_file
from servescope.trace.classify.taxonomy_file import (
    FIXED,
    FRAME_KINDS,
    RULE_KINDS,
    PrecisionRule,
    Rule,
    TaxonomyFile,
    is_literal,
    parse_taxonomy,
)

__all__ = ["Taxonomy", "load_taxonomy"]

_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op")


def load_taxonomy(path: str | Path | None = None) -> Taxonomy:
    """The bundled taxonomy, or the bundled one under a user file whose rules are tried first.

    Args:
        path: a TOML file in the schema of ``servescope/data/taxonomy.toml``. It may declare new
            categories (added before ``other`` in display order) and rules for any declared category.

    Raises:
        InputError: the file is missing or unreadable, is not TOML, has an unknown field or a wrong type,
            a bad regex, or a rule naming a category no file declares. The error names the file and, for
            a rule, its 1-based position, e.g. ``my.toml: rule 3: bad regex '(': missing ), ...``.

    Example:
        >>> load_taxonomy("my-taxonomy.toml").classify("my_fused_kernel", "kernel")  # doctest: +SKIP
        'gemm'
    """
    bundled = _bundled()
    if path is None:
        return Taxonomy(categories={name: c.group for name, c in bundled.categories.items()}, source="builtin",
                        words={name: c.said for name, c in bundled.categories.items()}, table=bundled.categories,
                        rules=bundled.rules["rule"], launch_rules=bundled.rules["launch"],
                        sequence_rules=bundled.rules["sequence"], precision_rules=bundled.precision,
                        precision_standalone=bundled.precision_standalone or frozenset())
    source = str(path)
    user = parse_taxonomy(read_taxonomy(Path(path), source), source, bundled=bundled)
    return Taxonomy(categories={name: c.group for name, c in user.categories.items()}, source=source,
                    words={name: c.said for name, c in user.categories.items()}, table=user.categories,
                    rules=user.rules["rule"] + bundled.rules["rule"],
                    launch_rules=user.rules["launch"] + bundled.rules["launch"],
                    sequence_rules=user.rules["sequence"] + bundled.rules["sequence"],
                    precision_rules=user.precision + bundled.precision,
                    precision_standalone=(bundled.precision_standalone or frozenset()
                                          if user.precision_standalone is None else user.precision_standalone))


@cache
def _bundled() -> TaxonomyFile:
    """The bundled taxonomy, checked; its ~150 regexes compiled to check them only the first time this install
    reads this very file (then noted in the cache folder of servescope.core.bundled: ~7 ms a run)."""
    data = data_stamp("taxonomy.toml")
    stamp = f"{data} {code_stamp(taxonomy_file.__file__)}"  # this file, checked by this code
    checked = bool(data) and read_derived("taxonomy-checked", stamp) is not None
    parsed = parse_taxonomy(bundled_taxonomy(), BUILTIN_SOURCE, bundled=None, regexes_checked=checked)
    if data and not checked:
        write_derived("taxonomy-checked", stamp, {})
    return parsed


@dataclass(frozen=True)
class Taxonomy:
    """Categories with their groups, and the ordered rules that map operation names onto them.

    Attributes:
        categories: category name → group (``communication``, ``compute``, ``memory``, ``other``), in
            display order.
        source: ``"builtin"``, or the path of the user file whose rules are tried before the bundled ones.
        rules: every rule in the order it is tried, user rules first.
        words: category name → what a sentence calls its kernels (taxonomy.toml's ``words``, else its label).
        table: category name → everything its entry declares (role, collective, generic, by_name: the marks code
            reads instead of naming categories).
    """

    categories: dict[str, str]
    source: str
    words: dict[str, str] = field(default_factory=dict)
    table: dict[str, Category] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    launch_rules: tuple[Rule, ...] = ()
    sequence_rules: tuple[Rule, ...] = ()
    precision_rules: tuple[PrecisionRule, ...] = ()
    # categories whose kernels do nothing but quantize or cast when a precision rule marks them (else the
    # quantization is fused into a kernel of another layer: a norm, an activation, a GEMM's prologue)
    precision_standalone: frozenset[str] = frozenset()
    _by_kind: dict[str, _Index] = field(init=False, repr=False, compare=False)
    _by_frame: dict[str, _Index] = field(init=False, repr=False, compare=False)
    _precision: dict[str, tuple[tuple[str, AnyOf, tuple[Needled, ...]], ...]] = field(
        init=False, repr=False, compare=False)  # by what they read (on): each rule's role, patterns, requirements

    def __post_init__(self) -> None:
        matchers = [(rule.kinds, _matcher(rule)) for rule in self.rules]
        by_kind = {kind: _Index(tuple(m for kinds, m in matchers if kind in kinds)) for kind in RULE_KINDS}
        object.__setattr__(self, "_by_kind", by_kind)
        frames = [(rule.kinds, _matcher(rule)) for rule in self.launch_rules]
        object.__setattr__(self, "_by_frame",
                           {kind: _Index(tuple(m for kinds, m in frames if kind in kinds)) for kind in FRAME_KINDS})
        precision: dict[str, list[tuple[str, AnyOf, tuple[Needled, ...]]]] = {}
        for rule in self.precision_rules:  # compiled now: analyze loads the taxonomy while the traces decode
            precision.setdefault(rule.on, []).append((rule.role, *rule.compile()))
        object.__setattr__(self, "_precision", {on: tuple(rules) for on, rules in precision.items()})
        keep_needles()

    def marked(self, mark: str) -> list[str]:
        """The categories whose entry sets the boolean ``mark`` (``generic``, ``by_name``)."""
        return [name for name, c in self.table.items() if getattr(c, mark)]

    def launch_rule(self, name: str, kind: str) -> Rule | None:
        """The first launch rule matching a frame named ``name`` of ``kind`` (``cpu_op``, ``annotation``,
        ``python``), or None: such a frame says nothing about the kernels launched inside it."""
        found = self._by_frame[kind].first(name)
        return found[4] if found is not None else None

    def name_rule(self, name: str, kind: str) -> Rule | None:
        """The first name rule matching ``name`` of ``kind`` (``kernel``, ``cpu_op``), or None."""
        index = self._by_kind.get(kind)
        found = index.first(name) if index is not None else None
        return found[4] if found is not None else None

    def precision(self, name: str, on: str) -> str | None:
        """The role (``quantize``, ``dequantize``, ``cast``) of the first precision rule reading ``on`` (``name``:
        a kernel's own name; ``launch``: a cpu_op around its launch) that ``name`` matches, or None."""
        lower = name.lower() if name.isascii() else None
        for role, patterns, requires in self._precision.get(on, ()):
            if patterns.found(name, lower) and all(p.found(name, lower) for p in requires):
                return role
        return None

    def classify(self, name: str, kind: str) -> str:
        """The category of an operation named ``name`` of event kind ``kind``.

        Args:
            name: the kernel or operator name as the trace spells it.
            kind: one of ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cpu_op``. Copies and sets are
                ``memcpy`` / ``memset`` whatever their name.

        Raises:
            ValueError: ``kind`` is not one of the four.
        """
        return self.decide(name, kind)[0]

    def decide(self, name: str, kind: str) -> tuple[str, Rule | None]:
        """The category of an operation named ``name`` of event kind ``kind`` (as :meth:`classify`) and the name
        rule that gave it (None: a copy or set, or no rule matched).

        Raises:
            ValueError: ``kind`` is not one of the four.
        """
        fixed = FIXED.get(kind)
        if fixed is not None:
            return fixed, None
        index = self._by_kind.get(kind)
        if index is None:
            raise ValueError(f"kind {kind!r} is not one of: {', '.join(_KINDS)}")
        found = index.first(name)
        return (found[0], found[4]) if found is not None else (CATEGORY_OTHER, None)

    def is_communication(self, category: str) -> bool:
        """Whether ``category`` belongs to the ``communication`` group (False for unknown names)."""
        return self.categories.get(category) == COMMUNICATION


# A rule as classify tests it: (category, ignore_case, plain-text patterns, other regexes, the rule).
_Matcher = tuple[str, bool, tuple[str, ...], tuple[Needled, ...], Rule]


def _matcher(rule: Rule) -> _Matcher:
    """The rule in a form that is fast to test and matches exactly the names ``rule.pattern`` matches.

    Python's ``re`` tries every alternative at every position of a name, and demangled kernel names run
    to a thousand characters. So the plain-text patterns (most of them) are tested with ``in``, on the
    lower-cased name for ``ignore_case`` rules (the same as IGNORECASE for ASCII text), and only the rest
    as regexes, one at a time so that ``^``-anchored ones stop at the first character, each only where the name
    holds the plain text every match of it contains (:class:`~servescope.core.needle.Needled`).
    """
    literals: list[str] = []
    regexes: list[Needled] = []
    for text in rule.patterns:
        if is_literal(text):
            literals.append(text.lower() if rule.ignore_case else text)
        else:
            regexes.append(Needled.of(text, rule.flags))
    return rule.category, rule.ignore_case, tuple(literals), tuple(regexes), rule


def _first(matchers: tuple[_Matcher, ...], name: str) -> _Matcher | None:
    """The first of ``matchers`` whose rule matches ``name``."""
    folded = name.lower() if name.isascii() else None
    in_name = name.__contains__  # any(map(...)) tests the plain-text patterns without a Python loop
    in_folded = folded.__contains__ if folded is not None else None
    for matcher in matchers:
        _, ignore_case, literals, regexes, rule = matcher
        if ignore_case:
            if in_folded is None:  # not ASCII: lower() is not IGNORECASE there
                if rule.pattern.search(name) is not None:
                    return matcher
                continue
            if literals and any(map(in_folded, literals)):
                return matcher
        elif literals and any(map(in_name, literals)):
            return matcher
        for regex in regexes:
            if regex.found(name, folded):
                return matcher
    return None


class _Index:
    """:func:`_first` over ``matchers`` for many names, in one pass over each name.

    A name is tested against a hundred-odd rules; testing them one by one costs a Python loop of ~50 µs a name,
    whatever its length. Here every plain-text pattern of the rules, and every needle of their regexes (the plain
    text each match of it must hold), is found in one pass over the name (and one over its lower-cased form for
    the ``ignore_case`` ones) by an Aho-Corasick automaton (pyahocorasick). The first rule with a plain-text
    pattern found bounds the answer; before it, only the regexes whose needles were found (or that have none)
    are searched, in rule order. The answer is :func:`_first`'s, name for name (tests/trace/test_pattern_index.py);
    a name that is not ASCII takes :func:`_first` itself (``lower()`` is not IGNORECASE there).
    """

    __slots__ = ("_folded", "_needleless", "_plain", "_regexes", "matchers")

    def __init__(self, matchers: tuple[_Matcher, ...]) -> None:
        self.matchers = matchers
        plain: dict[str, list[tuple[int, int]]] = {}  # text sought in the name -> (rule, -1 | its regex)
        folded: dict[str, list[tuple[int, int]]] = {}  # the same, sought in the lower-cased name
        self._regexes: dict[tuple[int, int], Needled] = {}  # (rule, which regex of it) -> the regex
        needleless: list[tuple[int, int]] = []  # the regexes searched whatever the name holds
        for i, (_, ignore_case, literals, regexes, _rule) in enumerate(matchers):
            for text in literals:
                (folded if ignore_case else plain).setdefault(text, []).append((i, -1))
            for j, regex in enumerate(regexes):
                self._regexes[i, j] = regex
                if not regex.needles:
                    needleless.append((i, j))
                for needle in regex.needles:
                    (folded if regex.ignore_case else plain).setdefault(needle, []).append((i, j))
        self._needleless = tuple(needleless)
        self._plain, self._folded = automaton(plain), automaton(folded)

    def first(self, name: str) -> _Matcher | None:
        """The first of the matchers whose rule matches ``name``."""
        if not name.isascii():
            return _first(self.matchers, name)
        bound = len(self.matchers)  # the first rule with a plain-text pattern in the name
        found: list[tuple[int, int]] = []  # regexes whose needles are in the name
        for words, text in ((self._plain, name), (self._folded, name.lower())):
            if words is None:
                continue
            for _, hits in words.iter(text):
                for i, j in hits:
                    if j < 0:
                        bound = min(bound, i)
                    else:
                        found.append((i, j))
        # the regexes that may match, in rule order: those whose needles were found and those without any
        for i, j in sorted({*found, *self._needleless}) if found else self._needleless:
            if i >= bound:
                break
            if self._regexes[i, j].regex.search(name) is not None:
                return self.matchers[i]
        return self.matchers[bound] if bound < len(self.matchers) else None
