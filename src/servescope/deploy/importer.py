"""Turn an existing unit into a spec that renders it back: every directive is carried or the import refuses.

Engine, model and arguments (in order) come from ExecStart, variables from Environment=; secrets (secret-shaped
variables, ``--api-key`` / ``--hf-token`` values) move to an EnvironmentFile. Each other directive goes where
``data/deploy/directives.toml`` says: a spec key (``RestartSec=`` → ``restart.delay_s``), the rendered unit's own
(``Type=simple`` → ``Type=exec`` with a readiness wait, named in the notes), or the spec's ``[extra]`` table,
written back verbatim. What a spec cannot carry (a value systemd would expand, a secret given twice, a ``Type=``
render does not write) is refused: one line naming the file, line and directive; secret values never appear.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.core import engines
from servescope.core.atomic import write_text_atomic
from servescope.core.errors import InputError
from servescope.core.redact import MASK, redact
from servescope.deploy.lint import exec_command, time_span_s
from servescope.deploy.render import DEPENDENCIES, WANTED_BY
from servescope.deploy.spec import defaults, directives, is_secret_name, parse_spec
from servescope.deploy.unitfile import UnitEntry, UnitFile, load_unit, split_command_lines, split_words

__all__ = ["ImportResult", "detect_engine", "import_unit", "import_unit_file", "spec_toml", "write_import"]

# ExecStart flags whose value is a secret, and the variable the engine reads it from instead
_SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}
# a systemd variable ($X, ${X}) or specifier (%i) that systemd expands at start: a spec word is literal
_EXPANDED = re.compile(r"\$\{?[A-Za-z_]|%[A-Za-z]")


@dataclass(frozen=True, slots=True)
class ImportResult:
    """The spec as a dict (spec.toml keys), the secrets moved out (names only are ever shown), and what the
    rendered unit will write in place of the unit's own (``FILE:LINE Key=...: why``)."""

    name: str
    spec: dict[str, object]
    secrets: dict[str, str] = field(repr=False)
    replaced: tuple[str, ...]

    @property
    def secret_names(self) -> tuple[str, ...]:
        return tuple(self.secrets)


def detect_engine(argv: list[str], source: str) -> tuple[str, int]:
    """(engine, index of the first engine argument) of an ExecStart argv (``data/engines.toml``)."""
    found = engines.detect_engine(argv)
    if found is None:
        raise InputError(source, f"ExecStart runs neither {engines.engines_words()}: {argv[0]!r}")
    return found


def _where(entry: UnitEntry) -> str:
    return f"{entry.source}:{entry.line}"


def _literal(entry: UnitEntry, text: str) -> None:
    """Refuse what systemd expands at start (``$X``, ``%i``): the spec holds literal words."""
    bare = text.replace("$$", "").replace("%%", "")
    found = _EXPANDED.search(bare)
    if found:
        raise InputError(_where(entry), f"{entry.key}= uses {found.group(0)}..., which systemd expands at start; "
                         "a spec holds literal values: write what it stands for")


class _Secrets:
    """Secrets by name, each with the place that gave it; a second place is an error naming both."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.places: dict[str, str] = {}

    def add(self, name: str, value: str, place: str) -> None:
        if name in self.values:
            raise InputError(place.split(" ", 1)[0], f"{name} is given twice: {self.places[name]} and {place} "
                             "(values not shown); keep one")
        self.values[name], self.places[name] = value, place


def _engine(start: UnitEntry, secrets: _Secrets, spec: dict[str, Any]) -> None:
    """engine, command, model and args from ExecStart; secret flags to ``secrets``."""
    _literal(start, start.value)
    command = exec_command(start)
    if command.prefixes:
        raise InputError(_where(start), f"ExecStart= prefix {command.prefixes!r}: the rendered unit runs the "
                         "server without one; remove it or keep this unit")
    argv = command.argv
    engine, first = detect_engine(argv, _where(start))
    words, rest = argv[:first], argv[first:]
    model_flag = engines.engine(engine).model_flag
    model: str | None = None
    args: list[str] = []
    i = 0
    if words[-1] == "serve" and rest and not rest[0].startswith("-"):
        model, i = rest[0], 1
    while i < len(rest):
        flag, eq, inline = rest[i].partition("=")
        takes = 1 if eq else 2
        if flag in _SECRET_FLAGS or (flag == model_flag and model is None):
            if not eq and i + 1 >= len(rest):
                raise InputError(_where(start), f"ExecStart {flag} has no value")
            value = inline if eq else rest[i + 1]
            if flag == model_flag:
                model = value
            else:
                secrets.add(_SECRET_FLAGS[flag], value, f"{_where(start)} (ExecStart {flag})")
            i += takes
            continue
        args.append(rest[i])
        i += 1
    if model is None:
        raise InputError(_where(start), f"ExecStart has no {model_flag}")
    spec.update({"engine": engine, "model": model})
    if words != list(engines.engine(engine).command):
        spec["command"] = words
    spec["args"] = args


def _environment(unit: UnitFile, secrets: _Secrets, spec: dict[str, Any]) -> None:
    env: dict[str, str] = {}
    for entry in unit.entries_of("Service", "Environment"):
        _literal(entry, entry.value.replace("$", ""))  # Environment= expands specifiers, not variables
        for word in split_words(entry.value.replace("%%", "%"), _where(entry)):
            key, _, value = word.partition("=")
            if is_secret_name(key):
                secrets.add(key, value, f"{_where(entry)} (Environment={key})")
            elif key == "CUDA_VISIBLE_DEVICES" and value and all(p.strip().isdigit() for p in value.split(",")):
                spec["gpus"] = [int(p) for p in value.split(",")]
            else:
                env[key] = value
    if env:
        spec["env"] = env


def _is_gpu_wait(entry: UnitEntry) -> bool:
    """An ExecStartPre that waits for free GPU memory (an nvidia-smi loop, ``gpu wait-free``): the guard."""
    text = " ".join(w for c in split_command_lines(entry.value, _where(entry)) for w in c.argv)
    return "nvidia-smi" in text or "gpu wait-free" in text


def _guard(entry: UnitEntry, spec: dict[str, Any]) -> dict[str, int]:
    """The [guard] table: a ``gpu wait-free`` command's own limits, else the defaults (a loop's are its own)."""
    default = defaults()["guard"]
    guard = {"max_used_mib": int(default["max_used_mib"]), "timeout_s": int(default["timeout_s"])}
    words = split_command_lines(entry.value, _where(entry))[0].argv
    if "wait-free" in words:
        _servescope(words, spec)
        for flag, key in (("--max-used-mib", "max_used_mib"), ("--timeout", "timeout_s")):
            if flag in words[:-1] and words[words.index(flag) + 1].isdigit():
                guard[key] = int(words[words.index(flag) + 1])
    return guard


def _render_own(entry: UnitEntry, spec: dict[str, Any]) -> bool:
    """True for an ExecStartPre / ExecStartPost a rendered unit writes itself (the secrets check, the health
    wait), whose facts go to ``spec``: the secret names it checks, the servescope it runs."""
    command = split_command_lines(entry.value, _where(entry))[0]
    words = command.argv
    script = words[2] if len(words) > 2 and words[1] == "-c" else ""
    if "servescope: $1" in script and "test -n" in script:
        names = re.findall(r'test -n "\$\{([A-Za-z_][A-Za-z0-9_]*)\}"', script)
        spec["secrets"] = list(dict.fromkeys([*spec.get("secrets", []), *names]))
        return True
    if "health" in words and "--wait" in words:
        _servescope(words, spec)
        wait = words[words.index("--timeout") + 1] if "--timeout" in words[:-1] else ""
        if wait.isdigit() and int(wait) > 0:  # render waits load_time_s + start_margin_s: keep the sum
            margin = int(defaults()["start_margin_s"])
            spec.update({"load_time_s": int(wait) - margin} if int(wait) > margin
                        else {"load_time_s": int(wait), "start_margin_s": 0})
        return True
    return False


def _servescope(words: list[str], spec: dict[str, Any]) -> None:
    """The servescope a rendered command runs, by absolute path, as the spec's ``servescope``."""
    if Path(words[0]).name == "servescope" and words[0].startswith("/"):
        spec["servescope"] = words[0]


def _verbatim(entry: UnitEntry) -> str:
    """``entry``'s value, to be carried as written: refused where it holds a credential (a ``$VAR`` reference
    to one is fine), which the spec would show; the value is never printed."""
    probe = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", MASK, entry.value)
    if redact(probe) != probe:
        raise InputError(_where(entry), f"{entry.key}= holds a secret (value not shown): put it in the "
                         "EnvironmentFile and refer to it as $NAME, then import again")
    return entry.value


def _read(entry: UnitEntry, how: str) -> object:
    if how == "int":
        if not entry.value.isdigit():
            raise InputError(_where(entry), f"{entry.key}={entry.value}: the spec holds a whole number here")
        return int(entry.value)
    if how == "seconds":
        span = time_span_s(entry.value)
        if span is None or span == float("inf") or span != int(span):
            raise InputError(_where(entry), f"{entry.key}={entry.value}: the spec holds whole seconds here")
        return int(span)
    return _verbatim(entry)


def _set(spec: dict[str, Any], key: str, value: object) -> None:
    table, dot, name = key.partition(".")
    if dot:
        spec.setdefault(table, {})[name] = value
    else:
        spec[key] = value


def _carry(unit: UnitFile, spec: dict[str, Any], replaced: list[str]) -> None:
    """Every directive other than ExecStart and Environment=: a spec key, the rendered unit's own, or [extra]."""
    known = directives()
    extra: dict[str, dict[str, list[str]]] = {}
    for entry in unit.entries:
        rule = known.get(f"{entry.section}.{entry.key}")
        if rule is None:
            extra.setdefault(entry.section, {}).setdefault(entry.key, []).append(_verbatim(entry))
        elif "field" in rule:
            for key in rule["field"]:
                _set(spec, key, _read(entry, rule.get("as", "text")))
        elif "accept" in rule:
            if entry.value not in rule["accept"]:
                raise InputError(_where(entry), f"{entry.key}={entry.value}: a rendered unit has "
                                 f"{rule['replaced']}; {entry.key}= may be {', '.join(rule['accept'])}")
            replaced.append(f"{_where(entry)} {entry.key}={entry.value}: {rule['replaced']}")
    for key in ("Unit.After", "Unit.Wants", "Install.WantedBy"):
        section, _, name = key.partition(".")
        own = set(DEPENDENCIES) | {WANTED_BY}
        words = [w for e in unit.entries_of(section, name) for w in split_words(e.value, _where(e)) if w not in own]
        if words:
            extra.setdefault(section, {})[name] = [" ".join(words)]
    for entry in unit.entries_of("Service", "ExecStartPre") + unit.entries_of("Service", "ExecStartPost"):
        if entry.key == "ExecStartPre" and _is_gpu_wait(entry):
            replaced.append(f"{_where(entry)} ExecStartPre: the GPU memory wait: the [guard] table "
                            "(servescope gpu wait-free, which fails naming who holds the memory)")
            spec["guard"] = _guard(entry, spec)
        elif _render_own(entry, spec):
            replaced.append(f"{_where(entry)} {entry.key}: written by render itself")
        else:
            extra.setdefault("Service", {}).setdefault(entry.key, []).append(_verbatim(entry))
    files = unit.entries_of("Service", "EnvironmentFile")
    if files:
        spec["env_file"] = files[0].value.removeprefix("-")
        if not files[0].value.startswith("-"):
            replaced.append(f"{_where(files[0])} EnvironmentFile={files[0].value}: EnvironmentFile=-"
                            f"{spec['env_file']}, with an ExecStartPre that names a missing secret")
        if files[1:]:
            extra.setdefault("Service", {})["EnvironmentFile"] = [e.value for e in files[1:]]
    if extra:
        spec["extra"] = extra


def import_unit(unit: UnitFile, *, name: str | None = None) -> ImportResult:
    """A spec from ``unit``; secret env and secret flags go to ``secrets`` and the spec names an ``env_file``.

    Raises:
        InputError: no ExecStart, one that runs neither vLLM nor SGLang, or a directive the spec cannot carry
            (``FILE:LINE: ...``).
    """
    start = unit.last_entry("Service", "ExecStart")
    if start is None or not start.value:
        raise InputError(unit.path, "no ExecStart= in [Service]")
    unit_name = name or Path(unit.path).name.removesuffix(".service")
    spec: dict[str, Any] = {"name": unit_name}
    secrets = _Secrets()
    replaced: list[str] = []
    _environment(unit, secrets, spec)  # before ExecStart: a secret given twice names its places in file order
    _engine(start, secrets, spec)
    _carry(unit, spec, replaced)
    if secrets.values:  # the rendered unit refuses to start without them (render.py's ExecStartPre check)
        spec.setdefault("env_file", f"{defaults()['env_file_dir']}/{unit_name}.env")
        spec["secrets"] = list(dict.fromkeys([*spec.get("secrets", []), *secrets.values]))
    order = ["name", "description", "engine", "model", "user", "working_directory", "command", "servescope",
             "env_file", "secrets", "gpus", "load_time_s", "start_margin_s", "start_timeout_s", "stop_timeout_s",
             "kill_signal", "limit_nofile", "args"]
    ordered = {k: spec[k] for k in order if k in spec}
    ordered.update({k: v for k, v in spec.items() if k not in ordered})
    result = ImportResult(unit_name, ordered, dict(secrets.values), tuple(replaced))
    parse_spec(spec_toml(result), unit.path)  # what render will read: a value it refuses is refused here
    return result


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _tables(prefix: str, table: dict[str, object]) -> list[str]:
    """``[prefix]`` with its plain keys, then each sub-table as ``[prefix.KEY]``."""
    plain = {k: v for k, v in table.items() if not isinstance(v, dict)}
    lines = ["", f"[{prefix}]"] if plain or not table else []
    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in plain.items()]
    for key, sub in table.items():
        if isinstance(sub, dict):
            lines += _tables(f"{prefix}.{json.dumps(key)}", sub)
    return lines


def spec_toml(result: ImportResult) -> str:
    """The spec as TOML text (plain keys first, then tables); what the rendered unit replaces is noted on top."""
    lines = ["# Imported by servescope service import."]
    lines += [f"# {note}" for note in result.replaced]
    if result.secrets:
        lines.append(f"# Secrets moved to env_file: {', '.join(result.secret_names)} (values not shown)")
    tables = {k: v for k, v in result.spec.items() if isinstance(v, dict)}
    for key, value in result.spec.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables.items():
        lines += _tables(key, table)
    return "\n".join(lines) + "\n"


def write_import(result: ImportResult, output: Path, *, mkdir: bool = False) -> Path | None:
    """Write the spec (:func:`spec_toml`) to ``output``, and its secrets beside it as ``NAME.env`` (``KEY=VALUE``
    lines, mode 0600), each atomically; the secrets file, or None when the unit had none. ``mkdir``: create
    ``output``'s folder when missing (else a missing folder is an InputError)."""
    write_text_atomic(output, spec_toml(result), mkdir=mkdir)
    if not result.secrets:
        return None
    env = output.with_name(f"{result.name}.env")
    write_text_atomic(env, "".join(f"{k}={v}\n" for k, v in result.secrets.items()), mode=0o600)
    return env


def import_unit_file(path: Path, *, output: Path | None = None,
                     mkdir: bool = False) -> tuple[ImportResult, Path | None]:
    """:func:`import_unit` of the unit at ``path`` with its drop-ins (``UNIT.d/*.conf``), as systemd runs it; with
    ``output``, the spec written there and its secrets beside it (:func:`write_import`). The result and the
    secrets file written (None: none written).

    Raises:
        InputError: as :func:`import_unit`, or a file that cannot be read or written.
    """
    result = import_unit(load_unit(path))
    return result, (None if output is None else write_import(result, output, mkdir=mkdir))
