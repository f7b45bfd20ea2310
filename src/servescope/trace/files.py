"""Where traces are: the files a user names (directories searched) and the bundled examples.

Standard library only, so the CLI can find the files and start reading them
(:class:`~servescope.trace.readahead.ReadAhead`) before it imports the analysis.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from servescope.core.errors import InputError

__all__ = ["EXAMPLES", "EXAMPLE_NAME", "TRACE_SUFFIXES", "discover_traces", "example_trace_dir"]

TRACE_SUFFIXES = (".json", ".json.gz")
EXAMPLE_NAME = "h200-vllm-moe-b16"
"""The default bundled example: a real vLLM 0.26 decode capture from an H200 (Qwen3-30B-A3B shapes, batch 16,
CUDA graphs), with vLLM's own profiler table beside it."""
EXAMPLES = ("h200-vllm-moe-b16", "vllm-cpu-tp2", "h200-moe-b16-graphs")
"""Every bundled example (``data/examples/NAME``, each with a README saying what it is and how it was made)."""


def discover_traces(paths: Iterable[str | Path]) -> list[Path]:
    """Trace files named by ``paths``: files as given, directories searched recursively.

    In a directory, when some files have ``trace`` in their name (``*.pt.trace.json.gz`` as
    torch.profiler, vLLM and SGLang write them), only those are taken, so a JSON side file
    (capture metadata, a saved analysis) beside the traces is not read as one.

    Raises:
        InputError: a path does not exist, or a directory holds no ``.json`` / ``.json.gz`` file.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            named = [p for p in inside if "trace" in p.name.lower()]
            inside = named or inside
            if not inside:
                raise InputError(str(path), "directory holds no trace files (*.json, *.json.gz)")
            found.extend(inside)
        elif path.exists():
            found.append(path)
        else:
            raise InputError(str(path), "no such file or directory")
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return unique


def example_trace_dir(name: str = EXAMPLE_NAME) -> Path:
    """The folder of a bundled example: by default a real vLLM decode capture from an H200; ``vllm-cpu-tp2`` is
    a vLLM TP=2 capture (two ranks with real all-reduces, and the front end) on the CPU; ``h200-moe-b16-graphs``
    the project's own ``capture decode`` of an HF MoE model on an H200.

    Raises:
        InputError: ``name`` is not one of :data:`EXAMPLES`, or the installation lacks it.
    """
    from importlib.resources import as_file, files

    if name not in EXAMPLES:
        raise InputError("--example-name", f"no bundled example {name!r} (there are: {', '.join(EXAMPLES)})")
    resource = files("servescope") / "data" / "examples" / name
    with as_file(resource) as path:
        if not path.is_dir():
            raise InputError(str(path), "bundled example missing from this installation")
        return path
