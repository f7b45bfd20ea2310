"""capture decode: GPU decode captures of a random-weight model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from servescope.bench import capture_decode as tool  # stdlib only at import: torch is imported by run()
from servescope.cli.apps import capture_app
from servescope.cli.common import user_errors


def _size(key: str) -> Any:
    """``--layers``, ``--hidden``, …: a model size; unset keeps each model's default (named in the help)."""
    return typer.Option(f"--{key.replace('_', '-')}", min=1, help=tool.size_help(key), show_default=False)


@capture_app.command("decode")
def capture_decode(
    out: Annotated[Path, typer.Option("--out", help=tool.HELP["out"])],
    model: Annotated[Literal["dense", "moe"], typer.Option("--model", help=tool.HELP["model"])] = "dense",
    batch: Annotated[int, typer.Option("--batch", help=tool.HELP["batch"])] = 1,
    input_tokens: Annotated[int, typer.Option("--input-tokens", help=tool.HELP["input_tokens"])] = 128,
    decode_steps: Annotated[int, typer.Option("--decode-steps", help=tool.HELP["decode_steps"])] = 16,
    device: Annotated[str | None, typer.Option("--device", help=tool.HELP["device"])] = None,
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs", help=tool.HELP["cuda_graphs"])] = False,
    warmup: Annotated[int, typer.Option("--warmup", help=tool.HELP["warmup"])] = 2,
    all_: Annotated[bool, typer.Option("--all", help=tool.HELP["all"])] = False,
    experts_impl: Annotated[Literal["grouped_mm", "batched_mm", "eager"],
                            typer.Option("--experts-impl", help=tool.HELP["experts_impl"])] = "grouped_mm",
    seed: Annotated[int, typer.Option("--seed", help=tool.HELP["seed"])] = 0,
    layers: Annotated[int | None, _size("layers")] = None,
    hidden: Annotated[int | None, _size("hidden")] = None,
    intermediate: Annotated[int | None, _size("intermediate")] = None,
    heads: Annotated[int | None, _size("heads")] = None,
    kv_heads: Annotated[int | None, _size("kv_heads")] = None,
    vocab: Annotated[int | None, _size("vocab")] = None,
    experts: Annotated[int | None, _size("experts")] = None,
    top_k: Annotated[int | None, _size("top_k")] = None,
    moe_intermediate: Annotated[int | None, _size("moe_intermediate")] = None,
) -> None:
    """Prefill + decode steps of a random-weight dense or MoE model under torch.profiler, annotated as vLLM does.

    Each capture writes `{model}_b{B}[_graphs]_rank0.pt.trace.json.gz` and a truth file beside it: the live
    profiler's own totals of device events by name (CPU ops by self time on a CPU-only run) and the median
    decode step of a separate unprofiled round. Needs torch and transformers (servescope[capture]).
    """
    from servescope.core.errors import InputError, require_extra

    sizes = {"layers": layers, "hidden": hidden, "intermediate": intermediate, "heads": heads, "kv_heads": kv_heads,
             "vocab": vocab, "experts": experts, "top_k": top_k, "moe_intermediate": moe_intermediate}
    request = tool.Request(out=out, model=model, batch=batch, input_tokens=input_tokens, decode_steps=decode_steps,
                           device=device, cuda_graphs=cuda_graphs, warmup=warmup, all=all_,
                           experts_impl=experts_impl, seed=seed, sizes=sizes)
    with user_errors():
        for module in ("torch", "transformers"):
            require_extra(module, "capture", "capture decode")
        try:
            code = tool.run(request)
        except tool.PlanError as exc:
            raise InputError("capture decode", str(exc)) from None
    raise typer.Exit(code)  # 1 when a capture of --all failed (its summary line names it)
