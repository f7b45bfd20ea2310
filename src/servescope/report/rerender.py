"""``servescope report``: any saved result document rendered again as text, JSON or HTML, without recomputing.

The text is what the command that wrote the document printed; the JSON is the document as :mod:`servescope.core
.document` writes it; the HTML is the kind's own page (analysis, plan, bench serve) or, for the others, the text
view in the shared page style, so every HTML view carries what the terminal shows.

Example:
    >>> doc = decode(Path("plan.json").read_bytes(), "plan.json")     # doctest: +SKIP
    >>> print(render_document(doc, "text", width=120))                # doctest: +SKIP
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from servescope.core.document import encode, kind_of
from servescope.report.page import page, text_block

__all__ = ["FORMATS", "render_document", "render_html", "render_text", "text_console"]

FORMATS = ("text", "json", "html")


def text_console(doc: object, *, width: int | None = None, file: io.StringIO | None = None) -> Console:
    """The console the writing command prints ``doc`` on: stdout's width (or ``width``), no highlighting."""
    return Console(highlight=False, file=file, width=width)


def render_text(doc: Any, console: Console, *, top: int = 15) -> None:
    """``doc`` as the command that wrote it prints it on ``console``."""
    schema = kind_of(doc).schema
    if schema == "servescope.analysis":
        from servescope.report.tables import render_analysis

        render_analysis(doc, console, top=top)
    elif schema == "servescope.plan":
        from servescope.report.plan import render_plan, render_plan_headline

        plain = doc.as_dict()
        render_plan_headline(plain, console)
        render_plan(plain, console)
    elif schema == "servescope.bench_serve":
        from servescope.report.serve import render_serve

        render_serve(doc, console)
    elif schema == "servescope.bench_comm":
        from servescope.report.comm import render_comm

        render_comm(doc, console)
    elif schema == "servescope.bench_gemm":
        from servescope.report.gpu import render_gemm

        render_gemm(doc, console)
    elif schema == "servescope.health":
        from servescope.report.health import render_health

        render_health(doc, console)
    elif schema == "servescope.settings":
        from servescope.report.settings import render_settings

        render_settings(doc, console)
    elif schema == "servescope.gpu":
        from servescope.report.gpu import render_snapshot

        render_snapshot(doc, console)
    elif schema == "servescope.service":
        from servescope.report.service import render_status

        render_status(doc, console)
    elif schema == "servescope.diff":
        from servescope.report.diff import render_diff

        render_diff(doc, console)
    else:  # a kind registered in core without a view here
        raise ValueError(f"no text view of {schema}")


def render_html(doc: Any, *, top: int = 15, width: int = 120) -> str:
    """``doc`` as a self-contained HTML page in the shared style (:mod:`servescope.report.page`)."""
    kind = kind_of(doc)
    if kind.schema == "servescope.analysis":
        from servescope.report.html import render_analysis_html

        return render_analysis_html(doc, top=top)
    if kind.schema == "servescope.plan":
        from servescope.report.plan import render_plan_html

        return render_plan_html(doc.as_dict())
    if kind.schema == "servescope.bench_serve":
        from servescope.report.serve import render_serve_html

        return render_serve_html(doc)
    text = render_document(doc, "text", width=width, top=top)
    return page(f"servescope {kind.title}", [f"<h1>servescope {kind.title}</h1>",
                                             f'<p class="meta">written by <code>servescope {kind.command}</code>'
                                             "</p>", text_block(text)])


def render_document(doc: Any, fmt: str, *, width: int | None = None, top: int = 15) -> str:
    """``doc`` as ``fmt`` (``text``, ``json`` or ``html``); text at ``width`` columns (default: the terminal's).

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt == "json":
        return encode(doc).decode()
    if fmt == "html":
        return render_html(doc, top=top, width=width or 120)
    if fmt != "text":
        raise ValueError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    out = io.StringIO()
    render_text(doc, text_console(doc, width=width, file=out), top=top)
    return out.getvalue()
