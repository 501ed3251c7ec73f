"""Kafka record <-> topics record mapping (no server; runs in the quick tier)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from topics.kafka.records import RecordError, to_kafka, to_new_record

LIMITS = {"max_tag_bytes": 256, "max_meta_bytes": 16_384, "max_record_bytes": 1_048_576}


def roundtrip(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]):
    r = to_new_record(key, value, headers, **LIMITS)
    orjson.loads(r.data)  # data is always valid JSON
    if r.meta is not None:
        orjson.loads(r.meta)
    assert r.nbytes == len(r.data) + (len(r.meta) if r.meta else 0)
    return r, to_kafka(r.tag, r.data, r.meta)


@given(
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=5
    ),
)
def test_non_document_values_round_trip_exactly(key, value, headers) -> None:
    try:
        obj = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        obj = None
    _r, (k, v, h) = roundtrip(key, value, headers)
    assert k == key
    assert h == headers
    if isinstance(obj, dict | list):
        assert orjson.loads(v) == obj  # documents: JSON-equal, compact
    else:
        assert v == value


def test_json_documents_are_stored_as_json() -> None:
    r, (k, v, h) = roundtrip(b"user-1", b'{"a": [1, 2]}', [("trace", b"t-1")])
    assert (r.tag, r.data, orjson.loads(r.meta)) == ("user-1", b'{"a":[1,2]}', {"trace": "t-1"})
    assert (k, v, h) == (b"user-1", b'{"a":[1,2]}', [("trace", b"t-1")])


@pytest.mark.parametrize(
    ("value", "data", "mark"),
    [
        (b"42", b"42", None),
        (b"1.50", b'"1.50"', "text"),
        (b"hello", b'"hello"', "text"),
        (b"\xff", b'"/w=="', "base64"),
        (None, b"null", "null"),
    ],
)
def test_value_forms(value: bytes | None, data: bytes, mark: str | None) -> None:
    r = to_new_record(None, value, [], **LIMITS)
    assert r.data == data
    got = orjson.loads(r.meta)["$kafka"]["value"] if r.meta else None
    assert got == mark


def test_v0_records_map_to_headers() -> None:
    meta = orjson.dumps({"trace": "abc", "n": 5, "x": None})
    assert to_kafka("k", b'{"a":1}', meta) == (
        b"k",
        b'{"a":1}',
        [("trace", b"abc"), ("n", b"5"), ("x", None)],
    )
    assert to_kafka(None, b'"s"', orjson.dumps([1, 2])) == (None, b'"s"', [("meta", b"[1,2]")])
    # A faked marker never raises.
    assert to_kafka(None, b"1", orjson.dumps({"$kafka": {"value": "base64", "key": 3}}))[1] == b"1"


def test_oversized_headers_are_refused() -> None:
    with pytest.raises(RecordError):
        to_new_record(None, b"1", [("h", b"x" * 20_000)], **LIMITS)
