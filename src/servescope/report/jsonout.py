"""The analysis document as JSON: what ``--json`` writes and what ``servescope report`` reads back."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from servescope.core.analysis import SCHEMA_VERSION, AnalysisDoc
from servescope.core.errors import InputError

__all__ = ["decode_analysis", "decode_document", "encode_analysis", "encode_document"]

D = TypeVar("D")

_SCHEMA = "servescope.analysis"


class _Header(msgspec.Struct):
    """The two fields that say what a JSON document is, read before the whole document."""

    schema: object = None
    schema_version: object = None


def encode_document(doc: object) -> bytes:
    """Any result document as UTF-8 JSON, indented by 2 spaces, ending in a newline; ``None`` is ``null``."""
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


def decode_document(data: bytes, kind: type[D], *, schema: str, source: str, what: str) -> D:
    """A ``kind`` document saved by :func:`encode_document`, whose ``schema`` field must be ``schema``.

    Raises:
        InputError: ``data`` is not such a document; the line names ``source`` and ``what`` it should be.
    """
    try:
        doc = msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(source, f"not a servescope {what} ({exc})") from None
    if getattr(doc, "schema", None) != schema:
        raise InputError(source, f"not a servescope {what} (schema is {getattr(doc, 'schema', None)!r})")
    return doc


def encode_analysis(doc: AnalysisDoc) -> bytes:
    """The document as UTF-8 JSON, indented by 2 spaces, ending in a newline; ``None`` is ``null``."""
    return encode_document(doc)


def decode_analysis(data: bytes, source: str) -> AnalysisDoc:
    """The analysis document saved in ``data`` (read from ``source``).

    Args:
        data: the bytes of a file written from :func:`encode_analysis`.
        source: the file name or URL, named in the error.

    Raises:
        InputError: ``data`` is not JSON, not a ``servescope.analysis`` document, of a newer schema
            version, or a field has the wrong type.
    """
    if not data.strip():
        raise InputError(source, "not a servescope analysis (empty file)")
    try:
        header = msgspec.json.decode(data, type=_Header)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(source, f"not a servescope analysis ({exc})") from None
    if header.schema != _SCHEMA:
        raise InputError(source, f"not a servescope analysis (schema is {header.schema!r}, not {_SCHEMA!r})")
    version = header.schema_version
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise InputError(source, f"not a servescope analysis (schema_version {version!r}; this servescope "
                                 f"reads 1 to {SCHEMA_VERSION})")
    try:
        return msgspec.json.decode(data, type=AnalysisDoc)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InputError(source, f"not a servescope analysis ({exc})") from None
