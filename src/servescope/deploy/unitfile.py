"""systemd unit files read as systemd reads them: sections, assignments, drop-ins, ExecStart= and Environment=.

The rules follow systemd.syntax(7), systemd.unit(5) and systemd.service(5) ("Command lines"), checked against
``systemd-analyze verify`` (tests/deploy/test_unitfile.py):

- ``#`` and ``;`` start comment lines, also between continued lines; a line ending in an unescaped backslash
  continues on the next one, the backslash becoming a space;
- whitespace around the key, the ``=`` and the value is dropped;
- drop-ins ``NAME.service.d/*.conf`` are applied after the unit in file-name order;
- an empty assignment to a list-valued key (Environment=, ExecStartPre=, After= ...) empties the list.

Lines systemd would skip with a warning (no ``=``, an assignment before any section, a broken section header)
are errors here, since a unit we are asked to describe should be read exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servescope.core.errors import InputError
from servescope.core.files import unreadable

__all__ = [
    "ExecCommand",
    "UnitEntry",
    "UnitFile",
    "default_dropin_dirs",
    "load_unit",
    "parse_environment",
    "parse_systemctl_cat",
    "parse_unit",
    "parse_unit_text",
    "split_command_line",
    "split_command_lines",
    "split_words",
]

# Prefix characters of an Exec*= command, systemd.service(5) table "Special executable prefixes".
EXEC_PREFIX_CHARS = "-@:+!"
_COMMENT_STARTS = ("#", ";")
_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", '"': '"', "'": "'", "s": " ",
}
# `systemctl cat` precedes each file with "# /full/path"; only a path ending like a unit or a drop-in counts.
_CAT_HEADER_RE = re.compile(
    r"^# (/\S+\.(?:conf|service|socket|target|timer|mount|path|slice|scope|device|swap|automount))$")


@dataclass(frozen=True)
class UnitEntry:
    """One assignment ``key=value`` in ``[section]`` of file ``source`` at 1-based ``line``."""

    section: str
    key: str
    value: str
    source: str
    line: int


@dataclass(frozen=True)
class UnitFile:
    """A unit and its drop-ins merged in the order systemd applies them.

    Attributes:
        path: the unit file (or the path `systemctl cat` named first).
        entries: every assignment, unit file first, then each drop-in in order.
        dropins: the drop-in files applied, in order.
    """

    path: str
    entries: tuple[UnitEntry, ...]
    dropins: tuple[str, ...] = ()

    def get(self, section: str, key: str) -> str | None:
        """The value of ``key`` in ``section`` (the last assignment wins), or None when never set."""
        value: str | None = None
        for entry in self.entries:
            if entry.section == section and entry.key == key:
                value = entry.value
        return value

    def get_all(self, section: str, key: str) -> list[str]:
        """Every value of a list-valued key, in order; an empty assignment drops the ones before it."""
        return [entry.value for entry in self.entries_of(section, key)]

    def entries_of(self, section: str, key: str) -> list[UnitEntry]:
        """The assignments of a list-valued key that count, in order: an empty one drops those before it."""
        found: list[UnitEntry] = []
        for entry in self.entries:
            if entry.section == section and entry.key == key:
                if entry.value == "":
                    found.clear()
                else:
                    found.append(entry)
        return found

    def last_entry(self, section: str, key: str) -> UnitEntry | None:
        """The assignment that decides ``get(section, key)``: which file and line set it."""
        found: UnitEntry | None = None
        for entry in self.entries:
            if entry.section == section and entry.key == key:
                found = entry
        return found

    def sections(self) -> list[str]:
        """Section names in order of first appearance."""
        seen: dict[str, None] = {}
        for entry in self.entries:
            seen.setdefault(entry.section, None)
        return list(seen)

    @property
    def sources(self) -> tuple[str, ...]:
        """The unit file then its drop-ins."""
        return (self.path, *self.dropins)


@dataclass(frozen=True)
class ExecCommand:
    """One command of an Exec*= line.

    Attributes:
        prefixes: the special prefix characters, as written (``-``, ``@``, ``:``, ``+``, ``!``, ``!!``).
        argv: the words after unquoting; ``argv[0]`` is the executable. With ``@`` in ``prefixes``, ``argv[1]``
            is the argv[0] the process sees. ``$VAR`` and ``${VAR}`` stay as text (systemd fills them in at
            start); ``$$`` in the arguments became ``$`` and ``%%`` became ``%``.
    """

    prefixes: str
    argv: list[str]


def _ends_in_escape(line: str) -> bool:
    """True when ``line`` ends in a backslash that is not itself escaped."""
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def parse_unit_text(text: str, source: str) -> list[UnitEntry]:
    """Every assignment in the unit file text ``text`` (named ``source`` in errors), in order.

    Raises:
        InputError: ``source:N: ...`` (N the line, as ``systemd-analyze verify`` names it) for a broken section
            header, a line without ``=``, an assignment
            before any section or a key with invalid characters.
    """
    entries: list[UnitEntry] = []
    section: str | None = None
    pending: str | None = None
    pending_line = 0
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if stripped.startswith(_COMMENT_STARTS):
            continue
        if pending is None and not stripped:
            continue
        if _ends_in_escape(raw):
            if pending is None:
                pending, pending_line = "", number
            pending += raw[:-1] + " "
            if number < len(lines):
                continue
            raw = ""
        if pending is not None:
            raw, number, pending = pending + raw, pending_line, None
            stripped = raw.strip()
            if not stripped:
                continue
        if stripped.startswith("["):
            if not stripped.endswith("]") or len(stripped) < 3:
                raise InputError(f"{source}:{number}", f"invalid section header {stripped!r}")
            section = stripped[1:-1]
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise InputError(f"{source}:{number}", f"missing '=' in {stripped!r}")
        if section is None:
            raise InputError(f"{source}:{number}", f"assignment {key.strip()!r} before any [Section] header")
        key = key.strip()
        if not _KEY_RE.match(key):
            raise InputError(f"{source}:{number}", f"invalid key {key!r}")
        entries.append(UnitEntry(section, key, value.strip(), source, number))
    return entries


_UNREADABLE: dict[type[OSError | UnicodeDecodeError], str] = {
    FileNotFoundError: "no such unit file",
    IsADirectoryError: "is a directory, not a unit file",
    PermissionError: "permission denied reading the unit file",
    UnicodeDecodeError: "not UTF-8 text; not a unit file",
}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise unreadable(str(path), exc, _UNREADABLE) from None


def parse_unit(text: str, source: str) -> UnitFile:
    """The one unit file ``text`` (named ``source``), without drop-ins: what ``service lint`` and ``service
    import`` judge.

    Raises:
        InputError: a malformed line (``source:N: ...``) or no assignment at all.
    """
    entries = parse_unit_text(text, source)
    if not entries:
        raise InputError(source, "no unit entries (empty or not a systemd unit)")
    return UnitFile(source, tuple(entries))


def default_dropin_dirs(path: Path) -> list[Path]:
    """The drop-in directory systemd reads beside ``path``: ``NAME.service.d``, and ``NAME@.service.d`` for
    an instance ``NAME@I.service``."""
    dirs = [path.with_name(path.name + ".d")]
    stem, at, instance = path.name.partition("@")
    if at and instance.split(".", 1)[0]:
        suffix = instance.split(".", 1)[1] if "." in instance else ""
        dirs.append(path.with_name(f"{stem}@.{suffix}.d"))
    return dirs


def _dropin_files(dirs: Sequence[Path]) -> list[Path]:
    """``*.conf`` in ``dirs`` sorted by file name; a name in an earlier dir masks the same name in later ones;
    a drop-in linked to /dev/null masks and is not read."""
    chosen: dict[str, Path] = {}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for conf in directory.glob("*.conf"):
            chosen.setdefault(conf.name, conf)
    ordered = [chosen[name] for name in sorted(chosen)]
    return [conf for conf in ordered if not (conf.is_symlink() and str(conf.resolve()) == "/dev/null")]


def load_unit(path: Path, *, dropin_dirs: Sequence[Path] | None = None) -> UnitFile:
    """The unit at ``path`` merged with its drop-ins, as systemd would load it.

    Shell twin: ``systemctl cat NAME`` (which shows the same files in the same order).

    Args:
        path: the unit file.
        dropin_dirs: directories of ``*.conf`` drop-ins, highest priority first (as /etc before /run before
            /usr/lib); default: ``NAME.service.d`` beside the unit.

    Raises:
        InputError: the unit or a drop-in is missing, unreadable or malformed.
    """
    entries = parse_unit_text(_read_text(path), str(path))
    dirs = default_dropin_dirs(path) if dropin_dirs is None else list(dropin_dirs)
    dropins = _dropin_files(dirs)
    for conf in dropins:
        entries.extend(parse_unit_text(_read_text(conf), str(conf)))
    return UnitFile(str(path), tuple(entries), tuple(str(conf) for conf in dropins))


def parse_systemctl_cat(text: str, source: str) -> UnitFile:
    """The unit printed by ``systemctl cat NAME``: each file follows its ``# /path`` header.

    Raises:
        InputError: no ``# /path`` header (not `systemctl cat` output), or a malformed file inside.
    """
    chunks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        header = _CAT_HEADER_RE.match(line.strip())
        if header:
            chunks.append((header.group(1), []))
        elif chunks:
            chunks[-1][1].append(line)
        elif line.strip() and not line.strip().startswith(_COMMENT_STARTS):
            raise InputError(source, "not `systemctl cat` output: text before the first '# /path' header")
    if not chunks:
        raise InputError(source, "not `systemctl cat` output: no '# /path' header")
    entries: list[UnitEntry] = []
    for path, lines in chunks:
        entries.extend(parse_unit_text("\n".join(lines), path))
    return UnitFile(chunks[0][0], tuple(entries), tuple(path for path, _ in chunks[1:]))


def _unescape(text: str, start: int) -> tuple[str, int]:
    """The character of the C escape at ``text[start]`` (just after a backslash) and the index after it.

    Unknown escapes stay as written, as systemd keeps them (with a warning)."""
    char = text[start]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], start + 1
    widths = {"x": 2, "u": 4, "U": 8}
    if char in widths:
        digits = text[start + 1:start + 1 + widths[char]]
        if len(digits) == widths[char] and all(c in "0123456789abcdefABCDEF" for c in digits):
            return chr(int(digits, 16)), start + 1 + widths[char]
    elif char in "01234567":
        digits = text[start:start + 3]
        if len(digits) == 3 and all(c in "01234567" for c in digits):
            return chr(int(digits, 8)), start + 3
    return "\\" + char, start + 1


def _tokens(value: str, source: str) -> list[tuple[str, str]]:
    """(as written, decoded) for each whitespace-separated word of ``value``.

    Raises:
        InputError: unbalanced quotes.
    """
    tokens: list[tuple[str, str]] = []
    raw_start: int | None = None
    current: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(value):
        char = value[i]
        if quote is None and char.isspace():
            if raw_start is not None:
                tokens.append((value[raw_start:i], "".join(current)))
                raw_start, current = None, []
            i += 1
            continue
        if raw_start is None:
            raw_start = i
        if char == "\\":
            if i + 1 == len(value):
                i += 1  # a trailing backslash is dropped, as systemd does at the end of a file
                continue
            decoded, i = _unescape(value, i + 1)
            current.append(decoded)
            continue
        if quote is None and char in "\"'":
            quote = char
        elif char == quote:
            quote = None
        else:
            current.append(char)
        i += 1
    if quote is not None:
        raise InputError(source, f"unbalanced quoting in {value!r}")
    if raw_start is not None:
        tokens.append((value[raw_start:], "".join(current)))
    return tokens


def split_words(value: str, source: str = "value") -> list[str]:
    """Whitespace-separated words of a unit value with quotes removed and C escapes decoded.

    Quotes may open in the middle of a word (``a"b c"`` is one word ``ab c``), as in systemd.

    Raises:
        InputError: unbalanced quotes.
    """
    return [decoded for _, decoded in _tokens(value, source)]


def _argument_text(word: str) -> str:
    """``$$`` → ``$``, as systemd does to arguments when it substitutes variables at start."""
    return word.replace("$$", "$")


def _parse_command(words: list[str], source: str) -> ExecCommand:
    first = words[0]
    prefixes = ""
    while first and first[0] in EXEC_PREFIX_CHARS:
        prefixes += first[0]
        first = first[1:]
    argv = ([first] if first else []) + words[1:]
    if not argv or ("@" in prefixes and len(argv) < 2):
        raise InputError(source, f"command line {' '.join(words)!r} names no executable")
    return ExecCommand(prefixes, [argv[0], *(_argument_text(word) for word in argv[1:])])


def split_command_lines(value: str, source: str = "ExecStart") -> list[ExecCommand]:
    """The commands of one Exec*= value; a lone ``;`` separates several (allowed for Type=oneshot).

    ``%%`` becomes ``%`` first (systemd resolves specifiers before splitting); other ``%`` specifiers stay.
    A lone ``\\;`` is a literal ``;`` argument.

    Raises:
        InputError: unbalanced quotes, or a command that is only prefixes.
    """
    groups: list[list[str]] = [[]]
    for raw, decoded in _tokens(value.replace("%%", "%"), source):
        if raw == ";":
            groups.append([])
        else:
            groups[-1].append(";" if raw == "\\;" else decoded)
    return [_parse_command(words, source) for words in groups if words]


def split_command_line(value: str, source: str = "ExecStart") -> ExecCommand:
    """The one command of an Exec*= value (``ExecStart=`` of a Type=simple/exec/notify service).

    Raises:
        InputError: no command, unbalanced quotes, or several ``;``-separated commands
            (use :func:`split_command_lines`).
    """
    commands = split_command_lines(value, source)
    if not commands:
        raise InputError(source, "empty command line")
    if len(commands) > 1:
        raise InputError(source, f"{len(commands)} commands separated by ';' where one was expected")
    return commands[0]


def parse_environment(values: list[str], source: str = "Environment") -> dict[str, str]:
    """Variables set by Environment= values, in order (later assignments win).

    Each value holds one or more ``NAME=VALUE`` words, quoted as in ``Environment="A=1 2" B=3``;
    ``%%`` becomes ``%``.

    Raises:
        InputError: a word that is not ``NAME=VALUE`` or unbalanced quotes (systemd would ignore them).
    """
    env: dict[str, str] = {}
    for value in values:
        if value == "":
            env.clear()
            continue
        for word in split_words(value.replace("%%", "%"), source):
            name, sep, assigned = word.partition("=")
            if not sep or not _ENV_NAME_RE.match(name):
                raise InputError(source, f"invalid environment assignment {word!r}")
            env[name] = assigned
    return env
