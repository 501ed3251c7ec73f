"""Record validation, byte accounting and rendering (API §1.6, §4; SEMANTICS §1.3)."""

from __future__ import annotations

import orjson
import pytest

from topics.engine.records import Payload, loads, prepare_records
from topics.errors import TopicsError


def test_byte_accounting_is_compact_utf8_json() -> None:
    [r] = prepare_records([{"data": {"a": "é", "b": [1, 2]}, "meta": {"m": 1}}], None)
    assert r.data == b'{"a":"\xc3\xa9","b":[1,2]}'
    assert r.nbytes == len(r.data) + len(b'{"m":1}')


def test_batch_node_and_overrides() -> None:
    recs = prepare_records([{"data": 1}, {"data": 2, "node": "x"}, {"data": 3, "node": None}], "b")
    assert [r.node for r in recs] == ["b", "x", "b"]


def test_payload_wire_object_and_slices() -> None:
    p = Payload.build(7, 99, "n1", "t1", b'{"x":1}', b'{"m":2}')
    assert (p.data, p.meta) == (b'{"x":1}', b'{"m":2}')
    assert Payload.build(1, 2, None, None, b"[]", None).meta is None
    obj = orjson.loads(p.frag)
    assert list(obj) == ["$seq", "$ts", "$node", "data", "meta"]
    assert obj == {"$seq": 7, "$ts": 99, "$node": "n1", "data": {"x": 1}, "meta": {"m": 2}}


def test_big_integers_become_floats_and_nan_is_rejected() -> None:
    assert loads(b"[1, 123456789012345678901234567890]")[1] == pytest.approx(1.2345678901e29)
    with pytest.raises(ValueError):
        loads(b"[NaN]")
    with pytest.raises(ValueError):
        loads(b"{")


@pytest.mark.parametrize(
    ("records", "code"),
    [
        (None, "invalid_request"),
        ([], "invalid_request"),
        ([1], "invalid_request"),
        ([{"tag": "x"}], "invalid_request"),
        ([{"data": 1, "meta": "x" * 20000}], "invalid_request"),
        ([{"data": "y" * 1_048_600}], "record_too_large"),
        ([{"data": 1}] * 10_001, "batch_too_large"),
    ],
)
def test_validation_codes(records: object, code: str) -> None:
    with pytest.raises(TopicsError) as e:
        prepare_records(records, None)
    assert e.value.status == 400 and e.value.code == code
