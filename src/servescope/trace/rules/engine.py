"""Which serving engine ran a trace, or whether it is a training run: the evidence advice needs first.

An engine's flags (vLLM's ``--async-scheduling``, ``--enforce-eager``, custom all-reduce; SGLang's) are advised
only where the evidence says that engine serves the run, best source first:

1. the live server or a settings document (its command line, or the engine that answered ``/version``);
2. the trace's metadata (vLLM writes ``vllm_version``) or its python frames / CPU operators naming the engine's
   code (``metadata`` and ``frames`` of its entry in ``data/engines.toml``);
3. the trace's step marks, where the format says whose they are (``serves`` in ``steps.toml``; a form two
   engines write, ``shared_form``, names none).

A trace with a backward pass or an optimizer step among its CPU operators (``[training]``) and no serving
engine's evidence is a training run: it gets no serving flag.
"""

from __future__ import annotations

from collections.abc import Sequence

from servescope.core.analysis import SettingEvidence
from servescope.core.engines import engine_ids, engines
from servescope.core.needle import any_of
from servescope.trace.read.table import TraceData, distinct_ids
from servescope.trace.rules.deployment import DeploymentInput
from servescope.trace.steps.formats import step_formats

__all__ = ["ENGINE_SETTING", "engine_evidence"]

ENGINE_SETTING = "engine"  # its key among the document's deployment settings
_SOURCE_WORDS = {"server": "the live server", "settings": "the settings document"}


def _from_inputs(inputs: Sequence[DeploymentInput]) -> SettingEvidence | None:
    known = set(engine_ids())
    for inp in inputs:
        engine = inp.engine
        if engine is None and inp.argv:
            from servescope.deploy.drift import parse_engine_argv  # only where a command line is given

            engine = parse_engine_argv(inp.argv).engine
        if engine in known:
            return SettingEvidence(value=str(engine), source=inp.source,
                                   detail=f"{_SOURCE_WORDS.get(inp.source, inp.source)} ({inp.where})")
    return None


def _names(data: TraceData) -> list[str]:
    """The trace's CPU operator, annotation and python frame names (each once)."""
    ids: set[int] = set()
    for table in (data.cpu_ops, data.annotations, data.frames):
        if len(table):
            ids.update(distinct_ids(table.name).tolist())
    return [data.names[i] for i in sorted(ids)]


def _from_trace(traces: Sequence[TraceData], serves: Sequence[str | None]) -> SettingEvidence | None:
    formats = step_formats()
    words = {e.id: e.words for e in engines()}
    for engine in engines():
        for data in traces:
            key = next((k for k in engine.metadata if data.metadata.get(k)), None)
            if key is not None:
                return SettingEvidence(value=engine.id, source="trace",
                                       detail=f"the trace's metadata ({key} {data.metadata[key]})")
    names = [_names(d) for d in traces]
    for engine in engines():
        frames = any_of(engine.frames)  # each name's needles found in one pass, not each regex searched
        for per_trace in names:
            hit = next((n for n in per_trace if frames.found(n)), None)
            if hit is not None:
                return SettingEvidence(value=engine.id, source="trace", detail=f"the trace's frames ({hit[:80]})")
    marked = next((s for s in serves if s is not None), None)
    if marked is not None:
        return SettingEvidence(value=marked, source="trace", detail=f"{words.get(marked, marked)}'s step marks")
    training = any_of(tuple(p.pattern for p in formats.training_ops))
    for per_trace in names:
        hit = next((n for n in per_trace if training.found(n)), None)
        if hit is not None:
            return SettingEvidence(value="training", source="trace",
                                   detail=f"a training run: the trace's backward / optimizer ops ({hit[:80]}), "
                                          "no serving engine's step marks")
    return None


def engine_evidence(traces: Sequence[TraceData], serves: Sequence[str | None],
                    inputs: Sequence[DeploymentInput] = ()) -> SettingEvidence | None:
    """The engine that serves the traced run (``vllm``, ``sglang``), ``training`` for a training run, or None
    where nothing tells (see the module). ``serves``: per trace, the engine its step marks belong to, if any."""
    return _from_inputs(inputs) or _from_trace(traces, serves)
