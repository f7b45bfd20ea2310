"""The serving engines, as data: ``servescope/data/engines.toml``, one entry each.

``deploy/`` (service import, lint, render, drift), ``server/`` (profile) and ``trace/`` (which engine ran a trace,
the deployment's defaults) read an engine's command-line detection, flags and trace evidence here, never from
their own lists; the other data files name an engine by its id, and :func:`check_engine` refuses an id this file
does not define, naming the file.

Example:
    >>> detect_engine(["/usr/bin/vllm", "serve", "m"])
    ('vllm', 2)
    >>> engine("sglang").model_flag
    '--model-path'
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import PurePath

import msgspec

from servescope.core.bundled import bundled_toml
from servescope.core.errors import InputError

__all__ = ["ENGINES_FILE", "Engine", "EngineDefault", "check_engine", "detect_engine", "engine", "engine_ids",
           "engine_words", "engines", "engines_words"]

ENGINES_FILE = "data/engines.toml"


class EngineDefault(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The engine's default of a deployment setting (an id of ``data/deployment.toml``) from version ``since``."""

    setting: str
    since: str
    value: str
    note: str = ""


class Engine(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[engine]]`` entry (``engines.toml`` says what each key means)."""

    id: str
    words: str
    modules: tuple[str, ...] = ()
    program: str | None = None
    subcommand: str | None = None
    command: tuple[str, ...] = ()
    model_flag: str = "--model"
    context_flag: str | None = None
    default_port: int = 8000
    profiler_dir_flags: tuple[str, ...] = ()
    profiler_dir_env: str | None = None
    version_path: str | None = None
    version_env: str | None = None
    metadata: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()
    source: str = ""
    default: tuple[EngineDefault, ...] = ()  # its defaults by version ([[engine.default]])
    graphs_by_default: bool = False  # it captures CUDA graphs unless told not to

    def argument_at(self, argv: Sequence[str], i: int) -> int | None:
        """Where ``argv[i]`` starts this engine (its module, or its program and subcommand): the index of the
        engine's first argument; else None."""
        word = argv[i]
        if word in self.modules:
            return i + 1
        if (self.program is not None and PurePath(word).name == self.program and i + 1 < len(argv)
                and argv[i + 1] == self.subcommand):
            return i + 2
        return None


@cache
def engines() -> tuple[Engine, ...]:
    """Every engine of ``engines.toml``, in the file's order."""
    try:
        return msgspec.convert(bundled_toml("engines.toml").get("engine", []), tuple[Engine, ...])
    except msgspec.ValidationError as exc:
        raise InputError(ENGINES_FILE, str(exc)) from exc


def engine_ids() -> tuple[str, ...]:
    """The ids ``engines.toml`` defines."""
    return tuple(e.id for e in engines())


def engine(id: str) -> Engine:  # noqa: A002 - the entry's own key
    """The engine with this id (KeyError for one the file does not define)."""
    for e in engines():
        if e.id == id:
            return e
    raise KeyError(id)


def check_engine(id: object, source: str, where: str) -> str:  # noqa: A002
    """``id`` where ``engines.toml`` defines it; else an InputError naming ``source``, ``where`` and the id."""
    if not isinstance(id, str) or id not in engine_ids():
        raise InputError(source, f"{where}: engine {id!r} is not defined in {ENGINES_FILE} "
                                 f"({', '.join(engine_ids())})")
    return id


def engine_words(id: str) -> str:  # noqa: A002
    """What sentences call the engine (its ``words``); an id the file does not define stands as is."""
    return next((e.words for e in engines() if e.id == id), id)


def engines_words(joiner: str = " nor ") -> str:
    """The engines' names joined (``vLLM nor SGLang``)."""
    return joiner.join(e.words for e in engines())


def detect_engine(argv: Sequence[str]) -> tuple[str, int] | None:
    """(engine id, index of its first argument) of a server command line, or None where it runs no engine of
    ``engines.toml``; the first word that starts one decides."""
    for i in range(len(argv)):
        for e in engines():
            first = e.argument_at(argv, i)
            if first is not None:
                return e.id, first
    return None
