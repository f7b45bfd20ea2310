"""The tune loop: the baseline knee twice (its noise), then one change at a time — the candidate the evidence
calls for with the most predicted gain — applied, restarted, measured, kept only if its knee beats the reference
by more than the noise, else rolled back; until no candidate is left, the budget or the restarts run out.

Nothing is left half-done: a failed start, a measurement that fails and a change that does not deliver are
rolled back to the last kept configuration at once; ctrl-c (KeyboardInterrupt), SIGTERM or any error puts the
original configuration back (the unit's drop-in byte for byte, the launched server stopped) before returning or
raising. The journal (:mod:`.journal`) is written after every step.

Example:
    >>> doc = run_tune(TuneRequest(slo=("ttft_p99=2000",), input_tokens=128, output_tokens=64),
    ...                target, knee_measure(...), journal_path=Path("tune.journal.json"))  # doctest: +SKIP
"""

from __future__ import annotations

import platform as _platform
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from servescope import __version__
from servescope.core.changes import Candidate, ChangeEdit, NotCandidate, SeenFinding, load_catalogue, match_changes
from servescope.core.errors import InputError, ServescopeError
from servescope.core.redact import redact
from servescope.core.tune import (
    KeepSettings,
    KneeFigure,
    TargetInfo,
    Trial,
    TuneDoc,
    TuneOptions,
    judge_gain,
    option_past_floor,
    reference_load,
)
from servescope.tune.edit import ServerConfig, apply_edits, merge_edits, shell_line
from servescope.tune.evidence import gather_evidence, platform_here, server_version
from servescope.tune.journal import Journal, JournalProcess, write_journal
from servescope.tune.launch import LaunchTarget
from servescope.tune.measure import Measure, Measured
from servescope.tune.target import Target
from servescope.tune.unit import NotConfirmed, UnitTarget

__all__ = ["Profiler", "TuneRequest", "beyond_noise", "noise_of", "run_tune"]

Say = Callable[[str, bool], None]
"""Progress: one line per step, and whether it is transient (a load's progress, replaced by the next line)."""
Profiler = Callable[[float], tuple[list[SeenFinding], str]]
"""Profiles the server at a load: its findings and a sentence on how it went."""


@dataclass(frozen=True)
class TuneRequest:
    """What to tune for. ``slo``: the targets as given (``ttft_p99=2000``); the measure holds them parsed."""

    slo: tuple[str, ...]
    input_tokens: int
    output_tokens: int
    prompt_form: str = "ids"
    budget_s: float | None = None
    max_restarts: int | None = None
    measure_budget_s: float | None = None
    allow: tuple[str, ...] = ()
    catalogue: Path | None = None
    profile: bool = False
    min_noise: float = 0.02
    inputs: Mapping[str, str] = field(default_factory=dict)
    keep: bool = True
    leave_running: bool = False
    api_key: str | None = field(default=None, repr=False)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # SIGTERM is handled as ctrl-c is; KeyboardInterrupt, since asyncio (the knee search) lets it out of a task
    # where it would keep another exception in the task
    raise KeyboardInterrupt("SIGTERM")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    try:
        before = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: no handler can be set, ctrl-c is all there is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextmanager
def _shielded() -> Iterator[None]:
    """Neither ctrl-c nor SIGTERM while the original configuration goes back."""
    try:
        saved = [(s, signal.signal(s, signal.SIG_IGN)) for s in (signal.SIGINT, signal.SIGTERM)]
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        for sig, handler in saved:
            signal.signal(sig, handler)


_NOT_THE_SERVER = {
    "client": "the knee is the client's (servescope's own load generator ran late): no server setting moves it; "
              "measure from more CPUs or another machine to see the server's own knee",
}


def beyond_noise(candidates: list[Candidate], noise: float) -> tuple[list[Candidate], list[NotCandidate]]:
    """The candidates a trial could tell from the noise, and the others ruled out (``below_noise``): a change
    predicted to gain at most the baseline's noise could never be kept (it must beat the reference by more), so
    its restart would be spent for nothing."""
    showable, below = [], []
    for c in candidates:
        if c.gain_high > noise:
            showable.append(c)
        else:
            below.append(NotCandidate(
                id=c.id, label=c.label, reason="below_noise", because=c.because,
                detail=(f"predicted {c.gain_low:+.0%}..{c.gain_high:+.0%} ({c.gain_basis}): within the baseline's "
                        f"noise (±{noise:.0%}), a trial could not tell it from the noise")))
    return showable, below


_UNSTEADY = 0.5  # a baseline noise above this is said to be the server's unsteadiness, not a fine point


def noise_of(first: KneeFigure, second: KneeFigure, *, floor: float) -> float:
    """How far the knee moves on its own, as a fraction of the baseline: the two baselines' difference and each
    one's repeat spread, relative to their mean; at least ``floor``."""
    mean = (first.delivered + second.delivered) / 2
    if mean <= 0:
        return floor
    noise = abs(first.delivered - second.delivered) / mean
    for figure in (first, second):
        if figure.spread and len(figure.spread) == 2:
            noise = max(noise, (figure.spread[1] - figure.spread[0]) / mean)
    return max(noise, floor)


class _Run:
    """One tune run's state; :func:`run_tune` drives it."""

    def __init__(self, request: TuneRequest, target: Target, measure: Measure, *, journal_path: Path | None,
                 journal: Journal, say: Say, profiler: Profiler | None) -> None:
        self.request, self.target, self.measure = request, target, measure
        self.journal_path, self.journal, self.say, self.profiler = journal_path, journal, say, profiler
        self.catalogue = load_catalogue(request.catalogue)
        self.began = time.monotonic()
        self.platform = platform_here()
        self.version: str | None = None
        self.restarts = 0
        self.kept: list[ChangeEdit] = list(journal.kept)
        self.trials: list[Trial] = list(journal.trials)
        self.baseline: list[KneeFigure] = list(journal.baseline)
        self.noise = journal.noise if journal.noise is not None else request.min_noise
        self.ruled_out: dict[str, NotCandidate] = {}
        self.evidence_notes: list[str] = []
        self.findings: list[SeenFinding] = []
        self.stopped = "running"
        self.restored = False
        self.last: Measured | None = None
        self.references: list[KneeFigure] = []  # the knees the reference figure came from (same-load judging)
        self.left_running: int | None = None

    # ---------------------------------------------------------------------------------------- bookkeeping

    def save(self, state: str | None = None) -> None:
        if state is not None:
            self.journal.state = state
        self.journal.kept, self.journal.trials = list(self.kept), list(self.trials)
        self.journal.baseline, self.journal.noise = list(self.baseline), self.noise
        if self.journal_path is not None:
            write_journal(self.journal_path, self.journal)

    def on_start(self, pid: int, ticks: int | None) -> None:
        self.journal.process = JournalProcess(pid=pid, start_ticks=ticks)
        self.save()

    def config(self, extra: Sequence[ChangeEdit] = ()) -> ServerConfig:
        return apply_edits(self.target.original, [*self.kept, *extra])

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    # ---------------------------------------------------------------------------------------- steps

    def start(self, config: ServerConfig, what: str, *, counts: bool = True) -> tuple[bool, str, float, list[str]]:
        """Start ``config``; ``counts``: a restart toward ``--max-restarts`` (a launched server's first start is
        not one)."""
        self.say(f"{what}: starting the server", False)
        started = self.target.start(config, progress=lambda e, p: self.say(f"{what}: loading, {e:.0f} s ({p})",
                                                                             True))
        self.restarts += int(counts)
        self.say(f"{what}: {'ready' if started.ok else 'failed: ' + started.reason} after {started.seconds:.0f} s",
                 False)
        return started.ok, started.reason, started.seconds, started.log_tail

    def knee(self, what: str, argv: Sequence[str], also_at: float | None = None) -> Measured:
        # the search never goes below its first load (a first miss ends it with no knee): a change that lowers the
        # knee must be measured from the bottom too, so every search starts at 1
        measured = self.measure(self.target.url, start=1.0, progress=lambda s: self.say(f"{what}: {s}", True),
                                server_argv=list(argv), also_at=also_at)
        f = measured.figure
        plus = "+" if f.floor else ""
        if f.load is None:
            knee = "no load met the targets"
        elif f.best_load != f.load:  # a lower load delivered more within the targets
            knee = f"{f.delivered:.1f} tok/s at {f.best_load:g} (the knee {f.load:g}{plus}: {f.tokens_per_s:.1f} tok/s)"
        else:
            knee = f"{f.delivered:.1f} tok/s at {f.load:g}{plus}"
        if f.floor:
            knee += f" (no higher load measured: {f.floor})"
        self.say(f"{what}: knee {knee} ({f.cause or 'no named cause'}; {f.seconds:.0f} s)", False)
        return measured

    def candidates(self, measured: Measured, config: ServerConfig) -> list[Candidate]:
        if self.request.profile and self.profiler is not None and measured.figure.load:
            self.findings, note = self.profiler(measured.figure.load)
            self.evidence_notes.append(note)
        evidence = gather_evidence(measured, config, log_lines=self.target.log_lines(), version=self.version,
                                   platform=self.platform, inputs=dict(self.request.inputs), findings=self.findings)
        matched = match_changes(evidence, allow=self.request.allow, catalogue=self.catalogue)
        for out in matched.ruled_out:
            self.ruled_out[out.id] = out
        for c in matched.candidates:
            self.ruled_out.pop(c.id, None)
        if measured.figure.cause_message:
            self.evidence_notes.append(f"knee cause {measured.figure.cause}: {measured.figure.cause_message}")
        return matched.candidates

    def rollback(self, what: str) -> None:
        if isinstance(self.target, LaunchTarget):
            # a launched server serves nobody but tune: the next trial starts its own configuration anyway, so the
            # last good one is started again only where it is needed (--leave-running at the end); a unit serves
            # users, and goes back at once
            self.target.stop()
            self.say(f"{what}: rolled back (stopped; the next start takes the last good configuration)", False)
            return
        ok, reason, _, _ = self.start(self.config(), f"{what}: rolling back")
        if not ok:
            raise InputError(self.target.name, f"the last good configuration did not start again: {reason}")

    def trial(self, number: int, cand: Candidate, reference: float,
              references: list[KneeFigure]) -> tuple[Trial, Measured | None]:
        what = f"trial {number} ({cand.edit.describe()})"
        config = self.config([cand.edit])
        self.journal.trying = cand
        self.save()
        began = time.monotonic()
        shown = shell_line(config, secrets=[self.request.api_key])

        def done(outcome: str, why: str, measured: Measured | None, restart_s: float, measure_s: float,
                 tail: list[str] | None = None) -> Trial:
            gain, at, within = judge_gain(cand, measured.figure, reference, references) if measured else \
                (None, None, None)
            return Trial(number=number, change=cand, config=shown, outcome=outcome, why=why,
                         knee=measured.figure if measured else None, reference_tokens_per_s=reference,
                         measured_gain=gain, within_prediction=within, restart_s=restart_s, measure_s=measure_s,
                         seconds=time.monotonic() - began, log_tail=tail or [],
                         same_load=at[0] if at else None, same_load_gain=at[1] if at else None)

        ok, reason, restart_s, tail = self.start(config, what)
        if not ok:
            self.rollback(what)
            return done("failed_start", f"the server did not start: {reason}", None, restart_s, 0.0, tail), None
        try:
            # a range of a shorter step prices the reference knee's load: the trial's search measures it too
            measured = self.knee(what, config.argv,
                                 also_at=reference_load(references) if cand.gain_at == "load" else None)
        except ServescopeError as exc:
            self.rollback(what)
            return done("measure_failed", f"the knee could not be measured: {exc}", None, restart_s, 0.0), None
        got = measured.figure.delivered
        bar = reference * (1 + self.noise)
        if (got > bar) if reference > 0 else got > 0:
            why = f"{got:.1f} tok/s beats {reference:.1f} by more than the noise (±{self.noise:.0%})"
            return done("kept", why, measured, restart_s, measured.figure.seconds), measured
        why = (f"{got:.1f} tok/s against {reference:.1f}: not beyond the noise (±{self.noise:.0%}, so at least "
               f"{bar:.1f})")
        self.rollback(what)
        return done("rolled_back", why, measured, restart_s, measured.figure.seconds), None

    # ---------------------------------------------------------------------------------------- the loop

    def baseline_knee(self) -> tuple[Measured, float]:
        config = self.config()
        resumed = bool(self.baseline)
        if self.target.kind == "launch" or (resumed and self.journal.trying is not None):
            ok, reason, _, tail = self.start(config, "baseline" if not resumed else "resume",
                                             counts=self.target.kind != "launch")
            if not ok:
                raise InputError(self.target.name, f"the server did not start: {reason}"
                                 + (f" (log: {tail[-1]})" if tail else ""))
        self.journal.trying = None
        self.version = server_version(self.target.url, self.request.api_key)
        if resumed:  # the configuration as kept so far, measured again as the reference
            last = self.knee("resumed reference", config.argv)
            self.references = [last.figure]
            return last, last.figure.delivered
        first = self.knee("baseline 1/2", config.argv)
        second = self.knee("baseline 2/2", config.argv)
        self.baseline, self.references = [first.figure, second.figure], [first.figure, second.figure]
        self.noise = noise_of(first.figure, second.figure, floor=self.request.min_noise)
        if self.noise > _UNSTEADY:
            a, b = first.figure, second.figure
            self.evidence_notes.append(
                f"the baseline's two knees lie {self.noise:.0%} apart ({a.delivered:.1f} tok/s at "
                f"{a.best_load or 0:g}, {b.delivered:.1f} at {b.best_load or 0:g}): a change must beat that to be "
                "kept and none predicted to gain less is tried; a server this unsteady between two searches is "
                "worth a look first (still compiling or loading, other work on it, a target on its edge), and a "
                "longer --measure-budget or more --repeats steadies the knee")
        self.save()
        reference = (first.figure.delivered + second.figure.delivered) / 2
        self.say(f"baseline: {reference:.1f} tok/s, noise ±{self.noise:.0%}", False)
        return second, reference

    def out_of_time(self) -> str | None:
        r = self.request
        if r.max_restarts is not None and self.restarts >= r.max_restarts:
            return f"max restarts ({r.max_restarts})"
        if r.budget_s is not None:
            last = self.trials[-1].seconds if self.trials else 0.0
            if self.elapsed() + last > r.budget_s:
                return f"budget ({r.budget_s:.0f} s; {self.elapsed():.0f} s spent, a trial takes ~{last:.0f} s)"
        return None

    def loop(self) -> None:
        self.save()
        self.last, reference = self.baseline_knee()
        candidates = self.candidates(self.last, self.config())
        while True:
            # a change that did not pay is not tried again; one kept may be tried again with a new value
            spent = {t.change.id for t in self.trials if t.outcome != "kept"}
            tried = {(t.change.id, t.change.edit.describe()) for t in self.trials}
            left, below = beyond_noise([c for c in candidates
                                        if c.id not in spent and (c.id, c.edit.describe()) not in tried], self.noise)
            self.ruled_out.update((out.id, out) for out in below)
            if not left:
                self.stopped = "no candidate left"
                last = self.last.figure if self.last is not None else None
                if last is not None and last.cause in _NOT_THE_SERVER:
                    self.evidence_notes.append(_NOT_THE_SERVER[last.cause])
                elif last is not None and last.cause is None and last.floor:
                    self.evidence_notes.append(
                        f"the knee search stopped before any load missed the targets ({last.floor}): with no load "
                        f"seen to miss, nothing bounds the knee that a change could answer "
                        f"({option_past_floor(last.floor)} to find it)")
                return
            if (limit := self.out_of_time()) is not None:
                self.stopped = limit
                for c in left:
                    self.ruled_out[c.id] = NotCandidate(id=c.id, label=c.label, reason="budget", detail=limit,
                                                        because=c.because)
                return
            cand = left[0]
            trial, measured = self.trial(len(self.trials) + 1, cand, reference, self.references)
            self.trials.append(trial)
            self.journal.trying = None
            if measured is not None:
                self.kept.append(cand.edit)
                self.last, reference = measured, measured.figure.delivered
                self.references = [measured.figure]
                candidates = self.candidates(measured, self.config())
            self.save()

    def restore(self) -> None:
        with _shielded():
            self.say("restoring the original configuration", False)
            self.target.restore()
            self.restored = True
            self.journal.trying = None
            self.save("restored")

    def finish(self) -> None:
        """The normal end: a launched server stops; a unit keeps what was kept (or, without --keep, goes back)."""
        if isinstance(self.target, UnitTarget):
            if self.kept and not self.request.keep:
                self.restore()
            else:
                self.restored = not self.kept
        elif self.request.leave_running and isinstance(self.target, LaunchTarget):
            if not self.target.running():
                ok, reason, _, _ = self.start(self.config(), "left running", counts=False)
                if not ok:
                    self.evidence_notes.append(f"the kept configuration did not start again to be left running: "
                                               f"{reason}")
            self.left_running = self.target.pid()
        else:
            self.target.stop()
        self.save("done" if not self.restored or not self.kept else "restored")

    # ---------------------------------------------------------------------------------------- the answer

    def document(self) -> TuneDoc:
        r = self.request
        original = self.target.original
        final_config = self.config()
        kept_ids = [t.change.id for t in self.trials if t.outcome == "kept"]
        dropin = None
        if isinstance(self.target, UnitTarget) and self.kept:
            dropin = redact(self.target.dropin_text(final_config), [r.api_key])
        final = next((t.knee for t in reversed(self.trials) if t.outcome == "kept"), None) or \
            (self.baseline[-1] if self.baseline else None)
        return TuneDoc(
            servescope_version=__version__, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            platform={"python": _platform.python_version(), "system": _platform.platform(), "engine": self.platform,
                      **({"server_version": self.version} if self.version else {})},
            target=TargetInfo(kind=self.target.kind, name=self.target.name, url=self.target.url,
                              original=shell_line(original, secrets=[r.api_key]),
                              dropin=str(self.target.dropin_path) if isinstance(self.target, UnitTarget) else None,
                              log=self.journal.log_dir, left_running=self.left_running),
            options=TuneOptions(slo=list(r.slo), input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                                prompt_form=r.prompt_form,
                                budget_s=r.budget_s, max_restarts=r.max_restarts,
                                measure_budget_s=r.measure_budget_s, allow=list(r.allow),
                                catalogue=str(r.catalogue) if r.catalogue else None, profile=r.profile,
                                min_noise=r.min_noise),
            baseline=self.baseline, noise=self.noise, final=final, trials=self.trials,
            not_tried=list(self.ruled_out.values()),
            keep=KeepSettings(changes=kept_ids, edit=merge_edits(self.kept),
                              command_line=shell_line(final_config, secrets=[r.api_key]), dropin=dropin),
            stopped=self.stopped, restored=self.restored, evidence=list(dict.fromkeys(self.evidence_notes)),
            seconds=self.elapsed(), journal=str(self.journal_path) if self.journal_path else None)


def new_journal(target: Target, options: Mapping[str, Any]) -> Journal:
    """The journal of a fresh run against ``target`` (``options``: what ``--resume`` needs to rebuild it)."""
    journal = Journal(kind=target.kind, url=target.url, argv=list(target.original.argv),
                      env=dict(target.original.env), options=dict(options))
    if isinstance(target, UnitTarget):
        journal.unit, journal.unit_path, journal.dropin = target.unit, str(target.unit_path), str(target.dropin_path)
        journal.set_before(target.before)
    else:
        journal.log_dir = str(getattr(target, "log_dir", "")) or None
    return journal


def run_tune(request: TuneRequest, target: Target, measure: Measure, *, journal_path: Path | None = None,
             journal: Journal | None = None, say: Say | None = None, profiler: Profiler | None = None) -> TuneDoc:
    """Tune ``target`` (see the module). ``journal``: a journal read back (``--resume``), else a fresh one is made;
    ``say`` gets one line per step (progress); ``profiler`` profiles the server at the knee's load (``--profile``).

    Returns the document; ``stopped == "interrupted"`` after ctrl-c or SIGTERM (the original put back), ``"not
    confirmed"`` when the user refused a restart (nothing restarted then; what ran stays).

    Raises:
        InputError: the server did not start with its original configuration, or a rollback failed (the original
            was put back first).
    """
    run = _Run(request, target, measure, journal_path=journal_path, journal=journal or new_journal(target, {}),
               say=say or (lambda text, transient: None), profiler=profiler)
    if hasattr(target, "on_start"):
        setattr(target, "on_start", run.on_start)  # noqa: B010 (a launch target tells the journal its process)
    with _sigterm_raises():
        try:
            run.loop()
            run.finish()
        except KeyboardInterrupt:
            run.stopped = "interrupted"
            if run.journal.trying is not None:
                cand = run.journal.trying
                run.trials.append(Trial(number=len(run.trials) + 1, change=cand, config="", outcome="interrupted",
                                        why="ctrl-c or SIGTERM during the trial", knee=None,
                                        reference_tokens_per_s=0.0, measured_gain=None, within_prediction=None,
                                        restart_s=0.0, measure_s=0.0, seconds=0.0))
            run.restore()
        except NotConfirmed:  # asked before anything was written: what runs is what is installed; no restart
            run.stopped = "not confirmed"
            run.journal.trying = None
            run.finish()
        except BaseException:
            run.stopped = "error"
            run.restore()
            raise
    return run.document()
