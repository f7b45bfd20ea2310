"""The ``tune`` result document: the baseline knee and its noise, every trial, the final knee, what to keep.

The objective is the most output tokens/s delivered at a load whose points all met every ``--slo`` target: the
knee's (the most load that met them; :mod:`servescope.bench.serve.knee`), or a lower load's where the server
delivered more there (past a point more streams can deliver fewer tokens and still meet the targets), with goodput
beside it (documents written before the delivered figure was measured compare goodput). The noise is how far the
baseline moves between two measurements of the same server (and the spread of the knee's repeats); a change is
kept only when it beats the reference (the baseline, or the last kept change) by more than that.
"""

from __future__ import annotations

import msgspec

from servescope.core.changes import Candidate, ChangeEdit, NotCandidate
from servescope.core.document import Document
from servescope.core.knee import most_delivered, option_past_stop
from servescope.core.serve import TargetCheck

__all__ = ["KeepSettings", "KneeFigure", "TargetInfo", "Trial", "TuneDoc", "TuneOptions", "judge_gain",
           "option_past_floor", "reference_load", "relative_gain", "same_load_gain"]

OUTCOMES = ("kept", "rolled_back", "failed_start", "measure_failed", "interrupted")


def option_past_floor(floor: str | None) -> str:
    """The tune option that lets a knee search measure past where ``floor`` (why it stopped) left it."""
    return (option_past_stop(floor, time_option="--measure-budget", each="each")
            or "--max-load lets the search go further")


class KneeFigure(msgspec.Struct, kw_only=True, frozen=True):
    """One measurement of the knee: goodput tokens/s and requests/s at ``load`` (``None``: no load met the
    targets, goodput 0), the repeats' spread, the cause's id and sentence, and the seconds it took.

    ``tokens_per_s``: the output tokens/s the knee's load delivered (all its requests; it met the targets as a
    whole), with ``spread`` then over its repeats; tune compares :attr:`delivered`: with ``compares`` ``most``
    (measured since 2026-12-07) the most tokens/s any load delivered within the targets (that figure, or a lower
    load's of ``delivered_at``: :attr:`best_load`), with ``knee`` (documents before) that figure alone, else
    goodput (documents written before either was measured).
    ``floor``: where the search measured no load above ``load``, why it stopped (a budget ran out, every load up
    to its limit met): the knee is then at least ``load``, not known to be there. ``checks``: each target at the
    knee's load, the worst of its repeats: how much room the knee leaves under the targets. ``delivered_at``: each
    load whose points all met the targets, with the output tokens/s it delivered (the median of its points), lowest
    load first."""

    goodput_tokens_per_s: float
    goodput_requests_per_s: float | None
    load: float | None
    unit: str | None
    spread: list[float] | None
    cause: str | None
    cause_message: str | None
    seconds: float
    tokens_per_s: float | None = None
    floor: str | None = None
    checks: list[TargetCheck] | None = None
    delivered_at: list[tuple[float, float]] | None = None
    compares: str = "knee"

    def delivered_at_load(self, load: float) -> float | None:
        """The tokens/s delivered at ``load`` where the search measured it and it met the targets."""
        return next((tokens for at, tokens in self.delivered_at or () if at == load), None)

    def _most(self) -> tuple[float | None, float | None]:
        if self.tokens_per_s is None or self.load is None or self.compares != "most":
            return self.load, self.tokens_per_s
        top = max(self.spread[1], self.tokens_per_s) if self.spread and len(self.spread) == 2 else self.tokens_per_s
        return most_delivered(self.load, self.tokens_per_s, top, self.delivered_at or ())

    @property
    def best_load(self) -> float | None:
        """The load whose tokens/s tune compares: the knee's, or (``compares`` ``most``) a lower load that
        delivered clearly more within the targets (:func:`~servescope.core.knee.most_delivered`)."""
        return self._most()[0]

    @property
    def delivered(self) -> float:
        """The figure tune compares: the tokens/s delivered at :attr:`best_load`, or goodput where tokens/s were
        not measured."""
        tokens = self._most()[1]
        return tokens if tokens is not None else self.goodput_tokens_per_s


class Trial(msgspec.Struct, kw_only=True, frozen=True):
    """One change tried: what it set, on what evidence, what it should have gained and what it did.

    ``outcome``: ``kept``, ``rolled_back`` (no gain beyond the noise), ``failed_start`` (the server did not come up:
    ``why`` quotes its log), ``measure_failed``, ``interrupted``. ``measured_gain``: the knee's goodput against
    ``reference_tokens_per_s`` (the knee it had to beat), as a fraction. A change whose range prices the same load
    (``change.gain_at`` ``load``: a shorter step) is judged there too: ``same_load_gain`` is the trial's tokens/s at
    ``same_load`` (the reference knee's load) against the reference's there, the knee's own move aside.
    ``within_prediction``: whether the gain the range prices lies in it.
    """

    number: int
    change: Candidate
    config: str
    outcome: str
    why: str
    knee: KneeFigure | None
    reference_tokens_per_s: float
    measured_gain: float | None
    within_prediction: bool | None
    restart_s: float
    measure_s: float
    seconds: float
    log_tail: list[str] = []
    same_load: float | None = None
    same_load_gain: float | None = None

    @property
    def judged_gain(self) -> float | None:
        """The gain set against the predicted range: at the same load where the range prices that, else the knee's."""
        return self.same_load_gain if self.same_load_gain is not None else self.measured_gain


class TargetInfo(msgspec.Struct, kw_only=True, frozen=True):
    """What tune changed: ``kind`` ``launch`` (a command servescope starts) or ``unit`` (a systemd unit, changed by
    the drop-in ``dropin``); ``original``: the command line it started from (secrets redacted); ``left_running``: the
    process of a launched server left up at the end on the kept settings (``--leave-running``)."""

    kind: str
    name: str
    url: str
    original: str
    dropin: str | None = None
    log: str | None = None
    left_running: int | None = None


class TuneOptions(msgspec.Struct, kw_only=True, frozen=True):
    """Every option that changes a number or a decision."""

    slo: list[str]
    input_tokens: int
    output_tokens: int
    budget_s: float | None
    max_restarts: int | None
    measure_budget_s: float | None
    allow: list[str]
    catalogue: str | None
    profile: bool
    min_noise: float
    prompt_form: str | None = None  # ids or text as sent (None: a document from before the option)


class KeepSettings(msgspec.Struct, kw_only=True, frozen=True):
    """The kept changes, ready to use: the whole command line, and for a unit the drop-in text."""

    changes: list[str]
    edit: ChangeEdit
    command_line: str
    dropin: str | None = None


class TuneDoc(Document, kw_only=True, frozen=True):
    """A whole ``tune`` run. ``stopped``: why the loop ended (no candidate left, budget, restarts, interrupted,
    an error); ``restored``: the original configuration was put back (a rollback at the end, ctrl-c, SIGTERM)."""

    schema: str = "servescope.tune"
    schema_version: int = 1
    servescope_version: str
    created_at: str
    platform: dict[str, str]
    target: TargetInfo
    options: TuneOptions
    baseline: list[KneeFigure]
    noise: float
    final: KneeFigure | None
    trials: list[Trial]
    not_tried: list[NotCandidate]
    keep: KeepSettings
    stopped: str
    restored: bool
    evidence: list[str] = []
    seconds: float = 0.0
    journal: str | None = None


def reference_load(references: list[KneeFigure]) -> float | None:
    """The load a shorter step's range prices: the references' knee load (the lowest, where their knees differ)."""
    return min((r.load for r in references if r.load is not None), default=None)


def same_load_gain(figure: KneeFigure, references: list[KneeFigure]) -> tuple[float, float] | None:
    """``figure``'s tokens/s at :func:`reference_load` against the mean of the references' there, as (load, gain);
    ``None`` where that load was not measured within the targets on both sides."""
    load = reference_load(references)
    if load is None:
        return None
    theirs = [v for r in references if (v := r.delivered_at_load(load)) is not None]
    ours = figure.delivered_at_load(load)
    gain = relative_gain(ours, sum(theirs) / len(theirs)) if ours is not None and theirs else None
    return None if gain is None else (load, gain)


def judge_gain(change: Candidate, figure: KneeFigure, reference: float,
               references: list[KneeFigure]) -> tuple[float | None, tuple[float, float] | None, bool | None]:
    """A trial's knee against its prediction: the gain over ``reference`` (tokens/s), the same-load (load, gain)
    where ``change`` prices the same load and both sides measured it, and whether the priced gain lies in the
    range."""
    gain = relative_gain(figure.delivered, reference)
    at = same_load_gain(figure, references) if change.gain_at == "load" else None
    judged = at[1] if at is not None else gain
    return gain, at, None if judged is None else change.gain_low <= judged <= change.gain_high


def relative_gain(value: float, reference: float) -> float | None:
    """``value / reference - 1``; None when the reference is 0 (no knee), where no ratio exists."""
    return None if reference <= 0 else value / reference - 1.0
