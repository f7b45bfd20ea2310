"""A deployment spec: the service as declarative TOML, typed and strict.

Unknown keys and wrong types are errors naming the file and key. Defaults live in
``data/deploy/defaults.toml``. Secrets never sit in the spec: ``env_file`` names the file holding them and
``secrets`` their names (the server's API key is ``VLLM_API_KEY``: vLLM reads it, and so does the unit's
``servescope health``).

Example spec::

    name = "vllm-kimi"
    engine = "vllm"
    model = "moonshotai/Kimi-K2.5"
    gpus = [0, 1, 2, 3, 4, 5, 6, 7]
    env_file = "/etc/servescope/vllm-kimi.env"
    secrets = ["VLLM_API_KEY"]      # env_file sets them; the unit will not start without them
    [args]
    tensor-parallel-size = 8
    max-model-len = 131072
    [env]
    NCCL_PROTO = "LL"
    [extra.Service]                 # directives render does not write, carried verbatim (service import)
    Nice = ["-5"]

``start_timeout_s`` and ``restart.interval_s`` set TimeoutStartSec and StartLimitIntervalSec as given (default:
computed from the guard, the load and the margin); ``[extra.SECTION]`` may add to render's list-valued directives
(After=, ExecStartPre=...) but not set one it writes itself (``data/deploy/directives.toml``).
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import msgspec

from servescope.core.engines import engine, engine_ids
from servescope.core.errors import InputError
from servescope.core.files import read_text

__all__ = [
    "ArgValue",
    "Guard",
    "MultiNode",
    "RestartPolicy",
    "Spec",
    "defaults",
    "directives",
    "engine_args",
    "is_secret_name",
    "load_spec",
    "parse_spec",
]

ArgValue = str | int | float | bool | list[str]
_SECRET_NAME = re.compile(r"(?i)(token|api[-_]?key|secret|password|passwd|_key$)")
_SECRET_FLAGS = ("--api-key", "--hf-token")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESTART = ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always")
_ALLOWED = {"restart.policy": ", ".join(_RESTART)}
_KEY = re.compile(r"[A-Za-z0-9_.-]+")


@cache
def directives() -> dict[str, Any]:
    """What render writes itself and how import carries each (``data/deploy/directives.toml``), by
    ``Section.Key``."""
    text = files("servescope").joinpath("data", "deploy", "directives.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


@cache
def defaults() -> dict[str, Any]:
    """The bundled defaults (``data/deploy/defaults.toml``)."""
    text = files("servescope").joinpath("data", "deploy", "defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def is_secret_name(name: str) -> bool:
    """True for names shaped like credentials: HF_TOKEN, *_KEY, *_SECRET, passwords, --api-key."""
    return bool(_SECRET_NAME.search(name))


class Guard(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """ExecStartPre's wait for free GPU memory (``servescope gpu wait-free``)."""

    max_used_mib: int = msgspec.field(default_factory=lambda: int(defaults()["guard"]["max_used_mib"]))
    timeout_s: int = msgspec.field(default_factory=lambda: int(defaults()["guard"]["timeout_s"]))


class RestartPolicy(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Restart= and the start limit. ``burst`` starts within ``interval_s`` trip the limit (None: an interval
    computed so that ``burst`` failed starts of full length fall inside it)."""

    policy: Literal["no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always"] = (
        msgspec.field(default_factory=lambda: str(defaults()["restart"]["policy"])))  # type: ignore[arg-type,return-value]
    delay_s: int = msgspec.field(default_factory=lambda: int(defaults()["restart"]["delay_s"]))
    burst: int = msgspec.field(default_factory=lambda: int(defaults()["restart"]["burst"]))
    interval_s: int | None = None


class MultiNode(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A Ray cluster across nodes: a head unit, a worker unit (same file on every worker), the server on the head."""

    head_address: str
    workers: list[str] = msgspec.field(default_factory=list)
    ray_port: int = msgspec.field(default_factory=lambda: int(defaults()["multinode"]["ray_port"]))
    ray: str = msgspec.field(default_factory=lambda: str(defaults()["multinode"]["ray"]))


class Spec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One deployment. ``args`` is a table (``flag = value``, order kept; true = bare flag) or a list of words."""

    name: str
    model: str
    engine: str = "vllm"  # an id of data/engines.toml (parse_spec checks it)
    description: str | None = None
    user: str = msgspec.field(default_factory=lambda: str(defaults()["user"]))
    working_directory: str = msgspec.field(default_factory=lambda: str(defaults()["working_directory"]))
    command: list[str] | None = None
    args: dict[str, ArgValue] | list[str] = msgspec.field(default_factory=dict)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    env_file: str | None = None
    secrets: list[str] = msgspec.field(default_factory=list)  # names env_file must set; never their values
    gpus: list[int] | None = None
    load_time_s: int = msgspec.field(default_factory=lambda: int(defaults()["load_time_s"]))
    start_timeout_s: int | None = None  # TimeoutStartSec; None: guard + load + margin (render.py)
    start_margin_s: int = msgspec.field(default_factory=lambda: int(defaults()["start_margin_s"]))
    stop_timeout_s: int = msgspec.field(default_factory=lambda: int(defaults()["stop_timeout_s"]))
    kill_signal: str = msgspec.field(default_factory=lambda: str(defaults()["kill_signal"]))
    limit_nofile: int = msgspec.field(default_factory=lambda: int(defaults()["limit_nofile"]))
    servescope: str | None = None  # the servescope the unit runs; None: the one that renders (render.py)
    guard: Guard = msgspec.field(default_factory=Guard)
    restart: RestartPolicy = msgspec.field(default_factory=RestartPolicy)
    multinode: MultiNode | None = None
    extra: dict[str, dict[str, list[str]]] = msgspec.field(default_factory=dict)  # SECTION -> Key -> values, verbatim

    @property
    def engine_command(self) -> list[str]:
        """The program and its leading words: the spec's ``command`` or the engine's default."""
        return list(self.command or engine(self.engine).command)


def engine_args(spec: Spec) -> list[str]:
    """The engine's argument words after the command: the model flag, then the spec's args in order."""
    command = spec.engine_command
    words = [spec.model] if command[-1] == "serve" else [engine(spec.engine).model_flag, spec.model]
    if isinstance(spec.args, list):
        return words + list(spec.args)
    for key, value in spec.args.items():
        flag = key if key.startswith("-") else f"--{key}"
        if value is True:
            words.append(flag)
        elif value is False:
            continue
        elif isinstance(value, list):
            words += [flag, *value]
        else:
            words += [flag, str(value)]
    return words


def _check(spec: Spec, source: str) -> Spec:
    if not re.fullmatch(r"[A-Za-z0-9:_.@-]+", spec.name):
        raise InputError(source, f"name {spec.name!r}: use letters, digits and :_.@- (it becomes NAME.service)")
    for key in spec.env:
        if is_secret_name(key):
            raise InputError(source, f"env.{key}: a secret inline; put it in the file named by env_file")
    words = engine_args(spec)
    for flag in _SECRET_FLAGS:
        if any(w == flag or w.startswith(flag + "=") for w in words):
            raise InputError(source, f"args: {flag} inline; put VLLM_API_KEY / HF_TOKEN in the env_file instead")
    if spec.env_file is not None and not spec.env_file.startswith("/"):
        raise InputError(source, f"env_file {spec.env_file!r}: must be an absolute path")
    if spec.secrets and spec.env_file is None:
        raise InputError(source, "secrets: names the variables env_file sets, but there is no env_file")
    for name in spec.secrets:
        if not _ENV_NAME.fullmatch(name):
            raise InputError(source, f"secrets: {name!r} is not a variable name (letters, digits, _)")
    for positive in ("load_time_s", "stop_timeout_s"):
        if getattr(spec, positive) <= 0:
            raise InputError(source, f"{positive}: must be > 0")
    if spec.restart.burst < 1:
        raise InputError(source, "restart.burst: must be >= 1")
    for optional in ("start_timeout_s", "restart.interval_s"):
        value = spec.start_timeout_s if optional == "start_timeout_s" else spec.restart.interval_s
        if value is not None and value <= 0:
            raise InputError(source, f"{optional}: must be > 0")
    _check_extra(spec, source)
    return spec


def _check_extra(spec: Spec, source: str) -> None:
    """``[extra.SECTION]`` holds directives render does not write itself; of those it writes, only list-valued
    ones (After=, ExecStartPre= ...), whose values add to render's own."""
    for section, keys in spec.extra.items():
        for key, values in keys.items():
            where = f"extra.{section}.{key}"
            if not _KEY.fullmatch(section) or not _KEY.fullmatch(key):
                raise InputError(source, f"{where}: not a unit section and directive name")
            known = directives().get(f"{section}.{key}")
            if known is not None and not known.get("list"):
                keys_of = ", ".join(known.get("field", [])) or "the rendered unit's own"
                raise InputError(source, f"{where}: render writes {key}= itself (set {keys_of})")
            if any("\n" in v for v in values):
                raise InputError(source, f"{where}: a value holds a line break")


def parse_spec(text: str, source: str) -> Spec:
    """The spec in TOML ``text``; ``source`` names it in errors.

    Raises:
        InputError: not TOML, an unknown key, a wrong type, a missing key or an inline secret (one line).
    """
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, f"not valid TOML ({exc})") from None
    if isinstance(raw.get("engine"), str) and raw["engine"] not in engine_ids():
        raise InputError(source, f"engine: invalid enum value {raw['engine']!r}; allowed: {', '.join(engine_ids())}")
    try:
        spec = msgspec.convert(raw, Spec, strict=True)
    except msgspec.ValidationError as exc:
        raise InputError(source, _describe(exc)) from None
    return _check(spec, source)


def load_spec(path: str | Path) -> Spec:
    """The spec in the TOML file at ``path``. Raises InputError (one line) for any problem."""
    return parse_spec(read_text(Path(path)), str(path))


def _describe(exc: msgspec.ValidationError) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.guard.timeout_s`' as 'guard.timeout_s: expected int, got str'."""
    message = str(exc)
    where = ""
    if " - at `$" in message:
        message, _, where = message.partition(" - at `$")
        where = where.rstrip("`").lstrip(".")
    if message.startswith("Object contains unknown field"):
        key = message.split("`")[1]
        where = f"{where}.{key}" if where else key
        message = "unknown key"
    elif message.startswith("Object missing required field"):
        key = message.split("`")[1]
        where = f"{where}.{key}" if where else key
        message = "missing required key"
    if message.startswith("Invalid enum value") and where in _ALLOWED:
        message += f"; allowed: {_ALLOWED[where]}"
    message = message.replace("`", "")
    message = message[:1].lower() + message[1:]
    return f"{where}: {message}" if where else message
