"""The analysis as JSON: a saved document reads back equal; anything else is an InputError naming its file."""

from __future__ import annotations

import json

import msgspec
import pytest
from test_tables import make_doc

from servescope.core.analysis import decode_analysis
from servescope.core.document import encode
from servescope.core.errors import InputError


def test_round_trip_is_equal() -> None:
    doc = make_doc()
    assert decode_analysis(encode(doc), "saved.json") == doc


def test_encoding_is_indented_json_with_null_for_none() -> None:
    data = encode(make_doc())
    text = data.decode("utf-8")
    assert text.startswith('{\n  "schema": "servescope.analysis",\n  "schema_version": 2,\n')
    assert text.endswith("}\n")
    plain = json.loads(data)  # the independent reader
    assert plain["ranks"][1]["rank"] == 0
    assert plain["ranks"][1]["phases"]["prefill"]["tokens_per_step"] is None
    assert plain["ranks"][1]["phases"]["decode"]["categories"]["allreduce"]["share"] == 0.5
    assert plain["traces"][2]["rank"] is None
    assert plain["findings"][2]["evidence"]["tokens"] is None


def test_a_version_1_document_reads_with_its_category_table_resolved() -> None:
    """Written before the category table, device and collectives: it decodes, its table from the taxonomy it
    names (bundled: the colour taxonomy.toml gives, read here with tomllib), the rest empty."""
    import tomllib
    from importlib.resources import files

    plain = json.loads(encode(make_doc()))
    plain["schema_version"] = 1
    del plain["category_table"]
    plain["categories"] = {"comm.all_reduce": "communication", "allreduce": "communication"}
    doc = decode_analysis(json.dumps(plain).encode(), "old.json")
    bundled = tomllib.loads(files("servescope").joinpath("data", "taxonomy.toml").read_text(encoding="utf-8"))
    assert doc.schema_version == 1
    assert doc.category_table["comm.all_reduce"].colour == bundled["categories"]["comm.all_reduce"]["colour"]
    assert doc.category_table["allreduce"].label == "allreduce"  # not the bundled taxonomy's: its group's defaults
    assert all(t.device is None for t in doc.traces)


def _with(**changes: object) -> bytes:
    plain = json.loads(encode(make_doc()))
    plain.update(changes)
    return json.dumps(plain).encode()


def _without(field: str) -> bytes:
    plain = json.loads(encode(make_doc()))
    del plain[field]
    return json.dumps(plain).encode()


@pytest.mark.parametrize(("data", "detail"), [
    (b"", "empty file"),
    (b" \n", "empty file"),
    (b"not json at all", "JSON"),
    (b"\xff\xfe{}", ""),
    (b"[1, 2, 3]", "object"),
    (b'{"schema": "servescope.analysis"', ""),
    (encode(make_doc())[:-40], ""),
    (b'{"traceEvents": []}', "schema is None"),
    (_with(schema="servescope.bench"), "schema is 'servescope.bench'"),
    (_with(schema_version=99), "schema_version 99"),
    (_with(schema_version="1"), "schema_version '1'"),
    (_with(ranks="rank0"), "ranks"),
    (_with(kernels=[{"rank": "zero"}]), "kernels"),
    (_without("created_at"), "created_at"),
])
def test_bad_input_raises_input_error_naming_the_source(data: bytes, detail: str) -> None:
    with pytest.raises(InputError) as caught:
        decode_analysis(data, "runs/saved.json")
    assert caught.value.source == "runs/saved.json"
    assert caught.value.problem.startswith("not a servescope analysis (")
    assert detail in caught.value.problem
    assert str(caught.value).startswith("runs/saved.json: not a servescope analysis (")


def test_wrong_type_deep_inside_names_the_path() -> None:
    plain = json.loads(encode(make_doc()))
    plain["ranks"][0]["phases"]["decode"]["steps"] = "three"
    where = r"Expected `int`, got `str` - at `\$\.ranks\[0\]\.phases\[\.\.\.\]\.steps`"
    with pytest.raises(InputError, match=where):
        decode_analysis(json.dumps(plain).encode(), "x.json")


def test_unknown_fields_are_ignored() -> None:
    """A newer servescope of the same schema version may add fields; this one still reads the file."""
    data = _with(extra_field={"a": 1})
    assert decode_analysis(data, "x.json") == make_doc()
    assert isinstance(msgspec.json.decode(data), dict)
