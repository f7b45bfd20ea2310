"""Lint a systemd unit for the ways a GPU model server goes wrong; rules live in ``data/deploy/lint_rules.toml``.

Each finding names the line it was found on and what to do. The NCCL rules need the GPU topology:
``--topology nvlink|pcie``, an ``nvidia-smi topo -m`` file, or none (those rules are then skipped).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from servescope.core.errors import InputError
from servescope.deploy.spec import defaults, is_secret_name

__all__ = ["Entry", "Finding", "LintResult", "UnitText", "lint_unit", "parse_unit", "split_command", "time_span_s"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``Key=value`` of a unit, with its section and 1-based line (continuations joined)."""

    section: str
    key: str
    value: str
    line: int


@dataclass(frozen=True, slots=True)
class UnitText:
    """A parsed unit: its source and entries in file order."""

    source: str
    entries: tuple[Entry, ...]

    def get_all(self, section: str, key: str) -> list[Entry]:
        return [e for e in self.entries if e.section == section and e.key == key]

    def get(self, section: str, key: str) -> Entry | None:
        found = self.get_all(section, key)
        return found[-1] if found else None


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
    """All findings of one unit, in line order; ``topology`` is what the NCCL rules checked against (or None)."""

    source: str
    topology: str | None
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")


def parse_unit(text: str, source: str) -> UnitText:
    """The entries of unit ``text`` (comments dropped, ``\\`` continuations joined).

    Raises:
        InputError: a line outside a section or without ``=`` (names the line).
    """
    entries: list[Entry] = []
    section: str | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        line = lines[i].strip()
        i += 1
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        if section is None or "=" not in line:
            why = "no [Section] above" if section is None else "no ="
            raise InputError(f"{source}:{start + 1}", f"not a unit line ({why}): {line[:60]!r}")
        key, _, value = line.partition("=")
        entries.append(Entry(section, key.strip(), value.strip(), start + 1))
    if not entries:
        raise InputError(source, "no unit entries (empty or not a systemd unit)")
    return UnitText(source, tuple(entries))


def split_command(value: str) -> tuple[str, list[str]]:
    """(prefixes, argv) of an Exec*= value: ``-@:+!`` prefixes, words split as systemd does, ``$$`` as ``$``."""
    prefixes = re.match(r"[-@:+!|]*", value)
    head = prefixes.group(0) if prefixes else ""
    words = shlex.split(value[len(head):], posix=True)
    return head, [w.replace("$$", "$") for w in words]


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


def _finding(rule_id: str, line: int | None, detail: str) -> Finding:
    rule = next(r for r in _rules()["rule"] if r["id"] == rule_id)
    return Finding(rule_id, rule["severity"], rule["message"], rule["fix"], line, detail)


def _environment(unit: UnitText) -> list[tuple[str, str, int]]:
    found = []
    for entry in unit.get_all("Service", "Environment"):
        for word in shlex.split(entry.value):
            key, _, value = word.partition("=")
            found.append((key, value, entry.line))
    return found


def _loop_cannot_fail(argv: list[str], prefixes: str) -> bool:
    if "-" in prefixes:
        return True
    if len(argv) < 3 or Path(argv[0]).name not in ("bash", "sh") or "-c" not in argv:
        return False
    script = argv[argv.index("-c") + 1]
    if not re.search(r"\b(for|while|until)\b", script) or "done" not in script:
        return False
    tail = script.rsplit("done", 1)[1].strip(" ;\n")
    return tail in ("", "exit 0", "true", ":")


def _check_timeouts(unit: UnitText, load_time_s: float) -> list[Finding]:
    found = []
    timeout = unit.get("Service", "TimeoutStartSec") or unit.get("Service", "TimeoutSec")
    if timeout is None:
        first = unit.get("Service", "ExecStart")
        found.append(_finding("no-start-timeout", first.line if first else None, "default 90 s"))
        start_s: float | None = 90.0
    else:
        start_s = time_span_s(timeout.value)
        if start_s is not None and start_s < load_time_s:
            found.append(_finding("start-timeout-short", timeout.line,
                                  f"TimeoutStartSec={timeout.value} ({start_s:.0f} s) < load {load_time_s:.0f} s"))
    restart = unit.get("Service", "Restart")
    burst_entry = unit.get("Unit", "StartLimitBurst") or unit.get("Service", "StartLimitBurst")
    interval_entry = unit.get("Unit", "StartLimitIntervalSec") or unit.get("Service", "StartLimitIntervalSec")
    if restart is not None and restart.value == "always" and (burst_entry is None or interval_entry is None
                                                               or time_span_s(interval_entry.value) == 0):
        found.append(_finding("restart-always-no-limit", restart.line, "Restart=always, no start limit"))
    elif restart is not None and restart.value not in ("no", ""):
        burst = int(burst_entry.value) if burst_entry and burst_entry.value.isdigit() else 5
        interval = time_span_s(interval_entry.value) if interval_entry else 10.0
        delay_entry = unit.get("Service", "RestartSec")
        delay = (time_span_s(delay_entry.value) if delay_entry else 0.1) or 0.0
        start = max(start_s or 0.0, load_time_s)
        if interval is not None and 0 < interval < burst * (start + delay):
            found.append(_finding("start-limit-cannot-trip", (interval_entry or restart).line,
                                  f"interval {interval:.0f} s < {burst} x ({start:.0f} s + {delay:.0f} s)"))
    return found


def _check_commands(unit: UnitText) -> list[Finding]:
    found = []
    for entry in unit.get_all("Service", "ExecStartPre"):
        prefixes, argv = split_command(entry.value)
        if _loop_cannot_fail(argv, prefixes):
            found.append(_finding("wait-loop-cannot-fail", entry.line, "the loop ends with success after its last try"))
    start = unit.get("Service", "ExecStart")
    if start is not None:
        _, argv = split_command(start.value)
        joined = " ".join(argv)
        for word in argv:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and is_secret_name(flag):
                found.append(_finding("inline-secret", start.line, f"ExecStart {flag} ***"))
        engine = "sglang" if "sglang" in joined else "vllm" if "vllm" in joined else None
        if engine is not None:
            flag = defaults()["engines"][engine]["context_flag"]
            if not any(w == flag or w.startswith(flag + "=") for w in argv):
                found.append(_finding("no-max-model-len", start.line, f"ExecStart has no {flag}"))
    for key, _, line in _environment(unit):
        if is_secret_name(key):
            found.append(_finding("inline-secret", line, f"Environment {key}=***"))
    kill = unit.get("Service", "KillMode")
    if kill is not None and kill.value in ("process", "none"):
        found.append(_finding("kill-mode-leaves-gpu", kill.line, f"KillMode={kill.value}"))
    kind = unit.get("Service", "Type")
    if (kind is None or kind.value == "simple") and not unit.get_all("Service", "ExecStartPost"):
        found.append(_finding("no-readiness", kind.line if kind else None, "Type=simple, no ExecStartPost"))
    return found


_EXEC_KEYS = ("ExecCondition", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost")
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


def _check_programs(unit: UnitText) -> list[Finding]:
    found = []
    for entry in unit.entries:
        if entry.section != "Service" or entry.key not in _EXEC_KEYS or not entry.value:
            continue
        try:
            _, argv = split_command(entry.value)
        except ValueError:
            continue
        problem = _program_problem(argv[0]) if argv else None
        if problem is not None:
            found.append(_finding("missing-executable", entry.line, f"{entry.key} {argv[0]}: {problem}"))
    return found


def _check_nccl(unit: UnitText, topology: str) -> list[Finding]:
    found = []
    for key, value, line in _environment(unit):
        for rule in _rules()["nccl"]:
            if rule["var"] == key and value.upper() in rule["values"] and rule["when"] == topology:
                found.append(_finding("nccl-topology", line, f"{key}={value} on {topology}: {rule['why']}"))
    return found


def lint_unit(unit: UnitText, *, topology: str | None = None, load_time_s: float | None = None,
              host: bool = True) -> LintResult:
    """Every rule over ``unit``; ``topology`` is "nvlink", "pcie" or None (NCCL rules skipped); ``host``: check
    that every Exec* program exists and is executable on this machine (off for a unit meant for another).

    Raises:
        ValueError: a topology other than nvlink/pcie.
    """
    if topology not in (None, "nvlink", "pcie"):
        raise ValueError(f"topology={topology!r}: allowed values are nvlink, pcie")
    load = float(defaults()["load_time_s"]) if load_time_s is None else load_time_s
    findings = _check_timeouts(unit, load) + _check_commands(unit)
    if host:
        findings += _check_programs(unit)
    if topology is not None:
        findings += _check_nccl(unit, topology)
    findings.sort(key=lambda f: (f.line or 0, f.rule))
    return LintResult(unit.source, topology, tuple(findings))
