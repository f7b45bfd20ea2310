"""capture decode: GPU decode captures of a random-weight model."""

from __future__ import annotations

import typer

from servescope.cli.common import capture_app, fail


@capture_app.command("decode", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                                 "help_option_names": []})
def capture_decode(ctx: typer.Context) -> None:
    """Prefill + decode steps of a random-weight dense or MoE model under torch.profiler, annotated as vLLM
    does, with the profiler's own per-kernel totals (needs torch and transformers). `--help` lists the options.
    """
    import importlib.util

    from servescope.bench import capture_decode as tool

    if "--help" not in ctx.args and "-h" not in ctx.args:
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            fail(f"capture decode needs {' and '.join(missing)}: pip install torch transformers")
    raise typer.Exit(tool.main(list(ctx.args)))


