"""A restructuring changes no document (issue 25): every analysis of the test corpus (its JSON, printed text and
HTML) and every saved result document rendered by ``report`` equals what was stored before the move.

The stored side is ``tests/data/house/``, written by ``tools/snapshot_documents.py --write`` on the code before
the restructuring; this test makes the documents again through the CLI and compares. A deliberate change of output
rewrites the store in the same commit, where its diff can be read.
"""

from __future__ import annotations

import difflib
import tempfile
from pathlib import Path

import pytest

from tracefiles import SHARED, tool

snap = tool("snapshot_documents")


def _id(path: Path) -> str:
    return snap.key(path)


def test_every_stored_document_is_made_again() -> None:
    """Nothing stored is left without its input, unless it is of the corpus beside the checkout and that is away."""
    made = {f"analyze__{snap.key(p)}" for p in snap.trace_inputs()} | \
        {f"report__{snap.key(p)}" for p in snap.saved_documents()}
    stored = {p.name.rsplit(".", 2)[0] for p in snap.STORE.iterdir() if p.name != "README.md"}
    missing = {name for name in stored if name not in made}
    if not (SHARED / "traces").is_dir():
        missing = {name for name in missing if "__repo__" in name}
    assert not missing


def _compare(prefix: str, path: Path, made: list[tuple[str, str]]) -> None:
    assert made
    for suffix, content in made:
        name, data = snap.stored_form(suffix, content)
        stored_name = f"{prefix}__{snap.key(path)}.{name}"
        before = snap.read_stored(stored_name)
        assert before is not None, f"{stored_name} was never stored: run tools/snapshot_documents.py --write"
        now = data.decode() if name.endswith("sha256") else content
        if before != now:
            diff = "".join(list(difflib.unified_diff(before.splitlines(True), now.splitlines(True)))[:60])
            pytest.fail(f"{stored_name} changed:\n{diff}")


@pytest.mark.parametrize("path", snap.trace_inputs(), ids=_id)
def test_the_analysis_is_byte_identical(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _compare("analyze", path, list(snap.documents_of_trace(path, Path(tmp))))


@pytest.mark.parametrize("path", snap.saved_documents(), ids=_id)
def test_the_report_of_a_saved_document_is_byte_identical(path: Path) -> None:
    _compare("report", path, list(snap.documents_of_saved(path)))
