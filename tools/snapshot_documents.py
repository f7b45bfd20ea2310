"""Every document servescope makes from the test corpus, written down so a restructuring can prove it changed none.

For each trace folder of ``tests/data``, each bundled example and each trace of ``../shared/traces``: the analysis
as ``analyze -o`` writes it, its text (as ``analyze`` prints it) and its HTML page. For each saved result document
of ``tests/data`` and the examples (settings, profile, plan, bench, health, gpu, service, diff): its text and HTML
as ``report`` renders them. Absolute paths of this checkout and of the corpus become ``<repo>`` and ``<shared>``,
so a clone elsewhere compares equal; text is rendered 4000 columns wide, so no line wraps on a path's length, and
compared without its padding (a table is as wide as its longest path).

``--write`` stores them under ``tests/data/house/`` (JSON and text gzipped whole, so a change can be read; HTML by
its SHA-256, being megabytes of embedded script); without it, the tool compares and prints what differs.
``tests/test_documents_unchanged.py`` does the same comparison in the suite.

Usage: python tools/snapshot_documents.py [--write] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SERVESCOPE_SHARED") or ROOT.parent / "shared").resolve()
STORE = ROOT / "tests" / "data" / "house"
EXAMPLES = ROOT / "src" / "servescope" / "data" / "examples"
WIDTH = 4000


def trace_inputs() -> list[Path]:
    """The trace folders of tests/data and the examples, and the shared corpus's trace files, sorted."""
    data = ROOT / "tests" / "data"
    folders = {p.parent for p in data.rglob("*.pt.trace.json.gz")} | {p for p in EXAMPLES.iterdir() if p.is_dir()}
    shared = sorted(p for p in (SHARED / "traces").rglob("*.json.gz") if "capture" not in p.name) \
        if (SHARED / "traces").is_dir() else []
    return sorted(folders) + shared


def saved_documents() -> list[Path]:
    """Every JSON file of tests/data and the examples that is a servescope result document."""
    out = []
    for base in (ROOT / "tests" / "data", EXAMPLES):
        for path in sorted(base.rglob("*.json")):
            if STORE in path.parents:
                continue
            try:
                head = json.loads(path.read_bytes())
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(head, dict) and str(head.get("schema", "")).startswith("servescope."):
                out.append(path)
    return out


def key(path: Path) -> str:
    """A file name for ``path``'s documents: its place under the repo or the corpus, slashes as ``__``."""
    rel = path.relative_to(SHARED).as_posix() if path.is_relative_to(SHARED) else \
        "repo/" + path.relative_to(ROOT).as_posix()
    return rel.replace("/", "__")


def normalise(text: str) -> str:
    """Checkout and corpus paths as placeholders (the longer first: the corpus may lie inside the checkout)."""
    for place, name in sorted(((str(ROOT), "<repo>"), (str(SHARED), "<shared>")), key=lambda x: -len(x[0])):
        text = text.replace(place, name)
    return text


def normalise_text(text: str) -> str:
    """A printed screen without its padding: a table's columns are as wide as its longest path, so a checkout
    elsewhere pads them otherwise. Runs of spaces become two, rules one dash, line ends lose their spaces."""
    text = re.sub(r"─{2,}", "─", re.sub(r" {2,}", "  ", normalise(text)))
    return "\n".join(line.rstrip() for line in text.split("\n"))


def _cli(args: list[str]) -> tuple[int, str]:
    from typer.testing import CliRunner

    from servescope.cli import app

    result = CliRunner().invoke(app, args, env={"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"})
    return result.exit_code, result.stdout


def documents_of_trace(path: Path, tmp: Path) -> Iterator[tuple[str, str]]:
    """(suffix, content) of the analysis of ``path``: JSON, printed text, HTML (or the one line it was refused with)."""
    out_json, out_html = tmp / "doc.json", tmp / "doc.html"
    for p in (out_json, out_html):
        p.unlink(missing_ok=True)
    code, text = _cli(["analyze", str(path), "-o", str(out_json), "--html", str(out_html)])
    doc = out_json.read_text(encoding="utf-8") if out_json.exists() else None
    # a trace that names no start time is dated by the clock: that stamp is the run's, not the analysis's
    created = str(json.loads(doc).get("created_at", "")) if doc is not None else ""

    def stable(content: str) -> str:
        # the machine that ran it (its kernel and python) is the run's too
        content = re.sub(r'("(?:system|python)"\s*:\s*)"[^"]*"', r'\1"<machine>"', content)
        return normalise(content.replace(created, "<created>") if created else content)

    yield "exit", str(code)
    yield "txt", normalise_text(stable(text))
    if doc is not None:
        yield "json", stable(doc)
    if out_html.exists():
        yield "html", stable(out_html.read_text(encoding="utf-8"))


def documents_of_saved(path: Path) -> Iterator[tuple[str, str]]:
    """(suffix, content) of ``report`` over a saved document: its text and its HTML."""
    from servescope.core.document import decode
    from servescope.core.errors import InputError
    from servescope.report.rerender import render_document

    try:
        doc = decode(path.read_bytes(), str(path))
    except InputError as exc:  # a data file of another kind (comm curves): the line report refuses it with
        yield "txt", normalise_text(str(exc))
        return
    yield "txt", normalise_text(render_document(doc, "text", width=WIDTH))
    yield "html", normalise(render_document(doc, "html", width=WIDTH))


def everything(only: str | None) -> Iterator[tuple[str, str, str]]:
    """(key, suffix, content) for the whole corpus."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for path in trace_inputs():
            if only is None or only in str(path):
                for suffix, content in documents_of_trace(path, Path(tmp)):
                    yield "analyze__" + key(path), suffix, content
    for path in saved_documents():
        if only is None or only in str(path):
            for suffix, content in documents_of_saved(path):
                yield "report__" + key(path), suffix, content


def stored_form(suffix: str, content: str) -> tuple[str, bytes]:
    """How a document is kept: HTML by its hash, the rest gzipped whole (mtime 0: the bytes depend on the text)."""
    if suffix == "html":
        return "html.sha256", hashlib.sha256(content.encode()).hexdigest().encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as fh:
        fh.write(content.encode())
    return f"{suffix}.gz", buf.getvalue()


def read_stored(name: str) -> str | None:
    """The stored content of ``name`` (hash for HTML), or None when nothing was stored."""
    path = STORE / name
    if not path.exists():
        return None
    data = path.read_bytes()
    return gzip.decompress(data).decode() if name.endswith(".gz") else data.decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="store the documents as they are now")
    parser.add_argument("--only", help="only inputs whose path holds this")
    args = parser.parse_args()
    differ = 0
    seen = set()
    if args.write:
        STORE.mkdir(parents=True, exist_ok=True)
    for name, suffix, content in everything(args.only):
        file_name, data = stored_form(suffix, content)
        stored = f"{name}.{file_name}"
        seen.add(stored)
        if args.write:
            (STORE / stored).write_bytes(data)
            continue
        before = read_stored(stored)
        now = data.decode() if file_name.endswith("sha256") else content
        if before != now:
            differ += 1
            print(f"differs: {stored}")
    if args.write and args.only is None:
        for old in STORE.iterdir():
            if old.name not in seen and old.name != "README.md":
                old.unlink()
    print(f"{len(seen)} documents {'written' if args.write else 'compared'}; {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
