"""The terminal view of a health result (``servescope health``); it reads only the document."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from servescope.core.health import HealthResult

__all__ = ["render_health"]

_NA = "N/A"
_PHASE_STYLE = {"ready": "bold green", "loading": "yellow", "unreachable": "yellow", "not ready": "yellow",
                "crashed": "bold red", "engine dead": "bold red"}


def render_health(result: HealthResult, console: Console) -> None:
    """A headline (URL, phase, model, elapsed), one row per check, the process, and the log tail."""
    head = Text()
    head.append(f"{result.url}: ")
    head.append(result.phase, style=_PHASE_STYLE.get(result.phase, ""))
    if result.model is not None:
        mml = _NA if result.max_model_len is None else str(result.max_model_len)
        head.append(f"  model {result.model}  max_model_len {mml}")
    verb = "waited" if result.waited else "took"
    head.append(f"  ({verb} {result.elapsed_s:.1f} s{', timed out' if result.timed_out else ''})")
    console.print(head)
    mark_w = max((2 if c.ok else 4 for c in result.checks), default=2)
    name_w = max((len(c.name) for c in result.checks), default=0)
    for check in result.checks:
        line = Text()
        line.append(("ok" if check.ok else "FAIL").ljust(mark_w), style="green" if check.ok else "red")
        line.append(f"  {check.name.ljust(name_w)}  {check.detail}")
        console.print(line)
    if result.process is not None and result.process.detail:
        console.print(Text(f"process: {result.process.detail}"))
    if result.log_tail:
        console.print(Text(f"last {len(result.log_tail)} log lines" +
                           (f" of {result.log_path}:" if result.log_path else ":"), style="bold"))
        for log_line in result.log_tail:
            console.print(Text(f"  {log_line}"), overflow="fold")
