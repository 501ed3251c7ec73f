"""The compiled record renderer gives the bytes of the reference renderer.

`topics.format._render` renders the wire object of each record straight from
its frame (docs/ARCHITECTURE.md, "Compiled code"); the Python loop in
`topics.engine.frames.python_render` is the reference. Both run here over the
same frames, WAL and segment, with every combination of node, tag and meta,
strings that need JSON escapes, and damaged frames.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.jsonvalues import json_values as _json
from tests.support.jsonvalues import short_text as _text

from topics.engine.frames import FrameCorrupt, python_render
from topics.format.frame import SEG_HDR, WAL_HDR, encode_record, native_render

pytestmark = pytest.mark.skipif(native_render is None, reason="compiled renderer not built")

_record = st.tuples(
    _json,  # data
    st.none() | _json,  # meta
    st.none() | _text,  # node
    st.none() | _text,  # tag
    st.integers(0, 2**48),  # ts (ms)
)


class _Src:
    """A frame source over one buffer (what a segment or a chunk gives the renderers)."""

    def __init__(self, buf: bytes, hdr: int, verify: bool) -> None:
        self.buf = buf
        self.hdr = hdr
        self.verify = verify
        self.blocking = False
        self.name = "test"

    def span(self, lo: int, hi: int) -> tuple[bytes, int]:
        return self.buf, 0

    def fetch(self, lo: int, hi: int) -> bytes:
        return self.buf[lo:hi]


def _frames(records: list[tuple], segment: bool, first_seq: int) -> tuple[bytes, list, list]:
    parts, offs, lens = [], [], []
    at = 0
    for k, (data, meta, node, tag, ts) in enumerate(records):
        f = encode_record(
            7,
            first_seq + k,
            ts,
            node,
            tag,
            orjson.dumps(data),
            None if meta is None else orjson.dumps(meta),
            durable=True,
            segment=segment,
        )
        parts.append(f)
        offs.append(at)
        lens.append(len(f))
        at += len(f)
    return b"".join(parts), offs, lens


def _both(src: _Src, seqs, offs, lens, tss, **opts):
    """(python result, native result): the rendered list, or the FrameCorrupt raised."""
    results = []
    for native in (False, True):
        out: list[bytes] = []
        try:
            if native:
                bad = native_render(
                    out,
                    src.buf,
                    0,
                    np.asarray(seqs, np.int64),
                    np.asarray(offs, np.int64),
                    np.asarray(lens, np.int64),
                    np.asarray(tss, np.int64),
                    src.hdr,
                    src.verify,
                    opts["include_tags"],
                    opts["include_meta"],
                    opts["include_data"],
                )
                if bad is not None:
                    raise FrameCorrupt(src.name, seqs[bad[0]], bad[1])
            else:
                python_render(src, src.buf, 0, seqs, offs, lens, tss, out, {}, **opts)
        except FrameCorrupt as e:
            results.append(("corrupt", e.seq, e.reason, out))
            continue
        results.append(("ok", out))
    return results


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(_record, min_size=1, max_size=8),
    segment=st.booleans(),
    verify=st.booleans(),
    include_tags=st.booleans(),
    include_meta=st.booleans(),
    include_data=st.booleans(),
    first_seq=st.integers(1, 2**40),
)
def test_native_matches_reference(
    records, segment, verify, include_tags, include_meta, include_data, first_seq
):
    buf, offs, lens = _frames(records, segment, first_seq)
    src = _Src(buf, SEG_HDR if segment else WAL_HDR, verify)
    seqs = [first_seq + k for k in range(len(records))]
    tss = [r[4] for r in records]
    py, nat = _both(
        src,
        seqs,
        offs,
        lens,
        tss,
        include_tags=include_tags,
        include_meta=include_meta,
        include_data=include_data,
    )
    assert py == nat
    assert py[0] == "ok"
    for line, (data, meta, node, tag, ts) in zip(py[1], records, strict=True):
        obj = orjson.loads(line)  # valid JSON, with what the options ask for
        assert obj["$ts"] == ts
        assert obj.get("$node") == node
        assert obj.get("$tag") == (tag if include_tags else None)
        if include_data:
            assert obj["data"] == data
        if include_meta and meta is not None:
            assert obj["meta"] == meta


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(_record, min_size=1, max_size=5),
    segment=st.booleans(),
    data=st.data(),
)
def test_damaged_frames_are_reported_alike(records, segment, data):
    buf, offs, lens = _frames(records, segment, 100)
    pos = data.draw(st.integers(0, len(buf) - 1))
    damaged = bytearray(buf)
    damaged[pos] ^= data.draw(st.integers(1, 255))
    src = _Src(bytes(damaged), SEG_HDR if segment else WAL_HDR, True)
    seqs = [100 + k for k in range(len(records))]
    tss = [r[4] for r in records]
    py, nat = _both(
        src, seqs, offs, lens, tss, include_tags=True, include_meta=True, include_data=True
    )
    assert py == nat
    assert py[0] == "corrupt"  # every byte of a frame is covered by a check


def test_wrong_seq_and_out_of_bounds():
    buf, offs, lens = _frames([({"a": 1}, None, None, None, 5)], True, 10)
    src = _Src(buf, SEG_HDR, True)
    opts = {"include_tags": False, "include_meta": True, "include_data": True}
    assert _both(src, [11], offs, lens, [5], **opts)[1][:3] == (
        "corrupt",
        11,
        "frame carries another seq",
    )
    for bad_off, bad_len in ((len(buf), lens[0]), (0, len(buf) + 1), (-1, lens[0])):
        py, nat = _both(src, [10], [bad_off], [bad_len], [5], **opts)
        assert py == nat
        assert nat[2] == "frame outside the file"


@pytest.mark.parametrize(
    ("columns", "error"),
    [
        # offs shorter than the others
        ((np.zeros(2, np.int64), np.zeros(1, np.int64)), ValueError),
        # seqs of another width than int64
        ((np.zeros(2, np.int32), np.zeros(2, np.int64)), TypeError),
    ],
)
def test_rejects_bad_columns(columns, error):
    seqs, offs = columns
    flags = (SEG_HDR, True, False, True, True)
    with pytest.raises(error):
        native_render([], b"", 0, seqs, offs, np.zeros(2, np.int64), np.zeros(2, np.int64), *flags)
