"""The engine's log events replay into the state they were logged from.

A realistic workload (creates, appends with nodes/tags/meta, config changes,
deletes by `before_seq` and by `match`, queue claims/acks/nacks/extends, routers,
TTL and cap floors on a TestClock) runs on an engine whose journal records every
event. The stream, handed event by event to :meth:`Engine.apply` of a fresh
engine, must rebuild the full observable state: topics, configs, seqs and floors,
every record read back, tombstones, lease state, routers (docs/ARCHITECTURE.md,
"The event log"). The same workload on a durable engine over a real directory,
stopped and reopened (replayed from the WAL, or restored from a snapshot), must
come back the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.support.clock import TestClock

from topics.engine.core import Engine, PendingDelete, Replay
from topics.engine.events import (
    ConfigChanged,
    Event,
    FloorsAdvanced,
    LeaseChanged,
    RecordsAppended,
    RecordsDeleted,
    RouterPut,
    SeqsDeleted,
    TopicCreated,
    TopicDeleted,
)
from topics.engine.journal import DONE, Handle, MemoryJournal
from topics.engine.queues import Queues, QueueState
from topics.engine.routers import RouterSet
from topics.engine.topic import PendingWrite
from topics.storage.checkpoint import CheckpointConfig
from topics.storage.fs import RealFs
from topics.storage.runtime import Storage, StorageConfig

T0 = 1_700_000_000_000


class RecordingJournal(MemoryJournal):
    """Keeps every event it is given; every handle is done at once."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def log(self, event: Event) -> Handle:
        self.events.append(event)
        return DONE


def new_engine(clock: TestClock, journal: Any = None) -> Engine:
    eng = Engine(clock=clock, journal=journal)
    RouterSet(eng)
    Queues(eng)
    return eng


# ---------------------------------------------------------------- workload


class Driver:
    """Runs engine calls and waits for their commit (`settle` drives the loop
    of a durable engine; nothing to wait for in memory)."""

    def __init__(self, eng: Engine, clock: TestClock, settle: Callable[[], None]) -> None:
        self.eng = eng
        self.clock = clock
        self.settle = settle

    def put(self, name: str, cfg: dict[str, Any]) -> None:
        self.eng.put_topic(name, cfg)
        self.settle()

    def write(self, name: str, records: list[dict[str, Any]], **body: Any) -> None:
        eng = self.eng
        res = eng.begin_write(name, eng.parse_write({"records": records, **body}, None))
        assert isinstance(res, PendingWrite | Replay)
        pw = res.pending if isinstance(res, Replay) else res
        while not pw.published:
            self.settle()
        eng.write_result(pw)

    def delete(self, name: str, body: dict[str, Any]) -> int:
        op: PendingDelete = self.eng.begin_delete(name, body)
        while not op.done:
            self.settle()
        return int(self.eng.delete_result(op)["deleted"])

    def read(self, name: str) -> None:
        self.eng.diff(name, self.eng.parse_diff({"limit": 1}))
        self.settle()


def recs(prefix: str, n: int, **extra: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        r: dict[str, Any] = {"data": {"k": f"{prefix}{i}", "pad": "x" * (i % 7)}}
        if i % 2:
            r["node"] = f"n{i % 3}"
        if i % 3 == 0:
            r["tag"] = f"{prefix}-t{i % 2}"
        if i % 4 == 1:
            r["meta"] = {"i": i, "p": prefix}
        r.update(extra)
        out.append(r)
    return out


def workload_part1(d: Driver, durability: str) -> None:
    eng, clock = d.eng, d.clock
    d.put("logs", {"durability": durability, "ttl_ms": 60_000})
    d.put("capped", {"durability": durability, "cap_records": 6})
    d.put("bytes", {"durability": durability, "cap_bytes": 300})
    d.put("q", {"type": "queue", "durability": durability, "leases_durable": True})
    for i in range(3):
        d.write("logs", recs(f"a{i}", 5))
        clock.advance(1_000)
    d.write("capped", recs("c", 10))
    for i in range(4):
        d.write("bytes", recs(f"b{i}", 4))
    d.read("capped")
    d.read("bytes")
    # A router from a source into a dest only it writes (copies derived, not logged).
    eng.routers.put("r1", {"source": "src", "dest": "dst", "filter": "s-t*"})  # type: ignore[union-attr]
    d.settle()
    eng.put_topic("src", {"durability": durability})
    d.settle()
    d.write("src", recs("s", 9))
    # An auto-created topic, written with a config, then deleted and created again.
    d.write("gone", recs("g", 3), config={"durability": durability})
    eng.delete_topic("gone")
    d.settle()
    d.write("gone", recs("h", 2))
    d.write("q", [{"data": {"job": i}, "tag": f"j{i % 2}"} for i in range(8)])
    qs = eng.queues
    assert qs is not None
    got = qs.claim("q", "w1", 3, 10_000)
    assert got["count"] == 3
    d.settle()
    qs.claim("q", "w2", 2, 50_000)
    d.settle()


def workload_part2(d: Driver, durability: str) -> None:
    eng, clock = d.eng, d.clock
    qs = eng.queues
    assert qs is not None
    qs.ack("q", {"node": "w1", "seqs": [1, 2]})
    d.settle()
    qs.nack("q", {"node": "w1", "seqs": [3], "delay_ms": 5_000})
    d.settle()
    qs.extend("q", {"node": "w2", "seqs": [4], "lease_ms": 90_000})
    d.settle()
    qs.claim("q", "w3", 1, 20_000)
    d.settle()
    assert d.delete("logs", {"before_seq": 4}) == 3
    assert d.delete("logs", {"match": "a1-*"}) >= 1
    d.write("logs", recs("late", 4))
    assert d.delete("logs", {"match": "late-t0", "before_seq": 100}) >= 1
    d.put("capped", {"durability": durability, "cap_records": 3})
    d.write("capped", recs("c2", 2))
    d.write("src", recs("s2", 5))
    clock.advance(58_000)  # the first `logs` batch passes its TTL
    d.read("logs")
    d.write("logs", recs("fresh", 2))
    d.read("dst")


# ------------------------------------------------------------- observation


def read_all(eng: Engine, name: str, **params: Any) -> tuple[list[Any], Any]:
    out: list[Any] = []
    tombs: list[Any] = []
    cur = 0
    while True:
        p = eng.parse_diff(
            {"from_seq": cur, "limit": 7, "include_tags": True, "include_meta": True, **params}
        )
        _t, r = eng.diff(name, p)
        if r.tombstone is not None:
            tombs.append(r.tombstone.to_wire())
        out.extend(orjson.loads(x) for x in r.records)
        if r.next_from_seq == cur:
            break
        cur = r.next_from_seq
    return out, tombs


def queue_state(eng: Engine, name: str) -> dict[str, Any]:
    t = eng.require(name)
    q = t.queue
    assert isinstance(q, QueueState)
    c = q.counters(t, eng.clock.now_ms())  # sweeps expired leases first
    live = {s for s in q.deliveries if t.slot_live(s) or s in q.leases}
    return {
        "counters": c,
        "leases": {s: (ls.node, ls.lease_id, ls.deadline_ms) for s, ls in q.leases.items()},
        "deliveries": {s: q.deliveries[s] for s in sorted(live)},
        "reclaim": sorted(s for s in q.reclaim_set if t.slot_live(s)),
        "delayed": sorted(q.delayed),
        "next_lease_id": q.next_lease_id,
    }


def observe(eng: Engine) -> dict[str, Any]:
    """Everything a client can see (a node's own records skipped too), plus the floors."""
    out: dict[str, Any] = {"next_topic_id": eng.next_topic_id, "topics": {}}
    for name in sorted(eng.topics):
        records, tombs = read_all(eng, name)
        t = eng.require(name)
        st = eng.topic_state(name, touch=False)
        st.pop("effective_priority")
        st.pop("last_read_ts")
        out["topics"][name] = {
            "id": t.topic_id,
            "epoch": t.epoch,
            "state": st,
            "floors": (t.l_cap, t.l_ttl, t.l_trim, t.delete_below, t.evict_floor),
            "records": records,
            "tombstones": tombs,
            "not_n1": [r["$seq"] for r in read_all(eng, name, node="n1")[0]],
            "queue": queue_state(eng, name) if t.config.is_queue else None,
        }
    rs = eng.routers
    assert rs is not None
    out["routers"] = [
        (r.name, r.source, r.dest, r.cursor, r.forwarded_total, r.dest_base, r.to_wire())
        for r in rs.routers()
    ]
    return out


def check_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    assert list(a["topics"]) == list(b["topics"])
    for name in a["topics"]:
        for k, v in a["topics"][name].items():
            assert b["topics"][name][k] == v, f"{name}.{k}"
    assert a == b


# ------------------------------------------------------------------ replay


def run_recorded() -> tuple[Engine, TestClock, RecordingJournal]:
    clock = TestClock(T0)
    j = RecordingJournal()
    eng = new_engine(clock, j)
    d = Driver(eng, clock, lambda: None)
    workload_part1(d, "disk")
    workload_part2(d, "disk")
    return eng, clock, j


def test_the_workload_logs_every_kind_of_event() -> None:
    _eng, _clock, j = run_recorded()
    kinds = {type(e) for e in j.events}
    assert kinds >= {
        TopicCreated,
        ConfigChanged,
        TopicDeleted,
        RecordsAppended,
        RecordsDeleted,
        SeqsDeleted,
        FloorsAdvanced,
        LeaseChanged,
        RouterPut,
    }
    assert {e.kind for e in j.events if isinstance(e, LeaseChanged)} == {
        "claimed",
        "released",
        "extended",
        "acked",
    }
    floors = [e for e in j.events if isinstance(e, FloorsAdvanced)]
    assert any(e.l_ttl for e in floors) and any(e.l_cap for e in floors)


def test_a_recorded_event_stream_replays_into_the_same_engine() -> None:
    eng, clock, j = run_recorded()
    fresh = new_engine(clock)
    for ev in j.events:
        fresh.apply(ev)
    before = observe(eng)
    check_same(before, observe(fresh))
    assert before["topics"]["dst"]["records"], "the router forwarded nothing"
    assert before["topics"]["logs"]["tombstones"], "no floor was crossed"
    assert before["topics"]["q"]["queue"]["leases"], "no lease is held"
    # The replayed engine carries on like the original: same seqs, same leases.
    for e in (eng, fresh):
        e.put_topic("logs", {"ttl_ms": 60_000, "cap_records": 4})
    check_same(observe(eng), observe(fresh))
    w = [{"data": 1, "tag": "z"}]
    a = eng.write_result(eng.begin_write("logs", eng.parse_write({"records": w}, None)))  # type: ignore[arg-type]
    b = fresh.write_result(fresh.begin_write("logs", fresh.parse_write({"records": w}, None)))  # type: ignore[arg-type]
    assert a == b
    qa, qb = eng.queues, fresh.queues
    assert qa is not None and qb is not None
    ca, cb = (orjson.dumps(x.claim("q", "w9", 10, None)) for x in (qa, qb))
    assert ca == cb and orjson.loads(ca)["count"] > 0


def test_replaying_a_stream_twice_changes_nothing() -> None:
    """Events about seqs the engine already has (or instances it already holds)
    are skipped, so a stream applied again leaves the state as it was."""
    eng, clock, j = run_recorded()
    fresh = new_engine(clock)
    for ev in j.events:
        fresh.apply(ev)
    once = observe(fresh)
    for ev in j.events:
        if isinstance(ev, RecordsAppended | TopicCreated | RecordsDeleted | FloorsAdvanced):
            fresh.apply(ev)
    check_same(once, observe(fresh))


# ------------------------------------------------------- through the WAL


class DurableEnv:
    """An engine over real files in `data_dir`, on a private loop and a TestClock."""

    def __init__(self, data_dir: Path, clock: TestClock) -> None:
        self.clock = clock
        self.loop = asyncio.new_event_loop()
        self.cfg = StorageConfig(
            str(data_dir),
            2,
            CheckpointConfig(interval_ms=0, wal_bytes=0),
            {"sync_interval_s": 0.002},
        )
        self.eng = new_engine(clock)
        self.storage = self.loop.run_until_complete(Storage.open(self.eng, RealFs(), self.cfg))

    def settle(self) -> None:
        self.loop.run_until_complete(self.storage.journal.barrier())
        self.loop.run_until_complete(asyncio.sleep(0.001))

    def checkpoint(self) -> None:
        self.loop.run_until_complete(self.storage.checkpoint())

    def stop(self, graceful: bool) -> None:
        st = self.storage
        self.loop.run_until_complete(st.close() if graceful else st.abort())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


@pytest.mark.parametrize("stop", ["abort", "close"])
def test_the_workload_comes_back_from_the_wal_and_snapshots(tmp_path: Path, stop: str) -> None:
    """`abort`: no final checkpoint, the second half is replayed from the WAL
    (after a snapshot and segments for the first). `close`: everything comes
    back from the final snapshot and its segments."""
    clock = TestClock(T0)
    env = DurableEnv(tmp_path, clock)
    try:
        d = Driver(env.eng, clock, env.settle)
        workload_part1(d, "disk")
        env.checkpoint()
        workload_part2(d, "disk")
        env.settle()
        before = observe(env.eng)
    finally:
        env.stop(graceful=stop == "close")
    again = DurableEnv(tmp_path, clock)
    try:
        if stop == "abort":
            assert again.storage.report.records > 0  # the WAL was replayed
        check_same(before, observe(again.eng))
    finally:
        again.stop(graceful=True)
