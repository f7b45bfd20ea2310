"""plan: what another parallel layout would cost."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from servescope.cli.apps import JsonDocumentOut, ModelPreset, app
from servescope.cli.common import emit, parse_assignments, user_errors

if TYPE_CHECKING:
    from servescope.core.plan import PlanDoc


@app.command("plan")
def plan(
    model: ModelPreset,
    hardware: Annotated[str, typer.Option("--hardware", help="A hardware profile (h200, …) or a .toml file.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to spread the model over.")],
    batch: Annotated[list[str], typer.Option("--batch", help="Decode batch sizes (running requests), comma-separated "
                                             "and repeatable: `--batch 1,8 --batch 64` is 1, 8 and 64.")]
        = ["1,8,32,128"],  # noqa: B006 (typer's default, never changed)
    context: Annotated[int, typer.Option("--context", help="Tokens in each request's KV cache.")] = 4096,
    comm: Annotated[Path | None, typer.Option("--comm", help="A `bench comm` curve file for this box.")] = None,
    calibrate: Annotated[Path | None, typer.Option("--calibrate", help="An `analyze --json` or `profile --json` "
                                                   "of a real capture (TP run of this model) to fit the step model "
                                                   "to: fixed times, per-request costs, efficiencies, its "
                                                   "collectives' own times a call for every layout of its group "
                                                   "size, and (from `profile`'s unprofiled step) the host's time "
                                                   "without the profiler.")]
        = None,
    eager: Annotated[bool, typer.Option("--eager", help="Use eager collective curves, not CUDA-graph ones.")]
        = False,
    force: Annotated[bool, typer.Option("--force", help="Use a --comm curve or --calibrate capture from another "
                                        "device, backend, work kind, model, quantization or TP instead of refusing it "
                                        "(named in the headline and the notes).")] = False,
    env: Annotated[list[str] | None, typer.Option("--env", help="The serving unit's environment, KEY=VALUE, "
                                                  "repeatable (NCCL_PROTO, NCCL_ALGO, NCCL_P2P_LEVEL, "
                                                  "VLLM_ALLREDUCE_USE_SYMM_MEM, …): the all-reduce path vLLM "
                                                  "takes and the NCCL curve used.")] = None,
    topology: Annotated[Path | None, typer.Option("--topology", help="An `nvidia-smi topo -m` file of this box: "
                                                  "which GPUs share a PCIe switch, for the all-to-all's bounds.")]
        = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan document as JSON.")] = False,
    output: JsonDocumentOut = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write an HTML report with a chart here.")] = None,
) -> None:
    """Predict the decode step per parallel layout (TP, TP+EP, DP-attention+EP, PP, TP×PP) and batch."""
    from servescope.plan.planner import PlanRequest, parse_batches, run_plan
    from servescope.report.plan import plan_to_json, render_plan_html

    with user_errors():
        request = PlanRequest(model=model, hardware=hardware, gpus=gpus, batches=parse_batches(",".join(batch)),
                              context=context, comm=None if comm is None else str(comm),
                              calibrate=None if calibrate is None else str(calibrate), graph=not eager,
                              force=force, env=parse_assignments("--env", env or [], strip=True),
                              topology=None if topology is None else str(topology))
        emit(run_plan(request), _render, as_json=as_json, output=output, html=html_out,
             render_html=render_plan_html, encode=lambda doc: plan_to_json(doc).encode())


def _render(doc: PlanDoc, console: Console) -> None:
    """The plan's headline, then its layouts."""
    from servescope.report.plan import render_plan, render_plan_headline

    render_plan_headline(doc, console)
    render_plan(doc, console)
