"""The settings document from the records of its sources: every setting grouped, every drift named, secrets
masked.

:func:`effective_settings` takes plain records (the unit, ``/proc/PID``, what the server reports, the GPUs;
collected by :func:`servescope.server.settings.read_settings`) and computes everything shown: groups, drift
(:mod:`servescope.deploy.drift`) and redaction. Every string of the document passes one redaction step:
secret-named flags and variables read ``***``, and every secret value seen anywhere (``--api-key X``,
``HF_TOKEN``) is replaced wherever else it appears.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from servescope import __version__
from servescope.core.gpu import GpuInfo
from servescope.core.settings import (
    GROUPS,
    MASK,
    Drift,
    Group,
    ProcessRecord,
    ServerRecord,
    Setting,
    SettingsDoc,
    SourceNote,
)
from servescope.deploy.drift import (
    EngineArgs,
    arg_drift,
    env_drift,
    env_group,
    file_drift,
    flag_group,
    is_secret_key,
    iso_time,
    parse_engine_argv,
    server_drift,
)
from servescope.deploy.installed import UnitRecord

__all__ = ["effective_settings"]

_LIST_KEYS = {"ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost", "ExecReload", "ExecCondition",
              "After", "Before", "Wants", "Requires", "BindsTo", "PartOf", "Conflicts", "WantedBy", "RequiredBy",
              "Also", "EnvironmentFile", "UnsetEnvironment", "SupplementaryGroups", "ReadWritePaths"}
_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|[^\s'\";]+)")
_FLAG_VALUE = re.compile(r"(--[A-Za-z0-9_-]+)(=|\s+)(\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
_URL_USER = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)\S+")
_MIN_SECRET_CHARS = 4  # shorter values would mask unrelated text and are no secret anyway


# ------------------------------------------------------------------------------------------- groups

def _service_settings(unit: UnitRecord) -> list[Setting]:
    items = [Setting(key="unit", value=unit.unit.path, source="unit", origin=unit.read_by)]
    items += [Setting(key=f"drop-in {i}", value=path, source="unit", origin=unit.read_by)
              for i, path in enumerate(unit.unit.dropins, start=1)]
    chosen: dict[tuple[str, str], list[Setting]] = {}
    for entry in unit.unit.entries:
        if entry.section == "Service" and entry.key in ("Environment", "ExecStart"):
            continue
        where = (entry.section, entry.key)
        made = Setting(key=entry.key if entry.section == "Service" else f"[{entry.section}] {entry.key}",
                       value=entry.value, source="unit", origin=f"{entry.source}:{entry.line}")
        if entry.key in _LIST_KEYS:
            chosen[where] = [] if entry.value == "" else [*chosen.get(where, []), made]
        else:
            chosen[where] = [made]
    items += [s for group in chosen.values() for s in group]
    items += [Setting(key=f"systemd {k}", value=v or None, source="systemd", origin="systemctl show")
              for k, v in unit.systemd.items()]
    items += [Setting(key="EnvironmentFile unread", value=why, source="unit") for why in unit.unread_env_files]
    return items


def _process_settings(proc: ProcessRecord) -> list[Setting]:
    origin = f"/proc/{proc.pid}"
    return [Setting(key="process id", value=str(proc.pid), source="process", origin=origin),
            Setting(key="parent process id", value=None if proc.ppid is None else str(proc.ppid),
                    source="process", origin=f"{origin}/stat"),
            Setting(key="process started", value=None if proc.start_time is None else iso_time(proc.start_time),
                    source="process", origin=f"{origin}/stat"),
            Setting(key="process uid", value=None if proc.uid is None else str(proc.uid), source="process",
                    origin=f"{origin}/status"),
            Setting(key="process cwd", value=proc.cwd, source="process", origin=f"{origin}/cwd")]


def _engine_settings(run: EngineArgs, argv: Sequence[str], source: str, origin: str,
                     other: EngineArgs | None) -> list[tuple[str, Setting]]:
    """(group, setting) for the engine, its command and each flag; ``other`` is the unit's args when
    ``run`` is the process's (flags only in the unit are listed as ``unit only``)."""
    base = [("engine", Setting(key="engine", value=run.engine, source=source, origin=origin)),
            ("engine", Setting(key="program", value=shlex.join(run.command), source=source, origin=origin)),
            ("engine", Setting(key="command line", value=shlex.join(argv), source=source, origin=origin))]
    theirs = other.values() if other is not None else {}
    mine = run.values()

    def source_of(flag: str) -> str:
        if other is None:
            return source
        return "unit+process" if theirs.get(flag) == mine.get(flag) else source

    if run.model is not None:
        base.append(("model", Setting(key="model", value=run.model, source=source_of("model"), origin=origin)))
    for flag, value, written in run.flags:
        shown = MASK if is_secret_key(flag) else value
        key = flag if written in ("", flag) else f"{flag} ({written})"
        base.append((flag_group(flag), Setting(key=key, value=shown, source=source_of(flag), origin=origin)))
    if other is not None:
        for flag, value, _ in other.flags:
            if flag not in mine:
                base.append((flag_group(flag), Setting(key=flag, value=MASK if is_secret_key(flag) else value,
                                                       source="unit only (not running)", origin="ExecStart")))
    return base


# Environment variables that matter to serving, shown by `settings` in a terminal (the JSON has every one):
# engines, collectives, CUDA/ROCm, torch and its compiler, Hugging Face, threading, the loader and Python.
def _env_settings(unit: UnitRecord | None, proc: ProcessRecord | None) -> list[tuple[str, Setting]]:
    unit_env = unit.env if unit is not None else {}
    items: list[tuple[str, Setting]] = []
    seen = proc.env if proc is not None else unit_env
    for name, value in seen.items():
        if proc is None:
            source, origin = "unit", unit.env_origin.get(name) if unit is not None else None
        elif unit_env.get(name) == value:
            source, origin = "unit+process", unit.env_origin.get(name) if unit is not None else None
        else:
            source, origin = "process", f"/proc/{proc.pid}/environ"
        items.append((env_group(name), Setting(key=name, value=MASK if is_secret_key(name) else value,
                                                source=source, origin=origin)))
    if proc is not None and unit is not None:
        for name, value in unit_env.items():
            if name not in proc.env:
                items.append((env_group(name), Setting(key=name, value=MASK if is_secret_key(name) else value,
                                                        source="unit only (not running)",
                                                        origin=unit.env_origin.get(name))))
    return items


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
        return
    if is_secret_key(prefix.rsplit(".", 1)[-1]) and value not in (None, "", [], {}):
        out[prefix] = MASK
    elif isinstance(value, str):
        out[prefix] = value
    else:
        out[prefix] = msgspec.json.encode(value).decode()


def _server_settings(server: ServerRecord) -> tuple[list[Setting], str | None]:
    """The server group (key → value as reported) and the base model's id."""
    items = [Setting(key="url", value=server.url, source="server")]
    items += [Setting(key=f"endpoint {e.path}", value="ok" if e.ok else e.detail, source="server", origin=e.path)
              for e in server.endpoints]
    if any(e.path == "/version" for e in server.endpoints):
        items.append(Setting(key="/version version", value=server.version, source="server", origin="/version"))
    for model in server.models:
        for attr in ("root", "parent", "max_model_len"):
            value = getattr(model, attr)
            items.append(Setting(key=f"/v1/models[{model.id}].{attr}", value=None if value is None else str(value),
                                 source="server", origin="/v1/models"))
    if server.models:
        items.append(Setting(key="/v1/models ids", value=", ".join(m.id for m in server.models), source="server",
                             origin="/v1/models"))
    for metric, samples in server.info_gauges.items():
        for i, labels in enumerate(samples):
            prefix = metric if len(samples) == 1 else f"{metric}[{i}]"
            for label, value in labels.items():
                items.append(Setting(key=f"/metrics {prefix}.{label}", value=MASK if is_secret_key(label) else value,
                                     source="server", origin="/metrics"))
    if server.server_info is not None:
        # vllm_env and system_env restate defaults and the host; the process environ is the truth for env.
        info = {k: v for k, v in server.server_info.items() if k not in ("vllm_env", "system_env")}
        flat: dict[str, str] = {}
        _flatten("", info, flat)
        items += [Setting(key=f"/server_info {k}", value=v, source="server", origin="/server_info")
                  for k, v in flat.items()]
    base = next((m.id for m in server.models if m.parent is None), None)
    return items, base


def _gpu_settings(gpus: Sequence[GpuInfo]) -> list[Setting]:
    def mib(value: int | None) -> str:
        return "N/A" if value is None else f"{value} MiB"

    return [Setting(key=f"GPU{g.index}", value=f"{g.name or 'N/A'}; memory {mib(g.memory_used_mib)} used of "
                    f"{mib(g.memory_total_mib)}; driver {g.driver_version or 'N/A'}", source="gpu")
            for g in gpus]


# ---------------------------------------------------------------------------------------- redaction

def _secret_values(unit: UnitRecord | None, proc: ProcessRecord | None, argvs: Sequence[EngineArgs]) -> set[str]:
    found: set[str] = set()
    for env in (unit.env if unit else {}, proc.env if proc else {}):
        found.update(v for k, v in env.items() if is_secret_key(k))
    for args in argvs:
        for flag, value, _ in args.flags:
            if is_secret_key(flag):  # `--api-key K1 K2` holds two keys: mask each wherever it shows
                found.update([value, *value.split()])
    return {v for v in found if len(v) >= _MIN_SECRET_CHARS}


def _mask_text(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={MASK}" if is_secret_key(m.group(1)) else m.group(0), text)
    text = _FLAG_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}" if is_secret_key(m.group(1)) else m.group(0),
                           text)
    text = _URL_USER.sub(f"://{MASK}@", text)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)


def _mask_all(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return _mask_text(value, secrets)
    if isinstance(value, list):
        return [_mask_all(v, secrets) for v in value]
    if isinstance(value, dict):
        return {_mask_text(k, secrets): _mask_all(v, secrets) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------------------ combine

def effective_settings(*, unit: UnitRecord | None, process: ProcessRecord | None, server: ServerRecord | None,
                       gpus: Sequence[GpuInfo] | None, notes: Mapping[str, str] | None = None) -> SettingsDoc:
    """The settings document: every setting grouped, every drift named, secrets masked.

    What runs wins: flags and environment come from the process when there is one, else from the unit;
    settings only on one side are listed with where they come from, and the differences are drift items.

    Args:
        notes: why a source is missing (``process``, ``server``, ``gpus``), shown in ``sources``.

    Example:
        >>> doc = effective_settings(unit=read_unit_settings(path=Path("vllm.service")),   # doctest: +SKIP
        ...                          process=None, server=None, gpus=None)
        >>> [s.key for g in doc.groups if g.id == "parallelism" for s in g.settings]
        ['--tensor-parallel-size']
        >>> [(d.kind, d.key) for d in doc.drift]
        []
    """
    why = dict(notes or {})
    grouped: dict[str, list[Setting]] = {g: [] for g in GROUPS}
    drift: list[Drift] = []
    sources: list[SourceNote] = []
    unit_argv = unit.argv() if unit is not None else None
    unit_args = parse_engine_argv(unit_argv) if unit_argv is not None else None
    proc_args = parse_engine_argv(process.argv) if process is not None else None

    if unit is not None:
        grouped["service"] += _service_settings(unit)
        sources.append(SourceNote(name="unit", ok=True, detail=f"{unit.unit.path} ({unit.read_by}"
                                  + (f", {len(unit.unit.dropins)} drop-in(s))" if unit.unit.dropins else ")")))
    else:
        sources.append(SourceNote(name="unit", ok=False, detail=why.get("unit", "no --unit or --unit-file given")))
    if process is not None:
        grouped["service"] += _process_settings(process)
        how = f" ({why['process']})" if "process" in why else ""
        sources.append(SourceNote(name="process", ok=True, detail=f"/proc/{process.pid}{how}"))
    else:
        sources.append(SourceNote(name="process", ok=False, detail=why.get("process", "no running process found")))

    if proc_args is not None and process is not None:
        engine_items = _engine_settings(proc_args, process.argv, "process", f"/proc/{process.pid}/cmdline",
                                        unit_args)
    elif unit_args is not None and unit_argv is not None and unit is not None:
        start = unit.unit.last_entry("Service", "ExecStart")
        engine_items = _engine_settings(unit_args, unit_argv, "unit", f"{start.source}:{start.line}"
                                        if start else "ExecStart", None)
    else:
        engine_items = []
    for group, setting in [*engine_items, *_env_settings(unit, process)]:
        grouped[group].append(setting)

    base_model = None
    if server is not None:
        server_items, base_model = _server_settings(server)
        grouped["server"] += server_items
        answered = [e.path for e in server.endpoints if e.ok]
        sources.append(SourceNote(name="server", ok=bool(answered), detail=f"{server.url}: "
                                  + (f"answered {', '.join(answered)}" if answered else
                                     (server.endpoints[0].detail if server.endpoints else "no answer"))))
    else:
        sources.append(SourceNote(name="server", ok=False, detail=why.get("server", "no server URL")))
    if gpus is not None:
        grouped["gpus"] += _gpu_settings(gpus)
        sources.append(SourceNote(name="gpus", ok=True, detail=f"{len(gpus)} GPU(s)"))
    else:
        sources.append(SourceNote(name="gpus", ok=False, detail=why.get("gpus", "not queried")))

    if unit is not None and process is not None:
        if unit_args is not None and proc_args is not None:
            drift += arg_drift(unit_args, proc_args)
        drift += env_drift(unit.env, process.env, unread_env_files=bool(unit.unread_env_files))
        if process.start_time is not None:
            drift += file_drift(unit.mtimes, process.start_time)
    if unit is not None and unit.systemd.get("NeedDaemonReload") == "yes":
        drift.append(Drift(kind="daemon_reload", key=unit.name or unit.unit.path, values={"NeedDaemonReload": "yes"},
                           detail="systemd has not re-read the changed unit: run systemctl daemon-reload, then "
                                  "restart the service"))
    running = proc_args or unit_args
    if server is not None and running is not None:
        flat = {s.key: s.value for s in grouped["server"] if s.value is not None}
        drift += server_drift(running, flat, base_model=base_model)

    engine = running.engine if running is not None else None
    doc = SettingsDoc(
        servescope_version=__version__, taken_at=datetime.now(UTC).isoformat(timespec="seconds"),
        engine=engine, unit=unit.name or unit.unit.path if unit is not None else None,
        pid=process.pid if process is not None else None, url=server.url if server is not None else None,
        sources=sources, groups=[Group(id=g, title=GROUPS[g], settings=s) for g, s in grouped.items() if s],
        drift=drift)
    secrets = sorted(_secret_values(unit, process, [a for a in (unit_args, proc_args) if a is not None]),
                     key=len, reverse=True)
    return msgspec.convert(_mask_all(msgspec.to_builtins(doc), secrets), SettingsDoc)
