"""A taxonomy file read and checked: its categories, and its name, launch, sequence and precision rules.

The schema is documented in the header of ``servescope/data/taxonomy.toml``; the categories are read by
:mod:`servescope.core.categories` (the reports and the planner read them too). Every problem is one
:class:`~servescope.core.errors.InputError` naming the file and, for a rule, its table and 1-based position,
e.g. ``my.toml: rule 3: bad regex '(': missing ), ...``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec

from servescope.core.categories import BUILTIN_SOURCE, CATEGORY_OTHER, GROUPS, Category, category_table
from servescope.core.errors import InputError
from servescope.core.needle import AnyOf, Needled, any_of, needled

__all__ = [
    "FIXED",
    "FRAME_KINDS",
    "PRECISION_ROLES",
    "RULE_KINDS",
    "PrecisionRule",
    "Rule",
    "TaxonomyFile",
    "is_literal",
    "joined",
    "parse_taxonomy",
]

# Kinds whose category is fixed by the event kind; rules apply to the others.
FIXED = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RULE_KINDS = ("kernel", "cpu_op")
# Launch rules match the CPU-side frames around a launch: operators, annotations, python functions / modules.
FRAME_KINDS = ("cpu_op", "annotation", "python")
# Precision rules: what a kernel does to the number format of its data, read from its name or launching op.
PRECISION_ROLES = ("quantize", "dequantize", "cast")
_INHERITS = ("previous_collective",)
_SCHEMA_VERSION = 1
_TOP_FIELDS = ("version", "precision_standalone", "precision_evidence", "categories", "rule", "launch", "sequence",
               "precision")
_COMMON_FIELDS = ("category", "regex", "ignore_case", "kinds", "note")
_RULE_FIELDS = (*_COMMON_FIELDS, "outranks_launch")
_LAUNCH_FIELDS = (*_COMMON_FIELDS, "inherit", "refines")
_SEQUENCE_FIELDS = ("category", "regex", "note")
# table name -> (fields, the kinds a rule may name)
_TABLES = {"rule": (_RULE_FIELDS, RULE_KINDS), "launch": (_LAUNCH_FIELDS, FRAME_KINDS),
           "sequence": (_SEQUENCE_FIELDS, ("cpu_op",))}
_PRECISION_FIELDS = ("role", "regex", "requires", "on", "ignore_case", "note")
_PRECISION_ON = ("name", "launch")
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
        return joined(self.patterns, self.flags)


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

    def compile(self) -> tuple[AnyOf, tuple[Needled, ...]]:
        """Its patterns and its requirements, compiled with their needles found (once: kept for every later call)."""
        flags = re.IGNORECASE if self.ignore_case else 0
        return any_of(self.patterns, flags), needled(self.requires, flags)

    def matches(self, name: str, lower: str | None = None) -> bool:
        """Whether one of ``patterns`` and each of ``requires`` is found in ``name`` (each pattern alone, and only
        where the name holds its needle: the same answer as their joined regex, faster on long names). ``lower``:
        ``name.lower()`` when ``name`` is ASCII (lowered once for every rule), else None."""
        if lower is None and name.isascii():
            lower = name.lower()
        patterns, requires = self.compile()
        return patterns.found(name, lower) and all(p.found(name, lower) for p in requires)


@cache
def joined(patterns: tuple[str, ...], flags: int) -> re.Pattern[str]:
    """``patterns`` as one regex (any of them matching), compiled once."""
    return re.compile("|".join(f"(?:{text})" for text in patterns), flags)


def is_literal(text: str) -> bool:
    """A pattern with no regex syntax: found with ``in``, never compiled."""
    return re.escape(text) == text and text.isascii()


@dataclass(frozen=True)
class TaxonomyFile:
    """What one taxonomy file declares. For a user file, ``categories`` are the bundled ones with the file's put
    over them; ``rules`` are by table (``rule``, ``launch``, ``sequence``), in file order;
    ``precision_standalone`` is None where the file does not give it."""

    categories: dict[str, Category]
    rules: dict[str, tuple[Rule, ...]]
    precision: tuple[PrecisionRule, ...]
    precision_standalone: frozenset[str] | None


def parse_taxonomy(document: Mapping[str, Any], source: str, *, bundled: TaxonomyFile | None,
                   regexes_checked: bool = False) -> TaxonomyFile:
    """The taxonomy file ``document`` (parsed TOML, read from ``source``), checked: the bundled one when
    ``bundled`` is None (every rule needs a note; ``memcpy``, ``memset`` and ``other`` must be declared), else a
    user file read on top of ``bundled``. ``regexes_checked``: this very file's regexes compiled without a problem
    before (the bundled file, once per install), so they are not compiled here.

    Raises:
        InputError: an unknown field or a wrong type, a bad regex, a rule naming a category no file declares.
    """
    _check_fields(document, _TOP_FIELDS, source, where="")
    version = document.get("version", _SCHEMA_VERSION)
    if version != _SCHEMA_VERSION or isinstance(version, bool):
        raise InputError(source, f"version: {version!r} is not supported (only {_SCHEMA_VERSION})")
    require_note = bundled is None
    if bundled is not None and "precision_evidence" in document:
        raise InputError(source, "precision_evidence: only the bundled taxonomy sets it")
    categories = category_table(document, source, None if bundled is None else bundled.categories)
    raw_rules = _raw_rules(document, source, require_note=require_note)
    if bundled is None:
        missing = [c for c in (*FIXED.values(), CATEGORY_OTHER) if c not in categories]
        if missing:
            raise InputError(source, f"categories {missing} are required")
    rules = {table: tuple(_compile_rule(raw, source, categories, regexes_checked) for raw in raws)
             for table, raws in raw_rules.items()}
    precision, standalone = _parse_precision(document, source, categories, require_note=require_note,
                                             regexes_checked=regexes_checked)
    return TaxonomyFile(categories, rules, precision, standalone)


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


def _raw_rules(document: Mapping[str, Any], source: str, *, require_note: bool) -> dict[str, list[_RawRule]]:
    rules: dict[str, list[_RawRule]] = {}
    for table in _TABLES:
        raw_rules = document.get(table, [])
        if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
            raise InputError(source, f"{table}: must be an array of tables ([[{table}]])")
        rules[table] = [_parse_rule(raw, i, source, require_note=require_note, table=table)
                        for i, raw in enumerate(raw_rules, start=1)]
    return rules
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
    if refines is not None and refines not in GROUPS:
        raise InputError(source, f"{where}refines: one of {', '.join(map(repr, GROUPS))}")

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


def _compile_rule(raw: _RawRule, source: str, categories: Mapping[str, Category], regexes_checked: bool) -> Rule:
    """The rule, its regexes checked (plain-text patterns need no check; nor do regexes checked before)."""
    where = f"{raw.table} {raw.index}: "
    if raw.category not in categories:
        raise InputError(source, f"{where}category {raw.category!r} is not declared in [categories]")
    flags = re.IGNORECASE if raw.ignore_case else 0
    for text in raw.patterns:
        if not is_literal(text) and not regexes_checked:
            _check_regex(text, flags, source, where)
    if source != BUILTIN_SOURCE:  # a user's patterns must also join into one regex
        try:
            joined(raw.patterns, flags)
        except re.error:
            raise InputError(source, f"{where}bad regex: {_NO_INLINE_FLAGS}") from None
    return Rule(raw.category, raw.patterns, raw.ignore_case, raw.kinds, raw.note, source, raw.index, raw.table,
                raw.inherit, raw.refines, raw.outranks_launch)


def _parse_precision(document: Mapping[str, Any], source: str, categories: Mapping[str, Category], *,
                     require_note: bool, regexes_checked: bool = False,
                     ) -> tuple[tuple[PrecisionRule, ...], frozenset[str] | None]:
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
        for text in () if regexes_checked else (*patterns, *requires):
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
