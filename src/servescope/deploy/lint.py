"""Lint a systemd unit for the ways a GPU model server goes wrong; rules live in ``data/deploy/lint_rules.toml``.

Each finding names the line it was found on and what to do. A rule declares in its data the directives it judges
and where it applies (``Type=``, an ``ExecStartPost``...); rules that only say a directive is missing need no code.
The unit is read by :mod:`servescope.deploy.unitfile`, as systemd reads it: a line or a value systemd could not
parse (an unclosed quote) is an :class:`InputError` naming the file and line. The NCCL rules need the GPU
topology: ``--topology nvlink|pcie``, an ``nvidia-smi topo -m`` file, or none (those rules are then skipped).
"""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from servescope.core.engines import detect_engine, engine
from servescope.core.files import read_text
from servescope.deploy.spec import defaults, is_secret_name
from servescope.deploy.unitfile import (
    ExecCommand,
    UnitEntry,
    UnitFile,
    parse_unit,
    split_command_line,
    split_command_lines,
    split_words,
)

__all__ = ["Finding", "LintResult", "directive", "environment", "exec_command", "lint_unit", "lint_unit_file",
           "parse_unit", "time_span_s"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: the rule's id, severity, message and fix, where it was found and what was seen."""

    rule: str
    severity: str
    message: str
    fix: str
    line: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class LintResult:
    """All findings of one unit, in line order; ``topology`` is what the NCCL rules checked against (or None);
    ``notes``: what was checked and found fine, one line each (e.g. the NCCL settings against the topology)."""

    source: str
    topology: str | None
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")


def _where(entry: UnitEntry) -> str:
    return f"{entry.source}:{entry.line}"


def directive(unit: UnitFile, name: str) -> UnitEntry | None:
    """The assignment that decides ``name`` ("Section.Key"), or None when unset (an empty one resets it)."""
    section, _, key = name.partition(".")
    found = unit.entries_of(section, key)
    return found[-1] if found else None


def exec_command(entry: UnitEntry) -> ExecCommand:
    """The one command of an ``Exec*=`` assignment, split as systemd does.

    Raises:
        InputError: ``FILE:LINE: ...``: unbalanced quotes, no executable, several commands.
    """
    return split_command_line(entry.value, _where(entry))


def environment(unit: UnitFile) -> list[tuple[str, str, UnitEntry]]:
    """(name, value, the assignment) of every ``Environment=`` word, in order.

    Raises:
        InputError: ``FILE:LINE: ...``: unbalanced quotes.
    """
    found = []
    for entry in unit.entries_of("Service", "Environment"):
        for word in split_words(entry.value.replace("%%", "%"), _where(entry)):
            key, _, value = word.partition("=")
            found.append((key, value, entry))
    return found


def time_span_s(value: str) -> float | None:
    """A systemd time span ("1800", "30min", "1h 5s", "infinity") in seconds; None when unreadable."""
    value = value.strip()
    if value == "infinity":
        return float("inf")
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if not parts or re.sub(r"[\d.\sa-z]", "", value):
        return None
    for number, unit in parts:
        if unit and unit not in units:
            return None
        total += float(number) * units.get(unit or "s", 1)
    return total


@cache
def _rules() -> dict[str, Any]:
    text = files("servescope").joinpath("data", "deploy", "lint_rules.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _rule(rule_id: str) -> dict[str, Any]:
    return next(r for r in _rules()["rule"] if r["id"] == rule_id)


def _finding(rule_id: str, line: int | None, detail: str) -> Finding:
    rule = _rule(rule_id)
    return Finding(rule_id, rule["severity"], rule["message"], rule["fix"], line, detail)


def _value(unit: UnitFile, name: str) -> str | None:
    """The value of ``name`` as systemd takes it: the assignment, else what systemd assumes (``[unset]``)."""
    entry = directive(unit, name)
    return entry.value if entry is not None else _rules()["unset"].get(name)


def _holding(rule: dict[str, Any], unit: UnitFile) -> list[dict[str, Any]] | None:
    """The conditions of ``rule`` that hold on ``unit`` ([] for a rule without any), or None: it does not apply."""
    conditions: list[dict[str, Any]] = rule.get("when", [])
    held = [c for c in conditions
            if ("in" in c and _value(unit, c["key"]) in c["in"])
            or ("set" in c and (directive(unit, c["key"]) is not None) == c["set"])]
    return held if held or not conditions else None


def _missing(rule: dict[str, Any], unit: UnitFile, held: list[dict[str, Any]]) -> Finding | None:
    """A ``missing = true`` rule: it fires when none of the directives it judges is set; the finding sits on the
    line of the condition that made it apply, else on ExecStart."""
    if any(directive(unit, name) is not None for name in rule["judges"]):
        return None
    why = [f"{c['key'].split('.', 1)[1]}={_value(unit, c['key'])}" if "in" in c else
           f"{c['key'].split('.', 1)[1]} {'set' if c['set'] else 'unset'}" for c in held]
    anchors = [directive(unit, c["key"]) for c in held] + [directive(unit, "Service.ExecStart")]
    line = next((a.line for a in anchors if a is not None), None)
    unset = " or ".join(name.split(".", 1)[1] for name in rule["judges"])
    return _finding(rule["id"], line, ", ".join([*why, f"no {unset}"]))


@dataclass(frozen=True, slots=True)
class _Context:
    load_time_s: float
    topology: str | None
    host: bool


def _start_timeout(unit: UnitFile) -> tuple[UnitEntry | None, float | None]:
    """The assignment that sets the start timeout (None: systemd's default) and its seconds."""
    entry = directive(unit, "Service.TimeoutStartSec") or directive(unit, "Service.TimeoutSec")
    return entry, time_span_s(entry.value if entry else _rules()["unset"]["Service.TimeoutStartSec"])


def _start_timeout_short(unit: UnitFile, ctx: _Context) -> list[Finding]:
    entry, start_s = _start_timeout(unit)
    if entry is None or start_s is None or start_s >= ctx.load_time_s:
        return []
    return [_finding("start-timeout-short", entry.line,
                     f"{entry.key}={entry.value} ({start_s:.0f} s) < load {ctx.load_time_s:.0f} s")]


def _start_limit(unit: UnitFile) -> tuple[UnitEntry | None, UnitEntry | None]:
    burst = directive(unit, "Unit.StartLimitBurst") or directive(unit, "Service.StartLimitBurst")
    interval = directive(unit, "Unit.StartLimitIntervalSec") or directive(unit, "Service.StartLimitIntervalSec")
    return burst, interval


def _restart_always_no_limit(unit: UnitFile, ctx: _Context) -> list[Finding]:
    restart = directive(unit, "Service.Restart")
    burst, interval = _start_limit(unit)
    if restart is None or restart.value != "always":
        return []
    if burst is not None and interval is not None and time_span_s(interval.value) != 0:
        return []
    return [_finding("restart-always-no-limit", restart.line, "Restart=always, no start limit")]


def _start_limit_cannot_trip(unit: UnitFile, ctx: _Context) -> list[Finding]:
    restart = directive(unit, "Service.Restart")
    if restart is None or restart.value == "no" or _restart_always_no_limit(unit, ctx):
        return []
    burst_entry, interval_entry = _start_limit(unit)
    burst = int(burst_entry.value) if burst_entry and burst_entry.value.isdigit() else 5
    interval = time_span_s(interval_entry.value) if interval_entry else 10.0
    delay_entry = directive(unit, "Service.RestartSec")
    delay = (time_span_s(delay_entry.value) if delay_entry else 0.1) or 0.0
    start = max(_start_timeout(unit)[1] or 0.0, ctx.load_time_s)
    if interval is None or not 0 < interval < burst * (start + delay):
        return []
    return [_finding("start-limit-cannot-trip", (interval_entry or restart).line,
                     f"interval {interval:.0f} s < {burst} x ({start:.0f} s + {delay:.0f} s)")]


def _loop_cannot_fail(command: ExecCommand) -> bool:
    argv = command.argv
    if "-" in command.prefixes:
        return True
    if len(argv) < 3 or Path(argv[0]).name not in ("bash", "sh") or "-c" not in argv[:-1]:
        return False
    script = argv[argv.index("-c") + 1]
    if not re.search(r"\b(for|while|until)\b", script) or "done" not in script:
        return False
    tail = script.rsplit("done", 1)[1].strip(" ;\n")
    return tail in ("", "exit 0", "true", ":")


def _wait_loop_cannot_fail(unit: UnitFile, ctx: _Context) -> list[Finding]:
    return [_finding("wait-loop-cannot-fail", entry.line, "the loop ends with success after its last try")
            for entry in unit.entries_of("Service", "ExecStartPre")
            if any(_loop_cannot_fail(c) for c in split_command_lines(entry.value, _where(entry)))]


def _inline_secret(unit: UnitFile, ctx: _Context) -> list[Finding]:
    found = []
    start = directive(unit, "Service.ExecStart")
    if start is not None:
        for word in exec_command(start).argv:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and is_secret_name(flag):
                found.append(_finding("inline-secret", start.line, f"ExecStart {flag} ***"))
    found += [_finding("inline-secret", entry.line, f"Environment {key}=***")
              for key, _, entry in environment(unit) if is_secret_name(key)]
    return found


def _no_max_model_len(unit: UnitFile, ctx: _Context) -> list[Finding]:
    start = directive(unit, "Service.ExecStart")
    if start is None:
        return []
    argv = exec_command(start).argv
    found = detect_engine(argv)
    flag = engine(found[0]).context_flag if found is not None else None
    if flag is None:
        return []
    if any(w == flag or w.startswith(flag + "=") for w in argv):
        return []
    return [_finding("no-max-model-len", start.line, f"ExecStart has no {flag}")]


def _kill_mode_leaves_gpu(unit: UnitFile, ctx: _Context) -> list[Finding]:
    kill = directive(unit, "Service.KillMode")
    if kill is None or kill.value not in ("process", "none"):
        return []
    return [_finding("kill-mode-leaves-gpu", kill.line, f"KillMode={kill.value}")]


# the search path systemd uses for a program named without a folder (systemd.exec(5), "Command lines")
_SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _program_problem(program: str) -> str | None:
    """Why systemd could not run ``program`` here, or None (programs built from variables are not judged)."""
    if "$" in program or "%" in program:
        return None
    if "/" not in program:
        return None if shutil.which(program, path=_SYSTEMD_PATH) else f"not found in systemd's PATH ({_SYSTEMD_PATH})"
    path = Path(program)
    if not path.is_absolute():
        return "a relative path (systemd needs an absolute one)"
    if not path.exists():
        return "no such file on this host"
    if not path.is_file() or not os.access(path, os.X_OK):
        return "not an executable file"
    return None


def _missing_executable(unit: UnitFile, ctx: _Context) -> list[Finding]:
    if not ctx.host:
        return []
    found = []
    for name in _rule("missing-executable")["judges"]:
        for entry in unit.entries_of(*name.split(".", 1)):
            for command in split_command_lines(entry.value, _where(entry)):
                problem = _program_problem(command.argv[0])
                if problem is not None:
                    found.append(_finding("missing-executable", entry.line,
                                          f"{entry.key} {command.argv[0]}: {problem}"))
    return found


def _nccl_matches(rule: dict[str, Any], value: str) -> bool:
    if not rule.get("list"):
        return value.upper() in rule["values"]
    return not value.startswith("^") and any(v.strip().upper() in rule["values"] for v in value.split(","))


def _nccl_topology(unit: UnitFile, ctx: _Context) -> list[Finding]:
    if ctx.topology is None:
        return []
    return [_finding("nccl-topology", entry.line, f"{key}={value} on {ctx.topology}: {rule['why']}")
            for key, value, entry in environment(unit) for rule in _rules()["nccl"]
            if rule["var"] == key and rule["when"] == ctx.topology and _nccl_matches(rule, value)]


def _nccl_note(unit: UnitFile, topology: str | None, findings: list[Finding]) -> str | None:
    """One line on the NCCL rules where a topology was given and none fired: what they checked."""
    if topology is None or any(f.rule == "nccl-topology" for f in findings):
        return None
    names = list(dict.fromkeys(key for key, _, _ in environment(unit) if key.startswith("NCCL_")))
    if not names:
        return f"NCCL: the unit sets no NCCL_* variable; no NCCL rule applies on {topology}"
    return f"NCCL: {', '.join(names)} checked against {topology}: none contradicts it"


_CHECKS: dict[str, Callable[[UnitFile, _Context], list[Finding]]] = {
    "missing-executable": _missing_executable,
    "start-timeout-short": _start_timeout_short,
    "wait-loop-cannot-fail": _wait_loop_cannot_fail,
    "inline-secret": _inline_secret,
    "no-max-model-len": _no_max_model_len,
    "restart-always-no-limit": _restart_always_no_limit,
    "start-limit-cannot-trip": _start_limit_cannot_trip,
    "kill-mode-leaves-gpu": _kill_mode_leaves_gpu,
    "nccl-topology": _nccl_topology,
}
"""The rules that need code, by id; a ``missing = true`` rule of the data needs none."""


def lint_unit(unit: UnitFile, *, topology: str | None = None, load_time_s: float | None = None,
              host: bool = True) -> LintResult:
    """Every rule that applies to ``unit``; ``topology`` is "nvlink", "pcie" or None (NCCL rules skipped);
    ``host``: check that every Exec* program exists and is executable on this machine (off for a unit meant
    for another).

    Raises:
        ValueError: a topology other than nvlink/pcie.
        InputError: a value systemd could not parse (``FILE:LINE: ...``).
    """
    if topology not in (None, "nvlink", "pcie"):
        raise ValueError(f"topology={topology!r}: allowed values are nvlink, pcie")
    load = float(defaults()["load_time_s"]) if load_time_s is None else load_time_s
    ctx = _Context(load, topology, host)
    findings: list[Finding] = []
    for rule in _rules()["rule"]:
        held = _holding(rule, unit)
        if held is None:
            continue
        if rule.get("missing"):
            missing = _missing(rule, unit, held)
            findings += [missing] if missing is not None else []
        else:
            findings += _CHECKS[rule["id"]](unit, ctx)
    findings.sort(key=lambda f: (f.line or 0, f.rule))
    note = _nccl_note(unit, topology, findings)
    return LintResult(unit.path, topology, tuple(findings), () if note is None else (note,))


def lint_unit_file(path: Path, *, topology: str | None = None, load_time_s: float | None = None,
                   host: bool = True) -> LintResult:
    """:func:`lint_unit` of the one unit file at ``path`` (its drop-ins not applied); ``topology``: "nvlink",
    "pcie", an ``nvidia-smi topo -m`` file, or None for this machine's GPUs (:func:`gpu.topology.link_kind`).

    Raises:
        InputError: the file cannot be read or parsed, or the topology file is not ``nvidia-smi topo -m`` output.
    """
    from servescope.gpu.topology import link_kind

    unit = parse_unit(read_text(path), str(path))
    return lint_unit(unit, topology=link_kind(topology), load_time_s=load_time_s, host=host)
