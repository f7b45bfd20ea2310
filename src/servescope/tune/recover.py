"""After servescope itself stopped mid-run (killed, a crash): ``tune --restore`` undoes what the journal says is
half-done, ``tune --resume`` rebuilds the target and continues.

Undo means: the server process tune started, if it still runs (its pid and start time match), stopped with its
whole session; the unit's drop-in put back as it was (bytes and mode, or no file) and systemd reloaded; and,
when asked (``restart``), the unit restarted on its original configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from servescope.deploy.lifecycle import restart_service
from servescope.deploy.systemctl import SystemctlError, run_systemctl
from servescope.tune.edit import ServerConfig
from servescope.tune.journal import Journal, read_journal, write_journal
from servescope.tune.launch import LaunchTarget, stop_session
from servescope.tune.target import Target
from servescope.tune.unit import UnitTarget, gpu_wait, restore_file

__all__ = ["restore_from_journal", "stop_leftover", "target_from_journal"]


def stop_leftover(journal: Journal) -> str | None:
    """Stop the server process the journal names, if it still runs; a sentence on what was done."""
    process = journal.process
    if process is None:
        return None
    if stop_session(process.pid, start_ticks=process.start_ticks):
        return f"stopped the server tune had started (pid {process.pid}) and its session"
    return f"the server tune had started (pid {process.pid}) was no longer running"


def restore_from_journal(path: Path, *, restart: bool = False) -> list[str]:
    """Undo the run the journal at ``path`` records (see the module); what was done, one sentence each.

    Raises:
        InputError: the journal cannot be read.
        SystemctlError: with ``restart``, the unit could not be restarted (its files are back first).
    """
    journal = read_journal(path)
    done: list[str] = []
    if journal.state == "restored":
        return ["the journal says the original configuration is already in place"]
    if (note := stop_leftover(journal)) is not None:
        done.append(note)
    if journal.kind == "unit" and journal.dropin:
        dropin = Path(journal.dropin)
        restore_file(dropin, journal.before())
        done.append(f"{dropin} put back as it was" if journal.before() is not None else f"{dropin} removed")
        try:
            run_systemctl(["daemon-reload"])
            done.append("systemd reloaded")
            if restart and journal.unit:  # service restart's safe path: stop, wait for free GPU memory, start
                result = restart_service(journal.unit, max_used_mib=1000, gpu_timeout_s=600.0, gpu_wait=gpu_wait)
                done.append(f"{journal.unit} restarted on its original configuration" if result.started
                            else f"{journal.unit} not started: {result.detail}")
        except SystemctlError as exc:
            done.append(f"systemd not reloaded ({exc}): run `systemctl daemon-reload` and restart the unit")
    elif journal.kind == "launch":
        done.append("the launch command was never written anywhere: nothing else to undo")
    journal.state = "restored"
    journal.process = None
    journal.trying = None
    write_journal(path, journal)
    return done


def target_from_journal(journal: Journal, *, ready_timeout_s: float, api_key: str | None,
                        confirm: Callable[[str], bool]) -> Target:
    """The target of a journal's run, as it was before tune changed anything (for ``--resume``)."""
    original = ServerConfig(tuple(journal.argv), dict(journal.env))
    if journal.kind == "unit":
        assert journal.unit and journal.unit_path and journal.dropin
        target = UnitTarget(journal.unit, unit_path=Path(journal.unit_path), url=journal.url, confirm=confirm,
                            ready_timeout_s=ready_timeout_s, api_key=api_key,
                            dropin_dir=Path(journal.dropin).parent)
        target.before = journal.before()  # the file now may hold a trial: the journal knows what was there
        target.original = original
        return target
    log_dir = Path(journal.log_dir) if journal.log_dir else Path(".")
    return LaunchTarget(original, url=journal.url, log_dir=log_dir, ready_timeout_s=ready_timeout_s,
                        api_key=api_key)
