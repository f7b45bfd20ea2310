"""The unit as installed, read for ``servescope settings``: through ``systemctl cat NAME`` where systemd runs,
else from the unit folders (``$SYSTEMD_UNIT_PATH`` or systemd's own) with ``NAME.service.d/*.conf`` drop-ins;
plus the environment it sets (Environment=, readable EnvironmentFile=) and each file's modification time.

Shell twins: ``systemctl cat NAME``, ``systemctl show NAME -p MainPID,NeedDaemonReload``, ``stat -c %Y FILE``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from servescope.core.errors import InputError
from servescope.deploy.drift import substitute_env
from servescope.deploy.systemctl import SystemctlError, run_systemctl, show_unit
from servescope.deploy.unitfile import UnitFile, load_unit, parse_environment, parse_systemctl_cat, split_command_line

__all__ = ["SYSTEM_UNIT_DIRS", "UnitRecord", "read_unit_settings"]

#: Where systemd's system manager looks for units, highest priority first (systemd.unit(5), abridged).
SYSTEM_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                    "/usr/lib/systemd/system", "/lib/systemd/system")
# What systemd itself says: state, and the effective values of keys the unit may leave at their defaults.
_SHOW_PROPERTIES = ("MainPID", "ActiveState", "SubState", "NRestarts", "ExecMainStartTimestamp",
                    "NeedDaemonReload", "FragmentPath", "DropInPaths", "Type", "User", "Restart", "RestartUSec",
                    "TimeoutStartUSec", "TimeoutStopUSec", "KillMode")


@dataclass(frozen=True, slots=True)
class UnitRecord:
    """A unit as read for settings.

    Attributes:
        unit: the unit and its drop-ins, merged.
        read_by: ``systemctl cat`` or ``file``.
        name: the unit name (``vllm.service``); None for ``--unit-file`` ... without a systemd name.
        systemd: ``systemctl show`` properties (MainPID, ActiveState, NeedDaemonReload); empty without systemd.
        mtimes: each file read (unit, drop-ins, EnvironmentFiles) → modification time, epoch seconds.
        env: Environment= and readable EnvironmentFile= variables, in the order systemd applies them.
        env_origin: variable → the ``FILE:LINE`` or EnvironmentFile that set it.
        unread_env_files: EnvironmentFiles that could not be read, with why.
    """

    unit: UnitFile
    read_by: str
    name: str | None
    systemd: dict[str, str] = field(default_factory=dict)
    mtimes: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    env_origin: dict[str, str] = field(default_factory=dict)
    unread_env_files: tuple[str, ...] = ()

    @property
    def main_pid(self) -> int | None:
        value = self.systemd.get("MainPID", "")
        return int(value) if value.isdigit() and int(value) > 0 else None

    def argv(self) -> list[str] | None:
        """ExecStart= as argv with ``${VAR}`` filled from the unit's environment; None without ExecStart."""
        start = self.unit.last_entry("Service", "ExecStart")
        if start is None or not start.value:
            return None
        return substitute_env(split_command_line(start.value, f"{start.source}:{start.line}").argv, self.env)


def _unit_name(name: str) -> str:
    return name if "." in name.rsplit("/", 1)[-1] else f"{name}.service"


def _read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of an EnvironmentFile (``#``/``;`` comments, optional quotes), as systemd reads."""
    env: dict[str, str] = {}
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        line = line.removeprefix("export ").strip()
        name, sep, value = line.partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            env[name.strip()] = value
    return env


def _with_environment(unit: UnitFile, read_by: str, name: str | None, systemd: dict[str, str]) -> UnitRecord:
    env: dict[str, str] = {}
    origin: dict[str, str] = {}
    unread: list[str] = []
    mtimes: dict[str, float] = {}
    for path in unit.sources:
        try:
            mtimes[path] = os.stat(path).st_mtime
        except OSError:
            pass
    for entry in unit.entries:
        if entry.section != "Service":
            continue
        if entry.key == "Environment":
            for key, value in parse_environment([entry.value], f"{entry.source}:{entry.line}").items():
                env[key], origin[key] = value, f"{entry.source}:{entry.line}"
            if entry.value == "":
                env.clear()
                origin.clear()
        elif entry.key == "EnvironmentFile" and entry.value:
            path = entry.value.removeprefix("-")
            try:
                loaded = _read_env_file(path)
                mtimes[path] = os.stat(path).st_mtime
            except FileNotFoundError:
                if not entry.value.startswith("-"):
                    unread.append(f"{path}: no such file")
                continue
            except (OSError, UnicodeDecodeError) as exc:
                unread.append(f"{path}: {getattr(exc, 'strerror', None) or exc}")
                continue
            for key, value in loaded.items():
                env[key], origin[key] = value, path
    return UnitRecord(unit, read_by, name, systemd, mtimes, env, origin, tuple(unread))


def _search_path() -> list[Path]:
    """``$SYSTEMD_UNIT_PATH`` (colon-separated; a trailing ``:`` appends the defaults), else the defaults."""
    value = os.environ.get("SYSTEMD_UNIT_PATH")
    if not value:
        return [Path(d) for d in SYSTEM_UNIT_DIRS]
    dirs = [Path(d) for d in value.split(":") if d]
    return dirs + [Path(d) for d in SYSTEM_UNIT_DIRS] if value.endswith(":") else dirs


def read_unit_settings(*, name: str | None = None, path: Path | None = None) -> UnitRecord:
    """The unit named ``name`` (``systemctl cat NAME`` where systemd runs, else found in the unit folders)
    or the unit file at ``path``, with its drop-ins and environment.

    Raises:
        InputError: no such unit or file, or a malformed one.
    """
    if path is not None:
        unit = load_unit(path)
        return _with_environment(unit, "file", None, {})
    if name is None:
        raise ValueError("read_unit_settings: give name or path")
    full = _unit_name(name)
    why = ""
    try:
        unit = parse_systemctl_cat(run_systemctl(["cat", "--no-pager", full], timeout_s=10),
                                   f"systemctl cat {full}")
        try:
            shown = show_unit(full, _SHOW_PROPERTIES)
        except SystemctlError:
            shown = {}
        return _with_environment(unit, "systemctl cat", full, shown)
    except SystemctlError as exc:
        why = str(exc)
    dirs = _search_path()
    for directory in dirs:
        candidate = directory / full
        if candidate.is_file():
            unit = load_unit(candidate, dropin_dirs=[d / f"{full}.d" for d in dirs])
            return _with_environment(unit, "file", full, {})
    raise InputError(f"--unit {name}", f"no such unit: not in {':'.join(map(str, dirs))}"
                     + (f" ({why})" if why else ""))
