"""Where traces are: the files a user names (directories searched) and the bundled examples.

Standard library only, so the CLI can find the files and start reading them
(:class:`~servescope.trace.read.readahead.ReadAhead`) before it imports the analysis.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from servescope.core.errors import InputError

__all__ = ["EXAMPLES", "EXAMPLE_NAME", "Discovery", "discover_traces", "example_trace_dir",
           "find_traces", "left_out_lines", "log_lines_beside", "why_not_a_trace"]

EXAMPLE_NAME = "h200-vllm-moe-b16"
"""The default bundled example: a real vLLM 0.26 decode capture from an H200 (Qwen3-30B-A3B shapes, batch 16,
CUDA graphs), with vLLM's own profiler table beside it."""
EXAMPLES = ("h200-vllm-moe-b16", "vllm-cpu-tp2", "h200-moe-b16-graphs")
"""Every bundled example (``data/examples/NAME``, each with a README saying what it is and how it was made)."""


@dataclass(frozen=True, slots=True)
class Discovery:
    """What the named paths hold: the trace files to read, and each file of a named directory left out, with why."""

    traces: list[Path]
    left_out: list[tuple[Path, str]] = field(default_factory=list)
    # the trace files named themselves (resolved), not found in a named directory: a damaged one of these is an
    # error; one found in a directory is left out with its reason while the rest are analysed
    named: list[Path] = field(default_factory=list)


def find_traces(paths: Iterable[str | Path]) -> Discovery:
    """Trace files named by ``paths``: files as given, directories searched recursively.

    In a directory every file is judged by its content, not its name (:func:`why_not_a_trace`): a torch
    profiler trace, gzipped or not (an object with ``traceEvents``, or a bare list of events), is read
    whatever it is called; anything else (vLLM's ``profiler_out`` tables, capture metadata, a saved analysis,
    a README) is left out, and :attr:`Discovery.left_out` says which and why.

    Raises:
        InputError: a path does not exist, or a directory holds no trace (naming what it holds instead).
    """
    found: list[Path] = []
    named: list[Path] = []
    left_out: list[tuple[Path, str]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            taken: list[Path] = []
            skipped: list[tuple[Path, str]] = []
            for inside in sorted(p for p in path.rglob("*") if p.is_file()):
                why = why_not_a_trace(inside)
                if why is None:
                    taken.append(inside)
                else:
                    skipped.append((inside, why))
            if not taken:
                held = "; ".join(f"{p.relative_to(path)}: {why}" for p, why in skipped[:_NAMED]) or "it is empty"
                more = f"; and {len(skipped) - _NAMED} more" if len(skipped) > _NAMED else ""
                raise InputError(str(path), f"directory holds no trace files, none a torch profiler trace by its "
                                            f"content ({held}{more})")
            found.extend(taken)
            left_out.extend(skipped)
        elif path.exists():
            found.append(path)
            named.append(path.resolve())
        else:
            raise InputError(str(path), "no such file or directory")
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return Discovery(unique, left_out, named)


def discover_traces(paths: Iterable[str | Path]) -> list[Path]:
    """The trace files of :func:`find_traces` (files as given, directories' files recognised by content)."""
    return find_traces(paths).traces


def left_out_lines(skipped: Sequence[tuple[Path, str]], *, most: int = 5) -> list[str]:
    """What :func:`find_traces` left out, for the user: a count, then one line per file (at most ``most``)."""
    if not skipped:
        return []
    noun = "file" if len(skipped) == 1 else "files"
    lines = [f"left out {len(skipped)} {noun} that are not torch profiler traces:"]
    lines += [f"  {p}: {why}" for p, why in skipped[:most]]
    if len(skipped) > most:
        lines.append(f"  ... and {len(skipped) - most} more")
    return lines


_NAMED = 3
_HEAD_BYTES = 64 << 10
_GZIP_MAGIC = b"\x1f\x8b"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:')
_SCHEMA = re.compile(rb'"schema"\s*:\s*"(servescope\.[^"]{1,80})"')
_EVENT_FIELD = re.compile(rb'"ph"\s*:')
_LEADING = b"\xef\xbb\xbf \t\r\n"  # a UTF-8 byte-order mark, JSON whitespace


class _Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


def why_not_a_trace(path: Path) -> str | None:
    """None when ``path`` holds a torch profiler trace (Chrome trace JSON, gzipped or not), else why not.

    Reads the first 64 KiB (inflated); only a JSON object whose ``traceEvents`` key is not among them is read
    on, a block at a time, until the key or the end. A gzip cut short after the start of a JSON object or list
    is taken, like a trace corrupt further on: reading it then says what is wrong with it, rather than the
    analysis going on without a rank.
    """
    try:
        with path.open("rb") as raw:
            if raw.read(2) != _GZIP_MAGIC:
                raw.seek(0)
                return _judge(raw.read(_HEAD_BYTES), raw)
            raw.seek(0)
            with gzip.open(raw, "rb") as inflated:
                head = bytearray()
                try:
                    while len(head) < _HEAD_BYTES and (block := inflated.read(4096)):
                        head += block
                except EOFError:
                    return None if _json_start(head) else "truncated gzip"
                return _judge(bytes(head), inflated)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        return "truncated gzip" if isinstance(exc, EOFError) else "corrupt gzip"
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"


def _json_start(head: bytes | bytearray) -> bool:
    return bytes(head).lstrip(_LEADING)[:1] in (b"{", b"[")


def _judge(head: bytes, rest: _Readable) -> str | None:
    """Why ``head`` (the first bytes of a file, ``rest`` the stream after them) is not a trace, or None."""
    text = head.lstrip(_LEADING)
    if not text:
        return "empty file" if not head else "only whitespace"
    first = text[:1]
    if first == b"[":
        return None if _EVENT_FIELD.search(text) else 'a JSON list without trace events (no "ph" field)'
    if first != b"{":
        return "not JSON"
    if _EVENTS_KEY.search(text):
        return None
    schema = _SCHEMA.search(text)
    if schema is not None:
        return f"a {schema.group(1).decode()} document, not a trace (servescope report reads it)"
    tail = head[-32:]
    while block := rest.read(1 << 20):
        if _EVENTS_KEY.search(tail + block):
            return None
        tail = block[-32:]
    return "JSON without traceEvents"


def example_trace_dir(name: str = EXAMPLE_NAME) -> Path:
    """The folder of a bundled example: by default a real vLLM decode capture from an H200; ``vllm-cpu-tp2`` is
    a vLLM TP=2 capture (two ranks with real all-reduces, and the front end) on the CPU; ``h200-moe-b16-graphs``
    the project's own ``capture decode`` of an HF MoE model on an H200.

    Raises:
        InputError: ``name`` is not one of :data:`EXAMPLES`, or the installation lacks it.
    """
    from importlib.resources import as_file, files

    if name not in EXAMPLES:
        raise InputError("--example-name", f"no bundled example {name!r} (there are: {', '.join(EXAMPLES)})")
    resource = files("servescope") / "data" / "examples" / name
    with as_file(resource) as path:
        if not path.is_dir():
            raise InputError(str(path), "bundled example missing from this installation")
        return path


def log_lines_beside(traces: Sequence[Path]) -> list[str]:
    """The server log lines saved beside traces (``server-log-lines.txt``, ``server.log``), for the catalogue."""
    lines: list[str] = []
    for folder in dict.fromkeys(p.parent for p in traces):
        for name in ("server-log-lines.txt", "server.log"):
            try:
                lines += (folder / name).read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
    return lines
