"""``servescope bench serve`` as Python functions: :func:`bench_serve` runs a sweep of given load points, or
searches the knee (the most load within the latency targets), and returns the finished document with its next
steps. The CLI only parses flags into a :class:`ServeRequest`; :func:`parse_loads` reads ``--concurrency`` and
``--rate``.

Example:
    >>> load = LoadSpec("http://127.0.0.1:8000", concurrency=())
    >>> result = bench_serve(ServeRequest(load=load, slo="ttft_p99=2000,itl_p99=50"))   # doctest: +SKIP
    >>> result.knee.load                                                                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import msgspec

from servescope.bench.serve.knee import KneeSpec, find_knee
from servescope.bench.serve.point import LoadSpec, PointProgress
from servescope.bench.serve.sweep import run_bench_serve
from servescope.core.errors import InputError
from servescope.core.knee import parse_slo
from servescope.core.next_steps import serve_next_steps
from servescope.core.serve import ServeResult

__all__ = ["DEFAULT_LEVELS", "SEARCH_WORDS", "LoadSpec", "ServeRequest", "bench_serve", "interrupted",
           "parse_loads", "server_argv"]

N = TypeVar("N", int, float)

SEARCH_WORDS = ("auto", "knee")
"""``--concurrency`` or ``--rate`` words that ask for the knee search on that load."""
DEFAULT_LEVELS = (1, 4, 16, 64)
"""The concurrency levels swept when no points, no search and no targets are given."""


@dataclass(frozen=True)
class ServeRequest:
    """What ``bench serve`` runs: ``load`` (its ``concurrency`` or ``rate`` the explicit points, both empty for a
    search or the default levels); ``slo`` the targets' text (``ttft_p99=2000,itl_p99=100``; None: the default
    targets); ``search`` the load the knee search varies ("concurrency" or "rate"; None: a search only with
    ``slo`` and no points). The rest bound the search, as :class:`~.knee.KneeSpec`."""

    load: LoadSpec
    slo: str | None = None
    search: Literal["concurrency", "rate"] | None = None
    tolerance: float = 0.1
    repeats: int = 2
    budget_s: float | None = None
    max_requests: int | None = None
    start: float = 1.0
    max_load: float | None = None

    @property
    def searches(self) -> bool:
        """Whether the request searches the knee rather than sweeping points."""
        return self.search is not None or (self.slo is not None and not self.load.rate and not self.load.concurrency)


def _numbers(option: str, text: str | None, kind: type[N]) -> tuple[N, ...]:
    if not text:
        return ()
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(option, f"not a comma-separated list of numbers: {text!r}") from None
    if any(v <= 0 for v in values):
        raise InputError(option, f"values must be positive: {text!r}")
    return values


def parse_loads(concurrency: str | None, rate: str | None
                ) -> tuple[tuple[int, ...], tuple[float, ...], Literal["concurrency", "rate"] | None]:
    """``--concurrency`` and ``--rate`` as (levels, rates, the load a search varies): lists of positive numbers,
    or a word of :data:`SEARCH_WORDS` that asks for the search.

    Raises:
        InputError: not a list of positive numbers, or both options given.
    """
    search_rate = rate is not None and rate.strip().lower() in SEARCH_WORDS
    search_conc = concurrency is not None and concurrency.strip().lower() in SEARCH_WORDS
    rates = () if search_rate else _numbers("--rate", rate, float)
    levels = () if search_conc else _numbers("--concurrency", concurrency, int)
    if rate is not None and concurrency is not None:
        raise InputError("--concurrency/--rate", "give one of them, not both")
    return levels, rates, "rate" if search_rate else "concurrency" if search_conc else None


def server_argv(url: str) -> list[str] | None:
    """The command line of the server at ``url`` where it runs on this machine (what settings are in place)."""
    from servescope.server.process import local_server

    record = local_server(url)
    return list(record.argv) if record is not None else None


def bench_serve(request: ServeRequest, *, progress: PointProgress | None = None,
                checkpoint: Callable[[ServeResult], None] | None = None) -> ServeResult:
    """The sweep or the knee search of ``request``, its next steps in the document (so that ``-o``, ``--json``
    and ``report`` say them too); ``checkpoint`` gets the document after every point.

    Raises:
        InputError: bad options or targets, or a server that cannot be benchmarked.
    """
    targets = parse_slo(request.slo)
    argv = server_argv(request.load.url)
    load = request.load
    if request.searches:
        spec = KneeSpec(load=load, slo=targets, mode=request.search or "concurrency", tolerance=request.tolerance,
                        budget_s=request.budget_s, max_requests=request.max_requests, repeats=request.repeats,
                        start=request.start, max_load=request.max_load, slo_default=request.slo is None,
                        server_argv=argv)
        result = find_knee(spec, progress=progress, checkpoint=checkpoint)
    else:
        if not load.concurrency and not load.rate:
            load = dataclasses.replace(load, concurrency=DEFAULT_LEVELS)
        result = run_bench_serve(load, progress=progress, checkpoint=checkpoint, slo=targets,
                                 slo_default=request.slo is None)
    steps = serve_next_steps(result, argv=argv or ())
    return msgspec.structs.replace(result, next_steps=steps) if steps else result


def interrupted(partial: ServeResult) -> ServeResult:
    """The document as it stood when the run was interrupted: its search (or sweep) marked so."""
    if partial.search is None:
        return msgspec.structs.replace(partial, aborted=partial.aborted or "interrupted")
    search = msgspec.structs.replace(partial.search, stopped=f"interrupted after {len(partial.points)} points")
    return msgspec.structs.replace(partial, search=search)
