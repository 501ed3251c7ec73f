"""Property: whatever single byte of a WAL goes bad, nothing else is lost or invented.

Hypothesis draws a workload (topics, fsync-class writes of random sizes into
small WAL files, one or two shards), stops it without a checkpoint (the WAL is
the only copy), and flips one bit anywhere in the used part of any WAL file.
Then either the server starts (the flip only hit bookkeeping it can cut, such as
the final SyncMark), or it refuses with nothing changed on disk and
`topics repair` salvages. Either way:

* the records readable afterwards are exactly the acknowledged ones minus the
  record whose frame holds the flipped bit (if that frame was a record);
* a read across that record's seq gets a `corrupt` tombstone starting at it;
* every topic's head is at least every acknowledged seq, so none is reissued;
* a topic whose create frame held the bit keeps its records (under
  `recovered.<id>`); only an empty one can be gone, as the repair plan says.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.clock import TestClock
from tests.support.durable import DATA_DIR, Durable
from tests.support.fakedisk import FakeDisk
from topics.engine.core import DiffParams
from topics.format.frame import APPEND, TOPIC_CREATE
from topics.storage.journal import shard_dirs
from topics.storage.repair import apply_repair, plan_repair
from topics.storage.wal import WalDamage, scan_shard

TOPICS = ("a", "b", "c")


def _records(draw: Any, i: int) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 3))
    size = draw(st.integers(1, 160))
    return [{"data": {"w": i, "k": k, "p": "x" * size}} for k in range(n)]


def _run(data: st.DataObject) -> None:
    disk = FakeDisk()
    shards = data.draw(st.sampled_from([1, 2]), label="shards")
    h = Durable(disk, shards=shards, file_bytes=2048, monitor=False)
    try:
        h.open()
        for t in TOPICS:
            assert h.put_topic(t, {"durability": "fsync"})
        acked: dict[str, list[int]] = {t: [] for t in TOPICS}
        for i in range(data.draw(st.integers(3, 24), label="writes")):
            t = data.draw(st.sampled_from(TOPICS))
            out = h.write(t, _records(data.draw, i))
            assert out.ok, out
            assert out.first_seq is not None and out.last_seq is not None
            acked[t] += list(range(out.first_seq, out.last_seq + 1))
        ids = {t: h.eng().require(t).topic_id for t in TOPICS}
        h.shutdown()  # no checkpoint: the WAL is the only copy

        # Pick one bit of the used part of one WAL file.
        used: list[tuple[str, int]] = []
        for d in shard_dirs(DATA_DIR, shards):
            sc = scan_shard(disk, d)
            for f in sc.files:
                extent = len(f.buf.rstrip(b"\0"))
                if extent:
                    used.append((f"{d}/{f.name}", extent))
        # Drawn independently of the layout (how many SyncMarks a run writes depends
        # on timing), then mapped onto it.
        pick = data.draw(st.integers(0, 1 << 30), label="file")
        where = data.draw(st.floats(0, 1, exclude_max=True), label="offset")
        bit = data.draw(st.integers(0, 7), label="bit")
        path, extent = used[pick % len(used)]
        at = int(where * extent)
        victim = None  # (topic id, seq) of the record frame holding the bit
        created_gone = None  # the topic id of a TopicCreate frame holding it
        for d in shard_dirs(DATA_DIR, shards):
            for name, fr in scan_shard(disk, d).frames:
                if f"{d}/{name}" == path and fr.offset <= at < fr.offset + fr.size:
                    if fr.type == APPEND:
                        victim = (fr.topic_id, fr.seq)
                    elif fr.type == TOPIC_CREATE:
                        created_gone = fr.topic_id
        disk.crash()
        raw = disk.snapshot_durable()[path]
        disk.poke(path, at, bytes([raw[at] ^ (1 << bit)]))
        disk.recover()

        image = disk.snapshot_durable()
        try:
            h.reopen()
        except WalDamage:
            assert disk.snapshot_durable() == image, "a refused start changed the disk"
            plan = plan_repair(disk, DATA_DIR)
            assert plan.ok, plan.lines()
            apply_repair(disk, plan, clock=TestClock())
            h.reopen()

        eng = h.eng()
        by_id = {t.topic_id: t for t in eng.topics.values()}
        for name in TOPICS:
            if ids[name] == created_gone and not acked[name]:
                # An empty topic whose only trace was its create frame: the repair
                # plan says it is gone (there is no record to keep).
                continue
            t = by_id[ids[name]]
            want = [s for s in acked[name] if (ids[name], s) != victim]
            got = [r["$seq"] for r in h.read_all(t.name) or []]
            assert got == want, (name, victim)
            assert t.head_seq >= max(acked[name], default=0)
        if victim is not None:
            t = by_id[victim[0]]
            p = DiffParams(from_seq=victim[1] - 1, limit=1000, budget=1 << 20)
            _t, r = eng.diff(t.name, p)
            assert r.tombstone is not None and r.tombstone.reason == "corrupt", victim
            assert r.tombstone.gap_from == victim[1]
        h.close()
    finally:
        h.shutdown()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_flipped_wal_bit_loses_exactly_its_record(data: st.DataObject) -> None:
    _run(data)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_flipped_wal_bit_loses_exactly_its_record_many(data: st.DataObject) -> None:
    _run(data)
