"""Lines wrapped for the terminal with a hanging indent: a wrapped line never restarts at column 0.

Rich wraps a long ``Text`` at the console's width and starts every continuation at column 0, so at 80 columns a
block's second line (``norm 2% (57 µs)``) reads as a block of its own. :func:`hang` wraps at the width itself and
indents each continuation under the block; the first line keeps its styled spans.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

__all__ = ["hang", "path_tail"]


def path_tail(path: str, width: int) -> str:
    """``path`` in at most ``width`` characters: its end kept (the file and the folders just above it tell two
    traces apart; their common start does not), cut at a ``/`` where one is near, marked ``…``."""
    if len(path) <= width:
        return path
    tail = path[len(path) - width + 1 :]
    cut = tail.find("/")
    if 0 <= cut < width // 3 and len(tail) - cut > 1:
        tail = tail[cut:]
    return "…" + tail


def hang(console: Console, text: str, *, indent: int | None = None, style: str = "",
         spans: Sequence[tuple[int, int, str]] = ()) -> None:
    """Print ``text`` wrapped at the console's width, each continuation line indented ``indent`` columns (default:
    the text's own leading spaces plus two); a line of its own in ``text`` (``\\n``) starts again at the indent.

    ``style`` applies to every line; ``spans`` (start, end, style) to the first line's characters."""
    lead = len(text) - len(text.lstrip(" "))
    hanging = " " * (lead + 2 if indent is None else indent)
    width = max(console.width, len(hanging) + 20)
    lines: list[str] = []
    for number, paragraph in enumerate(text.split("\n")):
        if not paragraph.strip():
            lines.append("")
            continue
        first = paragraph if number == 0 else hanging + paragraph.lstrip(" ")
        lines.extend(textwrap.wrap(first, width=width, subsequent_indent=hanging, break_on_hyphens=False,
                                   replace_whitespace=False, drop_whitespace=True) or [""])
    for number, line in enumerate(lines):
        out = Text(line, style=style)
        if number == 0:
            for start, end, span_style in spans:
                if start < len(line):
                    out.stylize(span_style, start, min(end, len(line)))
        console.print(out, soft_wrap=True)
