"""The knee as tune measures it: ``bench serve``'s search (:func:`servescope.bench.serve.knee.find_knee`) at the
user's targets, reduced to the figure tune compares (the output tokens/s the knee's load delivered) and the cause's
evidence figures.

A :data:`Measure` is any function of (url, start load, progress) to a :class:`Measured`; :func:`knee_measure`
makes the real one. Tests of the loop may pass their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from servescope.core.knee import delivered_by_load
from servescope.core.next_steps import knee_figures
from servescope.core.serve import Knee, ServeResult, SloTarget, TargetCheck
from servescope.core.tune import KneeFigure

__all__ = ["Measure", "Measured", "figure_of", "knee_measure"]


@dataclass(frozen=True)
class Measured:
    """One knee measurement: the figure tune records and the cause's evidence figures (for the catalogue)."""

    figure: KneeFigure
    cause_figures: dict[str, float] = field(default_factory=dict)


class Measure(Protocol):
    """Measures the knee of the server at ``url``, starting the search at ``start`` streams (and ``also_at``, below
    its knee, where the search did not)."""

    def __call__(self, url: str, *, start: float, progress: Callable[[str], None] | None,
                 server_argv: Sequence[str] | None, also_at: float | None = None) -> Measured: ...


def figure_of(result: ServeResult, seconds: float) -> Measured:
    """The figure of a knee search's document (no knee: goodput 0, the load None)."""
    knee, cause = result.knee, result.cause
    figure = KneeFigure(
        goodput_tokens_per_s=knee.goodput_tokens_per_s if knee else 0.0,
        goodput_requests_per_s=knee.goodput_requests_per_s if knee else None,
        load=knee.load if knee else None, unit=knee.unit if knee else None,
        spread=_spread(knee), cause=cause.id if cause else None, tokens_per_s=knee.tokens_per_s if knee else None,
        cause_message=cause.message if cause else None, seconds=seconds, floor=_floor(result),
        checks=_worst_checks(result), delivered_at=delivered_by_load(result.points) or None, compares="most")
    return Measured(figure=figure, cause_figures=knee_figures(result))


def _worst_checks(result: ServeResult) -> list[TargetCheck] | None:
    """Each target at the knee's load, the worst of its repeats (the largest statistic), in the targets' order."""
    knee = result.knee
    if knee is None:
        return None
    worst: dict[str, TargetCheck] = {}
    for point in result.points:
        if point.load != knee.load or point.slo is None:
            continue
        for check in point.slo.checks:
            held = worst.get(check.target)
            if held is None or (check.value_ms or 0.0) > (held.value_ms or 0.0):
                worst[check.target] = check
    return list(worst.values()) or None


def _floor(result: ServeResult) -> str | None:
    """Why the search measured no load above its knee, where it measured none (the knee is a lower bound)."""
    knee, search = result.knee, result.search
    return search.stopped if knee is not None and knee.next_load is None and search is not None else None


def _spread(knee: Knee | None) -> list[float] | None:
    """The repeats' spread of the figure tune compares (tokens/s delivered where measured, else goodput)."""
    if knee is None:
        return None
    if knee.tokens_per_s is not None and knee.tokens_spread is not None:
        return list(knee.tokens_spread)
    return list(knee.spread)


def knee_measure(*, slo: tuple[SloTarget, ...], input_tokens: int, output_tokens: int, api_key: str | None,
                 budget_s: float | None, max_requests: int | None, max_load: float | None, repeats: int = 2,
                 workers: int = 0, prompt_form: str = "ids") -> Measure:
    """The real measurement: a knee search per call with these targets, prompt and output lengths (and the
    prompts' form: token ids or text) and limits."""
    from servescope.bench.serve.knee import KneeSpec, find_knee
    from servescope.bench.serve.sweep import LoadSpec
    from servescope.server.client import ApiKey

    key = ApiKey(api_key, "--api-key") if api_key else None

    def measure(url: str, *, start: float, progress: Callable[[str], None] | None,
                server_argv: Sequence[str] | None, also_at: float | None = None) -> Measured:
        def tick(label: str, done: int, planned: int) -> None:
            if progress is not None:
                progress(f"{label}: {done}/{planned or '?'} requests")

        began = time.monotonic()
        spec = KneeSpec(load=LoadSpec(url=url, input_tokens=input_tokens, output_tokens=output_tokens, api_key=key,
                                      workers=workers, prompt_form=prompt_form),
                        slo=slo, budget_s=budget_s, max_requests=max_requests, repeats=repeats,
                        start=max(1.0, start), max_load=max_load, server_argv=server_argv,
                        also_at=(also_at,) if also_at is not None else ())
        result = find_knee(spec, progress=tick)
        return figure_of(result, time.monotonic() - began)

    return measure
