"""Hypothesis fuzz of the frame decoders (reliability-anchors §3.3 `f_fuzz_wal_decoder`, §5 row 4).

* arbitrary bytes and near-miss frames decode only to Frame / Torn / End, never raise;
* a log of random valid frames, then truncated / zeroed / bit-flipped at a random
  point: `scan` returns exactly the frames wholly before the damaged one and ends
  at its start (never skips ahead, never fabricates);
* any single corrupted byte of an encoded frame is never decoded as a valid frame.

Budgets keep the whole file around a few seconds; raise them with
`TOPICS_FUZZ_EXAMPLES=<n>` for a longer soak.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topics.format import frame as F
from topics.format.frame import End, Frame, Torn

N = int(os.environ.get("TOPICS_FUZZ_EXAMPLES", "0"))


def budget(n: int) -> settings:
    return settings(
        max_examples=max(n, N),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def check_outcome(r: object, off: int) -> None:
    assert type(r) in (Frame, Torn, End), r
    if isinstance(r, Torn):
        assert r.reason != F.TORN_UNREADABLE, r  # the safety net is never what answers
        assert r.offset == off
    elif isinstance(r, End):
        assert r.offset == off
    else:
        assert isinstance(r, Frame)
        assert r.offset == off and r.size >= F.SEG_MIN_FRAME_SIZE


# -- strategies ----------------------------------------------------------------

text = st.one_of(st.none(), st.text(max_size=6))
json_bytes = st.binary(max_size=40)


@dataclass(frozen=True)
class Spec:
    kind: str
    args: tuple[Any, ...]

    def wal(self) -> bytes:
        if self.kind == "append":
            topic_id, seq, ts, node, tag, data, meta, durable = self.args
            return F.encode_record(topic_id, seq, ts, node, tag, data, meta, durable=durable)
        typ, topic_id, body, seq, ts = self.args
        return F.encode_control(typ, topic_id, body, seq=seq, ts=ts)

    def seg(self) -> bytes:
        assert self.kind == "append"
        topic_id, seq, ts, node, tag, data, meta, durable = self.args
        return F.encode_record(
            topic_id, seq, ts, node, tag, data, meta, durable=durable, segment=True
        )


u64 = st.integers(min_value=0, max_value=2**64 - 1)
appends = st.builds(
    lambda *a: Spec("append", a),
    u64,
    u64,
    u64,
    text,
    text,
    json_bytes,
    st.one_of(st.none(), json_bytes),
    st.booleans(),
)
controls = st.builds(
    lambda *a: Spec("control", a),
    st.sampled_from(sorted(F.CONTROL_TYPES)),
    u64,
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=4)),
        max_size=3,
    ),
    u64,
    u64,
)
specs = st.one_of(appends, controls)


def key(f: Frame) -> tuple[Any, ...]:
    return (f.type, f.flags, f.topic_id, f.seq, f.ts, f.node, f.tag, f.payload, f.offset, f.size)


# -- arbitrary input never raises ------------------------------------------------


@budget(600)
@given(st.binary(max_size=300), st.integers(min_value=-4, max_value=310))
def test_decode_frame_arbitrary_bytes(buf: bytes, off: int) -> None:
    check_outcome(F.decode_frame(buf, off), off)
    check_outcome(F.decode_segment_frame(buf, off), off)


@budget(300)
@given(st.binary(max_size=200))
def test_scan_arbitrary_bytes(buf: bytes) -> None:
    for res in (F.scan(buf), F.scan_segment(buf)):
        assert 0 <= res.end_offset <= len(buf)
        assert res.end_offset == sum(f.size for f in res.frames)
        assert res.torn is None or res.torn.offset == res.end_offset


@st.composite
def near_miss(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A valid WAL or segment frame with a few bytes overwritten, cut, or extended."""
    seg = draw(st.booleans())
    spec = draw(appends if seg else specs)
    b = bytearray(spec.seg() if seg else spec.wal())
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(b) - 1))
        b[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        b[0:4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little")
    if draw(st.booleans()):
        b = b[: draw(st.integers(0, len(b)))]
    b += draw(st.binary(max_size=8))
    return bytes(b), seg


@budget(600)
@given(near_miss())
def test_near_miss_frames_never_raise(case: tuple[bytes, bool]) -> None:
    buf, seg = case
    decode = F.decode_segment_frame if seg else F.decode_frame
    r = decode(buf, 0)
    check_outcome(r, 0)
    if isinstance(r, Frame):  # whatever decodes must re-encode to exactly the bytes read
        raw = buf[: r.size]
        if seg:
            assert raw == F.encode_record(
                r.topic_id,
                r.seq,
                r.ts,
                r.node,
                r.tag,
                r.data,
                r.meta,
                durable=r.durable,
                segment=True,
            )
        else:
            flags = r.flags & ~(F.F_HAS_NODE | F.F_HAS_TAG)
            assert raw == F.encode_frame(
                r.type, r.topic_id, r.seq, r.ts, r.payload, node=r.node, tag=r.tag, flags=flags
            )


# -- damaged logs: scan returns exactly the prefix before the damage -------------


@budget(300)
@given(
    st.lists(specs, min_size=1, max_size=8),
    st.sampled_from(["truncate", "zero", "flip", "garble"]),
    st.data(),
)
def test_scan_returns_exactly_the_frames_before_the_damage(
    frames: list[Spec], damage: str, data: st.DataObject
) -> None:
    encoded = [s.wal() for s in frames]
    log = b"".join(encoded)
    starts = [0]
    for e in encoded:
        starts.append(starts[-1] + len(e))
    clean = F.scan(log)
    assert clean.torn is None and clean.end_offset == len(log)
    assert [f.offset for f in clean.frames] == starts[:-1]

    k = data.draw(st.integers(0, len(log) - 1 if damage in ("flip", "garble") else len(log)))
    b = bytearray(log)
    if damage == "truncate":
        b = b[:k]
    elif damage == "zero":
        b[k:] = bytes(len(b) - k)
    elif damage == "flip":
        b[k] ^= 1 << data.draw(st.integers(0, 7))
    else:  # garble: random bytes from k to the end of the frame holding k
        j = max(i for i in range(len(encoded)) if starts[i] <= k)
        n = starts[j + 1] - k
        new = data.draw(st.binary(min_size=n, max_size=n))
        b[k : starts[j + 1]] = new
    damaged = bytes(b)
    # The first frame touched by the damage (a frame ending exactly at k is intact).
    j = next((i for i in range(len(encoded)) if starts[i + 1] > k), len(encoded))
    if damaged == log:  # a garble that happened to rewrite the same bytes
        j = len(encoded)
    res = F.scan(damaged)
    assert [key(f) for f in res.frames] == [key(f) for f in clean.frames[:j]]
    assert res.end_offset == starts[j]
    if j < len(encoded):
        rest = damaged[starts[j] :]
        zero_len = len(rest) >= 4 and rest[:4] == b"\x00\x00\x00\x00"
        zero_tail = len(rest) < 4 and not any(rest)
        if zero_len or zero_tail:
            assert res.torn is None
        else:
            assert res.torn is not None and res.torn.offset == starts[j]
    else:
        assert res.torn is None


# -- a corrupted byte is never a (different) valid frame ------------------------


@budget(400)
@given(specs, st.data())
def test_single_corrupted_byte_never_decodes_as_a_frame(spec: Spec, data: st.DataObject) -> None:
    for enc, decode in (
        (spec.wal(), F.decode_frame),
        (spec.seg() if spec.kind == "append" else None, F.decode_segment_frame),
    ):
        if enc is None:
            continue
        assert isinstance(decode(enc, 0), Frame)
        i = data.draw(st.integers(0, len(enc) - 1))
        mask = data.draw(st.integers(1, 255))
        b = bytearray(enc)
        b[i] ^= mask
        tail = data.draw(st.binary(max_size=16))
        r = decode(bytes(b) + tail, 0)
        check_outcome(r, 0)
        assert not isinstance(r, Frame), (i, mask, r)


@budget(150)
@given(appends)
def test_every_single_byte_flip_is_detected_exhaustively(spec: Spec) -> None:
    for enc, decode in ((spec.wal(), F.decode_frame), (spec.seg(), F.decode_segment_frame)):
        for i in range(len(enc)):
            b = bytearray(enc)
            b[i] ^= 0xFF
            assert not isinstance(decode(bytes(b), 0), Frame), i


@budget(200)
@given(appends)
def test_wal_to_segment_round_trip(spec: Spec) -> None:
    wal = spec.wal()
    seg = F.wal_to_segment(wal)
    assert seg == spec.seg()
    assert seg[4:-8] == wal[5:-8]
    w, s = F.decode_frame(wal), F.decode_segment_frame(seg)
    assert isinstance(w, Frame) and isinstance(s, Frame)
    assert key(w)[:8] == key(s)[:8] and s.size == w.size - 1
    topic_id, seq, ts, node, tag, data_, meta, durable = spec.args
    assert (s.topic_id, s.seq, s.ts, s.node, s.tag, s.data, s.meta, s.durable) == (
        topic_id,
        seq,
        ts,
        node,
        tag,
        data_,
        meta,
        durable,
    )


# -- the columnar scanner agrees with scan -------------------------------------


@st.composite
def checksummed(draw: st.DrawFn) -> bytes:
    """A frame whose checksum is right but whose header may break any other rule."""
    typ = draw(st.integers(0, 13))
    flags = draw(st.integers(0, 255))
    nl, tl = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    body = draw(st.binary(min_size=0, max_size=24))
    dl = draw(st.one_of(st.just(max(len(body) - nl - tl, 0)), st.integers(0, 40)))
    head = F.HEADER.pack(
        F.MIN_FRAME_LEN - 8 + len(body) + 8, typ, flags, 7, draw(u64), draw(u64), nl, tl, dl
    )
    raw = head + body
    return raw + F.CHECKSUM.pack(F.checksum(raw[4:]))


log_pieces = st.one_of(
    specs.map(lambda s: s.wal()),
    checksummed(),
    st.binary(max_size=6),
    st.just(b"\x00" * 8),
)


def same_scan(buf: bytes, start: int = 0) -> None:
    want = F.scan(buf, start)
    got = F.scan_columns(buf, start)
    assert got.end_offset == want.end_offset
    assert got.torn == want.torn
    assert len(got.cols) == len(want.frames)
    for row, fr in zip(got.cols.tolist(), want.frames, strict=True):
        off, size, typ, flags, topic_id, seq, ts, nl, tl, dl = row
        assert (off, size, typ, flags, topic_id, seq, ts) == (
            fr.offset,
            fr.size,
            fr.type,
            fr.flags,
            fr.topic_id,
            fr.seq,
            fr.ts,
        )
        assert dl == len(fr.payload)
        assert nl == (len(fr.node.encode()) if fr.node is not None else 0)
        assert tl == (len(fr.tag.encode()) if fr.tag is not None else 0)


@budget(500)
@given(st.lists(log_pieces, max_size=8), st.integers(0, 3))
def test_scan_columns_agrees_with_scan(pieces: list[bytes], start: int) -> None:
    buf = b"".join(pieces)
    same_scan(buf)
    same_scan(buf, min(start, len(buf)))


@budget(200)
@given(st.binary(max_size=120), st.integers(-2, 130))
def test_scan_columns_arbitrary_bytes(buf: bytes, start: int) -> None:
    same_scan(buf, start)


# -- bulk WAL -> segment conversion ------------------------------------------------


@budget(150)
@given(st.lists(appends, min_size=1, max_size=12), st.binary(max_size=5))
def test_segment_blob_equals_wal_to_segment_per_frame(specs_: list[Spec], pad: bytes) -> None:
    import numpy as np

    from topics.storage.segment import segment_blob

    wal = [s.wal() for s in specs_]
    buf = pad + b"".join(wal)
    offs = np.cumsum([len(pad), *[len(w) for w in wal[:-1]]])
    # Two buffers: the frames alternate between `buf` and a copy of it.
    which = np.arange(len(wal)) % 2
    blob, lens, flags, seqs = segment_blob(
        [buf, bytes(buf)], which, offs, np.array([len(w) for w in wal])
    )
    assert blob == b"".join(F.wal_to_segment(w) for w in wal)
    assert lens.tolist() == [len(w) - 1 for w in wal]
    assert flags.tolist() == [w[5] for w in wal]
    assert seqs.tolist() == [s.args[1] for s in specs_]


# -- a batch laid out ahead of staging, then sealed ----------------------------------


@budget(150)
@given(
    st.lists(
        st.tuples(json_bytes, st.one_of(st.none(), json_bytes), text, text, st.integers(0, 3)),
        max_size=10,
    ),
    u64,
    u64,
    u64,
    st.booleans(),
    st.integers(1, 300),
    st.integers(1, 4),
)
def test_layout_then_seal_equals_encode_batch(
    recs: list[tuple[Any, ...]],
    topic_id: int,
    first_seq: int,
    ts: int,
    durable: bool,
    step_bytes: int,
    step_records: int,
) -> None:
    from topics.engine.records import NewRecord

    batch = [NewRecord(d, m, n, t, len(d), h) for d, m, n, t, h in recs]
    try:
        want: bytes | None = F.encode_batch(topic_id, first_seq, ts, batch, durable)[0]
    except F.FrameError:
        want = None  # a seq past u64, or text that is not UTF-8: both must refuse
    steps = F.layout_batch(batch, step_bytes=step_bytes, step_records=step_records)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        layout = done.value
    except F.FrameError:
        assert want is None
        return
    try:
        got = bytes(F.seal_batch(layout, topic_id, first_seq, ts, durable))
    except F.FrameError:
        assert want is None
        return
    assert got == want
