"""The compiled frame encoders give the bytes of the reference loops.

`topics.format._codec` encodes a write's Append frames and turns trusted WAL
frames into segment frames (docs/ARCHITECTURE.md, "Compiled code"); the Python
loops `python_encode_batch` and `_python_segment_frames` are the reference.
Both run here over the same records: every combination of node, tag and meta,
empty strings, multi-byte text, and values at the edge of their fields.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.jsonvalues import json_values as _json
from tests.support.jsonvalues import short_text as _text

from topics.config import Limits
from topics.engine.records import NewRecord, _prepare_each, native_prepare, prepare_records
from topics.errors import TopicsError
from topics.format.frame import (
    FrameError,
    encode_batch,
    encode_record,
    native_encode_batch,
    native_prepare_records,
    native_segment_frames,
    python_encode_batch,
    scan,
    wal_to_segment,
)
from topics.storage.segment import _python_segment_frames, segment_blob

pytestmark = pytest.mark.skipif(
    native_encode_batch is None or native_segment_frames is None or native_prepare_records is None,
    reason="compiled encoders not built",
)

_record = st.builds(
    lambda data, meta, node, tag: NewRecord(
        orjson.dumps(data), None if meta is None else orjson.dumps(meta), node, tag, 0
    ),
    _json,
    st.none() | _json,
    st.none() | _text,
    st.none() | _text,
)
_u64 = st.integers(0, 2**64 - 1)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_record, min_size=0, max_size=20),
    _u64,
    st.integers(0, 2**63),
    _u64,
    st.booleans(),
)
def test_encode_batch_same_bytes(records, topic_id, first_seq, ts, durable) -> None:
    want = python_encode_batch(topic_id, first_seq, ts, records, durable)
    got = native_encode_batch(topic_id, first_seq, ts, list(records), durable)
    assert got == want
    if records:  # and the frames read back as what was written
        frames = scan(got[0]).frames
        assert [f.seq for f in frames] == list(range(first_seq, first_seq + len(records)))
        assert [(f.node, f.tag, f.data, f.meta) for f in frames] == [
            (r.node, r.tag, r.data, r.meta) for r in records
        ]


@pytest.mark.parametrize(
    "args",
    [
        (1, 2**64 - 1, 5, [NewRecord(b"1", None, None, None, 1)] * 2),  # seq past u64
        (2**64, 0, 5, [NewRecord(b"1", None, None, None, 1)]),  # topic id past u64
        (1, 0, -1, [NewRecord(b"1", None, None, None, 1)]),  # negative ts
        (1, 0, 5, [NewRecord(b"1", None, "\ud800", None, 1)]),  # lone surrogate node
        (1, 0, 5, [NewRecord(b"1", None, None, "x" * 65536, 1)]),  # tag past u16
    ],
)
def test_encode_batch_refuses_alike(args) -> None:
    for encode in (python_encode_batch, encode_batch):
        with pytest.raises(FrameError):
            encode(*args, True)


def test_encode_batch_takes_other_record_shapes() -> None:
    """Records that are not tuples go to the reference loop, with the same result."""
    recs = [[b'"a"', None, "n", None], (b"2", b'{"m":1}', None, "t")]
    assert encode_batch(3, 10, 99, iter(recs), False) == python_encode_batch(3, 10, 99, recs, False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(_record, min_size=1, max_size=6), min_size=1, max_size=4), st.data())
def test_segment_frames_same_bytes(batches, data) -> None:
    bufs, which, offs, lens = [], [], [], []
    seq = 1
    for k, recs in enumerate(batches):
        pad = data.draw(st.integers(0, 7))  # frames need not start at 0
        blob, sizes = encode_batch(9, seq, 1234, recs, True)
        bufs.append(b"\0" * pad + blob)
        at = pad
        for s in sizes:
            which.append(k)
            offs.append(at)
            lens.append(s)
            at += s
        seq += len(recs)
    w, o, ln = (np.array(v, np.int64) for v in (which, offs, lens))
    want = _python_segment_frames(bufs, w, o, ln - 13)
    assert native_segment_frames(bufs, w, o, ln) == want
    frames = [bufs[k][a : a + b] for k, a, b in zip(which, offs, lens, strict=True)]
    assert want == b"".join(wal_to_segment(f) for f in frames)
    blob, flen, flags, seqs = segment_blob(bufs, w, o, ln)
    assert blob == want and list(seqs) == list(range(1, seq)) and int(flen.sum()) == len(blob)


def test_segment_frames_refuses_a_frame_outside_its_buffer() -> None:
    blob, sizes = encode_batch(1, 1, 1, [NewRecord(b"1", None, None, None, 1)], True)
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError):
        native_segment_frames([blob], one, one + 1, np.array(sizes, np.int64))
    with pytest.raises(ValueError):
        native_segment_frames([blob], one + 1, one, np.array(sizes, np.int64))


def test_encode_record_agrees_with_the_batch() -> None:
    r = NewRecord(b'{"x":[1,2]}', b'{"k":"v"}', "node-1", "tag-1", 0)
    blob, _ = encode_batch(4, 77, 5, [r], True)
    assert blob == encode_record(4, 77, 5, "node-1", "tag-1", r.data, r.meta, durable=True)


# -- records on their way in -----------------------------------------------------------

_small = Limits(
    max_record_bytes=60, max_meta_bytes=24, max_meta_keys=2, max_tag_bytes=6, max_node_bytes=6
)
_field = st.none() | _text | st.integers(0, 3) | st.just("\ud800") | st.just("é" * 4)
_raw_record = st.one_of(
    st.dictionaries(
        st.sampled_from(["data", "meta", "tag", "node", "other"]),
        _json | _field,
        max_size=5,
    ),
    _json,  # not an object at all
)


def _python(records, node, limits):
    out: list[NewRecord] = []
    try:
        _prepare_each(records, node, out, 0, None, limits)
    except TopicsError as e:
        return e
    return out


@settings(max_examples=250, deadline=None)
@given(
    st.lists(_raw_record, min_size=1, max_size=6),
    st.none() | st.sampled_from(["bn", "n2"]),
    st.sampled_from([_small, Limits()]),
)
def test_prepare_records_fast_path_agrees(records, node, limits) -> None:
    """The compiled loop gives the reference's records, or steps aside exactly where
    the reference refuses the write (which then gives the error)."""
    want = _python(records, node, limits)
    got = native_prepare(records, node, limits)
    if isinstance(want, TopicsError):
        assert got is None
    else:
        assert got == want
        assert all(type(r) is NewRecord for r in got)


def test_prepare_records_gives_the_errors_of_the_reference() -> None:
    for records, code in [
        ([{"data": 1}, {"meta": {}}], "invalid_request"),
        ([{"data": "x" * 70}], "record_too_large"),
        ([{"data": 1, "tag": 5}], "invalid_request"),
        ([{"data": 1, "node": "\ud800"}], "invalid_request"),
    ]:
        with pytest.raises(TopicsError) as info:
            prepare_records(records, None, _small)
        assert info.value.code == code
