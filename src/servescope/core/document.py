"""Result documents: one versioned base, one registry of kinds, one JSON encode and one decode.

Every command's ``--json`` is a document whose first fields say what it is: ``schema`` (a name such as
``servescope.analysis``) and ``schema_version`` (an integer). :func:`decode` reads those two first, so a file
of another kind, a newer version or no document at all fails with one line naming the file and the problem,
and only then decodes (and validates) the whole body into the kind's type.

Two older headers are read as well, because files of them exist: ``"schema": "NAME/N"`` (plan and collective
curves wrote their version into the name) and the GEMM benchmark's ``"kind": "gemm_bench", "schema": N``
(that document stays a stdlib dataclass: ``tools/bench_gemm_device.py`` builds it on a GPU machine that has
only Python and torch).

Example:
    >>> doc = decode(Path("analysis.json").read_bytes(), "analysis.json")    # doctest: +SKIP
    >>> kind_of(doc).title                                                  # doctest: +SKIP
    'analysis'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from servescope.core.errors import InputError
from servescope.core.files import read_bytes

__all__ = ["KINDS", "Document", "DocumentKind", "decode", "decode_as", "encode", "kind_named", "kind_of",
           "read_document", "read_header"]

D = TypeVar("D")


class Document(msgspec.Struct, kw_only=True, frozen=True):
    """The base of every result document: which kind it is and which version of that kind's schema.

    Each kind sets both as defaults (``schema: str = "servescope.health"``) and adds its own fields.
    """

    schema: str
    schema_version: int


@dataclass(frozen=True, kw_only=True)
class DocumentKind:
    """One kind of result document.

    Attributes:
        schema: the ``schema`` field's value, e.g. ``servescope.analysis``.
        version: the newest ``schema_version`` this servescope reads (and writes).
        title: what users call it, in errors and ``report``'s output (``analysis``, ``bench serve``).
        command: the command that writes it.
        type_path: ``module:Class`` of its type, imported only when a document of this kind is decoded.
    """

    schema: str
    version: int
    title: str
    command: str
    type_path: str

    def type(self) -> type[Any]:
        """The document's type (a :class:`Document` subclass; the GEMM benchmark's is a dataclass)."""
        module, _, name = self.type_path.partition(":")
        kind: type[Any] = getattr(importlib.import_module(module), name)
        return kind


def _kind(name: str, title: str, command: str, type_path: str, version: int = 1) -> DocumentKind:
    """The kind ``servescope.NAME`` whose type is ``servescope.core.TYPE_PATH``."""
    return DocumentKind(schema=f"servescope.{name}", version=version, title=title, command=command,
                        type_path=f"servescope.core.{type_path}")


KINDS: tuple[DocumentKind, ...] = (
    _kind("analysis", "analysis", "analyze", "analysis:AnalysisDoc", version=2),
    _kind("plan", "plan", "plan", "plan:PlanDoc"),
    _kind("bench_serve", "bench serve", "bench serve", "serve:ServeResult"),
    _kind("bench_comm", "bench comm", "bench comm", "comm_result:CommResultDoc"),
    _kind("bench_gemm", "bench gemm", "bench gemm", "gemm:GemmBenchDoc"),
    _kind("health", "health result", "health", "health:HealthResult"),
    _kind("settings", "settings", "settings", "settings:SettingsDoc"),
    _kind("gpu", "gpu snapshot", "gpu", "gpu:GpuSnapshot"),
    _kind("service", "service status", "service status", "service:ServiceStatus"),
    _kind("diff", "diff", "diff", "diff:DiffDoc"),
    _kind("tune", "tune", "tune", "tune:TuneDoc"),
)
_BY_SCHEMA = {k.schema: k for k in KINDS}
_GEMM_KIND = "gemm_bench"


def kind_named(schema: str) -> DocumentKind:
    """The registered kind whose ``schema`` is ``schema``.

    Raises:
        ValueError: no kind has that schema; the message lists those that do.
    """
    try:
        return _BY_SCHEMA[schema]
    except KeyError:
        raise ValueError(f"schema {schema!r}: expected one of {', '.join(_BY_SCHEMA)}") from None


def kind_of(doc: object) -> DocumentKind:
    """The kind of a decoded (or freshly made) document; an older file's ``schema`` (``servescope.plan/1``)
    names its kind with the version after a slash."""
    if isinstance(doc, Document):
        name, _, number = doc.schema.rpartition("/")
        return kind_named(name if name and number.isdigit() else doc.schema)
    if getattr(doc, "kind", None) == _GEMM_KIND:
        return kind_named("servescope.bench_gemm")
    raise ValueError(f"not a result document: {type(doc).__name__}")


def encode(doc: object) -> bytes:
    """A document as UTF-8 JSON, indented by 2 spaces, ending in a newline; ``None`` is ``null``."""
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


class _Header(msgspec.Struct):
    """The fields that say what a JSON document is, read before the whole document."""

    schema: object = None
    schema_version: object = None
    kind: object = None


def _what(expect: tuple[DocumentKind, ...]) -> str:
    titles = [k.title for k in expect] or ["document"]
    return titles[0] if len(titles) == 1 else f"{', '.join(titles[:-1])} or {titles[-1]}"


def read_header(data: bytes, source: str, *, expect: tuple[DocumentKind, ...] = KINDS) -> tuple[DocumentKind, int]:
    """The kind and schema version that ``data`` says it is, before its body is read.

    Raises:
        InputError: empty, not JSON, not an object, or no ``schema`` of ``expect`` at a version this servescope
            reads; one line: ``SOURCE: not a servescope KIND (what is wrong)``.
    """
    what = _what(expect)
    if not data.strip():
        raise InputError(source, f"not a servescope {what} (empty file)")
    try:
        header = msgspec.json.decode(data, type=_Header)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(source, f"not a servescope {what} ({exc})") from None
    schema, version = header.schema, header.schema_version
    if header.kind == _GEMM_KIND and version is None:       # the GEMM benchmark's own header
        schema, version = "servescope.bench_gemm", header.schema
    elif isinstance(schema, str) and version is None and "/" in schema:   # "servescope.plan/1"
        name, _, number = schema.rpartition("/")
        if number.isdigit():
            schema, version = name, int(number)
    kind = _BY_SCHEMA.get(schema) if isinstance(schema, str) else None
    if kind is None or kind not in expect:
        raise InputError(source, f"not a servescope {what} (schema is {header.schema!r}, not "
                                 f"{' or '.join(repr(k.schema) for k in expect)})"[:400])
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= kind.version:
        raise InputError(source, f"not a servescope {kind.title} (schema_version {version!r}; this servescope "
                                 f"reads 1 to {kind.version})")
    return kind, version


def decode(data: bytes, source: str, *, expect: tuple[DocumentKind, ...] = KINDS) -> Any:
    """The document saved in ``data`` (read from ``source``), of whichever kind its header names.

    Args:
        data: the bytes of a file written by :func:`encode` (or an older servescope).
        source: the file name or URL, named in the error.
        expect: the kinds accepted; by default every kind.

    A kind whose type has an ``upgraded()`` method is returned through it: an older version's document in the
    current schema where the missing fields can be told (the analysis's category table).

    Raises:
        InputError: not a document of ``expect`` (see :func:`read_header`), or a field is missing or of the
            wrong type; the line names the field's path (``$.ranks[0].steps``).
    """
    kind, _ = read_header(data, source, expect=expect)
    try:
        doc = msgspec.json.decode(data, type=kind.type())
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(source, f"not a servescope {kind.title} ({exc})") from None
    upgrade = getattr(doc, "upgraded", None)  # an older version made current where it can be (AnalysisDoc)
    return upgrade() if callable(upgrade) else doc


def decode_as(data: bytes, source: str, kind: type[D]) -> D:
    """The document saved in ``data``, which must be of type ``kind`` (e.g. ``AnalysisDoc``).

    Raises:
        InputError: as :func:`decode`, naming ``kind``'s title.
    """
    expect = tuple(k for k in KINDS if k.type_path.endswith(f":{kind.__name__}")
                   and k.type_path.startswith(kind.__module__ + ":"))
    doc: D = decode(data, source, expect=expect)
    return doc


def read_document(path: Path) -> Any:
    """The document saved at ``path``, of whichever kind it is (see :func:`decode`).

    Raises:
        InputError: ``path`` cannot be read, or is not a result document.
    """
    return decode(read_bytes(path), str(path))
