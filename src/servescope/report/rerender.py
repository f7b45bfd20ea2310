"""``servescope report``: any saved result document rendered again as text, JSON or HTML, without recomputing.

The text is what the command that wrote the document printed; the JSON is the document as :mod:`servescope.core
.document` writes it; the HTML is the kind's own page (analysis, plan, bench serve) or, for the others, the text
view in the shared page style, so every HTML view carries what the terminal shows.

Each kind's views are one entry of :data:`VIEWS`, by the ``schema`` of its :class:`~servescope.core.document
.DocumentKind`: a new kind of document is one entry there beside its entry in ``KINDS``.

Example:
    >>> doc = decode(Path("plan.json").read_bytes(), "plan.json")     # doctest: +SKIP
    >>> print(render_document(doc, "text", width=120))                # doctest: +SKIP
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console

from servescope.core.document import encode, kind_of
from servescope.core.plan import PlanDoc
from servescope.report.comm import render_comm
from servescope.report.diff import render_diff
from servescope.report.gpu import render_gemm, render_snapshot
from servescope.report.health import render_health
from servescope.report.html import render_analysis_html
from servescope.report.page import page, text_block
from servescope.report.plan import render_plan, render_plan_headline, render_plan_html
from servescope.report.serve import render_serve, render_serve_html
from servescope.report.service import render_status
from servescope.report.settings import render_settings
from servescope.report.tables import render_analysis
from servescope.report.tune import render_tune, render_tune_html

__all__ = ["FORMATS", "VIEWS", "HtmlView", "TextView", "View", "render_document", "render_html", "render_text"]

FORMATS = ("text", "json", "html")


class TextView(Protocol):
    """Prints a document on ``console`` as the command that wrote it does; ``top``: kernels an analysis lists."""

    def __call__(self, doc: Any, console: Console, *, top: int) -> None: ...


class HtmlView(Protocol):
    """A document's own self-contained HTML page."""

    def __call__(self, doc: Any, *, top: int) -> str: ...


@dataclass(frozen=True)
class View:
    """How one kind of document is shown: ``text`` as its command prints it, ``html`` its own page (``None``: the
    text view in the shared page style)."""

    text: TextView
    html: HtmlView | None = None


def _plain(render: Callable[[Any, Console], None]) -> TextView:
    """A text view without options."""
    def view(doc: Any, console: Console, *, top: int) -> None:
        render(doc, console)
    return view


def _plan_text(doc: PlanDoc, console: Console, *, top: int) -> None:
    render_plan_headline(doc, console)
    render_plan(doc, console)


def _plan_html(doc: PlanDoc, *, top: int) -> str:
    return render_plan_html(doc)


def _serve_html(doc: Any, *, top: int) -> str:
    return render_serve_html(doc)


VIEWS: dict[str, View] = {
    "servescope.analysis": View(render_analysis, render_analysis_html),
    "servescope.plan": View(_plan_text, _plan_html),
    "servescope.bench_serve": View(_plain(render_serve), _serve_html),
    "servescope.bench_comm": View(_plain(render_comm)),
    "servescope.bench_gemm": View(_plain(render_gemm)),
    "servescope.health": View(_plain(render_health)),
    "servescope.settings": View(_plain(render_settings)),
    "servescope.gpu": View(_plain(render_snapshot)),
    "servescope.service": View(_plain(render_status)),
    "servescope.diff": View(_plain(render_diff)),
    "servescope.tune": View(_plain(render_tune), lambda doc, *, top: render_tune_html(doc)),
}
"""Each kind's views, by its ``schema``."""


def _view(doc: object) -> View:
    schema = kind_of(doc).schema
    try:
        return VIEWS[schema]
    except KeyError:  # a kind registered in core without a view here
        raise ValueError(f"no view of {schema}") from None


def render_text(doc: Any, console: Console, *, top: int = 15) -> None:
    """``doc`` as the command that wrote it prints it on ``console``."""
    _view(doc).text(doc, console, top=top)


def render_html(doc: Any, *, top: int = 15, width: int = 120) -> str:
    """``doc`` as a self-contained HTML page in the shared style (:mod:`servescope.report.page`)."""
    html = _view(doc).html
    if html is not None:
        return html(doc, top=top)
    kind = kind_of(doc)
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
    render_text(doc, Console(highlight=False, file=out, width=width), top=top)
    return out.getvalue()
