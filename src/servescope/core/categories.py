"""What each category of the taxonomy is: its group, the label reports show, its colour and its role in the planner.

Categories are data, declared in ``[categories]`` of ``servescope/data/taxonomy.toml`` and of a user taxonomy read
on top of it (``analyze --taxonomy FILE``), either as ``name = "group"`` or as
``name = { group = "compute", label = "…", colour = "#1f77b4", role = "weights", words = "…" }``. A label defaults to
the name (``words``, what the verdict's sentence calls the category's kernels, to the label),
a colour to a stable hue of the group's (the HTML report picks it), a role to ``collectives`` for a category of the
``communication`` group and ``other`` for the rest. So adding a category is one entry there, and the reports and
the planner (:func:`categories_of`) learn it without a change of code.

An analysis document keeps each category's group (``categories``) and the rest as its taxonomy resolved it
(``category_table``: :func:`category_entries`); :func:`categories_of` reads both from the document alone, never the
taxonomy again. A version-1 document, written before the table, gets it on reading from the taxonomy it names
(:func:`legacy_category_table`: the user file where it still is, else the bundled one).

Example:
    >>> bundled_categories()["gemm"].role
    'weights'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Protocol

import msgspec

from servescope.core.bundled import bundled_toml
from servescope.core.errors import InputError
from servescope.core.files import unreadable


class CategorisedDoc(Protocol):
    """What of an analysis document (``core.analysis.AnalysisDoc``) the category table is read from."""

    @property
    def categories(self) -> dict[str, str]: ...

    @property
    def category_table(self) -> dict[str, CategoryEntry]: ...

    @property
    def options(self) -> dict[str, Any]: ...

__all__ = [
    "BUILTIN_SOURCE",
    "CATEGORY_OTHER",
    "COMMUNICATION",
    "GROUPS",
    "ROLES",
    "Category",
    "CategoryTable",
    "bundled_categories",
    "bundled_taxonomy",
    "categories_of",
    "category_entries",
    "category_table",
    "legacy_category_table",
    "read_taxonomy",
]

GROUPS = ("communication", "compute", "memory", "other")
COMMUNICATION = "communication"
CATEGORY_OTHER = "other"  # what a name no rule matches is
# The parts of a step the planner prices apart (servescope.plan.captured splits a capture into them): the weights
# read, the KV read, the collectives, and the rest.
ROLES = ("weights", "attention", "collectives", "other")
BUILTIN_SOURCE = "servescope/data/taxonomy.toml"
_FIELDS = ("group", "label", "colour", "role", "words", "collective", "generic", "by_name", "streams")
_COLLECTIVE = re.compile(r"[a-z][a-z0-9_]*")
_COLOUR = re.compile(r"#[0-9a-fA-F]{6}")
_UNREADABLE = {FileNotFoundError: "no such file", IsADirectoryError: "is a directory, not a TOML file",
               UnicodeDecodeError: "not UTF-8 text"}


@dataclass(frozen=True)
class Category:
    """One category: ``group`` (one of :data:`GROUPS`), the ``label`` reports show, its ``colour`` (``#rrggbb``;
    None: the report picks a hue of the group's), its ``role`` in the planner (one of :data:`ROLES`) and the
    ``words`` a sentence calls its kernels by ("GEMMs take the most device time"; None: the label). Marks the
    rules and the planner read instead of naming categories: ``collective``, the collective a communication
    category's kernels run (``all_reduce``: what the planner prices them as and the findings compare); ``generic``,
    a name in it says nothing of the layer it serves (a copy, a fill, a sort, unknown: a replayed kernel of such a
    name may stand for another at its place); ``by_name``, its operators are filed by their own name wherever they
    run (bookkeeping: views, allocation), never by a launching operator around them; ``streams``, every kernel of
    this weights category reads a weight matrix (gemm: the planner prices all of its time as weight reads; in
    another weights category only the kernels whose name says GEMM)."""

    name: str
    group: str
    label: str
    colour: str | None
    role: str
    words: str | None = None
    collective: str | None = None
    generic: bool = False
    by_name: bool = False
    streams: bool = False

    @property
    def said(self) -> str:
        """What a sentence calls the category's kernels: its words, else its label."""
        return self.words or self.label


class CategoryTable(dict[str, Category]):
    """A document's categories by name; a name it does not declare reads as a category of group ``other``,
    labelled by its name, coloured by the report and counted as ``other`` by the planner."""

    def __missing__(self, name: str) -> Category:
        return _unknown(name, CATEGORY_OTHER)


def _default_role(group: str) -> str:
    return "collectives" if group == COMMUNICATION else "other"


def _unknown(name: str, group: str) -> Category:
    return Category(name, group, name, None, _default_role(group))


def category_table(document: Mapping[str, Any], source: str,
                   under: Mapping[str, Category] | None = None) -> dict[str, Category]:
    """The categories a taxonomy file declares, in its order; with ``under`` (the bundled table), that table with
    the file's categories put over it: a category it declares again keeps its group and takes the fields the file
    gives, a new one comes before ``other``.

    Raises:
        InputError: ``[categories]`` is not a table, a category's entry has an unknown field, a group not in
            :data:`GROUPS`, a bundled category moved to another group, an empty label, a colour not ``#rrggbb`` or
            a role not in :data:`ROLES`.
    """
    raw = document.get("categories", {})
    if not isinstance(raw, dict):
        raise InputError(source, "categories: must be a table of category = group")
    declared = {name: _entry(name, value, source, (under or {}).get(name)) for name, value in raw.items()}
    if under is None:
        return declared
    merged = {name: category for name, category in under.items() if name != CATEGORY_OTHER}
    merged.update((name, category) for name, category in declared.items() if name != CATEGORY_OTHER)
    merged[CATEGORY_OTHER] = declared.get(CATEGORY_OTHER, under[CATEGORY_OTHER])
    return merged


def _entry(name: str, value: Any, source: str, bundled: Category | None) -> Category:
    where = f"categories.{name}"
    fields = {"group": value} if isinstance(value, str) else value
    if not isinstance(fields, dict):
        raise InputError(source, f"{where}: a group, or a table of {', '.join(_FIELDS)}")
    unknown = [key for key in fields if key not in _FIELDS]
    if unknown:
        raise InputError(source, f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(_FIELDS)})")
    group = fields.get("group")
    if group not in GROUPS:
        raise InputError(source, f"{where}: group {group!r} is not one of: {', '.join(GROUPS)}")
    if bundled is not None and bundled.group != group:
        raise InputError(source, f"{where}: the bundled taxonomy puts it in group {bundled.group!r}; "
                                 f"declare a new category instead of moving it to {group!r}")
    base = bundled or _unknown(name, group)
    label = fields.get("label", base.label)
    if not isinstance(label, str) or not label.strip() or not label.isprintable():
        raise InputError(source, f"{where}: label must be a line of text")
    colour = fields.get("colour", base.colour)
    if colour is not None and (not isinstance(colour, str) or not _COLOUR.fullmatch(colour)):
        raise InputError(source, f"{where}: colour {colour!r} is not #rrggbb")
    role = fields.get("role", base.role)
    if role not in ROLES:
        raise InputError(source, f"{where}: role {role!r} is not one of: {', '.join(ROLES)}")
    words = fields.get("words", base.words)
    if words is not None and (not isinstance(words, str) or not words.strip() or not words.isprintable()):
        raise InputError(source, f"{where}: words must be a line of text")
    collective = fields.get("collective", base.collective)
    if collective is not None and (group != COMMUNICATION or not isinstance(collective, str)
                                   or not _COLLECTIVE.fullmatch(collective)):
        raise InputError(source, f"{where}: collective {collective!r}: a name (all_reduce) of a communication "
                                 "category")
    marks = {key: fields.get(key, getattr(base, key)) for key in ("generic", "by_name", "streams")}
    wrong = next((key for key, value in marks.items() if not isinstance(value, bool)), None)
    if wrong is not None:
        raise InputError(source, f"{where}: {wrong} is true or false")
    return Category(name, group, label, colour, role, words, collective, **marks)


@cache
def bundled_taxonomy() -> dict[str, Any]:
    """``servescope/data/taxonomy.toml``, parsed once (shared: read, never change it)."""
    try:
        return bundled_toml("taxonomy.toml")
    except ValueError as exc:  # tomllib.TOMLDecodeError: a broken install
        raise InputError(BUILTIN_SOURCE, f"bad TOML: {exc}") from None


@cache
def bundled_categories() -> dict[str, Category]:
    """The bundled taxonomy's categories, in display order (shared: read, never change it)."""
    return category_table(bundled_taxonomy(), BUILTIN_SOURCE)


def read_taxonomy(path: Path, source: str) -> dict[str, Any]:
    """A user taxonomy file, parsed.

    Raises:
        InputError: the file is missing, a directory, unreadable, not UTF-8 or not TOML (named ``source``).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise unreadable(source, exc, _UNREADABLE) from None
    return _loads(text, source)


def _loads(text: str, source: str) -> dict[str, Any]:
    import tomllib  # only for a user's file: the bundled one comes through servescope.core.bundled

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, f"bad TOML: {exc}") from None


class CategoryEntry(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One category as the analysis's taxonomy resolved it (``core.categories.Category`` without its name and
    group, which ``AnalysisDoc.categories`` holds): what every view and ``plan`` read of it."""

    label: str  # what the views call it
    role: str  # its part of a step in the planner: weights, attention, collectives, other
    colour: str | None = None  # #rrggbb in the HTML report (absent: a hue of its group's)
    words: str | None = None  # what a sentence calls its kernels (absent: the label)
    collective: str | None = None  # the collective a communication category's kernels run (all_reduce)
    generic: bool = False  # a name in it says nothing of the layer it serves (copy, fill, sort)
    by_name: bool = False  # its operators are filed by their own name (bookkeeping)
    streams: bool = False  # every kernel of this weights category reads a weight matrix (gemm)



def category_entries(table: Mapping[str, Category]) -> dict[str, CategoryEntry]:
    """Each category of ``table`` as an analysis document keeps it (its group aside, in ``categories``)."""
    return {name: CategoryEntry(label=c.label, role=c.role, colour=c.colour, words=c.words, collective=c.collective,
                                generic=c.generic, by_name=c.by_name, streams=c.streams)
            for name, c in table.items()}


def categories_of(doc: CategorisedDoc) -> CategoryTable:
    """Every category of the analysis ``doc``, as its ``category_table`` keeps it (read from the document alone);
    a category the table does not hold takes its group's defaults (label = name, no colour, the group's role)."""
    out = CategoryTable()
    for name, group in doc.categories.items():
        entry = doc.category_table.get(name)
        out[name] = _unknown(name, group) if entry is None else Category(
            name, group, entry.label, entry.colour, entry.role, entry.words, entry.collective, entry.generic,
            entry.by_name, entry.streams)
    return out


def legacy_category_table(doc: CategorisedDoc) -> dict[str, CategoryEntry]:
    """The category table of a version-1 analysis ``doc`` (written without one), as the views resolved it then:
    from the taxonomy it names (the user file read again, where it still can be; else the bundled one). A
    category that taxonomy does not declare in the document's group (the file gone or changed since) takes that
    group's defaults."""
    source = doc.options.get("taxonomy")
    table = _declared(source) if isinstance(source, str) else bundled_categories()
    resolved = {}
    for name, group in doc.categories.items():
        known = table.get(name)
        resolved[name] = known if known is not None and known.group == group else _unknown(name, group)
    return category_entries(resolved)


@lru_cache(maxsize=8)
def _declared(source: str) -> dict[str, Category]:
    """The categories of the taxonomy ``source`` names (``builtin``, or a user file over the bundled one)."""
    if source == "builtin":
        return bundled_categories()
    try:
        return category_table(read_taxonomy(Path(source), source), source, under=bundled_categories())
    except InputError:
        return bundled_categories()
