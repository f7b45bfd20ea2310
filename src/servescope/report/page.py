"""The one look of every HTML view: a stylesheet and the page around a view's parts.

Every HTML page servescope writes (analysis, plan, bench serve and the text views of the other documents)
uses :data:`CSS`, so tables, warnings and headings read alike from one report to the next.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

__all__ = ["CSS", "escape", "page", "text_block", "warning"]

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.2rem; font-size: 0.9rem; }
th, td { padding: 0.2rem 0.6rem; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.comm td { color: #b2182b; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em; }
.sev-high { color: #b2182b; font-weight: bold; } .sev-medium { color: #b35806; }
.meta { color: #555; }
.warn { color: #8a4b00; background: #fff4e0; border-left: 4px solid #e08a00; padding: 0.3rem 0.6rem;
        margin: 0.3rem 0; }
.mark { color: #b2182b; font-weight: bold; }
pre.text { font-family: ui-monospace, monospace; font-size: 0.85rem; background: #fafafa; padding: 0.8rem;
           border: 1px solid #eee; overflow-x: auto; }
"""


def escape(text: object) -> str:
    """``text`` safe inside HTML text and attribute values."""
    return html.escape(str(text), quote=True)


def page(title: str, parts: Iterable[str]) -> str:
    """A self-contained HTML page titled ``title`` with :data:`CSS`, whose body is ``parts`` (already HTML)."""
    head = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"]
    return "\n".join([*head, *parts, "</body></html>"]) + "\n"


def warning(text: str) -> str:
    """One warning line (a finding the terminal shows in yellow)."""
    return f'<p class="warn">{escape(text)}</p>'


def text_block(text: str) -> str:
    """A terminal view's text, kept line for line."""
    return f'<pre class="text">{escape(text)}</pre>'
