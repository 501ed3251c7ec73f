"""With the WAL journal, a mutation is acknowledged only once its log frames are durable."""

from __future__ import annotations

import asyncio
import mmap

import pytest
from tests.support.fakedisk import FakeDisk, FaultFs
from tests.support.harness import Harness, assert_error

from topics.engine.frames import Chunk
from topics.format.frame import APPEND
from topics.storage.journal import WalJournal, open_shards
from topics.storage.wal import WalEntry, scan_shard


def _durable(h: Harness, fs: FaultFs) -> WalJournal:
    shards = open_shards(fs, "/data", 1, file_bytes=64 * 1024, sync_interval_s=0.002)
    journal = WalJournal(shards, h.loop)
    journal.bind(h.engine)
    h.engine.journal = h.node.wal = journal  # the node waits on it for acknowledgments
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


@pytest.mark.parametrize("durability", ["disk", "memory", "fsync"])
def test_a_large_write_is_laid_out_ahead_sealed_in_place_and_logged_whole(
    durability: str,
) -> None:
    """A write of 1 MiB or more has its frames laid out before staging (a piece per
    loop step) and sealed in place: the WAL gets those very frames, uncopied, and
    they are what reads are served from (docs/HTTP_INPUT.md "Large bodies")."""
    h = Harness()
    disk = FakeDisk()
    shards = open_shards(disk, "/data", 1, file_bytes=4 * 1024 * 1024, sync_interval_s=0.002)
    journal = WalJournal(shards, h.loop)
    h.engine.journal = h.node.wal = journal
    submitted: list[WalEntry] = []
    real_submit = shards[0].submit

    def submit(e: WalEntry) -> None:
        submitted.append(e)
        real_submit(e)

    shards[0].submit = submit  # type: ignore[method-assign]
    try:
        assert h.put("/v0/topics/t", {"durability": durability}).status_code == 201
        recs = [{"data": {"i": i, "s": "x" * 20_000}, "tag": f"t{i}"} for i in range(100)]
        r = h.post("/v0/topics/t", {"records": recs})
        assert r.status_code == 200, r.text
        assert (r.json()["first_seq"], r.json()["last_seq"]) == (1, 100)
        t = h.engine.require("t")
        (chunk,) = [s for s in t.sources.values() if isinstance(s, Chunk)]
        assert isinstance(chunk.buf, mmap.mmap)
        h.run(asyncio.sleep(0.05))  # let the coalesced flush of an early ack run
        entry = next(e for e in submitted if e.frames >= 100)
        assert entry.data is chunk.buf  # logged from the sealed buffer itself
        assert [len(m) < 128 for m in entry.more] == ([True] if durability == "disk" else [])
        got = h.diff("t", from_seq=97, include_tags=True)["records"]
        assert [(x["$seq"], x["$tag"], x["data"]["i"]) for x in got] == [
            (98, "t97", 97),
            (99, "t98", 98),
            (100, "t99", 99),
        ]
    finally:
        journal.close()
        h.close()
    frames = [f for _, f in scan_shard(disk, "/data/wal").frames if f.type == APPEND]
    assert [f.seq for f in frames] == list(range(1, 101))
    assert [f.tag for f in frames[-2:]] == ["t98", "t99"]


def test_a_request_waits_only_for_the_frames_it_logged() -> None:
    """Two requests log control frames on two shards; the first one's fsync is held.
    The second is acknowledged at once: a barrier covers only its own request's
    frames, never another's (nor does the first one's barrier take the second's)."""
    from tests.support.durable import GateFs

    from topics.format.frame import CONFIG_UPDATE

    gate = GateFs(FakeDisk(), "none")
    loop = asyncio.new_event_loop()
    shards = open_shards(gate, "/data", 2, file_bytes=64 * 1024, sync_interval_s=0.002)
    journal = WalJournal(shards, loop)
    try:

        async def request(shard: int, started: asyncio.Event | None = None) -> str:
            token = journal.open_request()
            try:
                journal._control(journal.shards[shard], CONFIG_UPDATE, 10 + shard, {"config": {}})
                if started is not None:
                    started.set()
                assert journal.has_pending_controls()
                await journal.barrier()
                return f"shard {shard} acked"
            finally:
                journal.close_request(token)

        async def main() -> None:
            gate.arm("fdatasync", 1)
            held = asyncio.ensure_future(request(0))
            await asyncio.to_thread(gate.reached.wait, 5)  # shard 0 is inside its fsync
            other = await asyncio.wait_for(request(1), 5)
            assert other == "shard 1 acked" and not held.done()
            gate.release()
            assert await asyncio.wait_for(held, 5) == "shard 0 acked"

        loop.run_until_complete(main())
    finally:
        gate.release()
        for s in shards:
            s.close()
        loop.close()
