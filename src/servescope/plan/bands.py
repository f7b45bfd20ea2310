"""How far each predicted figure may be from the truth, from where it comes from (issue 38).

Every figure of a step falls in one class of ``data/bands.toml`` — ``in_situ`` (a kernel in a real trace of this
box, or the user's ``bench comm`` curve), ``calibrated`` (``plan --calibrate``), ``published_same_device``,
``published_sibling``, ``assumed`` — and a figure carried past its measured sizes widens by a factor
``1 + [extended] per_doubling`` on each side for each doubling of the distance. The step's other parts (weights,
attention, other) take the bands of ``[part.*]`` unless calibrated. A layout's band adds its figures' bands (each
at its far side).

Two layouts compared (:func:`compare`) share the figures both use: a figure that is off moves both steps alike, so
what it can take from the margin is only the difference it makes: ``max(0, A_hi − B_hi, B_lo − A_lo)`` for the
faster ``A`` (``A_hi``: how much longer A's use of the figure may be; ``B_lo``: how much shorter B's). The call is
decided when the margin exceeds the sum over figures; the figure that could take the most is the one to measure.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

__all__ = ["CLASSES", "Compared", "Term", "band_of", "classify_point", "compare", "extended_by", "load_bands",
           "part_term", "scaled", "term_for"]

CLASSES = ("in_situ", "calibrated", "published_same_device", "published_sibling", "assumed")


@cache
def load_bands() -> dict[str, Any]:
    """``data/bands.toml``, read once."""
    data: dict[str, Any] = tomllib.loads(files("servescope").joinpath("data", "bands.toml").read_text(encoding="utf-8"))
    return data


def _fractions(cls: str, doublings: float = 0.0) -> tuple[float, float]:
    """(lo, hi) fractions of a figure of class ``cls`` carried ``doublings`` past its points; lo below 1."""
    b = load_bands()["class"][cls]
    widen = (1 + float(load_bands()["extended"]["per_doubling"])) ** max(0.0, doublings)
    return 1 - (1 - float(b["lo"])) / widen, (1 + float(b["hi"])) * widen - 1


def extended_by(nbytes: float, measured: tuple[int, ...] | list[int]) -> float:
    """Doublings ``nbytes`` lies beyond the measured sizes (0 within them)."""
    if not measured or nbytes <= 0:
        return 0.0
    lo, hi = min(measured), max(measured)
    if nbytes > hi:
        return math.log2(nbytes / hi)
    if nbytes < lo:
        return math.log2(lo / nbytes)
    return 0.0


@dataclass(frozen=True, kw_only=True)
class Term:
    """One figure's share of a step: ``ms`` and how much shorter (``lo_ms``) or longer (``hi_ms``) it may be.

    Attributes:
        figure: the figure's name (a collective's op, group, implementation and source; a part's rate).
        band: its class (``CLASSES``), ``extended`` appended where carried past its points.
        op, group, bytes: for a collective, what measures it (``bench comm --ops OP --gpus GROUP --sizes …``).
    """

    figure: str
    band: str
    ms: float
    lo_ms: float
    hi_ms: float
    op: str = ""
    group: int = 0
    bytes: tuple[int, ...] = field(default_factory=tuple)
    calls: int = 0


def scaled(cls: str, ms: float, doublings: float = 0.0) -> tuple[float, float]:
    """(lo_ms, hi_ms) of a figure of class ``cls`` worth ``ms``."""
    lo, hi = _fractions(cls, doublings)
    return ms * lo, ms * hi


def term_for(figure: str, cls: str, ms: float, *, doublings: float = 0.0, op: str = "", group: int = 0,
             nbytes: int = 0, calls: int = 0) -> Term:
    """A collective's term (one message size of one figure)."""
    lo, hi = scaled(cls, ms, doublings)
    band = cls + (f", extended {doublings:.1f}×2" if doublings > 0.05 else "")
    return Term(figure=figure, band=band, ms=ms, lo_ms=lo, hi_ms=hi, op=op, group=group,
                bytes=(nbytes,) if nbytes else (), calls=calls)


def part_term(part: str, ms: float, *, calibrated: bool) -> Term:
    """A non-collective part (weights, attention, other) at ``ms``: its ``[part.*]`` band, or the calibrated one."""
    if calibrated:
        lo, hi = _fractions("calibrated")
        cls = "calibrated"
    else:
        b = load_bands()["part"][part]
        lo, hi, cls = float(b["lo"]), float(b["hi"]), "assumed" if part == "other" else "datasheet × assumed"
    names = {"weights": "weights: datasheet memory rate × efficiency", "attention": "attention: KV read rate",
             "other": "other: fixed times per layer and step"}
    return Term(figure=names[part], band=cls, ms=ms, lo_ms=ms * lo, hi_ms=ms * hi)


def merge(terms: list[Term]) -> list[Term]:
    """Terms of the same figure summed (one figure, several message sizes or calls)."""
    out: dict[str, Term] = {}
    for t in terms:
        if t.figure in out:
            o = out[t.figure]
            band = o.band if "extended" in o.band or "extended" not in t.band else t.band
            out[t.figure] = Term(figure=t.figure, band=band, ms=o.ms + t.ms, lo_ms=o.lo_ms + t.lo_ms,
                                 hi_ms=o.hi_ms + t.hi_ms, op=t.op, group=t.group,
                                 bytes=tuple(sorted(set(o.bytes) | set(t.bytes))), calls=o.calls + t.calls)
        else:
            out[t.figure] = t
    return list(out.values())


def band_of(step_ms: float, terms: list[Term]) -> tuple[float, float]:
    """(low, high) step, ms: every figure at its far side."""
    return max(0.0, step_ms - sum(t.lo_ms for t in terms)), step_ms + sum(t.hi_ms for t in terms)


def classify_point(origin: str, stands_for: str, profile: str, explicit: str = "") -> str:
    """The class of a per-call point: its explicit ``band``, else in situ, calibrated, or published on the same
    device unless it stands for ``profile`` as a sibling (``stands_for`` names the profile)."""
    if explicit:
        return explicit
    if origin == "in-situ":
        return "in_situ"
    if origin == "calibrated":
        return "calibrated"
    return "published_sibling" if stands_for.startswith(f"{profile}:") else "published_same_device"


@dataclass(frozen=True, kw_only=True)
class Compared:
    """Two layouts at one batch: the faster ``a`` and the other ``b``, the margin, what the figures can take from it.

    Attributes:
        margin_ms: ``b``'s step less ``a``'s.
        band_ms: the most the figures, each at its far side, can take from the margin.
        decided: the margin exceeds it.
        by_figure: (figure, ms it can take, the term of ``a``, the term of ``b``), the largest first.
    """

    a: str
    b: str
    batch: int
    margin_ms: float
    band_ms: float
    decided: bool
    by_figure: list[tuple[str, float, Term | None, Term | None]]


def compare(a: str, a_terms: list[Term], a_ms: float, b: str, b_terms: list[Term], b_ms: float,
            batch: int) -> Compared:
    """``a`` (faster) against ``b`` at ``batch``: the margin and the figures' share of it (module doc)."""
    ta, tb = {t.figure: t for t in a_terms}, {t.figure: t for t in b_terms}
    rows: list[tuple[str, float, Term | None, Term | None]] = []
    for name in dict.fromkeys([*ta, *tb]):
        x, y = ta.get(name), tb.get(name)
        a_hi, a_lo = (x.hi_ms, x.lo_ms) if x else (0.0, 0.0)
        b_hi, b_lo = (y.hi_ms, y.lo_ms) if y else (0.0, 0.0)
        take = max(0.0, a_hi - b_hi, b_lo - a_lo)
        if take > 0:
            rows.append((name, take, x, y))
    rows.sort(key=lambda r: -r[1])
    band = sum(r[1] for r in rows)
    margin = b_ms - a_ms
    return Compared(a=a, b=b, batch=batch, margin_ms=margin, band_ms=band, decided=margin > band, by_figure=rows)
