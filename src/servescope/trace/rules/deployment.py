"""The deployment's effective settings, as evidence for the findings' advice.

Each setting of ``data/deployment.toml`` is told by the best source that knows it, best first: the live server
(``profile`` reads the serving process's command line and environment and asks ``/version``), a saved
``settings`` document, the trace itself (python frames, kernel names, graph replays, ranks, the device), and
last the engine version's default where no flag overrides it (``[[engine.default]]`` in ``data/engines.toml``,
each naming a setting here). A finding gives advice only where its setting is
not already in place, and says what it checked and where that came from.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from servescope.core.analysis import AnalysisDoc, SettingEvidence, StepReference, StepRow
from servescope.core.bundled import bundled_toml
from servescope.core.document import decode as decode_document
from servescope.core.document import read_document
from servescope.core.engines import ENGINES_FILE, engine_words, engines
from servescope.core.errors import InputError
from servescope.core.files import read_bytes
from servescope.core.needle import Needled, any_of, keep_needles
from servescope.core.settings import SettingsDoc
from servescope.trace.read.files import Discovery
from servescope.trace.read.table import TraceData, distinct_ids

__all__ = ["DeploymentInput", "Evidence", "deployment_settings", "evidence_beside", "from_settings_doc",
           "load_deployment_rules"]

_SOURCE_WORDS = {"server": "the live server", "settings": "the settings document", "trace": "the trace",
                 "default": "the engine's default"}


class DeploymentInput(msgspec.Struct, frozen=True, kw_only=True):
    """What a process or a settings document told about the server: its command line, environment, version.

    ``source``: ``server`` (read live) or ``settings`` (a saved document); ``where``: the process or file.
    """

    source: str
    where: str
    argv: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    version: str | None = None
    server: dict[str, str] = msgspec.field(default_factory=dict)  # fields the server reported (/metrics info)
    engine: str | None = None  # when no command line tells it (a remote server that answered vLLM's /version)


@cache
def load_deployment_rules() -> dict[str, Any]:
    """The bundled ``data/deployment.toml``: ``settings`` by id."""
    data = bundled_toml("deployment.toml")
    settings = data.get("settings", {})
    for e in engines():  # each engine's defaults ([[engine.default]] in data/engines.toml) name a setting here
        unknown = next((d.setting for d in e.default if d.setting not in settings), None)
        if unknown is not None:
            raise InputError(ENGINES_FILE, f"engine {e.id}: default of setting {unknown!r}, which "
                                           "data/deployment.toml does not define")
    for spec in settings.values():  # the patterns compiled once, their needles kept for the next runs
        for key in ("frames_on", "frames_off", "kernels"):
            any_of(tuple(spec.get(key, ())))
    keep_needles()
    return data


def from_settings_doc(doc: SettingsDoc, where: str) -> DeploymentInput:
    """The command line, environment, version and reported fields of a ``settings`` document."""
    argv: list[str] = []
    env: dict[str, str] = {}
    server: dict[str, str] = {}
    version = None
    for group in doc.groups:
        for s in group.settings:
            if s.value is None:
                continue
            if group.id == "engine" and s.key == "command line":
                argv = shlex.split(s.value)
            elif group.id.endswith("env") or group.id == "other":
                env[s.key] = s.value
            elif group.id == "server":
                server[s.key] = s.value
                if s.key == "/version version":
                    version = s.value
    if version is None:  # a launcher's variable for the engine's version (version_env in data/engines.toml)
        version = next((env[e.version_env] for e in engines() if e.version_env and env.get(e.version_env)), None)
    return DeploymentInput(source="settings", where=where, argv=argv, env=env, version=version, server=server)


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _from_input(inp: DeploymentInput, rules: Mapping[str, Any]) -> dict[str, SettingEvidence]:
    """Each setting the command line, environment or reported fields tell; else the version's default."""
    # the command-line parser (and the unit linter it imports) only where there is a command line: analyze's
    # start-up does not pay for it
    from servescope.deploy.drift import parse_engine_argv

    args = parse_engine_argv(inp.argv) if inp.argv else None
    values = args.values() if args is not None else {}
    engine = (args.engine if args is not None else None) or inp.engine
    version = _version_tuple(inp.version)
    where = f"{_SOURCE_WORDS[inp.source]} ({inp.where})"
    out: dict[str, SettingEvidence] = {}
    for sid, spec in rules["settings"].items():
        found: SettingEvidence | None = None
        for flag in spec.get("value", ()):
            if flag in values:
                found = SettingEvidence(value=values[flag][-1], source=inp.source, detail=f"{flag} in {where}")
        for flag in (*spec.get("on", ()), *spec.get("off", ())):
            if flag in values:
                state = "on" if flag in spec.get("on", ()) else "off"
                found = SettingEvidence(value=state, source=inp.source, detail=f"{flag} in {where}")
        for key in spec.get("server", ()):
            if found is None and inp.server.get(key) not in (None, "", "None"):
                found = SettingEvidence(value=inp.server[key], source=inp.source, detail=f"{key} from {where}")
        set_env = {k: inp.env[k] for k in spec.get("env", ()) if k in inp.env}
        if set_env:
            found = SettingEvidence(value=" ".join(f"{k}={v}" for k, v in sorted(set_env.items())),
                                    source=inp.source, detail=f"the environment in {where}")
        elif spec.get("env") and inp.env and found is None:
            found = SettingEvidence(value="unset", source=inp.source, detail=f"none set in the environment in {where}")
        if found is None and engine is not None and version is not None:
            for default in (d for e in engines() if e.id == engine for d in e.default if d.setting == sid):
                since = _version_tuple(default.since)
                if since is not None and version >= since:
                    found = SettingEvidence(
                        value=default.value, source="default",
                        detail=f"{engine_words(engine)} {inp.version}'s default, no flag against it in "
                               f"{where}")
        if found is not None:
            out[sid] = found
    return out


def _first_match(traces: Sequence[TraceData], ids: Sequence[Iterable[int]], patterns: Sequence[str]) -> str | None:
    """The first name (of the traces' ``ids``) that one of ``patterns`` matches, else None."""
    compiled = any_of(tuple(patterns))
    return next((d.names[i] for d, each in zip(traces, ids, strict=True) for i in each
                 if compiled.found(d.names[i])), None)


def _from_trace(traces: Sequence[TraceData], steps: Sequence[Sequence[StepRow]],
                replayed: Sequence[set[int]], rules: Mapping[str, Any],
                graph_engine: bool) -> dict[str, SettingEvidence]:
    """What the traces themselves show (``replayed``: per trace, the indices of the steps that replay graphs;
    ``graph_engine``: their steps are marked by an engine that captures graphs by default, ``steps.toml``)."""
    out: dict[str, SettingEvidence] = {}
    frame_ids = [distinct_ids(d.frames.name).tolist() for d in traces]
    kernel_ids = [distinct_ids(d.device.name).tolist() for d in traces]
    for sid, spec in rules["settings"].items():
        for state in ("on", "off"):
            patterns = spec.get(f"frames_{state}")
            if not patterns or sid in out:
                continue
            frame = _first_match(traces, frame_ids, patterns)
            if frame is not None:
                out[sid] = SettingEvidence(value=state, source="trace",
                                           detail=f"the trace's python frames ({frame.split(': ')[-1]} in "
                                                  f"{frame.split('(')[0]})")
        if "kernels" in spec and (kernel := _first_match(traces, kernel_ids, spec["kernels"])) is not None:
            out[sid] = SettingEvidence(value=spec["kernels_value"], source="trace",
                                       detail=f"the trace's kernels ({kernel[:60]})")
    every = [s for rank in steps for s in rank]
    graphed = [s for rank, idx in zip(steps, replayed, strict=True) for s in rank if s.index in idx]
    if graphed:
        out["cuda_graphs"] = SettingEvidence(value="on", source="trace",
                                             detail=f"graph replays in {len(graphed)} of {len(every)} steps")
        batches = [s.decode_requests or 0 for s in graphed if not s.prefill_requests]
        eager = [s.decode_requests or 0 for rank, idx in zip(steps, replayed, strict=True) for s in rank
                 if s.index not in idx and not s.prefill_requests and s.decode_requests]
        if batches:
            above = [b for b in eager if b > max(batches)]
            bound = f"at least {max(batches)}" + (f", below {min(above)}" if above else "")
            out["max_cudagraph_capture_size"] = SettingEvidence(
                value=bound, source="trace", detail="the decode batches replayed as graphs and those run without")
    elif "torch_compile" in out and every and graph_engine:
        out["cuda_graphs"] = SettingEvidence(value="not replayed", source="trace",
                                             detail="compiled kernels but no graph replay in any step: the batches "
                                                    "were above the largest captured size, or graphs are off")
        batches = [s.decode_requests or 0 for s in every if s.decode_requests and not s.prefill_requests]
        if batches:
            out["max_cudagraph_capture_size"] = SettingEvidence(
                value=f"below {min(batches)}", source="trace",
                detail="no decode batch replayed a graph though the model is compiled")
    elif every and any(len(d.device) for d in traces):
        compiled = "compiled kernels" if "torch_compile" in out else "no compiled kernels"
        why = ("--enforce-eager, or an engine without graphs" if graph_engine else
               "the steps are not marked by an engine that captures graphs by default")
        out["cuda_graphs"] = SettingEvidence(value="off", source="trace",
                                             detail=f"no graph replays and {compiled} in any step ({why})")
    world = max((int((d.distributed or {}).get("world_size") or 1) for d in traces), default=1)
    if any(d.distributed for d in traces):
        out["tensor_parallel_size"] = SettingEvidence(
            value=str(world), source="trace", detail="the rank traces' distributedInfo world_size")
    tokens = [(s.prefill_tokens or 0) + (s.decode_tokens or 0) for s in every]
    if any(tokens):
        out["max_num_batched_tokens"] = SettingEvidence(value=f"at least {max(tokens)}", source="trace",
                                                        detail="the most tokens one step computed")
    requests = [(s.prefill_requests or 0) + (s.decode_requests or 0) for s in every]
    if any(requests):
        out["max_num_seqs"] = SettingEvidence(value=f"at least {max(requests)}", source="trace",
                                              detail="the most requests one step held")
    out["platform"] = _platform(traces)
    return out


_HIP_NAMES = Needled.of(r"(?i)rccl|hipLaunch|_ZN7ck_tile|aiter")


def _platform(traces: Sequence[TraceData]) -> SettingEvidence:
    devices = {d.metadata.get("device_name", "") for d in traces} - {""}
    names = [d.names[i] for d in traces for i in distinct_ids(d.device.name).tolist()[:5000]]
    if any("AMD" in dev or "Instinct" in dev for dev in devices):
        return SettingEvidence(value="rocm", source="trace", detail=f"the device ({sorted(devices)[0]})")
    if any(_HIP_NAMES.found(n) for n in names):
        return SettingEvidence(value="rocm", source="trace", detail="HIP/RCCL kernel names")
    if any("NVIDIA" in dev for dev in devices):
        return SettingEvidence(value="cuda", source="trace", detail=f"the device ({sorted(devices)[0]})")
    if any(len(d.device) for d in traces):
        return SettingEvidence(value="cuda", source="trace", detail="device kernels without an AMD device or HIP names")
    return SettingEvidence(value="cpu", source="trace", detail="no device work: CPU operators")


def deployment_settings(traces: Sequence[TraceData], steps: Sequence[Sequence[StepRow]],
                        replayed: Sequence[set[int]],
                        inputs: Sequence[DeploymentInput] = (), *,
                        graph_engine: bool) -> dict[str, SettingEvidence]:
    """Every setting some source tells, best source first: the inputs in order (live server, then settings
    documents), then the trace, then the engine version's default. ``graph_engine``: the traces' steps are marked
    by an engine that captures CUDA graphs by default (``graphs_by_default`` in ``engines.toml`` of the engine whose
    marks ``steps.toml`` read)."""
    rules = load_deployment_rules()
    told: dict[str, SettingEvidence] = {}
    defaults: dict[str, SettingEvidence] = {}
    for inp in inputs:
        for sid, ev in _from_input(inp, rules).items():
            if ev.source == "default":
                defaults.setdefault(sid, ev)
            else:
                told.setdefault(sid, ev)
    for sid, ev in _from_trace(traces, steps, replayed, rules, graph_engine).items():
        # the trace is a better witness than a default, and than a reading that only bounds it
        told.setdefault(sid, ev)
    for sid, ev in defaults.items():
        told.setdefault(sid, ev)
    return {sid: told[sid] for sid in rules["settings"] if sid in told}


def label_of(setting: str) -> str:
    """The words a finding uses for ``setting``."""
    spec = load_deployment_rules()["settings"].get(setting, {})
    return str(spec.get("label", setting))


def describe(setting: str, evidence: SettingEvidence | None) -> str:
    """``async scheduling: on, from the trace's python frames (...)``, or that no source told."""
    if evidence is None:
        return f"{label_of(setting)}: no source told (give `--settings FILE` from `servescope settings --json`)"
    return f"{label_of(setting)}: {evidence.value}, from {evidence.detail}"




class Evidence(msgspec.Struct, frozen=True):
    """What documents beside the traces (or named by ``--settings``) tell: deployment inputs, the unprofiled
    step, and the files used (not reported as left out)."""

    settings: list[DeploymentInput]
    reference: StepReference | None
    used: list[Path]


def evidence_beside(discovery: Discovery, named: Sequence[Path] = ()) -> Evidence:
    """The settings documents named and found beside the traces, and the unprofiled step of a saved ``profile``
    document found there.

    Raises:
        InputError: a named file is not a settings document (one line naming it).
    """
    inputs: list[DeploymentInput] = []
    reference: StepReference | None = None
    used: list[Path] = []
    for path in named:
        doc = read_document(path)
        if not isinstance(doc, SettingsDoc):
            raise InputError(str(path), f"a {getattr(doc, 'schema', 'other')} document, not the settings document "
                                        "--settings takes (servescope settings --json)")
        inputs.append(from_settings_doc(doc, str(path)))
    for path, why in discovery.left_out:
        if why.startswith(_SETTINGS_REASON):
            inputs.append(from_settings_doc(read_document(path), str(path)))
            used.append(path)
        elif why.startswith(_ANALYSIS_REASON):
            found = _profile_reference(path)
            if found is not None:
                reference = reference or found
                used.append(path)
    return Evidence(settings=inputs, reference=reference, used=used)


def _profile_reference(path: Path) -> StepReference | None:
    """The unprofiled step a saved ``profile -o`` document holds: its ``unprofiled`` reference, or (documents
    written before it was stored) its ``profile.unprofiled_server`` inter-token latency."""
    data = read_bytes(path)
    doc = decode_document(data, str(path))
    if not isinstance(doc, AnalysisDoc):
        return None
    if doc.unprofiled is not None:
        return doc.unprofiled
    timing = msgspec.json.decode(data).get("profile", {}).get("unprofiled_server") or {}
    if isinstance(timing.get("itl_ms"), (int, float)) and timing["itl_ms"] > 0:
        return StepReference(step_us=float(timing["itl_ms"]) * 1000.0,
                             source=f"the server's {timing.get('itl_metric')} mean over the same batch run without "
                                    f"the profiler ({path.name})")
    return None


_SETTINGS_REASON = "a servescope.settings document"  # trace/files.py's word for a file that is one
_ANALYSIS_REASON = "a servescope.analysis document"
