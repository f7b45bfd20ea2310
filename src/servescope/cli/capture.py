"""capture decode: GPU decode captures of a random-weight model."""

from __future__ import annotations

import typer

from servescope.cli.common import capture_app, user_errors


@capture_app.command("decode", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                                 "help_option_names": []})
def capture_decode(ctx: typer.Context) -> None:
    """Prefill + decode steps of a random-weight dense or MoE model under torch.profiler, annotated as vLLM
    does, with the profiler's own per-kernel totals (needs torch and transformers). `--help` lists the options.
    """
    from servescope.bench import capture_decode as tool
    from servescope.core.errors import require_extra

    if "--help" not in ctx.args and "-h" not in ctx.args:
        with user_errors():
            for module in ("torch", "transformers"):
                require_extra(module, "capture", "capture decode")
    raise typer.Exit(tool.main(list(ctx.args)))


