"""Terminal and JSON views of service lint, import, status and restart results (records typed loosely:
report/ sits below deploy/)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from servescope.core.document import encode
from servescope.core.service import ServiceStatus
from servescope.report.wrap import hang

__all__ = ["encode_import", "encode_lint", "encode_record", "render_import", "render_lint", "render_restart",
           "render_status"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def encode_record(record: Any) -> bytes:
    """A frozen record as indented JSON, ending in a newline (a :class:`ServiceStatus` is a document)."""
    if isinstance(record, ServiceStatus):
        return encode(record)
    return (json.dumps(dataclasses.asdict(record), indent=2, default=str) + "\n").encode()


def encode_lint(result: Any) -> bytes:
    """``{"source", "topology", "errors", "findings": [{rule, severity, line, message, detail, fix}], "notes"}``."""
    doc = {"source": result.source, "topology": result.topology, "errors": result.errors,
           "findings": [dataclasses.asdict(f) for f in result.findings], "notes": list(result.notes)}
    return (json.dumps(doc, indent=2) + "\n").encode()


def render_lint(result: Any, console: Console) -> None:
    """One block per finding: ``file:line severity rule``, what was seen, why, and what to do."""
    if not result.findings:
        console.print(f"{escape(result.source)}: no problems found")
    for f in result.findings:
        where = f"{result.source}:{f.line}" if f.line else result.source
        # the compiler-style key (file:line severity rule) stays one line for editors and grep; the prose under
        # it wraps at spaces, indented
        console.print(f"[{_STYLE.get(f.severity, '')}]{escape(where)} {f.severity} {f.rule}[/]", soft_wrap=True)
        for label, text in (("", f.message), ("found: ", f.detail), ("fix:   ", f.fix)):
            console.print(Padding(Text(label + text), (0, 0, 0, 4), expand=False))
    for note in result.notes:
        console.print(escape(note))
    if result.topology is None:
        console.print("NCCL rules skipped: no topology (--topology nvlink|pcie|FILE, or run on the GPU box)")


def encode_import(result: Any, spec_path: str | None) -> bytes:
    """``{"name", "spec", "spec_path", "secrets_moved", "replaced"}``; secret values never appear."""
    doc = {"name": result.name, "spec": result.spec, "spec_path": spec_path,
           "secrets_moved": list(result.secret_names), "replaced": list(result.replaced)}
    return (json.dumps(doc, indent=2) + "\n").encode()


def render_import(result: Any, spec_path: str, env_path: str | None, console: Console) -> None:
    console.print(f"wrote {escape(spec_path)}")
    if result.secrets:
        target = str(result.spec.get("env_file", "the spec's env_file"))
        console.print(f"secrets moved to {escape(env_path or '?')}: {escape(', '.join(result.secrets))}"
                      f" (values not shown); install them as {escape(target)}, mode 0600")
    for note in result.replaced:
        hang(console, f"replaced: {note}")


def render_status(status: ServiceStatus, console: Console) -> None:
    """One row per ``systemctl show`` field of the unit (the document's header left out)."""
    table = Table(box=None, show_header=False)
    for field in msgspec.structs.fields(status):
        if field.name in ("schema", "schema_version"):
            continue
        value = getattr(status, field.name)
        table.add_row(field.name.replace("_", " "), "N/A" if value is None else escape(str(value)))
    console.print(table)


def render_restart(result: Any, console: Console) -> None:
    console.print(f"{escape(result.name)}: {' → '.join(result.steps)}")
    console.print(escape(result.detail))
