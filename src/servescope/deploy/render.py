"""Render systemd units from a spec: the server unit, and for multi-node the Ray head and worker units.

Readiness: vLLM never sends READY=1, so the server runs as ``Type=exec`` and an ``ExecStartPost=`` runs
``servescope health URL --wait --pid $MAINPID``. The unit stays "activating" until the model answers, so
``systemctl start`` returns when the server is ready, units ordered after it wait, and a crash while loading
fails the start at once (health sees the process gone). A ``Type=notify`` wrapper would need a second
long-lived process in the cgroup relaying signals and exit codes for the same result.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from servescope.core.atomic import write_text_atomic
from servescope.core.errors import InputError
from servescope.deploy.spec import Spec, defaults, engine_args

__all__ = ["DEPENDENCIES", "WANTED_BY", "RenderedUnit", "quote_word", "render_units", "servescope_argv",
           "start_limit_interval_s", "start_timeout_s", "write_units"]

DEPENDENCIES = ("network-online.target", "nvidia-persistenced.service")
"""What every rendered unit is ordered after and wants (``After=``, ``Wants=``)."""
WANTED_BY = "multi-user.target"
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./$-]+")
_READINESS_NOTE = (
    "# Type=exec + ExecStartPost health wait: vLLM sends no READY=1, so the unit stays 'activating' until\n"
    "# /health, /v1/models and a 1-token completion answer; a crash while loading fails the start at once.\n"
)


@dataclass(frozen=True, slots=True)
class RenderedUnit:
    """One unit file: its name (``NAME.service``), where it runs ("all", "head" or "workers"), and its text."""

    filename: str
    role: str
    text: str


def quote_word(word: str, *, dollars: bool = True) -> str:
    """One word as systemd's parser reads it back: ``%`` as ``%%``, ``$`` as ``$$`` (commands only), quoted if needed.

    Environment= values get ``dollars=False``: systemd expands ``$`` in command lines, not in Environment=.
    """
    escaped = word.replace("%", "%%")
    if dollars:
        escaped = escaped.replace("$", "$$")
    if escaped and _PLAIN.fullmatch(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _command(words: list[str]) -> str:
    return " ".join(quote_word(w) for w in words)


def start_timeout_s(spec: Spec) -> int:
    """TimeoutStartSec: the spec's ``start_timeout_s``, else the guard wait, the load and a margin (it covers
    ExecStartPre and ExecStartPost)."""
    if spec.start_timeout_s is not None:
        return spec.start_timeout_s
    return spec.guard.timeout_s + spec.load_time_s + spec.start_margin_s


def start_limit_interval_s(spec: Spec) -> int:
    """StartLimitIntervalSec: the spec's ``restart.interval_s``, else long enough that ``burst`` failed starts of
    full length fall inside it."""
    if spec.restart.interval_s is not None:
        return spec.restart.interval_s
    return spec.restart.burst * (start_timeout_s(spec) + spec.restart.delay_s) + 60


def _extra(spec: Spec, section: str) -> list[str]:
    """The spec's ``[extra.SECTION]`` directives, verbatim."""
    return [f"{key}={value}" for key, values in spec.extra.get(section, {}).items() for value in values]


def _port(spec: Spec) -> int:
    words = engine_args(spec)
    for i, word in enumerate(words):
        if word == "--port" and i + 1 < len(words):
            return int(words[i + 1])
        if word.startswith("--port="):
            return int(word.split("=", 1)[1])
    return int(defaults()["port"])


def _environment(spec: Spec) -> list[str]:
    env = dict(spec.env)
    if spec.gpus is not None:
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in spec.gpus))
    lines = [f"Environment={quote_word(f'{k}={v}', dollars=False)}" for k, v in env.items()]
    if spec.env_file is not None:
        lines.append(f"EnvironmentFile=-{spec.env_file}")
    return lines


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def servescope_argv(spec: Spec) -> list[str]:
    """How the unit runs servescope: the spec's ``servescope``, else the one rendering this unit, by absolute
    path: this process's console script (``sys.argv[0]``), the one beside its python, the one on PATH, else
    ``python -m servescope`` with this python."""
    if spec.servescope:
        return [spec.servescope]
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    beside = Path(sys.executable).parent / "servescope" if sys.executable else None
    for candidate in (argv0, beside):
        if candidate is not None and candidate.name == "servescope" and _executable(candidate):
            return [str(candidate.absolute())]
    found = shutil.which("servescope")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "servescope"]


def _secrets_check(spec: Spec) -> list[str]:
    """An ``ExecStartPre=`` that fails the start, naming the file, when a secret ``env_file`` must set is empty.

    ``EnvironmentFile=-FILE`` ignores a missing FILE, so vLLM would start without its ``VLLM_API_KEY``
    (open to anyone) and the readiness check would pass without a key. Without the ``-`` systemd refuses
    the start but says only "Failed to load environment files: No such file or directory", naming no file,
    and runs no ``ExecStartPre``. So the ``-`` stays and this check runs first: the journal and
    ``systemctl status`` show which file is missing, or which variable it does not set. No loop, so
    ``service lint``'s wait-loop rule has nothing to say about it.
    """
    if not spec.secrets or spec.env_file is None:
        return []
    checks = [f'test -n "${{{name}}}" || {{ test -e "$1" && echo "servescope: $1 does not set {name}: not '
              f'starting without it" >&2 || echo "servescope: $1 is missing (it must set {name}): not starting '
              f'without it" >&2; exit 1; }}' for name in spec.secrets]
    return ["ExecStartPre=" + _command(["/bin/sh", "-c", "; ".join(checks), "sh", spec.env_file])]


def _guard(spec: Spec) -> str:
    return "ExecStartPre=" + _command([*servescope_argv(spec), "gpu", "wait-free", "--max-used-mib",
                                       str(spec.guard.max_used_mib), "--timeout", str(spec.guard.timeout_s)])


def _unit_section(description: str, extra_after: list[str], spec: Spec, *, extra: bool = False) -> list[str]:
    after = [*DEPENDENCIES, *extra_after]
    return [
        "[Unit]",
        f"Description={description}",
        f"After={' '.join(after)}",
        f"Wants={' '.join(after)}",
        f"StartLimitIntervalSec={start_limit_interval_s(spec)}",
        f"StartLimitBurst={spec.restart.burst}",
        *(_extra(spec, "Unit") if extra else []),
        "",
    ]


def _service_tail(spec: Spec, *, extra: bool = False) -> list[str]:
    install = [f"WantedBy={WANTED_BY}", *(_extra(spec, "Install") if extra else [])]
    others = [line for section in spec.extra if section not in ("Unit", "Service", "Install")
              for line in ["", f"[{section}]", *_extra(spec, section)]] if extra else []
    return [
        f"Restart={spec.restart.policy}",
        f"RestartSec={spec.restart.delay_s}",
        f"TimeoutStartSec={start_timeout_s(spec)}",
        "# Stop: the whole cgroup gets KillSignal, so every worker exits and frees its GPU memory.",
        "KillMode=control-group",
        f"KillSignal={spec.kill_signal}",
        f"TimeoutStopSec={spec.stop_timeout_s}",
        f"LimitNOFILE={spec.limit_nofile}",
        *(["# Carried from the imported unit ([extra.Service] of the spec):", *_extra(spec, "Service")]
          if extra and spec.extra.get("Service") else []),
        "",
        "[Install]",
        *install,
        *others,
        "",
    ]


def _server_unit(spec: Spec, *, after: list[str], extra_args: list[str]) -> str:
    port = _port(spec)
    wait = spec.load_time_s + spec.start_margin_s
    if spec.start_timeout_s is not None:  # systemd ends the start at TimeoutStartSec anyway
        wait = min(wait, spec.start_timeout_s)
    health = [*servescope_argv(spec), "health", f"http://127.0.0.1:{port}", "--wait", "--timeout", str(wait)]
    lines = _unit_section(spec.description or f"{spec.engine} server: {spec.model}", after, spec, extra=True)
    lines += [
        "[Service]",
        _READINESS_NOTE.rstrip("\n"),
        "Type=exec",
        f"User={spec.user}",
        f"WorkingDirectory={spec.working_directory}",
        *_environment(spec),
        *_secrets_check(spec),
        _guard(spec),
        "ExecStart=" + _command(spec.engine_command + engine_args(spec) + extra_args),
        "ExecStartPost=" + _command(health) + " --pid $MAINPID",
        *_service_tail(spec, extra=True),
    ]
    return "\n".join(lines)


def _ray_unit(spec: Spec, role: str) -> str:
    assert spec.multinode is not None
    mn = spec.multinode
    if role == "head":
        words = [mn.ray, "start", "--head", "--port", str(mn.ray_port), "--block"]
        description = f"Ray head for {spec.name}"
    else:
        words = [mn.ray, "start", "--address", f"{mn.head_address}:{mn.ray_port}", "--block"]
        description = f"Ray worker for {spec.name} (head {mn.head_address}:{mn.ray_port})"
    lines = _unit_section(description, [], spec)
    lines += [
        "[Service]",
        "# ray start --block stays in the foreground; the server unit adds the GPUs of every node to the cluster.",
        "Type=exec",
        f"User={spec.user}",
        f"WorkingDirectory={spec.working_directory}",
        *_environment(spec),
        _guard(spec),
        "ExecStart=" + _command(words),
        "ExecStop=" + _command([mn.ray, "stop"]),
        *_service_tail(spec),
    ]
    return "\n".join(lines)


def render_units(spec: Spec) -> tuple[RenderedUnit, ...]:
    """The units of ``spec``: ``NAME.service``; with ``multinode`` also ``NAME-ray-head`` and ``NAME-ray-worker``."""
    if spec.multinode is None:
        return (RenderedUnit(f"{spec.name}.service", "all", _server_unit(spec, after=[], extra_args=[])),)
    head = f"{spec.name}-ray-head.service"
    words = engine_args(spec)
    extra = [] if "--distributed-executor-backend" in words else ["--distributed-executor-backend", "ray"]
    return (
        RenderedUnit(head, "head", _ray_unit(spec, "head")),
        RenderedUnit(f"{spec.name}.service", "head", _server_unit(spec, after=[head], extra_args=extra)),
        RenderedUnit(f"{spec.name}-ray-worker.service", "workers", _ray_unit(spec, "worker")),
    )


def write_units(units: tuple[RenderedUnit, ...], output: Path, *, mkdir: bool = False) -> list[tuple[Path, str | None]]:
    """Write ``units`` atomically: one unit to the file ``output`` (unless it is a folder), several into the
    folder ``output``; each path written with the role it runs on (None for a lone unit). ``mkdir``: create the
    folder when it is missing.

    Raises:
        InputError: several units and ``output`` a file, or a missing folder without ``mkdir``.
    """
    if len(units) == 1 and not output.is_dir():
        write_text_atomic(output, units[0].text, mkdir=mkdir)
        return [(output, None)]
    if output.exists() and not output.is_dir():
        raise InputError(str(output), "a multi-node spec renders several units: give a folder")
    if not output.exists() and not mkdir:
        raise InputError(f"--output {output}", "folder does not exist (a multi-node spec renders several "
                         "units into it): create it, or pass --mkdir")
    written: list[tuple[Path, str | None]] = []
    for unit in units:
        write_text_atomic(output / unit.filename, unit.text, mkdir=mkdir)
        written.append((output / unit.filename, unit.role))
    return written
