"""gpu list / topo / holders / wait-free: the GPUs of this machine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from servescope.cli.apps import gpu_app
from servescope.cli.common import emit, fail, user_errors

T = TypeVar("T")
Prefer = Annotated[str, typer.Option("--prefer", help="nvml or nvidia-smi (the other is the fallback).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a table.")]


def _show(query: Callable[..., T], render: Callable[[T, Console], None], *, prefer: str, as_json: bool,
          output: Path | None = None) -> None:
    """Run one GPU query (a failure is one line, exit 2), write its JSON to ``output`` when given, then print
    it as JSON or a table."""
    from servescope.gpu.errors import GpuQueryError, GpuUnavailable
    from servescope.report.gpu import encode_dataclass

    try:
        record: Any = query(prefer=prefer)
    except (GpuUnavailable, GpuQueryError, ValueError) as exc:
        fail(str(exc))
    with user_errors():
        emit(record, render, as_json=as_json, output=output, encode=encode_dataclass)


@gpu_app.command("list")
def gpu_list(
    prefer: Prefer = "nvml",
    as_json: AsJson = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the snapshot (JSON) here.")] = None,
) -> None:
    """GPUs, their memory, PCIe link and the processes holding memory (NVML, else nvidia-smi)."""
    from servescope.gpu.inventory import take_snapshot
    from servescope.report.gpu import render_snapshot

    _show(take_snapshot, render_snapshot, prefer=prefer, as_json=as_json, output=output)


@gpu_app.command("topo")
def gpu_topo(prefer: Prefer = "nvml", as_json: AsJson = False) -> None:
    """Per GPU pair NVLink or the PCIe path and P2P; each GPU's PCIe link and CPU/NUMA affinity; a verdict."""
    from servescope.gpu.topology import read_topology
    from servescope.report.gpu import render_topology

    _show(read_topology, render_topology, prefer=prefer, as_json=as_json)


@gpu_app.command("holders")
def gpu_holders(prefer: Prefer = "nvml", as_json: AsJson = False) -> None:
    """Processes holding GPU memory, per GPU: pid, user, MiB, command line (secrets redacted), and the total."""
    from servescope.gpu.holders import read_gpu_holders
    from servescope.report.gpu import render_holders

    _show(read_gpu_holders, render_holders, prefer=prefer, as_json=as_json)


@gpu_app.command("wait-free")
def gpu_wait_free(
    max_used_mib: Annotated[int, typer.Option("--max-used-mib", min=0, help="Free means every GPU uses less.")],
    timeout: Annotated[float, typer.Option("--timeout", min=0.0, help="Seconds before giving up (exit 1).")],
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="Seconds between checks.")] = 2.0,
) -> None:
    """Wait until GPU memory is free (for ExecStartPre); exit 1 naming who still holds it at the timeout."""
    from servescope.gpu.errors import GpuUnavailable
    from servescope.gpu.inventory import wait_until_gpu_memory_free

    try:
        result = wait_until_gpu_memory_free(max_used_mib, timeout, poll)
    except GpuUnavailable as exc:
        fail(str(exc))
    typer.echo(result.describe())
    if not result.ready:
        raise typer.Exit(1)
