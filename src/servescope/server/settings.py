"""``servescope settings``: the effective configuration of a deployed vLLM/SGLang server, from its unit, its
running process, the server's own report and the GPUs, with the drift between them.

:func:`read_settings` is the whole command: it reads each source where its API lives and hands the records to
:func:`~servescope.deploy.effective.effective_settings`, which groups, compares and redacts them:

- the unit: :func:`~servescope.deploy.installed.read_unit_settings`: ``systemctl cat NAME`` where systemd
  runs, else the unit file and its ``NAME.service.d/*.conf`` drop-ins;
- the process: ``server.process.read_process_record`` (``/proc/PID``); which pid comes from ``--pid``, the
  unit's MainPID, or ``server.process.find_processes(is_server_argv)`` narrowed by :func:`pick_process`;
- the server: ``server.reported.read_server_record`` at ``--url`` or :func:`server_url` of the command line;
- the GPUs: ``gpu.inventory.take_snapshot``.

It lives in ``server/``, beside the readers of the running process and server; the unit and the rules that
compare it with them are ``deploy/``'s (``deploy/`` is below ``server/``: trace analysis reads its rules too).

Example:
    >>> doc = read_settings(SettingsRequest(unit="vllm.service"))     # doctest: +SKIP
    >>> [(d.kind, d.key) for d in doc.drift]                         # doctest: +SKIP
    []
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from servescope.core.engines import engine, engine_ids
from servescope.core.errors import InputError
from servescope.core.settings import ProcessRecord, ProcessSeen, SettingsDoc
from servescope.deploy.drift import parse_engine_argv
from servescope.deploy.effective import effective_settings
from servescope.deploy.installed import UnitRecord, read_unit_settings
from servescope.gpu.errors import GpuQueryError, GpuUnavailable
from servescope.gpu.inventory import take_snapshot
from servescope.server.client import ApiKey
from servescope.server.process import find_processes, read_process_record
from servescope.server.reported import read_server_record

__all__ = ["SettingsRequest", "choose_pid", "choose_url", "is_server_argv", "pick_process", "process_api_key",
           "read_settings", "server_url"]


@dataclass(frozen=True, kw_only=True)
class SettingsRequest:
    """Which server ``settings`` reads; each source not given is found.

    Attributes:
        unit, unit_file: the systemd unit by name (``systemctl cat``, else looked up in ``$SYSTEMD_UNIT_PATH`` or
            systemd's unit folders) or a unit file (its ``NAME.service.d/*.conf`` drop-ins applied); one at most.
        pid: the server process; default the unit's MainPID, else the one vLLM/SGLang server process running.
        url: the server; default ``--host``/``--port`` of its command line.
        api_key: sent to the server; default the key the process was started with.
        timeout_s: seconds per server request.
        all_env: the text view shows every environment variable (else those that matter to serving).
    """

    unit: str | None = None
    unit_file: Path | None = None
    pid: int | None = None
    url: str | None = None
    api_key: ApiKey | None = field(default=None, repr=False)
    timeout_s: float = 5.0
    all_env: bool = False


def read_settings(request: SettingsRequest) -> SettingsDoc:
    """The settings document of the server ``request`` names (see the module's docstring).

    Raises:
        InputError: ``unit`` and ``unit_file`` together, a unit that cannot be read, or no unit and no pid and
            not exactly one server process running.
    """
    if request.unit is not None and request.unit_file is not None:
        raise InputError("--unit-file", "give --unit or --unit-file, not both")
    unit = read_unit_settings(name=request.unit, path=request.unit_file) if request.unit or request.unit_file else None
    target, how = choose_pid(pid=request.pid, unit=unit, scan=lambda: find_processes(is_server_argv))
    process = read_process_record(target) if target is not None else None
    address = choose_url(url=request.url, process=process, unit=unit)
    own_key = process_api_key(process)
    key = request.api_key or (ApiKey(own_key, "the server's command line") if own_key else None)
    server = read_server_record(address, api_key=key, timeout_s=request.timeout_s) if address else None
    notes = {"process": how}
    try:
        gpus = take_snapshot().gpus
    except (GpuUnavailable, GpuQueryError) as exc:
        gpus, notes["gpus"] = None, str(exc)
    doc = effective_settings(unit=unit, process=process, server=server, gpus=gpus, notes=notes)
    return msgspec.structs.replace(doc, all_env=request.all_env)


# ------------------------------------------------------------------------------------------ sources

def is_server_argv(argv: Sequence[str]) -> bool:
    """True for a vLLM or SGLang server command line (what ``ps`` shows for ``vllm serve`` and kin)."""
    return parse_engine_argv(argv).engine is not None


def pick_process(candidates: Sequence[ProcessSeen], unit: UnitRecord | None) -> int:
    """The one server among ``candidates``: the top of each process tree, and the one that runs the unit's
    command line when a unit is given.

    Raises:
        InputError: none found, or several that cannot be told apart (pass --pid).
    """
    pids = {c.pid for c in candidates}
    tops = [c for c in candidates if c.ppid not in pids]
    argv = unit.argv() if unit is not None else None
    if argv is not None and len(tops) > 1:
        wanted = parse_engine_argv(argv)
        same = [c for c in tops if parse_engine_argv(c.argv).values() == wanted.values()]
        tops = same or tops
    if not tops:
        raise InputError("--pid", "no vLLM/SGLang server process found; pass --pid PID")
    if len(tops) > 1:
        listed = ", ".join(str(c.pid) for c in tops)
        raise InputError("--pid", f"several vLLM/SGLang server processes ({listed}); pass --pid PID")
    return tops[0].pid


def choose_pid(*, pid: int | None, unit: UnitRecord | None,
               scan: Callable[[], Sequence[ProcessSeen]]) -> tuple[int | None, str]:
    """The server's pid and how it was chosen: ``pid`` as given, else the unit's MainPID, else the one server
    process ``scan`` finds (the second item then says why there is none).

    Raises:
        InputError: no unit and no pid, and the scan finds no server or several.
    """
    if pid is not None:
        return pid, "--pid"
    if unit is not None and unit.main_pid is not None:
        return unit.main_pid, "the unit's MainPID"
    candidates = scan()
    try:
        found = pick_process(candidates, unit)
    except InputError as exc:
        if unit is None:
            raise InputError("settings", f"{exc.problem}, or give --unit/--unit-file") from None
        return None, exc.problem
    argv = unit.argv() if unit is not None else None
    chosen = next(c for c in candidates if c.pid == found)
    if argv is not None and parse_engine_argv(argv).values() != parse_engine_argv(chosen.argv).values():
        return found, "found in /proc: the only vLLM/SGLang server; it does not run the unit's command line"
    return found, "found in /proc" + (": it runs the unit's command line" if argv is not None else "")


def choose_url(*, url: str | None, process: ProcessRecord | None, unit: UnitRecord | None) -> str | None:
    """``url`` as given, else where the running (or else the unit's) command line listens."""
    if url is not None:
        return url
    argv = process.argv if process is not None else unit.argv() if unit is not None else None
    return server_url(argv) if argv else None


def process_api_key(process: ProcessRecord | None) -> str | None:
    """The API key the server was started with (``--api-key`` or ``$VLLM_API_KEY``), to ask it with."""
    if process is None:
        return None
    given = parse_engine_argv(process.argv).get("--api-key")
    return given[1].split()[0] if given and given[1] else process.env.get("VLLM_API_KEY") or None


def server_url(argv: Sequence[str]) -> str:
    """Where a server with this command line listens: ``--host``/``--port``, else the engine's default port
    (``default_port`` in ``data/engines.toml``: vLLM 8000, SGLang 30000) on 127.0.0.1 (a server bound to all
    addresses answers there too)."""
    args = parse_engine_argv(argv)
    host = args.get("--host")
    port = args.get("--port")
    address = host[1] if host and host[1] not in ("", "0.0.0.0", "::") else "127.0.0.1"
    # the engine's default port (data/engines.toml); a program no entry names: the first engine's
    default = engine(args.engine or engine_ids()[0]).default_port
    address = f"[{address}]" if ":" in address else address
    return f"http://{address}:{port[1] if port and port[1] else default}"
