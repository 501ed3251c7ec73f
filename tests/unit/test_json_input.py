"""Strict JSON input (docs/HTTP_INPUT.md "JSON") and the piecewise write-body parser.

:func:`iter_write_body` must be indistinguishable from parsing the whole body
with :func:`loads` and validating it with :func:`prepare_records`: the same
records, the same other fields, the same error (status, code, message) -- or it
declines (returns None) and the caller does exactly that.
"""

from __future__ import annotations

import json
import os
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topics.config import Limits
from topics.engine import records as records_mod
from topics.engine.records import (
    PreparedRecords,
    iter_density_check,
    iter_write_body,
    json_bytes,
    loads,
    prepare_records,
)
from topics.errors import TopicsError

# Raise for a deeper local run, e.g. `TOPICS_FUZZ_SCALE=20 pytest tests/unit/test_json_input.py`.
SCALE = float(os.environ.get("TOPICS_FUZZ_SCALE", "1"))

# Small caps so that the limits are hit by generated bodies too.
CAPS = Limits(
    max_batch_records=40,
    max_record_bytes=600,
    max_meta_bytes=120,
    max_meta_keys=4,
    max_tag_bytes=16,
    max_node_bytes=12,
)


# ---------------------------------------------------------------- strict loads


@pytest.mark.parametrize(
    "text",
    [
        b'"\\ud800"',
        b'"\\udc00"',
        b'{"\\ud800": 1}',
        b'["a\\ud83dz"]',
        b'"\xed\xa0\x80"',  # a surrogate encoded straight into the UTF-8 bytes
        b"1e400",
        b"-1e400",
        b'{"a": [1, 2, 1e309]}',
        b"[" * 1025 + b"]" * 1025,
        b"[" * 100_000 + b"]" * 100_000,
        b"\xef\xbb\xbf{}",
        b"[NaN]",
        b"[Infinity]",
        b"[-Infinity]",
    ],
)
def test_loads_refuses(text: bytes) -> None:
    with pytest.raises(ValueError):
        loads(text)
    with pytest.raises(ValueError):
        loads(text.decode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    "text",
    [
        b'"\\ud800"',
        b'"\xed\xa0\x80"',
        b"1e400",
        b"[-1e400]",
        b"1" + b"0" * 400,
        b"[NaN]",
        b"[" * 1100 + b"]" * 1100,
        b"{",
    ],
)
def test_stdlib_fallback_is_as_strict(monkeypatch: pytest.MonkeyPatch, text: bytes) -> None:
    """With an orjson that refuses wide integers the stdlib parser steps in: same rules."""
    monkeypatch.setattr(records_mod, "_NEEDS_FALLBACK", True)
    with pytest.raises(ValueError):
        records_mod.loads(text)


def test_stdlib_fallback_reads_wide_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records_mod, "_NEEDS_FALLBACK", True)
    real = orjson.loads

    def old_orjson(text: Any) -> Any:
        if b"18446744073709551616" in bytes(text):
            raise orjson.JSONDecodeError("number out of range", "", 0)
        return real(text)

    monkeypatch.setattr(records_mod.orjson, "loads", old_orjson)
    assert records_mod.loads(b"[1, 18446744073709551616]") == [1, 2.0**64]
    for bad in (b'"\\udc00"', b"1e400", b"[" * 300 + b"0" + b"]" * 300):
        with pytest.raises(ValueError):
            records_mod.loads(b"[18446744073709551616, " + bad + b"]")


def test_loads_accepts_the_edges() -> None:
    assert loads(b'"\\ud83d\\ude00"') == "\U0001f600"  # a proper surrogate pair
    assert loads(b"[" * 1024 + b"]" * 1024) is not None
    assert loads(b"1.7976931348623157e308") == 1.7976931348623157e308
    assert loads(b"1e-400") == 0.0  # underflow is a finite number
    assert loads(b"18446744073709551615") == 2**64 - 1
    assert isinstance(loads(b"18446744073709551616"), float)


def test_json_bytes_refuses_what_it_cannot_store() -> None:
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ValueError):
        json_bytes(deep)
    with pytest.raises(ValueError):
        json_bytes({"a": "\ud800"})


def test_records_too_deep_to_store_are_400() -> None:
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    for rec in ({"data": deep}, {"data": 1, "meta": {"m": deep}}):
        with pytest.raises(TopicsError) as e:
            prepare_records([rec], None)
        assert (e.value.status, e.value.code) == (400, "invalid_request")
    for rec in ({"data": "\ud800"}, {"data": 1, "tag": "\udfff"}, {"data": 1, "node": "\ud800"}):
        with pytest.raises(TopicsError) as e:
            prepare_records([rec], None)
        assert (e.value.status, e.value.code) == (400, "invalid_request")
    with pytest.raises(TopicsError):
        prepare_records([{"data": 1}], "\ud800")


# ---------------------------------------------------------- the piecewise parser


def reference(raw: bytes) -> tuple[str, Any]:
    """What a whole parse gives: ("ok", (records, other fields)) or ("error", ...)."""
    try:
        body = loads(raw)
    except ValueError:
        return "malformed", None
    if not isinstance(body, dict):
        return "not-object", None
    try:
        recs = prepare_records(body.get("records"), body.get("node"), CAPS)
    except TopicsError as err:
        return "error", (err.status, err.code, err.message)
    rest = {k: v for k, v in body.items() if k != "records"}
    return "ok", (list(recs), rest)


def piecewise(raw: bytes, chunk: int) -> tuple[str, Any]:
    steps = iter_write_body(raw, CAPS, chunk_bytes=chunk)
    n = 0
    try:
        while True:
            next(steps)
            n += 1
    except StopIteration as done:
        body = done.value
    except TopicsError as err:
        return "error", (err.status, err.code, err.message)
    if body is None:
        return "declined", None
    assert type(body["records"]) is PreparedRecords
    recs = prepare_records(body["records"], body.get("node"), CAPS)
    rest = {k: v for k, v in body.items() if k != "records"}
    return "ok", (list(recs), rest)


def check(raw: bytes, chunk: int) -> str:
    ref = reference(raw)
    got = piecewise(raw, chunk)
    if got[0] == "declined":
        return "declined"
    assert got == ref, (raw[:300], chunk)
    return got[0]


TRICKY = st.sampled_from(
    [
        '},{"data":1}',
        '}, {"tag": "x"',
        '"records":[',
        "]}",
        '\\"},{"data":',
        '}\n,\n{"node":',
        "é",
        "\U0001f600",
        "",
    ]
)
LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | TRICKY
)
VALUE = st.recursive(
    LEAF,
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(
            st.sampled_from(["data", "tag", "node", "meta", "k"]) | TRICKY, kids, max_size=3
        )
    ),
    max_leaves=8,
)


SHORT = st.text(max_size=6)


@st.composite
def records(draw: st.DrawFn) -> Any:
    out = []
    hostile = draw(st.integers(0, 3)) == 0  # a quarter of the bodies carry a bad record
    for _ in range(draw(st.integers(0, 45) if hostile else st.integers(1, 30))):
        if hostile and draw(st.integers(0, 10)) == 0:
            out.append(draw(VALUE))  # possibly not an object, no data, wrong types
            continue
        rec: dict[str, Any] = {}
        keys = draw(st.permutations(["data", "tag", "node", "meta", "x"]))
        for k in keys[: draw(st.integers(0, 5))]:
            if k == "tag":
                rec[k] = draw(st.none() | SHORT | TRICKY)
            elif k == "node":
                rec[k] = draw(st.none() | SHORT)
            elif k == "meta":
                rec[k] = draw(st.none() | st.dictionaries(SHORT, LEAF, max_size=3))
            else:
                rec[k] = draw(VALUE)
        rec.setdefault("data", draw(VALUE))
        out.append(rec)
    return out


SEPARATORS = [(",", ":"), (", ", ": "), (" ,\n", " :\t"), ("\r\n,", ":\r\n")]


@st.composite
def write_bodies(draw: st.DrawFn) -> bytes:
    recs = draw(records())
    others = draw(
        st.dictionaries(
            st.sampled_from(["node", "idempotency_key", "create", "config", "zz"]),
            VALUE,
            max_size=3,
        )
    )
    items = list(others.items())
    where = draw(st.integers(0, len(items)))
    items.insert(where, ("records", recs))
    if draw(st.integers(0, 15)) == 0:
        items.append(("records", draw(records())))  # a duplicate key: the last wins
    item_sep, key_sep = draw(st.sampled_from(SEPARATORS))
    lead = draw(st.sampled_from(["", " ", "\n\t"]))
    text = (
        lead
        + "{"
        + item_sep.join(
            json.dumps(k) + key_sep + json.dumps(v, separators=(item_sep, key_sep))
            for k, v in items
        )
        + "}"
    )
    raw = text.encode()
    mutation = draw(st.integers(0, 11))
    if mutation == 0 and raw:  # cut it short
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif mutation == 1 and raw:  # one stray byte somewhere
        i = draw(st.integers(0, len(raw) - 1))
        raw = (
            raw[:i]
            + draw(st.sampled_from([b",", b"]", b"}", b"{", b'"', b"\\", b"\xff"]))
            + raw[i:]
        )
    elif mutation == 2:  # hostile values spliced in for a record's data
        bad = draw(st.sampled_from([b'"\\ud800"', b"1e400", b"[" * 1100 + b"]" * 1100]))
        raw = raw.replace(
            b'"data"' + key_sep.encode() + b"null", b'"data"' + key_sep.encode() + bad, 1
        )
    return raw


@settings(
    max_examples=max(1, int(100 * SCALE)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    raw=write_bodies(),
    chunk=st.sampled_from([1, 7, 40, 300, 1 << 20]),
    window=st.sampled_from([1, 16, 200, 1 << 20]),
)
def test_piecewise_parse_equals_whole_parse(
    monkeypatch: pytest.MonkeyPatch, raw: bytes, chunk: int, window: int
) -> None:
    monkeypatch.setattr(records_mod, "_SCAN_WINDOW", window)
    check(raw, chunk)


def test_piecewise_parse_takes_the_common_layouts() -> None:
    """Bodies as clients send them are parsed piecewise, not declined."""
    recs = [
        {"data": {"i": i, "s": "x" * 50, "nested": [{"data": 1}, {"tag": 2}]}} for i in range(30)
    ]
    recs[3]["tag"] = "t"
    recs[4]["node"] = ""
    recs[5]["node"] = "own"
    for body in (
        {"records": recs},
        {"records": recs, "node": "batch"},
        {"idempotency_key": "k", "records": recs},
        {"node": "batch", "records": recs, "create": True, "config": {"a": [1, {"b": [2]}]}},
    ):
        for raw in (orjson.dumps(body), json.dumps(body, indent=2).encode()):
            for chunk in (1, 64, 1000):
                assert check(raw, chunk) == "ok", (body.keys(), chunk)
    got = piecewise(orjson.dumps({"records": recs, "node": "batch"}), 64)[1][0]
    assert [r.node for r in got[3:6]] == ["batch", None, "own"]


def test_piecewise_errors_keep_their_precedence() -> None:
    # A bad record early and malformed JSON later: the whole parse says malformed.
    raw = b'{"records":[{"data":1,"tag":5},' + b'{"data":2},' * 50 + b'{"data":}]}'
    assert piecewise(raw, 16) == ("declined", None)
    # Too many records beats a bad record and a bad batch node.
    raw = orjson.dumps({"records": [{"tag": 1}] + [{"data": 1}] * 45, "node": 7})
    assert check(raw, 16) == "error"
    assert piecewise(raw, 16)[1][1] == "batch_too_large"
    # A bad batch node beats a bad record.
    raw = orjson.dumps({"records": [{"data": 1}] * 30 + [{"tag": 1}], "node": 7})
    assert piecewise(raw, 16)[1] == (400, "invalid_request", "node must be a string")
    # A record error carries its index in the whole array.
    raw = orjson.dumps({"records": [{"data": 1}] * 30 + [{"data": 1, "tag": 1}]})
    assert piecewise(raw, 16)[1] == (400, "invalid_request", "records[30].tag must be a string")


def test_piecewise_refuses_hostile_values_in_any_piece() -> None:
    good = b'{"data":{"k":"v"}},' * 40
    for bad in (b'"\\ud800"', b"1e400", b"-1e400", b"[" * 1030 + b"]" * 1030):
        raw = b'{"records":[' + good + b'{"data":' + bad + b"}," + good + b'{"data":0}]}'
        assert reference(raw) == ("malformed", None)
        assert piecewise(raw, 64) == ("declined", None)
    deep = b"[" * 300 + b"]" * 300
    raw = b'{"records":[' + good + b'{"data":' + deep + b"}]}"
    assert check(raw, 64) == "error"


def test_piecewise_parse_takes_records_with_any_first_field() -> None:
    recs = [{"id": i, "data": {"items": [{"a": 1}, {"b": 2}]}, "tag": "t"} for i in range(40)]
    raw = orjson.dumps({"records": recs})
    for chunk in (1, 50, 500):
        assert check(raw, chunk) == "ok"


def drain(steps: Any) -> Any:
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value


@pytest.mark.parametrize(
    "item",
    [b"{}", b"[]", b'{"a":{}}', b"1.5", b'"ab"', b"[1,2]"],
)
def test_dense_bodies_are_refused_before_parsing(item: bytes) -> None:
    """A value every few bytes would become a Python object many times its text."""
    raw = b'{"x":[' + b",".join([item] * (2 * 1024 * 1024 // len(item))) + b"]}"
    for body in (raw, bytearray(raw), raw.decode()):
        with pytest.raises(TopicsError) as e:
            drain(iter_density_check(body))
        assert (e.value.status, e.value.code) == (413, "payload_too_large")


def test_ordinary_large_bodies_pass_the_density_check() -> None:
    text = "x" * 200
    recs = [{"data": {"i": i, "s": text, "v": [1.5, 2.5]}, "tag": "t"} for i in range(8000)]
    raw = orjson.dumps({"node": "n", "records": recs})
    assert len(raw) > 1 << 20
    assert drain(iter_density_check(raw)) is None
    assert drain(iter_density_check(b"[" + b"1," * 1000 + b"1]")) is None  # small: not counted
