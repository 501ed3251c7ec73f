"""WAL / segment frames: exact byte layout, round trips, and the torn/corrupt decoder rules.

docs/FORMATS.md "WAL frame" and "Segment files"; reliability-anchors §3.3 and §5 row 4.
"""

from __future__ import annotations

import mmap
import random
from typing import Any

import msgpack
import pytest
import xxhash

from topics.engine.records import NewRecord
from topics.format import frame as F
from topics.format.frame import End, Frame, FrameError, Torn

TS = 1_700_000_000_123
DATA = b'{"a":1,"b":"x"}'
META = b'{"m":true}'


def le(v: int, n: int) -> bytes:
    return v.to_bytes(n, "little")


def rechecksum(frame: bytes | bytearray) -> bytes:
    """Recompute the trailing XXH3 of a (deliberately malformed) WAL or segment frame."""
    b = bytearray(frame)
    b[-8:] = le(xxhash.xxh3_64_intdigest(bytes(b[4:-8])), 8)
    return bytes(b)


def raw_frame(
    typ: int,
    flags: int,
    node: bytes,
    tag: bytes,
    payload: bytes,
    *,
    topic_id: int = 9,
    seq: int = 5,
    ts: int = TS,
) -> bytes:
    """Hand-build a WAL frame byte by byte at the documented offsets (no frame.py involved)."""
    frame_len = 34 + len(node) + len(tag) + len(payload) + 8
    b = bytearray(4 + frame_len)
    b[0:4] = le(frame_len, 4)
    b[4] = typ
    b[5] = flags
    b[6:14] = le(topic_id, 8)
    b[14:22] = le(seq, 8)
    b[22:30] = le(ts, 8)
    b[30:32] = le(len(node), 2)
    b[32:34] = le(len(tag), 2)
    b[34:38] = le(len(payload), 4)
    p = 38
    for part in (node, tag, payload):
        b[p : p + len(part)] = part
        p += len(part)
    crc_off = p
    assert crc_off == 4 + frame_len - 8
    b[crc_off:] = le(xxhash.xxh3_64_intdigest(bytes(b[4:crc_off])), 8)
    return bytes(b)


def fields(f: Frame) -> tuple[Any, ...]:
    return (f.type, f.flags, f.topic_id, f.seq, f.ts, f.node, f.tag, f.payload)


def decoded(buf: bytes | bytearray | memoryview, off: int = 0) -> Frame:
    r = F.decode_frame(buf, off)
    assert isinstance(r, Frame), r
    return r


# -- constants and layout ------------------------------------------------------


def test_constants_match_formats_md() -> None:
    assert F.HEADER.format == "<IBBQQQHHI" and F.HEADER.size == 38
    assert F.SEG_HEADER.size == 37 and F.CHECKSUM.size == 8
    assert (F.MIN_FRAME_LEN, F.MIN_FRAME_SIZE) == (42, 46)
    assert (F.SEG_MIN_FRAME_LEN, F.SEG_MIN_FRAME_SIZE) == (41, 45)
    assert [
        F.APPEND,
        F.TOPIC_CREATE,
        F.TOPIC_DELETE,
        F.ROUTER_CREATE,
        F.ROUTER_DELETE,
        F.DELETE,
        F.EVICT_WATERMARK,
        F.CHECKPOINT_MARK,
        F.CONFIG_UPDATE,
        F.LEASE,
        F.HEAD_WATERMARK,
        F.SYNC_MARK,
        F.LOST,
    ] == list(range(1, 14))
    assert F.FRAME_TYPES == frozenset(range(1, 14))
    assert F.CONTROL_TYPES == frozenset(range(2, 14))
    assert (F.F_HAS_TAG, F.F_HAS_NODE, F.F_DURABLE, F.F_HAS_META) == (1, 2, 4, 8)
    assert F.checksum(b"abc") == xxhash.xxh3_64_intdigest(b"abc", seed=0)


def test_append_exact_byte_layout_against_hand_built_frame() -> None:
    node, tag = "nödé", "tag:1"
    got = F.encode_record(0x0102030405060708, 77, TS, node, tag, DATA, None, durable=True)
    want = raw_frame(
        1,
        F.F_HAS_TAG | F.F_HAS_NODE | F.F_DURABLE,
        node.encode(),
        tag.encode(),
        DATA,
        topic_id=0x0102030405060708,
        seq=77,
    )
    assert got == want
    nl, tl = len(node.encode()), len(tag.encode())
    frame_len = 34 + nl + tl + len(DATA) + 8
    assert len(got) == frame_len + 4
    # Every header field at its documented offset.
    assert int.from_bytes(got[0:4], "little") == frame_len
    assert got[4] == 1
    assert got[5] == 0b0111
    assert int.from_bytes(got[6:14], "little") == 0x0102030405060708
    assert int.from_bytes(got[14:22], "little") == 77
    assert int.from_bytes(got[22:30], "little") == TS
    assert int.from_bytes(got[30:32], "little") == nl
    assert int.from_bytes(got[32:34], "little") == tl
    assert int.from_bytes(got[34:38], "little") == len(DATA)
    assert got[38 : 38 + nl] == node.encode()
    assert got[38 + nl : 38 + nl + tl] == tag.encode()
    crc_off = 38 + nl + tl + len(DATA)
    assert got[38 + nl + tl : crc_off] == DATA
    assert crc_off == len(got) - 8
    # Checksum coverage is exactly [4, crc_off): not the length prefix, not itself.
    stored = int.from_bytes(got[crc_off:], "little")
    assert stored == xxhash.xxh3_64_intdigest(got[4:crc_off])
    assert stored != xxhash.xxh3_64_intdigest(got[0:crc_off])
    assert stored != xxhash.xxh3_64_intdigest(got[5:crc_off])
    assert stored != xxhash.xxh3_64_intdigest(got[4 : crc_off - 1])


def test_smallest_frame_is_46_bytes() -> None:
    b = F.encode_frame(F.APPEND, 0, 0, 0, b"")
    assert len(b) == 46 and b[:4] == le(42, 4)
    f = decoded(b)
    assert f.size == 46 and f.payload == b"" and f.node is None and f.tag is None


def test_has_meta_payload_layout() -> None:
    b = F.encode_record(1, 2, 3, "n", None, DATA, META, durable=False)
    assert b == raw_frame(
        1,
        F.F_HAS_NODE | F.F_HAS_META,
        b"n",
        b"",
        le(len(META), 4) + META + DATA,
        topic_id=1,
        seq=2,
        ts=3,
    )
    f = decoded(b)
    assert f.flags & F.F_HAS_META and not f.durable
    assert f.payload == le(len(META), 4) + META + DATA
    assert f.meta == META and f.data == DATA
    # Without meta the payload is the data itself.
    g = decoded(F.encode_record(1, 2, 3, None, None, DATA, None, durable=False))
    assert g.payload == DATA and g.data == DATA and g.meta is None and g.flags == 0
    # Empty meta is present-but-empty, distinct from absent.
    h = decoded(F.encode_record(1, 2, 3, None, None, DATA, b"", durable=True))
    assert h.meta == b"" and h.data == DATA and h.payload == le(0, 4) + DATA


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("node", [None, "", "n1", "ü" * 40, "x" * 65535])
@pytest.mark.parametrize("tag", [None, "", "t:1", "日本"])
@pytest.mark.parametrize("meta", [None, b"", META])
@pytest.mark.parametrize("durable", [False, True])
def test_append_round_trip(
    node: str | None, tag: str | None, meta: bytes | None, durable: bool
) -> None:
    b = F.encode_record(2**64 - 1, 2**63, 2**64 - 1, node, tag, DATA, meta, durable=durable)
    f = decoded(b"\x00" * 0 + b)
    assert (f.type, f.topic_id, f.seq, f.ts) == (F.APPEND, 2**64 - 1, 2**63, 2**64 - 1)
    assert (f.node, f.tag, f.data, f.meta, f.durable) == (node, tag, DATA, meta, durable)
    assert bool(f.flags & F.F_HAS_NODE) == (node is not None)
    assert bool(f.flags & F.F_HAS_TAG) == (tag is not None)
    assert (f.offset, f.size, f.end) == (0, len(b), len(b))


CONTROL_BODIES: dict[int, dict[Any, Any]] = {
    F.TOPIC_CREATE: {"name": "a.b", "config": {"retention": {"max_records": 5}}, "epoch": 3},
    F.TOPIC_DELETE: {"name": "a.b"},
    F.ROUTER_CREATE: {
        "name": "r",
        "source": "a",
        "dest": "b",
        "preserve_node": True,
        "preserve_tag": False,
        "filter": ["glob", "x:*"],
        "allow_cycle": False,
        "guarantee": "at_least_once",
        "cursor": 17,
        "dest_base": 0,
        "forwarded_total": 2**40,
    },
    F.ROUTER_DELETE: {"name": "r"},
    F.DELETE: {"bound": 11, "before_seq": None, "match": ["eq", "t"], "seqs": [1, 2, 3]},
    F.EVICT_WATERMARK: {"l_cap": 4, "l_ttl": 0, "l_trim": 2},
    F.CHECKPOINT_MARK: {"topics": {7: {"seq": 9, "segment": 1, "data_len": 100}}, "shard": 0},
    F.CONFIG_UPDATE: {"config": {"durability": "fsync", "blob": b"\x00\xff"}},
    F.LEASE: {"kind": "claimed", "node": "w1", "lease_id": "L1", "deadline": TS, "deliveries": 1},
    F.HEAD_WATERMARK: {},
}


@pytest.mark.parametrize("typ", sorted(CONTROL_BODIES))
def test_control_round_trip_every_type(typ: int) -> None:
    body = CONTROL_BODIES[typ]
    b = F.encode_control(typ, 42, body, seq=8 if typ in (F.LEASE, F.HEAD_WATERMARK) else 0, ts=TS)
    f = decoded(b)
    assert (f.type, f.topic_id, f.ts, f.node, f.tag, f.flags) == (typ, 42, TS, None, None, 0)
    assert f.seq == (8 if typ in (F.LEASE, F.HEAD_WATERMARK) else 0)
    assert f.payload == msgpack.packb(body, use_bin_type=True)
    assert f.control() == body
    assert b == raw_frame(typ, 0, b"", b"", f.payload, topic_id=42, seq=f.seq, ts=TS)
    assert decoded(F.encode_control(typ, 0, body, durable=True)).durable


@pytest.mark.parametrize("typ", sorted(F.FRAME_TYPES))
def test_encode_frame_every_type(typ: int) -> None:
    payload = b"\x80" if typ != F.APPEND else DATA  # msgpack {} for control types
    b = F.encode_frame(typ, 3, 4, 5, payload, node="n", tag="t", flags=F.F_DURABLE)
    assert b == raw_frame(typ, 0b111, b"n", b"t", payload, topic_id=3, seq=4, ts=5)
    f = decoded(b)
    assert fields(f) == (typ, 0b111, 3, 4, 5, "n", "t", payload)


def test_encode_frame_derives_node_tag_flags() -> None:
    f = decoded(F.encode_frame(F.APPEND, 0, 0, 0, DATA, flags=F.F_HAS_NODE | F.F_HAS_TAG))
    assert f.flags == 0 and f.node is None and f.tag is None


def test_encode_appends_marks_all_but_the_last_frame_of_a_write() -> None:
    recs = [
        NewRecord(DATA, None, None, None, len(DATA)),
        NewRecord(DATA, META, "n1", None, 1),
        NewRecord(b"1", None, "n1", "t", 1),
        NewRecord(b"2", None, "n2", "t", 1),
        NewRecord(b"3", b"{}", None, "", 1),
        NewRecord(b"4", None, "n1", None, 1),
    ]
    for durable in (False, True):
        batch = F.encode_appends(5, 100, TS, recs, durable)
        res = F.scan(batch)
        # Every frame but the last says "more of this write follows" (batch marker).
        assert [bool(f.flags & F.F_BATCH_MORE) for f in res.frames] == [True] * 5 + [False]
        # Apart from that flag (and so the checksum) the bytes match per-record encoding.
        singles = [
            F.encode_record(5, 100 + i, TS, r.node, r.tag, r.data, r.meta, durable=durable)
            for i, r in enumerate(recs)
        ]
        assert singles[-1] == batch[res.frames[-1].offset :]
        for f, one in zip(res.frames[:-1], singles[:-1], strict=True):
            got = bytearray(batch[f.offset : f.offset + f.size])
            got[5] &= ~F.F_BATCH_MORE & 0xFF
            assert got[:-8] == one[:-8]
        assert res.torn is None and res.end_offset == len(batch)
        assert [(f.seq, f.node, f.tag, f.data, f.meta) for f in res.frames] == [
            (100 + i, r.node, r.tag, r.data, r.meta) for i, r in enumerate(recs)
        ]
    assert F.encode_appends(5, 1, TS, [], True) == b""


def _drain(steps: Any) -> tuple[Any, int]:
    """Run a stepping generator to its value; returns (value, steps yielded)."""
    n = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, n
        n += 1


def _batch(rnd: random.Random, n: int) -> list[NewRecord]:
    out = []
    for i in range(n):
        data = b'{"i":%d,"s":"%b"}' % (i, b"x" * rnd.choice([0, 3, 700, 5000]))
        out.append(
            NewRecord(
                data,
                rnd.choice([None, b"{}", META]),
                rnd.choice([None, "", "n1", "n\u00e9\u4e2d"]),
                rnd.choice([None, "", "t", "t\u00e4g" * 20]),
                len(data),
                rnd.choice([0, 2]),
            )
        )
    return out


@pytest.mark.parametrize("seed", range(12))
def test_layout_then_seal_is_byte_identical_to_encode_batch(seed: int) -> None:
    rnd = random.Random(seed)
    recs = _batch(rnd, rnd.choice([0, 1, 2, 17, 60]))
    durable = bool(seed % 2)
    want, sizes = F.encode_batch(9, 1000 + seed, TS, recs, durable)
    layout, steps = _drain(
        F.layout_batch(recs, step_bytes=rnd.choice([1, 4096, 1 << 20]), step_records=7)
    )
    assert layout.records is recs and layout.sizes == sizes and not layout.sealed
    if len(recs) >= 7:
        assert steps >= len(recs) // 7  # sizing yields every 7 records at least
    buf = F.seal_batch(layout, 9, 1000 + seed, TS, durable)
    assert buf is layout.buf and layout.sealed
    assert bytes(buf) == want


def test_a_large_layout_sits_in_an_mmap_written_a_piece_per_step() -> None:
    data = b'"' + b"x" * 65_000 + b'"'
    recs = [NewRecord(data, None, "n", f"t{i}", len(data)) for i in range(40)]  # ~2.5 MiB
    layout, steps = _drain(F.layout_batch(recs, step_bytes=256 * 1024))
    assert isinstance(layout.buf, mmap.mmap) and len(layout.buf) == sum(layout.sizes)
    assert steps >= 8  # ~2.5 MiB in 256 KiB pieces
    assert F.seal_batch(layout, 1, 1, TS, False)[:] == F.encode_batch(1, 1, TS, recs, False)[0]
    small, _ = _drain(F.layout_batch(recs[:1]))
    assert isinstance(small.buf, bytearray)


def test_a_layout_is_sealed_once_and_refuses_what_encode_batch_refuses() -> None:
    recs = [NewRecord(DATA, None, None, "t", 1), NewRecord(DATA, META, "n", None, 1)]
    layout, _ = _drain(F.layout_batch(recs))
    F.seal_batch(layout, 1, 1, TS, False)
    with pytest.raises(FrameError):
        F.seal_batch(layout, 1, 5, TS, False)  # a second seal would rewrite live frames
    for bad in ({"node": "\ud800"}, {"tag": "\udfff"}, {"tag": "y" * 65536}):
        rec = NewRecord(DATA, None, bad.get("node"), bad.get("tag"), 1)
        with pytest.raises(FrameError):
            _drain(F.layout_batch([rec]))
    fresh, _ = _drain(F.layout_batch(recs))
    with pytest.raises(FrameError):
        F.seal_batch(fresh, 1, 2**64, TS, False)


# -- encode errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"node": "x" * 65536},
        {"tag": "y" * 65536},
        {"node": "\ud800"},
        {"tag": "\udfff"},
        {"topic_id": -1},
        {"topic_id": 2**64},
        {"seq": 2**64},
        {"ts": -5},
    ],
)
def test_encode_rejects_out_of_range_fields(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"topic_id": 1, "seq": 1, "ts": 1, "node": None, "tag": None}
    args.update(kwargs)
    with pytest.raises(FrameError):
        F.encode_record(**args, data=DATA, meta=None, durable=False)
    with pytest.raises(FrameError):
        F.encode_record(**args, data=DATA, meta=None, durable=False, segment=True)
    with pytest.raises(FrameError):
        F.encode_appends(
            args["topic_id"],
            args["seq"],
            args["ts"],
            [NewRecord(DATA, None, args["node"], args["tag"], 1)],
            False,
        )
    with pytest.raises(FrameError):
        F.encode_frame(
            F.APPEND,
            args["topic_id"],
            args["seq"],
            args["ts"],
            DATA,
            node=args["node"],
            tag=args["tag"],
        )


def test_encode_rejects_bad_types_and_bodies() -> None:
    for t in (0, 14, 255, -1):
        with pytest.raises(FrameError):
            F.encode_frame(t, 0, 0, 0, b"")
    with pytest.raises(FrameError):
        F.encode_control(F.APPEND, 0, {})
    with pytest.raises(FrameError):
        F.encode_control(F.TOPIC_DELETE, 0, {"x": object()})
    with pytest.raises(FrameError):  # has_meta payload without room for meta_len
        F.encode_frame(F.APPEND, 0, 0, 0, b"\x01", flags=F.F_HAS_META)
    with pytest.raises(FrameError):  # meta_len larger than the payload
        F.encode_frame(F.APPEND, 0, 0, 0, le(5, 4) + b"abc", flags=F.F_HAS_META)


def test_control_and_record_accessors_reject_the_wrong_kind() -> None:
    app = decoded(F.encode_record(1, 1, 1, None, None, DATA, None, durable=False))
    with pytest.raises(FrameError):
        app.control()
    ctl = decoded(F.encode_control(F.TOPIC_DELETE, 1, {"name": "x"}))
    with pytest.raises(FrameError):
        _ = ctl.data
    with pytest.raises(FrameError):
        _ = ctl.meta


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"\x93\x01\x02\x03",
        b"\x81\xa1a",
        b"\x80\x80",
        b"\xa3abc",
        b"\xdf\xff\xff\xff\xff",
    ],
)
def test_control_garbage_payload_raises_frame_error(payload: bytes) -> None:
    f = decoded(F.encode_frame(F.CONFIG_UPDATE, 0, 0, 0, payload))
    with pytest.raises(FrameError):
        f.control()


# -- torn and corrupt frames ---------------------------------------------------

FRAME = F.encode_record(3, 9, TS, "node", "tag", DATA, META, durable=True)
NL, TL = 4, 3
CRC_OFF = len(FRAME) - 8


def test_empty_buffer_and_exact_end_are_end() -> None:
    assert F.decode_frame(b"") == End(0)
    assert F.decode_frame(FRAME, len(FRAME)) == End(len(FRAME))
    assert F.decode_frame(FRAME + FRAME, len(FRAME)) == decoded(FRAME + FRAME, len(FRAME))


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_tear_inside_length_prefix(cut: int) -> None:
    assert F.decode_frame(FRAME[:cut]) == Torn(0, F.TORN_SHORT_PREFIX)
    # Up to 3 zero bytes are preallocated space, not a torn frame.
    assert F.decode_frame(b"\x00" * cut) == End(0)
    assert F.decode_frame(FRAME + b"\x00" * cut, len(FRAME)) == End(len(FRAME))


@pytest.mark.parametrize(
    "cut",
    [4, 5, 13, 37, 38, 38 + NL, 38 + NL + TL, 38 + NL + TL + 2, CRC_OFF, CRC_OFF + 7],
    ids=lambda c: f"cut{c}",
)
def test_tear_in_header_payload_or_checksum_is_overrun(cut: int) -> None:
    assert F.decode_frame(FRAME[:cut]) == Torn(0, F.TORN_OVERRUN)
    res = F.scan(FRAME + FRAME[:cut])
    assert len(res.frames) == 1 and res.end_offset == len(FRAME)
    assert res.torn == Torn(len(FRAME), F.TORN_OVERRUN)


def test_frame_len_huge_is_overrun_without_reading_the_body() -> None:
    bad = b"\xff\xff\xff\xff" + FRAME[4:]
    assert F.decode_frame(bad) == Torn(0, F.TORN_OVERRUN)
    assert F.decode_frame(b"\xff\xff\xff\xff") == Torn(0, F.TORN_OVERRUN)


@pytest.mark.parametrize("frame_len", [1, 4, 8, 33, 41])
def test_frame_len_below_minimum(frame_len: int) -> None:
    buf = le(frame_len, 4) + b"\x01" * 200
    assert F.decode_frame(buf) == Torn(0, F.TORN_TOO_SHORT)
    seg = le(frame_len - 1, 4) + b"\x01" * 200 if frame_len > 1 else le(40, 4) + b"\x01" * 200
    assert F.decode_segment_frame(seg) == Torn(0, F.TORN_TOO_SHORT)


def test_frame_len_zero_is_end_even_before_garbage_or_frames() -> None:
    assert F.decode_frame(b"\x00" * 4096) == End(0)
    assert F.decode_frame(b"\x00\x00\x00\x00garbage") == End(0)
    res = F.scan(FRAME + b"\x00" * 100 + FRAME)
    assert len(res.frames) == 1 and res.end_offset == len(FRAME) and res.torn is None


def test_zeroed_frame_mid_log_ends_the_log() -> None:
    log = FRAME + b"\x00" * len(FRAME) + FRAME
    res = F.scan(log)
    assert [f.offset for f in res.frames] == [0] and res.torn is None
    assert res.end_offset == len(FRAME)


@pytest.mark.parametrize("delta", [-1, 1, 8])
def test_lengths_inconsistent_with_frame_len(delta: int) -> None:
    b = bytearray(FRAME)
    b[34:38] = le(len(DATA) + len(META) + 4 + delta, 4)  # data_len off by delta
    assert F.decode_frame(rechecksum(b) + b"\x00" * 16) == Torn(0, F.TORN_LENGTHS)
    b = bytearray(FRAME)
    b[30:32] = le(NL + delta, 2)
    assert F.decode_frame(rechecksum(b) + b"\x00" * 16) == Torn(0, F.TORN_LENGTHS)


def test_frame_len_larger_than_lengths_with_bytes_available() -> None:
    b = bytearray(FRAME + b"\x00" * 8)
    b[0:4] = le(len(FRAME) - 4 + 8, 4)
    assert F.decode_frame(bytes(b)) == Torn(0, F.TORN_LENGTHS)


@pytest.mark.parametrize("typ", [0, 14, 15, 127, 255])
def test_unknown_type_with_valid_checksum(typ: int) -> None:
    assert F.decode_frame(raw_frame(typ, 0, b"", b"", b"\x80")) == Torn(0, F.TORN_TYPE)


@pytest.mark.parametrize(
    "bad", [b"\xff", b"\xc3", b"a\x80", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
)
def test_invalid_utf8_in_node_or_tag(bad: bytes) -> None:
    assert F.decode_frame(raw_frame(1, F.F_HAS_NODE, bad, b"", DATA)) == Torn(0, F.TORN_UTF8)
    assert F.decode_frame(raw_frame(1, F.F_HAS_TAG, b"", bad, DATA)) == Torn(0, F.TORN_UTF8)
    assert F.decode_frame(raw_frame(1, 3, b"ok", bad, DATA)) == Torn(0, F.TORN_UTF8)


def test_node_or_tag_bytes_without_their_flag() -> None:
    assert F.decode_frame(raw_frame(1, 0, b"n", b"", DATA)) == Torn(0, F.TORN_FLAGS)
    assert F.decode_frame(raw_frame(1, F.F_HAS_NODE, b"n", b"t", DATA)) == Torn(0, F.TORN_FLAGS)
    # A flag with an empty string is a present-but-empty value.
    f = decoded(raw_frame(1, F.F_HAS_NODE | F.F_HAS_TAG, b"", b"", DATA))
    assert (f.node, f.tag) == ("", "")


@pytest.mark.parametrize("payload", [b"", b"\x00\x00\x00", le(2, 4) + b"a", le(2**32 - 1, 4)])
def test_meta_len_inconsistent_with_data_len(payload: bytes) -> None:
    assert F.decode_frame(raw_frame(1, F.F_HAS_META, b"", b"", payload)) == Torn(0, F.TORN_META)
    # Control frames do not interpret bit3.
    assert isinstance(F.decode_frame(raw_frame(2, F.F_HAS_META, b"", b"", payload)), Frame)


REGIONS = {
    "frame_len": range(0, 4),
    "type": range(4, 5),
    "flags": range(5, 6),
    "topic_id": range(6, 14),
    "seq": range(14, 22),
    "ts": range(22, 30),
    "lengths": range(30, 38),
    "node": range(38, 38 + NL),
    "tag": range(38 + NL, 38 + NL + TL),
    "payload": range(38 + NL + TL, CRC_OFF),
    "checksum": range(CRC_OFF, len(FRAME)),
}


@pytest.mark.parametrize("region", list(REGIONS))
def test_every_bit_flip_in_each_region_is_torn(region: str) -> None:
    tail = F.encode_record(3, 10, TS, None, None, b"1", None, durable=True)
    for i in REGIONS[region]:
        for bit in range(8):
            b = bytearray(FRAME)
            b[i] ^= 1 << bit
            r = F.decode_frame(bytes(b) + tail)
            assert isinstance(r, Torn) and r.offset == 0, (region, i, bit, r)
            if region in ("node", "tag", "payload", "checksum", "topic_id", "seq", "ts", "flags"):
                assert r.reason == F.TORN_CHECKSUM
            res = F.scan(FRAME + bytes(b) + tail)  # the bad frame is mid-log
            assert [f.offset for f in res.frames] == [0] and res.end_offset == len(FRAME)
            assert res.torn == Torn(len(FRAME), r.reason)


def test_bad_offsets_and_buffer_kinds() -> None:
    assert F.decode_frame(FRAME, -1) == Torn(-1, F.TORN_OFFSET)
    assert F.decode_frame(FRAME, len(FRAME) + 1) == Torn(len(FRAME) + 1, F.TORN_OFFSET)
    want = fields(decoded(FRAME))
    assert fields(decoded(bytearray(FRAME))) == want
    assert fields(decoded(memoryview(FRAME))) == want
    wide = memoryview(FRAME + b"\x00" * (-len(FRAME) % 4)).cast("I")
    assert fields(decoded(wide)) == want
    strided = memoryview(bytes(b for c in FRAME for b in (c, 0)))[::2]
    assert fields(decoded(strided)) == want
    assert isinstance(F.decode_frame(None), (Torn, End))  # type: ignore[arg-type]


# -- scan ----------------------------------------------------------------------


def _log(n: int) -> tuple[bytes, list[int]]:
    frames = [
        F.encode_record(1, i + 1, TS, "n" if i % 2 else None, None, b"%d" % i, None, durable=True)
        if i % 3
        else F.encode_control(F.HEAD_WATERMARK, 1, {}, seq=i)
        for i in range(n)
    ]
    offs = [sum(len(f) for f in frames[:i]) for i in range(n + 1)]
    return b"".join(frames), offs


def test_scan_and_iter_frames_clean_log() -> None:
    log, offs = _log(6)
    res = F.scan(log)
    assert [f.offset for f in res.frames] == offs[:-1]
    assert [f.end for f in res.frames] == offs[1:]
    assert res.end_offset == len(log) and res.torn is None
    assert list(F.iter_frames(log)) == res.frames
    assert F.scan(log, offs[2]).frames == res.frames[2:]
    assert list(F.iter_frames(log, offs[4])) == res.frames[4:]
    assert F.scan(b"") == F.ScanResult([], 0, None)


@pytest.mark.parametrize("bad", [0, 2, 5])
def test_scan_stops_at_first_bad_frame_and_never_skips_ahead(bad: int) -> None:
    log, offs = _log(6)
    b = bytearray(log)
    b[offs[bad] + 20] ^= 0x40
    res = F.scan(bytes(b))
    assert [f.offset for f in res.frames] == offs[:bad]
    assert res.end_offset == offs[bad]
    assert res.torn == Torn(offs[bad], F.TORN_CHECKSUM)
    assert list(F.iter_frames(bytes(b))) == res.frames
    # The frames after the damage are intact and would decode on their own, but scan stops.
    if bad < 5:
        assert isinstance(F.decode_frame(bytes(b), offs[bad + 1]), Frame)


def test_scan_preallocated_tail() -> None:
    log, offs = _log(4)
    res = F.scan(log + b"\x00" * 4096)
    assert len(res.frames) == 4 and res.end_offset == len(log) and res.torn is None


# -- segment frames ------------------------------------------------------------


@pytest.mark.parametrize("node", [None, "", "nödé"])
@pytest.mark.parametrize("tag", [None, "t"])
@pytest.mark.parametrize("meta", [None, META])
@pytest.mark.parametrize("durable", [False, True])
def test_wal_to_segment_preserves_every_record_field(
    node: str | None, tag: str | None, meta: bytes | None, durable: bool
) -> None:
    wal = F.encode_record(0xABCDEF, 123456, TS, node, tag, DATA, meta, durable=durable)
    seg = F.wal_to_segment(wal)
    assert seg == F.encode_record(
        0xABCDEF, 123456, TS, node, tag, DATA, meta, durable=durable, segment=True
    )
    # Layout: type byte dropped, record fields one verbatim byte range, len and crc rewritten.
    assert len(seg) == len(wal) - 1
    assert int.from_bytes(seg[0:4], "little") == int.from_bytes(wal[0:4], "little") - 1
    assert seg[4:-8] == wal[5:-8]
    assert int.from_bytes(seg[-8:], "little") == xxhash.xxh3_64_intdigest(seg[4:-8])
    assert seg[4] == wal[5]  # flags
    assert int.from_bytes(seg[5:13], "little") == 0xABCDEF
    assert int.from_bytes(seg[13:21], "little") == 123456
    assert int.from_bytes(seg[21:29], "little") == TS
    w = decoded(wal)
    s = F.decode_segment_frame(seg)
    assert isinstance(s, Frame)
    assert fields(s) == fields(w)
    assert (s.data, s.meta, s.node, s.tag, s.durable) == (DATA, meta, node, tag, durable)
    assert (s.offset, s.size) == (0, len(seg))
    # Works on a slice of a larger buffer (as recovery hands it over).
    big = b"xx" + wal + b"yy"
    assert F.wal_to_segment(memoryview(big)[2 : 2 + len(wal)]) == seg


def test_wal_to_segment_rejects_anything_but_one_valid_append_frame() -> None:
    wal = F.encode_record(1, 1, 1, None, None, DATA, None, durable=False)
    bad = bytearray(wal)
    bad[-12] ^= 1
    for src in (
        bytes(bad),  # corrupt: must never be re-checksummed into a valid frame
        wal[:-1],
        wal + b"\x00",
        wal + wal,
        b"",
        b"\x00" * 50,
        F.encode_control(F.TOPIC_DELETE, 1, {"name": "x"}),
    ):
        with pytest.raises(FrameError):
            F.wal_to_segment(src)


def test_segment_decoder_torn_rules() -> None:
    seg = F.encode_record(1, 2, 3, "n", "t", DATA, META, durable=True, segment=True)
    assert len(F.encode_record(0, 0, 0, None, None, b"", None, durable=False, segment=True)) == 45
    assert F.decode_segment_frame(b"") == End(0)
    assert F.decode_segment_frame(b"\x00" * 64) == End(0)
    assert F.decode_segment_frame(seg[:2]) == Torn(0, F.TORN_SHORT_PREFIX)
    assert F.decode_segment_frame(seg[:-1]) == Torn(0, F.TORN_OVERRUN)
    assert F.decode_segment_frame(le(40, 4) + b"\x00" * 60) == Torn(0, F.TORN_TOO_SHORT)
    b = bytearray(seg)
    b[33:37] = le(len(DATA), 4)
    assert F.decode_segment_frame(rechecksum(b) + b"\x00" * 64) == Torn(0, F.TORN_LENGTHS)
    for i in range(len(seg)):
        b = bytearray(seg)
        b[i] ^= 0x10
        assert isinstance(F.decode_segment_frame(bytes(b)), Torn), i
    # A WAL frame is not a segment frame and vice versa.
    assert not isinstance(
        F.decode_segment_frame(F.encode_record(1, 2, 3, "n", "t", DATA, META, durable=True)), Frame
    )
    assert not isinstance(F.decode_frame(seg), Frame)
    two = seg + F.encode_record(1, 3, 3, None, None, b"1", None, durable=True, segment=True)
    res = F.scan_segment(two + b"\x00" * 10)
    assert [f.seq for f in res.frames] == [2, 3] and res.end_offset == len(two) and res.torn is None
    assert list(F.iter_segment_frames(two)) == res.frames
