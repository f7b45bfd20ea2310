"""tune: the loop closed on a live server (launch command or systemd unit); --resume / --restore after a crash."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from servescope.cli.apps import ApiKeyOption, JsonFlag, PromptsOption, app, checked_url
from servescope.cli.common import emit, err, fail, parse_assignments, parse_duration, user_errors
from servescope.core.errors import InputError

__all__ = ["tune"]


class _Screen:
    """Progress on stderr: a line per step, a load's progress on one status line that the next replaces."""

    def __init__(self, quiet: bool) -> None:
        self.status = None if quiet or not err.is_terminal else err.status("")
        self.quiet = quiet
        if self.status is not None:
            self.status.start()

    def __call__(self, text: str, transient: bool) -> None:
        if self.quiet:
            return
        if transient:
            if self.status is not None:
                self.status.update(text)
            return
        err.print(f"tune: {text}", markup=False, highlight=False)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def _confirm(yes: bool, unit: bool) -> Callable[[str], bool]:
    if yes or not unit:
        return lambda text: True
    if not sys.stdin.isatty():
        raise InputError("--yes", "restarting a unit needs --yes, or a terminal to confirm each restart at")

    def ask(text: str) -> bool:
        err.print(text, markup=False, highlight=False)
        return typer.confirm("restart?", default=False, err=True)

    return ask


@app.command("tune")
def tune(
    launch: Annotated[str | None, typer.Option("--launch", help="The server's command line; servescope starts and "
                                               "stops it (containers, no systemd).")] = None,
    unit: Annotated[str | None, typer.Option("--unit", help="A systemd unit; each trial is one drop-in under "
                                             "NAME.service.d/, restarted by `service restart`'s safe path.")] = None,
    unit_file: Annotated[Path | None, typer.Option("--unit-file", help="The unit's file (default: found in "
                                                   "/etc, /run, /usr/lib systemd folders).")] = None,
    dropin_dir: Annotated[Path | None, typer.Option("--dropin-dir", help="Where the drop-in goes (default: "
                                                    "NAME.service.d beside the unit file).")] = None,
    url: Annotated[str | None, typer.Option("--url", help="The server (default: from its --host/--port).",
                                                  callback=checked_url)] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="NAME=VALUE for a launched server (repeat).")]
    = None,
    slo: Annotated[str | None, typer.Option("--slo", help="Latency targets, e.g. ttft_p99=2000,itl_p99=50 (as "
                                            "bench serve).")] = None,
    input_tokens: Annotated[int, typer.Option("--input-tokens", min=1, help="Prompt tokens a request.")] = 128,
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=1, help="Output tokens a request.")] = 64,
    prompts: PromptsOption = "ids",
    budget: Annotated[str | None, typer.Option("--budget", help="Stop trying changes after this long (2h, "
                                               "90m).")] = None,
    max_restarts: Annotated[int | None, typer.Option("--max-restarts", min=0, help="Stop after this many "
                                                     "restarts (rollbacks count; a launched server's first start "
                                                     "does not).")] = None,
    measure_budget: Annotated[str | None, typer.Option("--measure-budget", help="Each knee search's budget "
                                                       "(10m).")] = None,
    max_load: Annotated[float | None, typer.Option("--max-load", min=1.0, help="The most streams a search "
                                                   "tries.")] = None,
    max_requests: Annotated[int | None, typer.Option("--max-requests", min=1, help="Each search's request "
                                                     "budget.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Measurements of each knee's load.")] = 2,
    allow: Annotated[list[str] | None, typer.Option("--allow", help="Allow a change that alters the model's "
                                                    "outputs, by name (kv-fp8, weight-fp8).")] = None,
    catalogue: Annotated[Path | None, typer.Option("--catalogue", help="A TOML of [changes.ID] entries added to "
                                                   "the bundled catalogue.")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="Profile at each knee's load (a launched server gets "
                                          "vLLM's profiler flags; a unit needs its own).")] = False,
    moe_config_dir: Annotated[Path | None, typer.Option("--moe-config-dir", help="A folder of tuned fused-MoE "
                                                        "configs (VLLM_TUNED_CONFIG_FOLDER).")] = None,
    comm: Annotated[Path | None, typer.Option("--comm", help="A `bench comm --json` result: its best settings "
                                              "are a candidate.")] = None,
    min_noise: Annotated[float, typer.Option("--min-noise", min=0.0, help="The least noise assumed (a "
                                             "fraction).")] = 0.02,
    no_keep: Annotated[bool, typer.Option("--no-keep", help="A unit goes back to its original configuration at "
                                          "the end, even with changes kept.")] = False,
    leave_running: Annotated[bool, typer.Option("--leave-running", help="A launched server stays up at the end, on "
                                                "the settings kept (its process in the answer).")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Restart the unit without asking each time.")] = False,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", min=1.0, help="Seconds a start may take.")]
    = 1800.0,
    journal: Annotated[Path, typer.Option("--journal", show_default=False, help="The journal (resume / restore "
                                          "read it); default servescope-tune.journal.json here.")]
    = Path("servescope-tune.journal.json"),
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run the journal records.")] = False,
    restore: Annotated[bool, typer.Option("--restore", help="Undo the run the journal records (a unit: with "
                                          "--yes also restarted on its original configuration).")] = False,
    api_key: ApiKeyOption = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the JSON document here.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Close the loop on a live server: measure the knee at --slo twice (its noise), then try the change the
    evidence calls for with the most predicted gain, restart, measure, keep it only if the knee moves beyond the
    noise, else roll back; until no candidate is left, --budget or --max-restarts.

    The original configuration comes back byte for byte on a rollback, a failed start, ctrl-c and SIGTERM; after a
    crash of servescope, --restore undoes and --resume continues. Exit 0 done (kept or not), 1 a restart not
    confirmed, 2 bad input or a server that does not start as it is, 130 interrupted (restored).
    """
    from servescope.report.tune import render_tune, render_tune_html
    from servescope.tune.api import TuneSetup, restore_tune, resume_tune, tune_server

    with user_errors():
        if restore:
            for line in restore_tune(journal, restart=yes):
                typer.echo(line)
            return
        if not resume and (launch is None) == (unit is None):
            raise InputError("--launch/--unit", "give exactly one: the command servescope runs, or the systemd unit")
        confirm = _confirm(yes, unit is not None or resume)
        screen = _Screen(quiet or as_json)
        try:
            if resume:
                doc = resume_tune(journal, api_key=api_key, say=screen, confirm=confirm)
            else:
                setup = TuneSetup(
                    launch=launch, unit=unit, unit_file=unit_file, dropin_dir=dropin_dir, url=url,
                    env=parse_assignments("--env", env or []),
                    slo=slo, input_tokens=input_tokens, output_tokens=output_tokens, prompt_form=prompts,
                    budget_s=parse_duration("--budget", budget), max_restarts=max_restarts,
                    measure_budget_s=parse_duration("--measure-budget", measure_budget), max_load=max_load,
                    max_requests=max_requests, repeats=repeats, allow=tuple(allow or ()), catalogue=catalogue,
                    profile=profile, moe_config_dir=moe_config_dir, comm=comm, min_noise=min_noise, keep=not no_keep,
                    leave_running=leave_running,
                    ready_timeout_s=ready_timeout, journal=journal, api_key=api_key)
                doc = tune_server(setup, say=screen, confirm=confirm)
        finally:
            screen.stop()
        emit(doc, render_tune, as_json=as_json, output=output, html=html, render_html=render_tune_html,
             blank_line=True)
    if doc.stopped == "interrupted":
        raise typer.Exit(130)
    if doc.stopped == "not confirmed":
        fail("a restart was not confirmed; nothing restarted", 1)
