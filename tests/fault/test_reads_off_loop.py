"""Reads of records in segment files fetch their bytes on the read pool, never on the loop.

docs/ARCHITECTURE.md, "The read path": a diff pass, an SSE/WebSocket drain step or
a Kafka fetch pass run on the loop, but the segment bytes they need are read by
:data:`topics.storage.reads.read_pool` first. These tests use the real filesystem
(:class:`tests.support.realstore.RealStore`) after a checkpoint moved every record
into segments.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.realstore import RealStore
from topics.engine.core import DiffParams
from topics.engine.frames import ColdRead, ReadAhead, read_ahead, span_of
from topics.engine.watch import Delivery, ReadOpts, drain_step
from topics.storage.reads import ReadPool
from topics.storage.topicstore import SegmentSource, open_files

N = 3000


def _fill(store: RealStore) -> None:
    recs = [{"data": {"i": i, "pad": "x" * 40}, "tag": f"t{i % 7}"} for i in range(N)]
    for k in range(0, N, 500):
        store.write_many([("hist", recs[k : k + 500], None)])
    store.checkpoint()
    open_files.clear()


def _all_seqs(records: list[bytes]) -> list[int]:
    return [orjson.loads(b)["$seq"] for b in records]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with RealStore(str(tmp_path / "data")) as s:
        _fill(s)
        yield s


def test_a_diff_over_segments_reads_no_file_on_the_loop(
    store: RealStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = store.eng()
    loop_thread = threading.get_ident()
    spans: list[int] = []
    fetches: list[int] = []
    real_span, real_fetch = SegmentSource.span, SegmentSource.fetch

    def span(self: SegmentSource, lo: int, hi: int) -> Any:
        spans.append(threading.get_ident())
        return real_span(self, lo, hi)

    def fetch(self: SegmentSource, lo: int, hi: int) -> bytes:
        fetches.append(threading.get_ident())
        return real_fetch(self, lo, hi)

    monkeypatch.setattr(SegmentSource, "span", span)
    monkeypatch.setattr(SegmentSource, "fetch", fetch)
    pool = ReadPool(2)

    async def scan() -> list[bytes]:
        out: list[bytes] = []
        cur = 0
        while True:
            p = DiffParams(from_seq=cur, limit=700, include_tags=True, budget=1 << 20)
            _t, r = await pool.run(lambda p=p: eng.diff("hist", p))
            out.extend(r.records)
            if r.caught_up:
                return out
            cur = r.next_from_seq

    got = store.run(scan())
    pool.close()
    assert _all_seqs(got) == list(range(1, N + 1))
    assert not spans, "a segment was read through span() while reads were off the loop"
    assert fetches and loop_thread not in fetches
    assert pool.fetches == len(fetches) and pool.fetched_bytes > N * 40
    # The same records, rendered identically, as a blocking read gives them.
    assert [orjson.loads(b) for b in got] == store.read_all("hist")


def test_a_slow_disk_does_not_stall_the_loop(
    store: RealStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch that takes 300 ms leaves the loop free: a ticker keeps running meanwhile."""
    eng = store.eng()
    real_fetch = SegmentSource.fetch

    def slow_fetch(self: SegmentSource, lo: int, hi: int) -> bytes:
        time.sleep(0.3)
        return real_fetch(self, lo, hi)

    monkeypatch.setattr(SegmentSource, "fetch", slow_fetch)
    pool = ReadPool(2)

    async def both() -> tuple[float, int]:
        stop = False
        worst = 0.0

        async def ticker() -> None:
            nonlocal worst
            last = time.monotonic()
            while not stop:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                worst = max(worst, now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        p = DiffParams(from_seq=0, limit=100, include_tags=True, budget=1 << 20)
        _t, r = await pool.run(lambda: eng.diff("hist", p))
        stop = True
        await tick
        return worst, len(r.records)

    worst, n = store.run(both())
    pool.close()
    assert n == 100
    assert worst < 0.15, f"the loop stalled {worst * 1000:.0f} ms while the disk answered"


def test_an_sse_drain_step_retries_without_delivering_twice(store: RealStore) -> None:
    eng = store.eng()
    t = eng.require("hist")
    d = Delivery("hist", t)
    opts = ReadOpts(limit=256, budget=1 << 20)
    pool = ReadPool(1)

    async def drain() -> list[int]:
        seqs: list[int] = []
        cur = 0
        while True:
            step = await pool.run(lambda c=cur: drain_step(eng, d, c, opts, relabel_first=True))
            for ev in step.events:
                seqs.extend(orjson.loads(b)["$seq"] for b in ev.records)
            cur = step.cursor
            if step.drained:
                return seqs

    seqs = store.run(drain())
    pool.close()
    assert seqs == list(range(1, N + 1))
    assert pool.fetches >= 1


def test_read_ahead_refuses_an_unfetched_span_and_serves_a_fetched_one(store: RealStore) -> None:
    t = store.eng().require("hist")
    src = next(s for s in t.sources.values() if isinstance(s, SegmentSource))
    ahead = ReadAhead()
    token = read_ahead.set(ahead)
    try:
        with pytest.raises(ColdRead) as e:
            span_of(src, 0, 100)
        assert (e.value.source, e.value.lo, e.value.hi) == (src, 0, 100)
        ahead.add(src, 0, src.fetch(0, 200))
        buf, base = span_of(src, 10, 150)
        assert base == 0 and bytes(buf[10:150]) == src.fetch(10, 150)
        with pytest.raises(ColdRead):
            span_of(src, 150, 300)
    finally:
        read_ahead.reset(token)
    # Outside a pooled read, blocking sources are read in place as before.
    buf, base = span_of(src, 0, 100)
    assert bytes(buf[0 - base : 100 - base]) == src.fetch(0, 100)


def _frame_spans(t: Any, seqs: list[int]) -> list[tuple[Any, int, int]]:
    """(source, offset, end) of the frames of `seqs` (from the slot index)."""
    idx = t.index
    arr = idx.window(0, len(idx))
    out = []
    for s in seqs:
        row = arr[s - idx.base_seq]
        out.append(
            (t.sources[int(row["loc"])], int(row["offset"]), int(row["offset"] + row["len"]))
        )
    return out


def _covered(frames: list[tuple[Any, int, int]], warmed: list[tuple[Any, int, int]]) -> bool:
    return all(
        any(src is ws and wl <= lo and hi <= wh for ws, wl, wh in warmed) for src, lo, hi in frames
    )


def test_a_claim_reads_only_spans_warmed_on_the_pool(
    store: RealStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims change state as they read, so their segment bytes are read ahead:
    `Queues.claim_spans` names them and `ReadPool.warm` reads them off the loop."""
    from topics.engine.queues import Claimer

    recs = [{"data": {"job": i}} for i in range(400)]
    store.write_many([("jobs", recs, {"type": "queue"})])
    store.checkpoint()
    open_files.clear()
    eng = store.eng()
    queues = eng.queues
    loop_thread = threading.get_ident()
    fetched: list[tuple[int, Any, int, int]] = []
    real_fetch = SegmentSource.fetch

    def fetch(self: SegmentSource, lo: int, hi: int) -> bytes:
        fetched.append((threading.get_ident(), self, lo, hi))
        return real_fetch(self, lo, hi)

    monkeypatch.setattr(SegmentSource, "fetch", fetch)
    pool = ReadPool(1)
    spans = queues.claim_spans("jobs", 50)
    assert spans and all(isinstance(s, SegmentSource) for s, _lo, _hi in spans)
    store.run(pool.warm(spans))
    pool.close()
    assert fetched and all(tid != loop_thread for tid, *_ in fetched)
    jobs = queues.claim_pass("jobs", [Claimer("w1", 50)], None)[0]
    seqs = [int(j["$seq"]) for j in jobs]
    assert seqs == list(range(1, 51))
    assert _covered(_frame_spans(eng.require("jobs"), seqs), [f[1:] for f in fetched])
    assert queues.claim_spans("hist", 10) == []  # not a queue


def test_forwarding_warms_the_spans_it_reads(store: RealStore) -> None:
    eng = store.eng()
    routers = eng.routers
    routers.put("copy", {"source": "feed", "dest": "copy"})  # forwards what comes next
    recs = [{"data": {"i": i, "pad": "y" * 40}} for i in range(2000)]
    store.write_many([("feed", recs, None)])
    store.checkpoint()
    open_files.clear()
    spans = routers.pending_spans()
    assert spans and all(isinstance(s, SegmentSource) for s, _lo, _hi in spans)
    from topics.engine.routers import PASS_MAX_SEQS

    first_pass = list(range(1, PASS_MAX_SEQS + 1))
    assert _covered(_frame_spans(eng.require("feed"), first_pass), spans)
    pool = ReadPool(1)
    store.run(pool.warm(spans))
    pool.close()
    assert pool.fetched_bytes >= sum(hi - lo for _s, lo, hi in spans)
    routers.drain_dirty()
    assert eng.require("copy").head_seq == 2000


def test_a_tag_index_rebuild_reads_warmed_spans(store: RealStore) -> None:
    eng = store.eng()
    t = eng.require("hist")
    t.tags_stale()  # as after a restart: tags are read from the frames when first needed
    spans = t.tag_spans()
    assert spans and all(isinstance(s, SegmentSource) for s, _lo, _hi in spans)
    tagged = list(range(1, N + 1))  # every record of the fixture has a tag
    assert _covered(_frame_spans(t, tagged), spans)
    pool = ReadPool(1)
    store.run(pool.warm(spans, 1 << 30))
    pool.close()
    assert pool.fetched_bytes >= sum(hi - lo for _s, lo, hi in spans)
    assert t.tags.eq("t3", N + 1) == [s for s in tagged if (s - 1) % 7 == 3]
    assert t.tag_spans() == []  # rebuilt: nothing to warm any more


def test_cold_segment_spans_use_their_own_threads(tmp_path: Path) -> None:
    """A fetch of a cold-tier source runs on the cold threads: while a slow cold
    store holds every one of them, a hot fetch still completes and the pool's
    `busy` (the governor's signal) counts only hot fetches."""

    class Slow:
        hdr = 37
        verify = True
        blocking = True
        name = "slow-cold"
        cold = True

        def __init__(self) -> None:
            self.release = threading.Event()

        def span(self, lo: int, hi: int) -> Any:
            raise AssertionError("not on the loop")

        def fetch(self, lo: int, hi: int) -> bytes:
            assert threading.current_thread().name.startswith("topics-read-cold")
            self.release.wait(10)
            return b"c" * (hi - lo)

    class Hot(Slow):
        name = "hot"
        cold = False

        def fetch(self, lo: int, hi: int) -> bytes:
            assert threading.current_thread().name.startswith("topics-read_")
            return b"h" * (hi - lo)

    async def main() -> None:
        pool = ReadPool(threads=1, cold_threads=2)
        slow = Slow()
        try:
            stuck = [asyncio.ensure_future(pool._fetch(slow, 0, 10)) for _ in range(2)]
            await asyncio.sleep(0.05)
            assert pool.cold_busy == 2 and pool.busy == 0
            assert await asyncio.wait_for(pool._fetch(Hot(), 0, 4), 2) == b"hhhh"
            slow.release.set()
            assert [await f for f in stuck] == [b"c" * 10] * 2
            assert pool.cold_fetches == 2 and pool.fetches == 3
        finally:
            slow.release.set()
            pool.close()

    asyncio.run(main())
