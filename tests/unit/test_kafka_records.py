"""Fetch batches built by kafka/records.py: codec and timestamp type in the attributes."""

from __future__ import annotations

import crc32c
import pytest
from aiokafka.record._crecords.default_records import DefaultRecordBatch

from topics.kafka.records import append_time_batches


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_fetch_batches_carry_their_codec_and_log_append_time(codec: int) -> None:
    recs = [
        (10 + i, 1_000 + i // 5, b"k%d" % i, b'{"i":%d}' % i * 20, [("h", b"v")]) for i in range(25)
    ]
    raw = append_time_batches(recs, 1 << 20, codec)
    got = []
    pos = 0
    while pos < len(raw):
        length = int.from_bytes(raw[pos + 8 : pos + 12], "big")
        chunk = raw[pos : pos + 12 + length]
        batch = DefaultRecordBatch(chunk)
        assert batch.compression_type == codec
        assert batch.timestamp_type == 1  # LogAppendTime
        assert crc32c.crc32c(chunk[21:]) == batch.crc
        got += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
        pos += 12 + length
    assert len(raw) > 0 and pos == len(raw)
    assert got == [(o, ts, k, v) for o, ts, k, v, _h in recs]
    if codec:
        assert len(raw) < len(append_time_batches(recs, 1 << 20, 0))
