"""Engine command lines read as flags, and the drift between what is on disk, what runs and what the server says.

Each kind of drift is one function over plain values, returning named :class:`~servescope.core.settings.Drift`
items: ``arg`` and ``env`` (the unit's ExecStart/Environment vs ``/proc/PID``), ``unit_changed`` (a unit
file, drop-in or EnvironmentFile modified after the process started: the process still runs the old one),
``server`` (a process flag vs the server's report of the same setting, e.g. ``--max-model-len`` vs
``/v1/models`` ``max_model_len``). Secret values never enter an item: both sides read ``***``.

Which flag belongs to which group and which flags are checked against the server is data:
``data/deploy/settings.toml``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from servescope.core.engines import detect_engine
from servescope.core.settings import MASK, Drift

__all__ = [
    "EngineArgs",
    "UNIT_CHANGED_MARGIN_S",
    "arg_drift",
    "env_drift",
    "env_group",
    "file_drift",
    "flag_group",
    "is_secret_key",
    "iso_time",
    "parse_engine_argv",
    "server_drift",
    "settings_rules",
    "substitute_env",
]

#: A unit file counts as changed after the process started only when its mtime is this much later: the
#: start time is known to a clock tick, and a unit written just before `systemctl start` must not count.
UNIT_CHANGED_MARGIN_S = 1.0
_NUMBER = re.compile(r"^-\d+(\.\d+)?$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WHOLE_VAR = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")


_SECRET_LAST_WORDS = {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "PASS", "CREDENTIALS", "PAT"}
_SECRET_ANY_WORDS = {"SECRET", "PASSWORD", "PASSWD", "APIKEY"}


def is_secret_key(name: str) -> bool:
    """True for a flag or variable that holds a credential: ``--api-key``, ``HF_TOKEN``, ``*_KEY``,
    ``*_SECRET``, passwords. Stricter than ``spec.is_secret_name``, which also hides ``--tokenizer`` and
    ``--max-num-batched-tokens``: settings must show those."""
    words = [w for w in re.split(r"[-_.\s]+", name.strip("-").upper()) if w]
    return bool(words) and (words[-1] in _SECRET_LAST_WORDS or any(w in _SECRET_ANY_WORDS for w in words))


@cache
def settings_rules() -> dict[str, Any]:
    """The bundled grouping and check rules (``data/deploy/settings.toml``)."""
    text = files("servescope").joinpath("data", "deploy", "settings.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


@cache
def _group_of_flag() -> dict[str, str]:
    return {flag: group for group, flags in settings_rules()["groups"].items() for flag in flags}


def flag_group(flag: str) -> str:
    """The group id of a normalised flag (``--no-X`` belongs where ``--X`` does); ``engine`` when unknown."""
    table = _group_of_flag()
    if flag in table:
        return table[flag]
    if flag.startswith("--no-") and "--" + flag[5:] in table:
        return table["--" + flag[5:]]
    return "engine"


def _normalise(flag: str) -> str:
    """``--tensor_parallel_size`` → ``--tensor-parallel-size``; short spellings → the long flag."""
    aliases: dict[str, str] = settings_rules()["aliases"]
    if flag in aliases:
        return aliases[flag]
    dashes = len(flag) - len(flag.lstrip("-"))
    name = flag[:dashes] + flag[dashes:].replace("_", "-")
    return aliases.get(name, name)


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """An engine command line as flags.

    Attributes:
        engine: ``vllm``, ``sglang``, or None when the command runs neither (then every word after the
            program counts as an argument).
        command: the words before the engine's arguments (``python3 -m vllm.entrypoints.openai.api_server``).
        model: the positional model of ``vllm serve MODEL``; None otherwise.
        flags: (flag as normalised, value, flag as written) in order; a flag without a value has ``""``;
            several words after one flag (``nargs='+'``) are joined by a space.
    """

    engine: str | None
    command: tuple[str, ...]
    model: str | None
    flags: tuple[tuple[str, str, str], ...]

    def values(self) -> dict[str, list[str]]:
        """Each normalised flag → its values in order (``model`` for the positional model)."""
        found: dict[str, list[str]] = {}
        if self.model is not None:
            found["model"] = [self.model]
        for flag, value, _ in self.flags:
            found.setdefault(flag, []).append(value)
        return found

    def get(self, *names: str) -> tuple[str, str] | None:
        """(flag, last value) of the first of ``names`` given; None when none is."""
        values = self.values()
        for name in names:
            if name in values:
                return name, values[name][-1]
        return None


def _is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NUMBER.match(word)


def parse_engine_argv(argv: Sequence[str]) -> EngineArgs:
    """The engine, command, model and flags of a server command line (ExecStart or ``/proc/PID/cmdline``).

    The engine is found as ``service import`` finds it, by ``data/engines.toml``: ``vllm serve``, ``python -m
    vllm.entrypoints.openai.api_server``, ``python -m sglang.launch_server``.
    """
    words = list(argv)
    found = detect_engine(words)
    engine, first = found if found is not None else (None, min(1, len(words)))
    command, rest = tuple(words[:first]), words[first:]
    model = None
    i = 0
    if command and command[-1] == "serve" and rest and not _is_flag(rest[0]):
        model, i = rest[0], 1
    flags: list[tuple[str, str, str]] = []
    while i < len(rest):
        word = rest[i]
        i += 1
        if not _is_flag(word):  # a stray positional: keep it, as an argument without a flag
            flags.append(("(positional)", word, ""))
            continue
        written, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if eq:
            flags.append((_normalise(written), inline, written))
            continue
        taken = []
        while i < len(rest) and not _is_flag(rest[i]):
            taken.append(rest[i])
            i += 1
        flags.append((_normalise(written), " ".join(taken), written))
    return EngineArgs(engine, command, model, tuple(flags))


def substitute_env(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``argv`` with ``${NAME}`` filled in and a word ``$NAME`` split into words, as systemd does at start
    (systemd.service(5), "Command lines"); unknown variables become empty, as in systemd."""
    out: list[str] = []
    for word in argv:
        whole = _WHOLE_VAR.match(word)
        if whole:
            out.extend(env.get(whole.group(1), "").split())
        else:
            out.append(_VAR.sub(lambda m: env.get(m.group(1), ""), word))
    return out


def _shown(flag: str, values: Sequence[str] | None) -> str | None:
    if values is None:
        return None
    if is_secret_key(flag):
        return MASK
    return ", ".join(v if v else "(set)" for v in values)


def arg_drift(unit: EngineArgs, process: EngineArgs) -> list[Drift]:
    """The unit's ExecStart against the running command line: each flag changed, added or dropped."""
    items: list[Drift] = []
    if unit.engine != process.engine:
        items.append(Drift(kind="arg", key="engine", values={"unit": unit.engine, "process": process.engine},
                           detail=f"the unit runs {unit.engine or 'an unknown program'} but the process is "
                                  f"{process.engine or 'an unknown program'}"))
    on_disk, running = unit.values(), process.values()
    for flag in [*running, *(f for f in on_disk if f not in running)]:
        a, b = on_disk.get(flag), running.get(flag)
        if a == b:
            continue
        values = {"unit": _shown(flag, a), "process": _shown(flag, b)}
        if a is None:
            detail = f"{flag} is in the running process but not in the unit (started by hand, or the unit " \
                     "lost it since)"
        elif b is None:
            detail = f"{flag} is in the unit but not in the running process: restart the service to apply it"
        elif is_secret_key(flag):
            detail = f"{flag} differs between the unit and the running process (values hidden)"
        else:
            detail = f"{flag}: the unit says {values['unit']}, the running process has {values['process']}"
        items.append(Drift(kind="arg", key=flag, values=values, detail=detail))
    return items


def env_group(name: str) -> str:
    """The group id of an environment variable: ``nccl_cuda_env``, ``vllm_env`` or ``other``."""
    prefixes: dict[str, list[str]] = settings_rules()["env"]
    for group in ("nccl_cuda_env", "vllm_env"):
        if name.startswith(tuple(prefixes[group])):
            return group
    return "other"


def env_drift(unit_env: Mapping[str, str], process_env: Mapping[str, str], *, unread_env_files: bool = False) \
        -> list[Drift]:
    """The unit's environment against the process's: each variable changed or missing, and NCCL/CUDA/vLLM
    variables the process has that the unit does not set (the usual trace of a hand-run experiment)."""
    managed = set(settings_rules()["env"]["managed"])
    items: list[Drift] = []
    for name, value in unit_env.items():
        shown = MASK if is_secret_key(name) else value
        if name not in process_env:
            items.append(Drift(kind="env", key=name, values={"unit": shown, "process": None},
                               detail=f"{name} is set by the unit but not in the running process: restart "
                                      "the service to apply it"))
        elif process_env[name] != value:
            got = MASK if is_secret_key(name) else process_env[name]
            detail = (f"{name} differs between the unit and the running process (values hidden)"
                      if is_secret_key(name) else
                      f"{name}: the unit sets {value!r}, the running process has {process_env[name]!r}")
            items.append(Drift(kind="env", key=name, values={"unit": shown, "process": got}, detail=detail))
    for name, value in process_env.items():
        if name in unit_env or name in managed or env_group(name) == "other":
            continue
        why = " (or it comes from an EnvironmentFile we could not read)" if unread_env_files else ""
        items.append(Drift(kind="env", key=name,
                           values={"unit": None, "process": MASK if is_secret_key(name) else value},
                           detail=f"{name} is in the running process but not set by the unit{why}"))
    return items


def iso_time(epoch_s: float) -> str:
    """``epoch_s`` as ISO 8601 UTC to the second (a label, never for arithmetic)."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")


def file_drift(files_mtime: Mapping[str, float], process_start: float) -> list[Drift]:
    """Each unit file, drop-in or EnvironmentFile modified after the process started (``stat -c %y FILE``
    against ``ps -o lstart= -p PID``): the running process does not have what it says."""
    items = []
    for path, mtime in files_mtime.items():
        if mtime > process_start + UNIT_CHANGED_MARGIN_S:
            items.append(Drift(
                kind="unit_changed", key=path,
                values={"modified": iso_time(mtime), "process_started": iso_time(process_start)},
                detail=f"{Path(path).name} was modified at {iso_time(mtime)}, after the process started at "
                       f"{iso_time(process_start)}: the process runs the old settings (daemon-reload, restart)"))
    return items


def _same(kind: str, flag_value: str, server_value: str) -> bool | None:
    """Whether the two agree under ``kind``; None when they cannot be compared."""
    truth = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False, "": True}
    try:
        if kind == "int":
            return int(float(flag_value)) == int(float(server_value))
        if kind == "float":
            return abs(float(flag_value) - float(server_value)) <= 1e-9 * max(1.0, abs(float(flag_value)))
        if kind == "bool":
            return truth[flag_value.lower()] == truth[server_value.lower()]
        if kind == "dtype":
            return flag_value.removeprefix("torch.").lower() == server_value.removeprefix("torch.").lower()
        if kind == "member":
            return all(name in server_value.split(", ") for name in flag_value.split())
    except (ValueError, KeyError):
        return None
    return flag_value == server_value


def server_drift(args: EngineArgs, server: Mapping[str, str], *, base_model: str | None) -> list[Drift]:
    """Process flags against what the server reports (rules: ``[[checks]]`` of settings.toml).

    Args:
        server: server setting key → value, as the settings ``server`` group lists them.
        base_model: the id of the base model in ``/v1/models`` (for ``[*]`` in a rule).
    """
    items = []
    for check in settings_rules()["checks"]:
        flags = check["flags"]
        given = args.get(*flags, *(["--no-" + f[2:] for f in flags] if check["type"] == "bool" else []))
        if given is None:
            continue
        flag, value = given
        if flag.startswith("--no-"):
            value = "false"
        if value == "auto" or (value == "" and check["type"] != "bool"):
            continue
        for key in check["server"]:
            key = key.replace("[*]", f"[{base_model}]")
            if key in server and server[key] not in ("None", "null"):
                break
        else:
            continue
        reported = server[key]
        if _same(check["type"], value, reported) is False:
            items.append(Drift(kind="server", key=flag, values={"process": value or "(set)", "server": reported},
                               detail=f"{flag} is {value or '(set)'} on the command line but the server reports "
                                      f"{reported} ({key})"))
    return items
