"""``servescope tune`` as Python functions: :func:`tune_server` (a fresh run), :func:`resume_tune` (after a crash
of servescope) and :func:`restore_tune` (undo after a crash). The CLI only parses flags into a :class:`TuneSetup`.

Example:
    >>> doc = tune_server(TuneSetup(launch="vllm serve /models/x --max-num-seqs 4", slo="ttft_p99=2000",
    ...                             journal=Path("tune.journal.json")))                     # doctest: +SKIP
    >>> doc.keep.command_line                                                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.core.comm_result import CommResultDoc
from servescope.core.document import decode_as
from servescope.core.errors import InputError
from servescope.core.files import read_bytes
from servescope.core.knee import parse_slo
from servescope.core.tune import TuneDoc
from servescope.tune.edit import ServerConfig
from servescope.tune.journal import read_journal
from servescope.tune.launch import LaunchTarget
from servescope.tune.loop import Profiler, Say, TuneRequest, new_journal, run_tune
from servescope.tune.measure import Measure, knee_measure
from servescope.tune.recover import restore_from_journal, stop_leftover, target_from_journal
from servescope.tune.target import Target
from servescope.tune.unit import UnitTarget

__all__ = ["TuneSetup", "restore_tune", "resume_tune", "tune_server"]

UNIT_DIRS = (Path("/etc/systemd/system"), Path("/run/systemd/system"), Path("/usr/lib/systemd/system"),
             Path("/lib/systemd/system"))
Confirm = Callable[[str], bool]


@dataclass(frozen=True)
class TuneSetup:
    """Every option of ``servescope tune`` (one of ``launch`` / ``unit``)."""

    launch: str | None = None
    unit: str | None = None
    unit_file: Path | None = None
    dropin_dir: Path | None = None
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    slo: str | None = None
    input_tokens: int = 128
    output_tokens: int = 64
    prompt_form: str = "ids"
    budget_s: float | None = None
    max_restarts: int | None = None
    measure_budget_s: float | None = None
    max_load: float | None = None
    max_requests: int | None = None
    repeats: int = 2
    allow: tuple[str, ...] = ()
    catalogue: Path | None = None
    profile: bool = False
    moe_config_dir: Path | None = None
    comm: Path | None = None
    min_noise: float = 0.02
    keep: bool = True
    leave_running: bool = False
    ready_timeout_s: float = 1800.0
    journal: Path = Path("servescope-tune.journal.json")
    log_dir: Path | None = None
    api_key: str | None = field(default=None, repr=False)

    def record(self) -> dict[str, Any]:
        """The setup as JSON values, for the journal (without the API key)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "api_key"}
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in out.items()}

    @classmethod
    def from_record(cls, record: dict[str, Any], api_key: str | None) -> TuneSetup:
        paths = {"unit_file", "dropin_dir", "catalogue", "moe_config_dir", "comm", "journal", "log_dir"}
        values: dict[str, Any] = {k: (Path(v) if k in paths and v is not None else tuple(v) if k == "allow" else v)
                  for k, v in record.items() if k in {f.name for f in dataclasses.fields(cls)}}
        return cls(**values, api_key=api_key)


def _comm_env(path: Path) -> str:
    """``K=V K=V`` of the ``Environment=`` lines a ``bench comm`` document found best."""
    doc = decode_as(read_bytes(path), str(path), CommResultDoc)
    pairs = [line.removeprefix("Environment=").strip('"') for line in doc.environment
             if line.startswith("Environment=")]
    return " ".join(p for p in pairs if "=" in p)


def _inputs(setup: TuneSetup) -> dict[str, str]:
    inputs: dict[str, str] = {}
    if setup.moe_config_dir is not None:
        if not setup.moe_config_dir.is_dir():
            raise InputError("--moe-config-dir", f"{setup.moe_config_dir} is not a folder")
        inputs["moe_config_dir"] = str(setup.moe_config_dir.resolve())
    if setup.comm is not None:
        inputs["comm_env"] = _comm_env(setup.comm)
    return inputs


def _unit_file(setup: TuneSetup) -> Path:
    assert setup.unit is not None
    name = setup.unit if "." in setup.unit else f"{setup.unit}.service"
    if setup.unit_file is not None:
        if not setup.unit_file.is_file():
            raise InputError("--unit-file", f"{setup.unit_file} is not a file")
        return setup.unit_file
    found = next((d / name for d in UNIT_DIRS if (d / name).is_file()), None)
    if found is None:
        raise InputError("--unit", f"no unit file {name} in {', '.join(map(str, UNIT_DIRS))} (give --unit-file)")
    return found


def _api_key(setup: TuneSetup, argv: tuple[str, ...]) -> str | None:
    from servescope.core.changes import flag_values
    from servescope.server.client import resolve_api_key

    if setup.api_key:
        return setup.api_key
    given = flag_values(argv).get("--api-key")
    if given and given[-1]:
        return given[-1]
    key = resolve_api_key(None)
    return key.reveal() if key else None


def _profiler_flags(setup: TuneSetup, argv: tuple[str, ...], log_dir: Path) -> tuple[str, ...]:
    """With --profile, vLLM's profiler flags for a launched server (idle until profiled), unless it has its own.

    Python stacks stay on (vLLM 0.26's default): they carry the deployment evidence (async scheduling's worker
    thread) that a later ``analyze`` of the kept traces reads; without them it would advise what is in place.
    """
    if not setup.profile or any(w.startswith("--profiler-config") for w in argv):
        return ()
    traces = log_dir.resolve() / "traces"
    traces.mkdir(parents=True, exist_ok=True)  # vLLM makes it only at the first /start_profile, which profile waits on
    return ("--profiler-config.profiler=torch", f"--profiler-config.torch_profiler_dir={traces}",
            "--profiler-config.torch_profiler_with_stack=true")


def _target(setup: TuneSetup, confirm: Confirm) -> Target:
    from servescope.server.settings import server_url

    if (setup.launch is None) == (setup.unit is None):
        raise InputError("--launch/--unit", "give exactly one: the command servescope runs, or the systemd unit")
    if setup.leave_running and setup.unit is not None:
        raise InputError("--leave-running", "only with --launch: a unit stays as systemd runs it (--no-keep puts "
                                            "its original back)")
    if setup.launch is not None:
        try:
            argv = tuple(shlex.split(setup.launch))
        except ValueError as exc:
            raise InputError("--launch", f"not a command line ({exc})") from None
        if not argv:
            raise InputError("--launch", "an empty command")
        url = setup.url or server_url(argv)
        log_dir = setup.log_dir or setup.journal.with_name(setup.journal.name + ".logs")
        return LaunchTarget(ServerConfig(argv, dict(setup.env)), url=url, log_dir=log_dir,
                            ready_timeout_s=setup.ready_timeout_s, api_key=_api_key(setup, argv),
                            extra_argv=_profiler_flags(setup, argv, log_dir))
    path = _unit_file(setup)
    probe = UnitTarget(setup.unit or "", unit_path=path, url="", confirm=confirm, ready_timeout_s=0)
    url = setup.url or server_url(probe.original.argv)
    return UnitTarget(setup.unit or "", unit_path=path, url=url, confirm=confirm,
                      ready_timeout_s=setup.ready_timeout_s, api_key=_api_key(setup, probe.original.argv),
                      dropin_dir=setup.dropin_dir)


def _request(setup: TuneSetup, api_key: str | None) -> TuneRequest:
    return TuneRequest(slo=tuple(t.name + f"={t.limit_ms:g}" for t in parse_slo(setup.slo)),
                       input_tokens=setup.input_tokens, output_tokens=setup.output_tokens,
                       prompt_form=setup.prompt_form, budget_s=setup.budget_s,
                       max_restarts=setup.max_restarts, measure_budget_s=setup.measure_budget_s,
                       allow=setup.allow, catalogue=setup.catalogue, profile=setup.profile,
                       min_noise=setup.min_noise, inputs=_inputs(setup), keep=setup.keep,
                       leave_running=setup.leave_running, api_key=api_key)


def _measure(setup: TuneSetup, api_key: str | None) -> Measure:
    return knee_measure(slo=parse_slo(setup.slo), input_tokens=setup.input_tokens, output_tokens=setup.output_tokens,
                        prompt_form=setup.prompt_form, api_key=api_key, budget_s=setup.measure_budget_s,
                        max_requests=setup.max_requests, max_load=setup.max_load, repeats=setup.repeats)


def _profiler(setup: TuneSetup, target: Target, api_key: str | None) -> Profiler | None:
    if not setup.profile:
        return None
    from servescope.tune.evidence import profile_findings

    return lambda load: profile_findings(target.url, load, api_key=api_key, output_tokens=setup.output_tokens)


def tune_server(setup: TuneSetup, *, say: Say | None = None, confirm: Confirm = lambda _: False,
                measure: Measure | None = None) -> TuneDoc:
    """A fresh tune run (see :mod:`servescope.tune.loop`); ``measure`` replaces the knee search (tests).

    Raises:
        InputError: bad options, a journal of an unfinished run in the way (``--resume`` or ``--restore`` it), a
            server that does not start with its original configuration.
    """
    parse_slo(setup.slo)
    catalogue_check = setup.catalogue
    if catalogue_check is not None:
        from servescope.core.changes import load_catalogue

        load_catalogue(catalogue_check)
    if setup.journal.exists():
        state = read_journal(setup.journal).state
        if state in ("running", "interrupted"):
            raise InputError(str(setup.journal), f"a tune run was cut off here (state {state}): "
                                                 "--resume continues it, --restore undoes it")
    target = _target(setup, confirm)
    api_key = getattr(target, "api_key", None)
    journal = new_journal(target, setup.record())
    return run_tune(_request(setup, api_key), target, measure or _measure(setup, api_key), journal_path=setup.journal,
                    journal=journal, say=say, profiler=_profiler(setup, target, api_key))


def resume_tune(journal_path: Path, *, api_key: str | None = None, say: Say | None = None,
                confirm: Confirm = lambda _: False, measure: Measure | None = None) -> TuneDoc:
    """Continue the run the journal records: its leftover server stopped, the kept changes started again and
    measured as the reference, then the candidates it had not tried.

    Raises:
        InputError: no journal, or its run finished (nothing to resume).
    """
    journal = read_journal(journal_path)
    if journal.state not in ("running", "interrupted"):
        raise InputError(str(journal_path), f"the run it records is {journal.state}: nothing to resume")
    setup = TuneSetup.from_record(journal.options, api_key)
    stop_leftover(journal)
    journal.process = None
    key = _api_key(setup, tuple(journal.argv))
    target = target_from_journal(journal, ready_timeout_s=setup.ready_timeout_s, api_key=key, confirm=confirm)
    if isinstance(target, LaunchTarget):
        target.extra_argv = _profiler_flags(setup, tuple(journal.argv), target.log_dir)
    return run_tune(_request(setup, key), target, measure or _measure(setup, key), journal_path=journal_path,
                    journal=journal, say=say, profiler=_profiler(setup, target, key))


def restore_tune(journal_path: Path, *, restart: bool = False) -> list[str]:
    """Undo the run the journal records (see :func:`servescope.tune.recover.restore_from_journal`)."""
    return restore_from_journal(journal_path, restart=restart)
