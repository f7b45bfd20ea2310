"""Kernel and operator names → categories (``gemm``, ``comm.all_reduce``, …), by ordered rules kept as data.

The rules live in ``servescope/data/taxonomy.toml``, whose header documents the schema. Each rule lists
regular expressions searched in the operation's name; the first rule that matches names the category, and
a name no rule matches is :data:`CATEGORY_OTHER`. Memory copies and sets are categorised by their event
kind, not their name. A user file in the same schema is tried before the bundled rules, so it can correct
a misclassification or add categories without editing the package. Its ``[[precision]]`` rules say, apart
from the category, which kernels quantize, dequantize or cast (:mod:`servescope.trace.precision`).

Example:
    >>> tax = load_taxonomy()
    >>> tax.classify("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(...)", "kernel")
    'comm.all_reduce'
    >>> tax.is_communication("comm.all_reduce")
    True
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from servescope.core.errors import InputError

__all__ = ["CATEGORY_OTHER", "FRAME_KINDS", "PRECISION_ROLES", "PrecisionRule", "Rule", "Taxonomy", "load_taxonomy"]

CATEGORY_OTHER = "other"
_GROUPS = ("communication", "compute", "memory", "other")
_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op")
# Kinds whose category is fixed by the event kind; rules apply to the others.
_FIXED = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_RULE_KINDS = ("kernel", "cpu_op")
# Launch rules match the CPU-side frames around a launch: operators, annotations, python functions / modules.
FRAME_KINDS = ("cpu_op", "annotation", "python")
_INHERITS = ("previous_collective",)
_SCHEMA_VERSION = 1
_TOP_FIELDS = ("version", "precision_standalone", "categories", "rule", "launch", "sequence", "precision")
_COMMON_FIELDS = ("category", "regex", "ignore_case", "kinds", "note")
_RULE_FIELDS = (*_COMMON_FIELDS, "outranks_launch")
_LAUNCH_FIELDS = (*_COMMON_FIELDS, "inherit", "refines")
_SEQUENCE_FIELDS = ("category", "regex", "note")
# table name -> (fields, the kinds a rule may name)
_TABLES = {"rule": (_RULE_FIELDS, _RULE_KINDS), "launch": (_LAUNCH_FIELDS, FRAME_KINDS),
           "sequence": (_SEQUENCE_FIELDS, ("cpu_op",))}
# Precision rules: what a kernel does to the number format of its data, read from its name or launching op.
PRECISION_ROLES = ("quantize", "dequantize", "cast")
_PRECISION_FIELDS = ("role", "regex", "requires", "on", "ignore_case", "note")
_PRECISION_ON = ("name", "launch")
_BUILTIN_SOURCE = "servescope/data/taxonomy.toml"
# Global inline flags would change how the whole rule matches, and cannot be joined with other patterns.
_INLINE_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE | re.ASCII
_NO_INLINE_FLAGS = "inline flags such as (?i) are not allowed; use ignore_case = true"


class Rule(msgspec.Struct, frozen=True):
    """One classification rule: a name in which any of ``patterns`` is found is ``category``.

    ``pattern`` is the patterns joined into one regex (``re.IGNORECASE`` when ``ignore_case``), searched
    anywhere in the name. ``kinds`` are the operation kinds it applies to (``kernel``, ``cpu_op``);
    ``source`` is the file it came from and ``index`` its 1-based position there, so a report can say
    which rule decided.
    """

    category: str
    patterns: tuple[str, ...]
    ignore_case: bool
    kinds: frozenset[str]
    note: str
    source: str
    index: int
    table: str = "rule"  # "rule" (names), "launch" (frames around a launch), "sequence" (runs of operators)
    inherit: str | None = None  # launch rules: "previous_collective" takes the category of the collective waited on
    refines: str | None = None  # launch rules: decide only work whose name rules file it in this group or "other"
    # name rules: the name lists what the kernel computes (Inductor's fused kernels), so its category outranks a
    # launching op that names another kind of work (the GEMM the kernel feeds)
    outranks_launch: bool = False

    @property
    def flags(self) -> int:
        return re.IGNORECASE if self.ignore_case else 0

    @property
    def pattern(self) -> re.Pattern[str]:
        """The patterns joined into one regex, compiled on first use (classify rarely needs it)."""
        return _joined(self.patterns, self.flags)


@cache

def _check_regex(text: str, flags: int, source: str, where: str) -> None:
    """One line naming the rule when ``text`` is not a Python regex, or sets flags inline.

    Raises:
        InputError: it does not compile, or it sets inline flags.
    """
    try:
        compiled = re.compile(text, flags)
    except re.error as exc:
        raise InputError(source, f"{where}bad regex {text!r}: {exc}") from None
    if compiled.flags & _INLINE_FLAGS & ~flags:
        raise InputError(source, f"{where}bad regex {text!r}: {_NO_INLINE_FLAGS}")

def _joined(patterns: tuple[str, ...], flags: int) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{text})" for text in patterns), flags)


def _is_literal(text: str) -> bool:
    """A pattern with no regex syntax: found with ``in``, never compiled."""
    return re.escape(text) == text and text.isascii()


class PrecisionRule(msgspec.Struct, frozen=True):
    """One precision rule: work whose name (``on = "name"``, a kernel's own name) or launching operator
    (``on = "launch"``, a ``cpu_op`` frame around the kernel's launch) matches any of ``patterns`` and each of
    ``requires`` quantizes, dequantizes or casts (``role``)."""

    role: str
    patterns: tuple[str, ...]
    requires: tuple[str, ...]
    on: str
    ignore_case: bool
    note: str
    source: str
    index: int

    def matches(self, name: str) -> bool:
        flags = re.IGNORECASE if self.ignore_case else 0
        return _joined(self.patterns, flags).search(name) is not None and all(
            _joined((part,), flags).search(name) is not None for part in self.requires)


# A rule as classify tests it: (category, ignore_case, plain-text patterns, other regexes, the rule).
_Matcher = tuple[str, bool, tuple[str, ...], tuple[re.Pattern[str], ...], Rule]


def _matcher(rule: Rule) -> _Matcher:
    """The rule in a form that is fast to test and matches exactly the names ``rule.pattern`` matches.

    Python's ``re`` tries every alternative at every position of a name, and demangled kernel names run
    to a thousand characters. So the plain-text patterns (most of them) are tested with ``in``, on the
    lower-cased name for ``ignore_case`` rules (the same as IGNORECASE for ASCII text), and only the rest
    as regexes, one at a time so that ``^``-anchored ones stop at the first character.
    """
    literals: list[str] = []
    regexes: list[re.Pattern[str]] = []
    for text in rule.patterns:
        if _is_literal(text):
            literals.append(text.lower() if rule.ignore_case else text)
        else:
            regexes.append(re.compile(text, rule.flags))
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
            if regex.search(name) is not None:
                return matcher
    return None


@dataclass(frozen=True)
class Taxonomy:
    """Categories with their groups, and the ordered rules that map operation names onto them.

    Attributes:
        categories: category name → group (``communication``, ``compute``, ``memory``, ``other``), in
            display order.
        source: ``"builtin"``, or the path of the user file whose rules are tried before the bundled ones.
        rules: every rule in the order it is tried, user rules first.
    """

    categories: dict[str, str]
    source: str
    rules: tuple[Rule, ...] = ()
    launch_rules: tuple[Rule, ...] = ()
    sequence_rules: tuple[Rule, ...] = ()
    precision_rules: tuple[PrecisionRule, ...] = ()
    # categories whose kernels do nothing but quantize or cast when a precision rule marks them (else the
    # quantization is fused into a kernel of another layer: a norm, an activation, a GEMM's prologue)
    precision_standalone: frozenset[str] = frozenset()
    _by_kind: dict[str, tuple[_Matcher, ...]] = field(init=False, repr=False, compare=False)
    _by_frame: dict[str, tuple[_Matcher, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        matchers = [(rule.kinds, _matcher(rule)) for rule in self.rules]
        by_kind = {kind: tuple(m for kinds, m in matchers if kind in kinds) for kind in _RULE_KINDS}
        object.__setattr__(self, "_by_kind", by_kind)
        frames = [(rule.kinds, _matcher(rule)) for rule in self.launch_rules]
        object.__setattr__(self, "_by_frame",
                           {kind: tuple(m for kinds, m in frames if kind in kinds) for kind in FRAME_KINDS})

    def launch_rule(self, name: str, kind: str) -> Rule | None:
        """The first launch rule matching a frame named ``name`` of ``kind`` (``cpu_op``, ``annotation``,
        ``python``), or None: such a frame says nothing about the kernels launched inside it."""
        found = _first(self._by_frame[kind], name)
        return found[4] if found is not None else None

    def name_rule(self, name: str, kind: str) -> Rule | None:
        """The first name rule matching ``name`` of ``kind`` (``kernel``, ``cpu_op``), or None."""
        found = _first(self._by_kind.get(kind, ()), name)
        return found[4] if found is not None else None

    def precision(self, name: str, on: str) -> str | None:
        """The role (``quantize``, ``dequantize``, ``cast``) of the first precision rule reading ``on`` (``name``:
        a kernel's own name; ``launch``: a cpu_op around its launch) that ``name`` matches, or None."""
        return next((rule.role for rule in self.precision_rules if rule.on == on and rule.matches(name)), None)

    def classify(self, name: str, kind: str) -> str:
        """The category of an operation named ``name`` of event kind ``kind``.

        Args:
            name: the kernel or operator name as the trace spells it.
            kind: one of ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cpu_op``. Copies and sets are
                ``memcpy`` / ``memset`` whatever their name.

        Raises:
            ValueError: ``kind`` is not one of the four.
        """
        fixed = _FIXED.get(kind)
        if fixed is not None:
            return fixed
        matchers = self._by_kind.get(kind)
        if matchers is None:
            raise ValueError(f"kind {kind!r} is not one of: {', '.join(_KINDS)}")
        found = _first(matchers, name)
        return found[0] if found is not None else CATEGORY_OTHER

    def is_communication(self, category: str) -> bool:
        """Whether ``category`` belongs to the ``communication`` group (False for unknown names)."""
        return self.categories.get(category) == "communication"


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
    builtin_categories, builtin_rules, builtin_precision = _builtin()
    if path is None:
        return Taxonomy(categories=dict(builtin_categories), source="builtin", rules=builtin_rules["rule"],
                        launch_rules=builtin_rules["launch"], sequence_rules=builtin_rules["sequence"],
                        precision_rules=builtin_precision[0], precision_standalone=builtin_precision[1])

    source = str(path)
    document = _read_toml(Path(path), source)
    user_categories, raw_rules = _parse_document(document, source, require_note=False)
    categories = _merge_categories(builtin_categories, user_categories, source)
    user = {table: tuple(_compile_rule(raw, source, categories) for raw in raws) for table, raws in raw_rules.items()}
    precision, standalone = _parse_precision(document, source, categories, require_note=False)
    return Taxonomy(categories=categories, source=source, rules=user["rule"] + builtin_rules["rule"],
                    launch_rules=user["launch"] + builtin_rules["launch"],
                    sequence_rules=user["sequence"] + builtin_rules["sequence"],
                    precision_rules=precision + builtin_precision[0],
                    precision_standalone=builtin_precision[1] if standalone is None else standalone)


_Precision = tuple[tuple[PrecisionRule, ...], frozenset[str]]


@lru_cache(maxsize=1)
def _builtin() -> tuple[dict[str, str], dict[str, tuple[Rule, ...]], _Precision]:
    text = (resources.files("servescope") / "data" / "taxonomy.toml").read_text(encoding="utf-8")
    document = _loads(text, _BUILTIN_SOURCE)
    categories, raw_rules = _parse_document(document, _BUILTIN_SOURCE, require_note=True)
    missing = [c for c in (*_FIXED.values(), CATEGORY_OTHER) if c not in categories]
    if missing:
        raise InputError(_BUILTIN_SOURCE, f"categories {missing} are required")
    precision, standalone = _parse_precision(document, _BUILTIN_SOURCE, categories, require_note=True)
    return categories, {table: tuple(_compile_rule(raw, _BUILTIN_SOURCE, categories) for raw in raws)
                        for table, raws in raw_rules.items()}, (precision, standalone or frozenset())


def _parse_precision(document: Mapping[str, Any], source: str, categories: Mapping[str, str], *,
                     require_note: bool) -> tuple[tuple[PrecisionRule, ...], frozenset[str] | None]:
    """The ``[[precision]]`` rules and the ``precision_standalone`` categories (None: not given)."""
    standalone = document.get("precision_standalone")
    if standalone is not None:
        if not isinstance(standalone, list) or not all(isinstance(c, str) for c in standalone):
            raise InputError(source, "precision_standalone: must be a list of category names")
        unknown = [c for c in standalone if c not in categories]
        if unknown:
            raise InputError(source, f"precision_standalone: category {unknown[0]!r} is not declared in [categories]")
    raws = document.get("precision", [])
    if not isinstance(raws, list) or not all(isinstance(r, dict) for r in raws):
        raise InputError(source, "precision: must be an array of tables ([[precision]])")
    rules: list[PrecisionRule] = []
    for index, raw in enumerate(raws, start=1):
        where = f"precision {index}: "
        _check_fields(raw, _PRECISION_FIELDS, source, where=where)
        role = raw.get("role")
        if role not in PRECISION_ROLES:
            raise InputError(source, f"{where}role: one of {', '.join(map(repr, PRECISION_ROLES))}")
        on = raw.get("on", "name")
        if on not in _PRECISION_ON:
            raise InputError(source, f"{where}on: one of {', '.join(map(repr, _PRECISION_ON))}")
        ignore_case = raw.get("ignore_case", False)
        if not isinstance(ignore_case, bool):
            raise InputError(source, f"{where}ignore_case: must be true or false")
        patterns = _patterns(raw.get("regex"), source, f"{where}regex")
        requires = _patterns(raw.get("requires", []), source, f"{where}requires", empty=True)
        note = raw.get("note", "")
        if not isinstance(note, str) or (require_note and not note.strip()):
            raise InputError(source, f"{where}note: a short note on the kernel family is required")
        flags = re.IGNORECASE if ignore_case else 0
        for text in (*patterns, *requires):
            _check_regex(text, flags, source, where)
        rules.append(PrecisionRule(role, patterns, requires, on, ignore_case, note, source, index))
    return tuple(rules), (frozenset(standalone) if standalone is not None else None)


def _patterns(value: Any, source: str, where: str, *, empty: bool = False) -> tuple[str, ...]:
    patterns = (value,) if isinstance(value, str) else value
    if not isinstance(patterns, list | tuple) or not (patterns or empty) or not all(
            isinstance(p, str) and p for p in patterns):
        raise InputError(source, f"{where}: one pattern or a {'' if empty else 'non-empty '}list of patterns "
                                 "is required")
    return tuple(patterns)


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(source, "no such file") from None
    except IsADirectoryError:
        raise InputError(source, "is a directory, not a TOML file") from None
    except UnicodeDecodeError:
        raise InputError(source, "not UTF-8 text") from None
    except OSError as exc:
        raise InputError(source, f"cannot read: {exc.strerror or exc}") from None
    return _loads(text, source)


def _loads(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, f"bad TOML: {exc}") from None


class _RawRule(msgspec.Struct, frozen=True):
    index: int
    category: str
    patterns: tuple[str, ...]
    ignore_case: bool
    kinds: frozenset[str]
    note: str
    table: str = "rule"
    inherit: str | None = None
    refines: str | None = None
    outranks_launch: bool = False


def _parse_document(
    document: Mapping[str, Any], source: str, *, require_note: bool
) -> tuple[dict[str, str], dict[str, list[_RawRule]]]:
    _check_fields(document, _TOP_FIELDS, source, where="")
    version = document.get("version", _SCHEMA_VERSION)
    if version != _SCHEMA_VERSION or isinstance(version, bool):
        raise InputError(source, f"version: {version!r} is not supported (only {_SCHEMA_VERSION})")

    raw_categories = document.get("categories", {})
    if not isinstance(raw_categories, dict):
        raise InputError(source, "categories: must be a table of category = group")
    categories: dict[str, str] = {}
    for name, group in raw_categories.items():
        if group not in _GROUPS:
            raise InputError(
                source, f"categories.{name}: group {group!r} is not one of: {', '.join(_GROUPS)}"
            )
        categories[name] = group

    rules: dict[str, list[_RawRule]] = {}
    for table in _TABLES:
        raw_rules = document.get(table, [])
        if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
            raise InputError(source, f"{table}: must be an array of tables ([[{table}]])")
        rules[table] = [_parse_rule(raw, i, source, require_note=require_note, table=table)
                        for i, raw in enumerate(raw_rules, start=1)]
    return categories, rules


def _parse_rule(raw: Mapping[str, Any], index: int, source: str, *, require_note: bool,
                table: str = "rule") -> _RawRule:
    where = f"{table} {index}: "
    fields, kinds_allowed = _TABLES[table]
    _check_fields(raw, fields, source, where=where)

    category = raw.get("category")
    if not isinstance(category, str) or not category:
        raise InputError(source, f"{where}category: a category name is required")

    regex = raw.get("regex")
    patterns = (regex,) if isinstance(regex, str) else regex
    if (
        not isinstance(patterns, list | tuple)
        or not patterns
        or not all(isinstance(p, str) and p for p in patterns)
    ):
        raise InputError(source, f"{where}regex: one pattern or a non-empty list of patterns is required")

    ignore_case = raw.get("ignore_case", False)
    if not isinstance(ignore_case, bool):
        raise InputError(source, f"{where}ignore_case: must be true or false")

    kinds = raw.get("kinds", list(kinds_allowed))
    if (
        not isinstance(kinds, list)
        or not kinds
        or not all(isinstance(k, str) and k in kinds_allowed for k in kinds)
    ):
        raise InputError(source, f"{where}kinds: a non-empty list of {', '.join(map(repr, kinds_allowed))}")

    inherit = raw.get("inherit")
    if inherit is not None and inherit not in _INHERITS:
        raise InputError(source, f"{where}inherit: one of {', '.join(map(repr, _INHERITS))}")
    refines = raw.get("refines")
    if refines is not None and refines not in _GROUPS:
        raise InputError(source, f"{where}refines: one of {', '.join(map(repr, _GROUPS))}")

    outranks = raw.get("outranks_launch", False)
    if not isinstance(outranks, bool):
        raise InputError(source, f"{where}outranks_launch: must be true or false")

    note = raw.get("note", "")
    if not isinstance(note, str) or (require_note and not note.strip()):
        raise InputError(source, f"{where}note: a short note on the kernel family is required")

    return _RawRule(index, category, tuple(patterns), ignore_case, frozenset(kinds), note, table, inherit, refines,
                    outranks)


def _check_fields(table: Mapping[str, Any], allowed: Iterable[str], source: str, *, where: str) -> None:
    allowed = tuple(allowed)
    unknown = [key for key in table if key not in allowed]
    if unknown:
        raise InputError(source, f"{where}unknown field {unknown[0]!r} (allowed: {', '.join(allowed)})")


def _merge_categories(builtin: Mapping[str, str], user: Mapping[str, str], source: str) -> dict[str, str]:
    for name, group in user.items():
        if name in builtin and builtin[name] != group:
            raise InputError(
                source,
                f"categories.{name}: the bundled taxonomy puts it in group {builtin[name]!r}; "
                f"declare a new category instead of moving it to {group!r}",
            )
    added = {name: group for name, group in user.items() if name not in builtin}
    merged = {name: group for name, group in builtin.items() if name != CATEGORY_OTHER}
    merged.update(added)
    merged[CATEGORY_OTHER] = builtin[CATEGORY_OTHER]
    return merged


def _compile_rule(raw: _RawRule, source: str, categories: Mapping[str, str]) -> Rule:
    """The rule, its regexes checked (plain-text patterns need no check)."""
    where = f"{raw.table} {raw.index}: "
    if raw.category not in categories:
        raise InputError(source, f"{where}category {raw.category!r} is not declared in [categories]")
    flags = re.IGNORECASE if raw.ignore_case else 0
    for text in raw.patterns:
        if not _is_literal(text):
            _check_regex(text, flags, source, where)
    if source != _BUILTIN_SOURCE:  # a user's patterns must also join into one regex
        try:
            _joined(raw.patterns, flags)
        except re.error:
            raise InputError(source, f"{where}bad regex: {_NO_INLINE_FLAGS}") from None
    return Rule(raw.category, raw.patterns, raw.ignore_case, raw.kinds, raw.note, source, raw.index, raw.table,
                raw.inherit, raw.refines, raw.outranks_launch)
