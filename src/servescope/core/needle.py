"""Regexes searched in long kernel names, with the plain text a match must contain looked for first.

The taxonomy, precision, findings and deployment rules search a few hundred regexes in each distinct kernel name
of a trace, and demangled names run to hundreds of characters. Python's ``re`` scans the whole name for a pattern
that starts with a lookbehind (``(?<!un)quant``), a class (``[Mm]arlin``) or that ignores case, one position at a
time. Most patterns hold a run of plain characters that any match must contain (``quant``, ``arlin``): when the
name does not contain that *needle*, found with ``in`` (a C substring search), the regex cannot match and is not
run. The answer is always the regex's own: the needle only skips searches that would find nothing.

Example:
    >>> p = Needled.of("(?<!un)quant(?!ile)", re.IGNORECASE)
    >>> p.needles, p.found("dynamic_per_token_scaled_fp8_QUANT_kernel")
    (('quant',), True)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import ahocorasick

__all__ = ["AnyOf", "Needled", "any_of", "automaton", "keep_needles", "needle_of", "needled"]

_MIN_NEEDLE = 2  # a single character is in almost every name: not worth an extra test


def needle_of(pattern: str, flags: int = 0) -> tuple[tuple[str, ...], bool] | None:
    """Plain texts one of which every match of ``pattern`` contains (the longest run of plain characters; for an
    alternation, one such run of each alternative), and whether they are to be found ignoring case; None when
    there are none worth looking for (a short run, classes only, non-ASCII text under ``IGNORECASE``) or the
    pattern does not parse."""
    from re import _parser  # type: ignore[attr-defined]  # the stdlib's own parser, as re.compile reads it

    try:
        tree = _parser.parse(pattern, flags)
    except (re.error, RecursionError, OverflowError):
        return None
    ignore_case = bool((flags | tree.state.flags) & re.IGNORECASE)
    needles = _needles(list(tree))
    if not needles or (ignore_case and not all(n.isascii() for n in needles)):
        return None
    return (tuple(n.lower() for n in needles), True) if ignore_case else (needles, False)


def _needles(items: list[tuple[Any, Any]]) -> tuple[str, ...] | None:
    """The needles of a parsed sequence (see :func:`needle_of`): its longest run of literals, else the
    alternatives' of the one alternation (or group of one) it consists of."""
    from re import _constants as sre  # type: ignore[attr-defined]

    best = ""
    run: list[str] = []
    solid = []  # the items that take up characters
    for op, arg in items:
        if op is sre.LITERAL:
            run.append(chr(arg))
            solid.append((op, arg))
            continue
        if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
            continue  # zero width: the characters on either side of it are next to each other in the name
        best = max(best, "".join(run), key=len)
        run = []
        solid.append((op, arg))
    best = max(best, "".join(run), key=len)
    if len(best) >= _MIN_NEEDLE:
        return (best,)
    if len(solid) != 1:
        return None
    op, arg = solid[0]
    if op is sre.SUBPATTERN and not arg[1] and not arg[2]:  # a group without flags of its own
        return _needles(list(arg[3]))
    if op is sre.BRANCH:
        found = [_needles(list(branch)) for branch in arg[1]]
        if all(found):
            return tuple(n for each in found if each for n in each)
    return None


# Needles found before (by this code: ``_STAMP``), by "flags pattern": parsing a pattern costs ~60 us, ~10 ms for
# the taxonomy's, so they are kept across runs like the parsed data files (servescope.core.bundled).
_known: dict[str, tuple[tuple[str, ...], bool] | None] | None = None
_unsaved = False


def _stamp() -> str:
    """This module's code, by its source: needles found by other code are found again."""
    from servescope.core.bundled import code_stamp

    return code_stamp(__file__)


def _needles_of(pattern: str, flags: int) -> tuple[tuple[str, ...], bool] | None:
    """:func:`needle_of`, remembered across runs."""
    global _known, _unsaved
    if _known is None:
        from servescope.core.bundled import read_derived

        _known = read_derived("needles", _stamp()) or {}
    key = f"{flags} {pattern}"
    if key not in _known:
        _known[key] = needle_of(pattern, flags)
        _unsaved = True
    return _known[key]


def keep_needles() -> None:
    """Keep the needles this process found for the next runs (no-op when it found none)."""
    global _unsaved
    if _unsaved and _known is not None:
        from servescope.core.bundled import write_derived

        write_derived("needles", _stamp(), _known)
        _unsaved = False


class Needled:
    """A regex and its needles (:func:`needle_of`): :meth:`found` answers as ``regex.search`` does. The regex is
    compiled the first time a text holds a needle (most of a taxonomy's never are, ~60 us each)."""

    __slots__ = ("_regex", "flags", "ignore_case", "needles", "pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern, self.flags = pattern, flags
        self._regex: re.Pattern[str] | None = None
        found = _needles_of(pattern, flags)
        self.needles, self.ignore_case = found if found is not None else ((), False)

    @classmethod
    def of(cls, pattern: str, flags: int = 0) -> Needled:
        return cls(pattern, flags)

    @property
    def regex(self) -> re.Pattern[str]:
        """The compiled regex.

        Raises:
            re.error: the pattern is not a regex (the data files' loaders check theirs first).
        """
        if self._regex is None:
            self._regex = re.compile(self.pattern, self.flags)
        return self._regex

    def found(self, text: str, lower: str | None = None) -> bool:
        """Whether the regex matches anywhere in ``text``. ``lower``: ``text.lower()`` when ``text`` is ASCII (a
        caller testing many patterns on one name lowers it once), else None."""
        needles = self.needles
        if needles:
            if not self.ignore_case:
                if not any(map(text.__contains__, needles)):
                    return False
            else:
                if lower is None and text.isascii():
                    lower = text.lower()
                # ASCII: lower() is what IGNORECASE folds
                if lower is not None and not any(map(lower.__contains__, needles)):
                    return False
        return self.regex.search(text) is not None


@cache
def needled(patterns: tuple[str, ...], flags: int = 0) -> tuple[Needled, ...]:
    """``patterns``, each compiled with ``flags`` and its needle, once."""
    return tuple(Needled.of(p, flags) for p in patterns)


_FEW_NEEDLES = 8  # fewer than this: ``in`` for each is as fast as one pass of the automaton


class AnyOf:
    """Whether any of several regexes is found in a text: :meth:`found` answers as ``any(p.regex.search(text) ...)``.

    With many patterns, every needle of every one is looked for in one pass over the text (and one over its
    lower-cased form for those that ignore case) by an Aho-Corasick automaton (pyahocorasick), and only the
    patterns whose needle is there, or that have none, are searched; with a few, each needle is tested with ``in``
    as :class:`Needled` does.
    """

    __slots__ = ("_always", "_folded", "_plain", "patterns")

    def __init__(self, patterns: tuple[Needled, ...]) -> None:
        self.patterns = patterns
        plain: dict[str, list[int]] = {}
        folded: dict[str, list[int]] = {}
        always: list[int] = []  # no needle: searched every time
        for i, p in enumerate(patterns):
            if not p.needles:
                always.append(i)
            for needle in p.needles:
                (folded if p.ignore_case else plain).setdefault(needle, []).append(i)
        self._always = tuple(always)
        few = len(plain) + len(folded) < _FEW_NEEDLES
        self._plain = None if few else automaton(plain)
        self._folded = None if few else automaton(folded)

    def found(self, text: str, lower: str | None = None) -> bool:
        """Whether one of the patterns is found in ``text``. ``lower``: ``text.lower()`` when ``text`` is ASCII (a
        caller testing many sets on one name lowers it once), else None."""
        if self._plain is None and self._folded is None:
            return any(p.found(text, lower) for p in self.patterns)
        if lower is None:
            if not text.isascii():  # lower() is not IGNORECASE here: each pattern as it is
                return any(p.found(text, None) for p in self.patterns)
            lower = text.lower()
        patterns = self.patterns
        if any(patterns[i].regex.search(text) is not None for i in self._always):
            return True
        tried: set[int] = set()
        for words, where in ((self._plain, text), (self._folded, lower)):
            if words is None:
                continue
            for _, hits in words.iter(where):
                for i in hits:
                    if i not in tried:
                        tried.add(i)
                        if patterns[i].regex.search(text) is not None:
                            return True
        return False


@cache
def any_of(patterns: tuple[str, ...], flags: int = 0) -> AnyOf:
    """``patterns`` (each compiled with ``flags``, as :func:`needled`) as one :class:`AnyOf`, once."""
    return AnyOf(needled(patterns, flags))


def automaton(words: Mapping[str, Sequence[Any]]) -> ahocorasick.Automaton | None:
    """An Aho-Corasick automaton that finds each of ``words`` in a text with what it maps to (a tuple of it), or
    None for no words."""
    if not words:
        return None
    found = ahocorasick.Automaton()
    for text, hits in words.items():
        found.add_word(text, tuple(hits))
    found.make_automaton()
    return found
