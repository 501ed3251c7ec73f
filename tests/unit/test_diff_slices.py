"""A diff read in slices gives exactly what one pass of the read pipeline gives.

docs/ARCHITECTURE.md, "The read path": `topics.http.topics.read_diff` renders a long
page in slices of `DIFF_SLICE` records with the loop free in between; the budget
counts across slices and only the first may deliver an oversized record.
"""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest
from tests.support.clock import TestClock

from topics.engine.core import DiffParams, Engine
from topics.http.topics import DIFF_SLICE, read_diff


def _engine(seed: int) -> Engine:
    rng = random.Random(seed)
    eng = Engine(clock=TestClock())
    for _ in range(12):
        recs = []
        for _ in range(rng.randint(50, 200)):
            rec: dict[str, object] = {"data": "x" * rng.choice([1, 10, 100, 3000])}
            if rng.random() < 0.2:
                rec["tag"] = rng.choice(["a", "b"])
            recs.append(rec)
        eng.begin_write("t", eng.parse_write({"records": recs}, None))
    if seed % 2:
        eng.begin_delete("t", {"match": "a"})
    return eng


@pytest.mark.parametrize("seed", range(6))
def test_slices_add_up_to_one_pass(seed: int) -> None:
    eng = _engine(seed)
    rng = random.Random(seed)
    t = eng.require("t")
    head = t.head_seq
    for _ in range(40):
        p = DiffParams(
            from_seq=rng.randint(0, head),
            limit=rng.choice([1, DIFF_SLICE, DIFF_SLICE + 1, 500, 1000]),
            nodes=None,
            include_tags=rng.random() < 0.5,
            include_meta=True,
            wait_ms=0,
            budget=rng.choice([1, 2_000, 50_000, 300_000, 1 << 20]),
        )
        _t, one = eng.diff("t", p)
        _t, sliced = asyncio.run(read_diff(eng, "t", p))
        assert sliced.records == one.records, p
        assert sliced.seqs == one.seqs
        assert sliced.next_from_seq == one.next_from_seq
        assert sliced.scanned == one.scanned
        assert sliced.tombstone == one.tombstone
        assert sliced.used == one.used


def test_a_long_page_yields_to_the_loop_between_slices() -> None:
    eng = _engine(0)
    ticks = 0

    async def run() -> int:
        nonlocal ticks
        stop = False

        async def ticker() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        _t, r = await read_diff(eng, "t", DiffParams(from_seq=0, limit=1000, budget=1 << 22))
        stop = True
        await task
        assert len(r.records) > 3 * DIFF_SLICE
        return ticks - before

    assert asyncio.run(run()) >= 3


def test_history_gives_way_to_a_write_in_flight() -> None:
    from topics.storage.reads import HISTORY_MAX_WAIT_S, HistoryGate

    gate = HistoryGate()

    async def run() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await gate.turn()  # no write: only a yield
        idle = loop.time() - t0
        with gate.write():
            t0 = loop.time()
            await gate.turn()  # the write never ends in time: bounded wait
            capped = loop.time() - t0

        async def short_write() -> None:
            with gate.write():
                await asyncio.sleep(0.0005)

        task = asyncio.create_task(short_write())
        await asyncio.sleep(0)
        t0 = loop.time()
        await gate.turn()  # returns when the write is done
        ended = loop.time() - t0
        await task
        return idle, capped, ended

    idle, capped, ended = asyncio.run(run())
    assert idle < HISTORY_MAX_WAIT_S
    assert capped >= HISTORY_MAX_WAIT_S * 0.9
    assert ended < HISTORY_MAX_WAIT_S + 0.05


@pytest.mark.parametrize("seed", range(3))
def test_a_long_page_in_pieces_is_the_rendered_body(seed: int) -> None:
    from topics.http.topics import diff_response, render_diff

    eng = _engine(seed)
    p = DiffParams(
        from_seq=0,
        limit=1000,
        nodes=None,
        include_tags=True,
        include_meta=True,
        wait_ms=0,
        budget=1 << 22,
    )
    t, r = eng.diff("t", p)
    assert len(r.records) > DIFF_SLICE  # long enough to go out in pieces
    whole = render_diff(t, r, 0.0)
    resp = diff_response(t, r, 0.0)
    assert resp.pieces is not None
    pieces = resp.pieces

    async def collect() -> list[bytes]:
        return [piece async for piece in pieces]  # each piece a step of the lane

    parts = asyncio.run(collect())
    assert len(parts) > 1
    body = b"".join(parts)
    assert resp.length == len(body)
    # identical but for server_total_ms, rendered at a different instant
    cut = whole.rindex(b'"server_total_ms":')
    assert body[:cut] == whole[:cut]
    assert orjson.loads(body)["records"] == orjson.loads(whole)["records"]


def test_history_steps_take_turns_in_one_lane() -> None:
    from topics.storage.reads import HistoryGate

    gate = HistoryGate()
    running: list[int] = []
    overlaps = 0
    steps = 0

    async def scanner(k: int) -> None:
        nonlocal overlaps, steps
        for _ in range(20):
            await gate.turn()
            running.append(k)
            if len(running) > 1:
                overlaps += 1
            steps += 1
            await asyncio.sleep(0)  # a step that yields inside must still hold the lane
            running.remove(k)

    async def run() -> None:
        await asyncio.gather(*(scanner(k) for k in range(3)))

    asyncio.run(run())
    assert steps == 60
    assert overlaps == 0
