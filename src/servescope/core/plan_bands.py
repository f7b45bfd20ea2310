"""The plan document's bands (issue 38): each figure's share of a step with its band, the call at each batch, and the
measurement that settles a close call. :mod:`servescope.core.plan` holds them; :mod:`servescope.plan.bands` makes
them."""

from __future__ import annotations

import msgspec

__all__ = ["A2aRow", "A2aWhatIf", "BatchCall", "FigureTerm", "Measurement"]


class FigureTerm(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One figure's share of a step (:class:`servescope.plan.bands.Term`): ``ms``, and how much shorter (``lo_ms``)
    or longer (``hi_ms``) the step may be for it; ``band`` its class; a collective's ``op``, ``group``, ``bytes``."""

    figure: str
    band: str
    ms: float
    lo_ms: float
    hi_ms: float
    op: str | None = None
    group: int | None = None
    bytes: list[int] | None = None
    calls: int | None = None


class BatchCall(msgspec.Struct, kw_only=True, frozen=True):
    """At one batch, the fastest layout against the next: the margin, what the figures' bands can take from it, and
    whether the call is decided; ``deciding``: the figure that can take the most."""

    batch: int
    fastest: str
    next: str | None
    margin_ms: float | None
    band_ms: float | None
    decided: bool
    deciding: str | None
    deciding_ms: float | None


class Measurement(msgspec.Struct, kw_only=True, frozen=True):
    """The measurement that settles a close call: the figure, the command that measures it on this box, and about
    how long it runs (seconds), with what the estimate rests on."""

    figure: str
    band: str
    command: str
    seconds: float
    basis: str
    then: str


class A2aRow(msgspec.Struct, kw_only=True, frozen=True):
    """One batch of the all-to-all what-if (:mod:`servescope.plan.ep_a2a`): the TP step and the EP step with
    all-to-all, each with its band (ms), what was swapped (the MoE all-reduces out, the all-to-alls in, µs a call,
    the all-to-all's origin, band class and bound), and whether the faster of the two is decided."""

    batch: int
    tp_ms: float
    tp_low_ms: float
    tp_high_ms: float
    ep_ms: float
    ep_low_ms: float
    ep_high_ms: float
    all_reduce_calls: int
    all_reduce_us_each: float
    all_to_all_calls: int
    all_to_all_bytes: int
    all_to_all_us_each: float
    all_to_all_origin: str
    all_to_all_band: str
    bound: str
    decided: bool


class A2aWhatIf(msgspec.Struct, kw_only=True, frozen=True):
    """EP with all-to-all in place of the MoE all-reduce against TP, per batch, and where they cross: as predicted
    (``crossover_batch``) and with every figure at the side favouring EP, then TP (``crossover_band``)."""

    layout: str
    versus: str
    rows: list[A2aRow]
    crossover_batch: int | None
    crossover_band: list[int | None]
    sentence: str
    assumption: str
    measure: Measurement | None = None  # what settles the call at the first batch, where it is not decided
