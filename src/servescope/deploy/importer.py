"""Turn an existing unit into a spec: engine, model, args in order, env; secrets moved to an EnvironmentFile."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from servescope.core.atomic import write_text_atomic
from servescope.core.errors import InputError
from servescope.deploy.lint import UnitText, split_command, time_span_s
from servescope.deploy.spec import defaults, is_secret_name

__all__ = ["ImportResult", "detect_engine", "import_unit", "spec_toml", "write_import"]


@dataclass(frozen=True, slots=True)
class ImportResult:
    """The spec as a dict (spec.toml keys), the secrets moved out (names only are ever shown), what was dropped."""

    name: str
    spec: dict[str, object]
    secrets: dict[str, str] = field(repr=False)
    dropped: tuple[str, ...]

    @property
    def secret_names(self) -> tuple[str, ...]:
        return tuple(self.secrets)


def detect_engine(argv: list[str], source: str) -> tuple[str, int]:
    """(engine, index of the first engine argument) of an ExecStart argv."""
    for i, word in enumerate(argv):
        if word in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
            return "vllm", i + 1
        if word == "sglang.launch_server":
            return "sglang", i + 1
        if Path(word).name == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm", i + 2
    raise InputError(source, f"ExecStart runs neither vLLM nor SGLang: {argv[0]!r}")


def import_unit(unit: UnitText, *, name: str | None = None) -> ImportResult:
    """A spec from ``unit``; secret env and ``--api-key`` go to ``secrets`` and the spec names an ``env_file``.

    Raises:
        InputError: no ExecStart, or one that runs neither vLLM nor SGLang.
    """
    start = unit.get("Service", "ExecStart")
    if start is None:
        raise InputError(unit.source, "no ExecStart= in [Service]")
    _, argv = split_command(start.value)
    engine, first = detect_engine(argv, unit.source)
    command, rest = argv[:first], argv[first:]
    model_flag = defaults()["engines"][engine]["model_flag"]
    model: str | None = None
    args: list[str] = []
    secrets: dict[str, str] = {}
    i = 0
    if command[-1] == "serve" and rest and not rest[0].startswith("-"):
        model, i = rest[0], 1
    while i < len(rest):
        word = rest[i]
        flag, eq, inline = word.partition("=")
        if flag == model_flag and model is None:
            model = inline if eq else rest[i + 1]
            i += 1 if eq else 2
            continue
        if flag == "--api-key":
            secrets["VLLM_API_KEY"] = inline if eq else rest[i + 1]
            i += 1 if eq else 2
            continue
        args.append(word)
        i += 1
    if model is None:
        raise InputError(f"{unit.source}:{start.line}", f"ExecStart has no {model_flag}")
    unit_name = name or Path(unit.source).name.removesuffix(".service")
    env: dict[str, str] = {}
    gpus: list[int] | None = None
    for entry in unit.get_all("Service", "Environment"):
        for word in shlex.split(entry.value):  # Environment= does not expand $, so no $$ unescaping here
            key, _, value = word.partition("=")
            if is_secret_name(key):
                secrets[key] = value
            elif key == "CUDA_VISIBLE_DEVICES" and all(p.strip().isdigit() for p in value.split(",")):
                gpus = [int(p) for p in value.split(",")]
            else:
                env[key] = value
    spec: dict[str, object] = {"name": unit_name}
    description = unit.get("Unit", "Description")
    if description is not None:
        spec["description"] = description.value
    spec.update({"engine": engine, "model": model})
    for key, field_name in (("User", "user"), ("WorkingDirectory", "working_directory")):
        found = unit.get("Service", key)
        if found is not None:
            spec[field_name] = found.value
    if command != defaults()["engines"][engine]["command"]:
        spec["command"] = command
    env_files = [e.value.lstrip("-") for e in unit.get_all("Service", "EnvironmentFile")]
    if secrets or env_files:
        spec["env_file"] = env_files[0] if env_files else f"{defaults()['env_file_dir']}/{unit_name}.env"
    if secrets:  # the rendered unit refuses to start without them (render.py's ExecStartPre check)
        spec["secrets"] = list(secrets)
    if gpus is not None:
        spec["gpus"] = gpus
    timeout = unit.get("Service", "TimeoutStartSec")
    span = time_span_s(timeout.value) if timeout is not None else None
    if span is not None and span != float("inf"):
        spec["load_time_s"] = int(span)
    restart = unit.get("Service", "Restart")
    if restart is not None and restart.value in ("on-failure", "always", "no", "on-abnormal"):
        spec["restart"] = {"policy": restart.value}
    spec["args"] = args
    if env:
        spec["env"] = env
    dropped = tuple(f"line {e.line}" for e in unit.get_all("Service", "ExecStartPre"))
    if dropped:  # written out, so the comment that names it points at a table the spec has
        guard = defaults()["guard"]
        spec["guard"] = {"max_used_mib": int(guard["max_used_mib"]), "timeout_s": int(guard["timeout_s"])}
    return ImportResult(unit_name, spec, secrets, dropped)


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


def spec_toml(result: ImportResult) -> str:
    """The spec as TOML text (plain keys first, then tables); ExecStartPre lines it replaced are noted on top."""
    lines = ["# Imported by servescope service import."]
    lines += [f"# ExecStartPre at {d} of the unit: replaced by the [guard] table below (servescope gpu wait-free, "
              "rendered as ExecStartPre)" for d in result.dropped]
    if result.secrets:
        lines.append(f"# Secrets moved to env_file: {', '.join(result.secret_names)} (values not shown)")
    tables = {k: v for k, v in result.spec.items() if isinstance(v, dict)}
    for key, value in result.spec.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables.items():
        lines += ["", f"[{key}]"]
        lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_import(result: ImportResult, output: Path) -> Path | None:
    """Write the spec (:func:`spec_toml`) to ``output``, and its secrets beside it as ``NAME.env`` (``KEY=VALUE``
    lines, mode 0600), each atomically; the secrets file, or None when the unit had none."""
    write_text_atomic(output, spec_toml(result))
    if not result.secrets:
        return None
    env = output.with_name(f"{result.name}.env")
    write_text_atomic(env, "".join(f"{k}={v}\n" for k, v in result.secrets.items()), mode=0o600)
    return env
