"""Real process, real files: SIGKILL the server mid-burst, restart, check the log.

Every acknowledged `fsync`-class record must come back byte-identical; nothing
that was never written may appear; each batch is all-or-nothing. (A write whose
fsync completed just before the kill may survive without its ack having reached
the client: that is "attempted", not fabricated.)
"""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

WRITERS = 8
BATCH = 5


async def _burst(
    base: str, seed: int, acked: dict[str, dict], attempted: set[str]
) -> tuple[dict[str, dict], set[str]]:
    """Concurrent writers until the server dies; fills (acked {uid: data}, attempted uids)."""
    rng = random.Random(seed)

    async def writer(w: int) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=5) as c:
            n = 0
            while True:
                batch = []
                for _ in range(BATCH):
                    batch.append(
                        {"uid": f"w{w}-{n}", "v": rng.random(), "s": "é" * rng.randint(0, 40)}
                    )
                    n += 1
                attempted.update(d["uid"] for d in batch)
                try:
                    r = await c.post(
                        "/v0/topics/crash", json={"records": [{"data": d} for d in batch]}
                    )
                except httpx.HTTPError:
                    return  # the server is gone
                if r.status_code != 200:
                    return
                for d in batch:
                    acked[d["uid"]] = d

    await asyncio.wait_for(asyncio.gather(*(writer(w) for w in range(WRITERS))), 60)
    return acked, attempted


# Checkpoints every ~100 ms (and after 64 KiB of WAL) with small segments: the kill
# lands before, during or after checkpoints, seals and WAL pruning.
CHECKPOINTING = {
    "TOPICS_CHECKPOINT_INTERVAL_MS": "100",
    "TOPICS_CHECKPOINT_WAL_BYTES": "65536",
    "TOPICS_SEGMENT_MAX_EVENTS": "200",
}


@pytest.mark.parametrize(
    "seed,checkpoints", [(1, False), (2, False), (3, False), (4, True), (5, True), (6, True)]
)
def test_sigkill_keeps_every_acked_fsync_record(
    tmp_path: Path, seed: int, checkpoints: bool
) -> None:
    env = {"TOPICS_WAL_SHARDS": str(1 + seed % 2), **(CHECKPOINTING if checkpoints else {})}
    srv = ServerProcess(tmp_path, env)
    with httpx.Client(base_url=srv.base) as c:
        assert c.put("/v0/topics/crash", json={"durability": "fsync"}).status_code == 201

    async def run() -> tuple[dict[str, dict], set[str]]:
        lo, hi = (1.0, 2.5) if checkpoints else (0.3, 1.2)
        delay = random.Random(seed).uniform(lo, hi)
        acked: dict[str, dict] = {}
        attempted: set[str] = set()
        burst = asyncio.create_task(_burst(srv.base, seed, acked, attempted))
        for _ in range(3000):  # the kill is timed from the first acknowledged write
            if acked or burst.done():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(delay)
        srv.proc.send_signal(signal.SIGKILL)  # the process this test started
        return await burst

    acked, attempted = asyncio.run(run())
    srv.stop()
    assert len(acked) > 0, "no write was acknowledged before the kill"
    srv2 = ServerProcess(tmp_path, env)
    try:
        with httpx.Client(base_url=srv2.base) as c:
            survivors: dict[str, dict] = {}
            seqs: list[int] = []
            cur = 0
            while True:
                resp = c.post("/v0/topics/crash/diff", json={"from_seq": cur, "limit": 1000})
                assert resp.status_code == 200, (resp.status_code, resp.text, srv2.log_text())
                d = resp.json()
                assert d["tombstone"] is None
                for r in d["records"]:
                    survivors[r["data"]["uid"]] = r["data"]
                    seqs.append(r["$seq"])
                cur = d["next_from_seq"]
                if d["caught_up"]:
                    break
    finally:
        assert srv2.stop() == 0
    if checkpoints:
        segs = list((tmp_path / "data" / "topics").rglob("seg-*.idx"))
        assert segs, "no checkpoint ran before the kill"
    missing = [u for u in acked if u not in survivors]
    assert not missing, f"{len(missing)} acked records lost, e.g. {missing[:3]}"
    for uid, data in acked.items():
        assert survivors[uid] == data  # byte-identical content
    fabricated = set(survivors) - attempted
    assert not fabricated
    # Batches are atomic: a batch's records survive together, at contiguous seqs.
    by_batch: dict[tuple[str, int], int] = {}
    for uid in survivors:
        w, n = uid.split("-")
        key = (w, int(n) // BATCH)
        by_batch[key] = by_batch.get(key, 0) + 1
    assert all(v == BATCH for v in by_batch.values())
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
