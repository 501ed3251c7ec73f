"""With the WAL journal, a mutation is acknowledged only once its log frames are durable."""

from __future__ import annotations

from tests.support.fakedisk import FakeDisk, FaultFs
from tests.support.harness import Harness, assert_error

from topics.storage.journal import WalJournal, open_shards


def _durable(h: Harness, fs: FaultFs) -> WalJournal:
    shards = open_shards(fs, "/data", 1, file_bytes=64 * 1024, sync_interval_s=0.002)
    journal = WalJournal(shards, h.loop)
    journal.topic_ids = lambda n: h.engine.topics[n].topic_id if n in h.engine.topics else 0
    h.engine.journal = journal
    return journal


def test_config_and_delete_acks_wait_for_the_log_and_fail_when_it_fails() -> None:
    h = Harness()
    fault = FaultFs(FakeDisk())
    journal = _durable(h, fault)
    try:
        r = h.put("/v0/topics/t", {"durability": "fsync"})
        assert r.status_code == 201
        assert not journal.has_pending_controls()  # the 201 came after the sync
        assert h.post("/v0/topics/t", {"records": [{"data": 1}, {"data": 2}]}).status_code == 200
        fault.fail("fdatasync", 1, "EIO", persistent=True)
        assert_error(h.post("/v0/topics/t/delete", {"before_seq": 2}), 500, "internal")
        assert_error(h.put("/v0/topics/u", {}), 500, "internal")
        assert_error(h.post("/v0/topics/t", {"records": [{"data": 3}]}), 500, "internal")
    finally:
        fault.clear()
        journal.close()
        h.close()
