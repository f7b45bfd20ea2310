"""A server configuration (command line + environment) and the edits of the catalogue applied to it.

:class:`ServerConfig` is what a target runs; :func:`apply_edits` lays changes over it in order, each flag set
replacing every earlier spelling of that flag (``--max-num-seqs 4``, ``--max_num_seqs=4``), switches added or
removed; :func:`render_dropin` writes the systemd drop-in that turns a unit's own configuration into another.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from servescope.core.changes import ChangeEdit
from servescope.core.redact import redact
from servescope.deploy.render import quote_word

__all__ = ["ServerConfig", "apply_edits", "merge_edits", "render_dropin", "shell_line"]

_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ServerConfig:
    """A server's command line and the environment variables set for it (beyond the inherited ones)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def _flag_of(word: str) -> str | None:
    if not word.startswith("--"):
        return None
    name = word.partition("=")[0]
    return "--" + name[2:].replace("_", "-")


def _without(argv: Sequence[str], flag: str, *, takes_value: bool) -> list[str]:
    """``argv`` without any spelling of ``flag`` (and, for a flag with a value, the word after it)."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            if not word.startswith("-") or re.fullmatch(r"-\d.*", word):
                continue
        if _flag_of(word) == flag:
            skip = takes_value and "=" not in word
            continue
        out.append(word)
    return out


def _apply(config: ServerConfig, edit: ChangeEdit) -> ServerConfig:
    argv = list(config.argv)
    for flag in edit.remove:
        argv = _without(argv, flag, takes_value=False)
    for flag in edit.add:
        argv = _without(argv, flag, takes_value=False) + [flag]
    for flag, value in edit.set_flags.items():
        argv = _without(argv, flag, takes_value=True)
        argv += [f"{flag}={value}"] if "." in flag else [flag, value]
    return ServerConfig(tuple(argv), {**config.env, **edit.env})


def apply_edits(config: ServerConfig, edits: Iterable[ChangeEdit]) -> ServerConfig:
    """``config`` with ``edits`` applied in order."""
    for edit in edits:
        config = _apply(config, edit)
    return config


def merge_edits(edits: Iterable[ChangeEdit]) -> ChangeEdit:
    """One edit that does what ``edits`` do in order (later values win)."""
    set_flags: dict[str, str] = {}
    add: list[str] = []
    remove: list[str] = []
    env: dict[str, str] = {}
    for edit in edits:
        set_flags.update(edit.set_flags)
        add = [f for f in add if f not in edit.remove] + [f for f in edit.add if f not in add]
        remove = [f for f in remove if f not in edit.add] + [f for f in edit.remove if f not in remove]
        env.update(edit.env)
    return ChangeEdit(set_flags=set_flags, add=add, remove=remove, env=env)


def shell_line(config: ServerConfig, *, secrets: Sequence[str | None] = ()) -> str:
    """The configuration as one shell line (``K=V ... argv``), secrets redacted."""
    words = [f"{k}={shlex.quote(v)}" for k, v in config.env.items()] + [shlex.quote(w) for w in config.argv]
    return redact(" ".join(words), secrets)


def _exec_word(word: str) -> str:
    # a $VAR the unit itself wrote stays a variable for systemd to fill in; any other $ is literal
    return quote_word(word, dollars=_VAR.search(word) is None)


def render_dropin(original: ServerConfig, wanted: ServerConfig, *, prefixes: str = "", header: str = "") -> str:
    """The drop-in (``[Service]`` section) that makes a unit running ``original`` run ``wanted``: an
    ``Environment=`` line for each variable changed, and ``ExecStart=`` reset and set when the command changed."""
    lines = [f"# {line}" for line in header.splitlines()] + ["[Service]"]
    for key, value in wanted.env.items():
        if original.env.get(key) != value:
            lines.append("Environment=" + quote_word(f"{key}={value}", dollars=False))
    if tuple(wanted.argv) != tuple(original.argv):
        lines += ["ExecStart=", f"ExecStart={prefixes}" + " ".join(_exec_word(w) for w in wanted.argv)]
    return "\n".join(lines) + "\n"
