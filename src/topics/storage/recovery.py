"""Recovery: rebuild the engine from the WAL shards in a data directory.

Order of work (SEMANTICS §18, seed: crash recovery):

1. open every shard of the current layout (repairing each torn tail: zeroed
   from the first invalid frame, later files removed) and scan any shard
   directory left over from a different shard count (read-only);
2. group the valid frames by topic id and order each topic's frames by their
   position in the topic's seq space: an Append sorts at `seq - 1`, a control
   frame at `h` (the head when it was logged), controls before appends at the
   same position, then shard and log order. This is the order they were applied
   in at run time, whatever shard they sit on;
3. replay: create/configure/delete topic instances, publish appends in runs
   (frames of one write share a ts), re-apply deletes with their point-in-time
   bound, restore involuntary floors and lease events;
4. raise each `disk` topic's head to its durable reservation (padding with
   silent holes), apply retention, reinstall routers whose source and dest
   instances still exist, and re-derive their copies.

The engine must be fresh and use the in-memory journal while replaying (nothing
is logged again); the caller installs the WAL journal afterwards.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from topics.engine.core import Engine
from topics.engine.records import NewRecord
from topics.engine.topic import Topic
from topics.engine.topic_config import parse_topic_config
from topics.storage.frame import (
    APPEND,
    CONFIG_UPDATE,
    DELETE,
    EVICT_WATERMARK,
    HEAD_WATERMARK,
    LEASE,
    ROUTER_CREATE,
    ROUTER_DELETE,
    TOPIC_CREATE,
    TOPIC_DELETE,
    Frame,
    FrameError,
)
from topics.storage.fs import Fs
from topics.storage.journal import shard_dirs
from topics.storage.wal import ShardScan, WalShard, scan_shard

__all__ = ["recover", "RecoveryReport"]

log = logging.getLogger("topics.recovery")


@dataclass
class RecoveryReport:
    """What recovery found and did."""

    shards: int = 0
    frames: int = 0
    records: int = 0
    topics: int = 0
    routers: int = 0
    torn: list[str] = field(default_factory=list)
    seconds: float = 0.0
    reserved: dict[int, int] = field(default_factory=dict)


def _existing_shard_dirs(fs: Fs, data_dir: str) -> list[str]:
    root = posixpath.join(data_dir, "wal")
    try:
        names = fs.listdir(root)
    except FileNotFoundError:
        return []
    out = []
    if any(n.startswith("wal-") and n.endswith(".log") for n in names):
        out.append(root)
    out += [posixpath.join(root, n) for n in sorted(names) if n.startswith("shard-")]
    return out


def open_and_scan(
    fs: Fs, data_dir: str, n_shards: int, **shard_kw: Any
) -> tuple[list[WalShard], list[ShardScan]]:
    """Open (repairing torn tails) the current layout's shards and scan every shard dir.

    Pure I/O, no engine state: safe to run in a worker thread. Raises OSError.
    """
    layout = shard_dirs(data_dir, n_shards)
    scans: list[ShardScan] = []
    shards: list[WalShard] = []
    try:
        for d in layout:
            shard, found = WalShard.open(fs, d, **shard_kw)
            shards.append(shard)
            scans.append(found)
        for d in _existing_shard_dirs(fs, data_dir):
            if d not in layout:
                scans.append(scan_shard(fs, d))  # left over from another shard count
    except BaseException:
        for sh in shards:
            sh.close()
        raise
    return shards, scans


def recover(
    engine: Engine,
    fs: Fs,
    data_dir: str,
    n_shards: int,
    *,
    progress: Callable[[float], None] | None = None,
    **shard_kw: Any,
) -> tuple[list[WalShard], RecoveryReport]:
    """Replay every WAL shard under `data_dir` into `engine`; return the open shards.

    Raises OSError when a shard cannot be read or repaired (nothing is served
    over a half-read log). `progress(fraction)` is called as frames are applied.
    """
    t0 = time.perf_counter()
    shards, scans = open_and_scan(fs, data_dir, n_shards, **shard_kw)
    report = RecoveryReport()
    for _ in replay(engine, scans, report, progress=progress):
        pass
    report.seconds = time.perf_counter() - t0
    return shards, report


async def recover_async(
    engine: Engine,
    fs: Fs,
    data_dir: str,
    n_shards: int,
    *,
    progress: Callable[[float], None] | None = None,
    **shard_kw: Any,
) -> tuple[list[WalShard], RecoveryReport]:
    """:func:`recover` that keeps the event loop responsive.

    Shards are read in a worker thread; replay runs on the loop in slices so
    `/v0/ready` can answer 503 with progress meanwhile.
    """
    import asyncio

    t0 = time.perf_counter()
    shards, scans = await asyncio.to_thread(open_and_scan, fs, data_dir, n_shards, **shard_kw)
    report = RecoveryReport()
    for _ in replay(engine, scans, report, progress=progress):
        await asyncio.sleep(0)
    report.seconds = time.perf_counter() - t0
    return shards, report


def replay(
    engine: Engine,
    scans: list[ShardScan],
    report: RecoveryReport,
    *,
    progress: Callable[[float], None] | None = None,
    slice_frames: int = 50_000,
) -> Iterator[None]:
    """Apply scanned frames to `engine`; yields between slices of about `slice_frames`."""
    report.shards = len(scans)
    # Per topic: frames in log order, and which shards they came from. A topic's
    # frames normally sit on one shard, in run-time order already; only when the
    # shard count changed between runs do several shards need merging by position.
    per_topic: dict[int, list[tuple[int, int, Frame]]] = {}
    shards_of: dict[int, set[int]] = {}
    routers: list[tuple[int, int, Frame]] = []
    for si, sc in enumerate(scans):
        if sc.torn is not None:
            report.torn.append(f"{sc.end_file}@{sc.torn.offset}: {sc.torn.reason}")
        report.frames += len(sc.frames)
        for fi, (_name, fr) in enumerate(sc.frames):
            if fr.type == ROUTER_CREATE or fr.type == ROUTER_DELETE:
                routers.append((si, fi, fr))
                continue
            tid = fr.topic_id
            lst = per_topic.get(tid)
            if lst is None:
                per_topic[tid] = lst = []
                shards_of[tid] = {si}
            elif si not in shards_of[tid]:
                shards_of[tid].add(si)
            lst.append((si, fi, fr))

    total = max(report.frames, 1)
    done = 0
    by_id: dict[int, Topic] = {}
    reserved: dict[int, int] = {}
    max_id = 0
    since_yield = 0
    for topic_id in sorted(per_topic):
        max_id = max(max_id, topic_id)
        items = per_topic[topic_id]
        if len(shards_of[topic_id]) > 1:
            items = _merge_by_position(items)
        _replay_topic(engine, by_id, reserved, topic_id, [x[2] for x in items], report)
        done += len(items)
        since_yield += len(items)
        if progress is not None:
            progress(min(done / total, 0.99))
        if since_yield >= slice_frames:
            since_yield = 0
            yield

    # Disk-class seqs are never reused: the head jumps to the durable reservation.
    for topic_id, head in reserved.items():
        t = by_id.get(topic_id)
        if t is not None and t.alive and t.config.durability in ("disk", "ephemeral"):
            t.reserve_head(head, t.last_ts)
    engine.next_topic_id = max(engine.next_topic_id, max_id + 1)
    now = engine.clock.now_ms()
    for t in engine.topics.values():
        t.apply_retention(now)

    live_ids = {t.topic_id: t.name for t in engine.topics.values()}
    state: dict[str, dict[str, Any]] = {}
    for _si, _fi, fr in sorted(routers, key=lambda x: (x[0], x[1])):
        try:
            body = fr.control()
        except FrameError:
            continue
        if fr.type == ROUTER_CREATE:
            state[str(body["name"])] = body
        else:
            state.pop(str(body.get("name")), None)
    if engine.routers is not None:
        for body in state.values():
            if live_ids.get(int(body.get("source_id", -1))) == body.get("source") and live_ids.get(
                int(body.get("dest_id", -1))
            ) == body.get("dest"):
                engine.routers.restore(body)
                report.routers += 1
        engine.routers.drain_all()
    report.topics = len(engine.topics)
    report.reserved = reserved
    if progress is not None:
        progress(1.0)


def _position(fr: Frame) -> tuple[int, int]:
    """Where a frame sits in its topic's seq space: (head position, rank)."""
    if fr.type == APPEND:
        return fr.seq - 1, 1
    if fr.type == HEAD_WATERMARK:
        return fr.seq, 2
    try:
        return int(fr.control().get("h", 0)), 0
    except (FrameError, ValueError, TypeError):
        return 0, 0


def _merge_by_position(
    items: list[tuple[int, int, Frame]],
) -> list[tuple[int, int, Frame]]:
    """Order one topic's frames from several shards by position, then shard and log order."""
    keyed = [(*_position(fr), si, fi, (si, fi, fr)) for si, fi, fr in items]
    keyed.sort(key=lambda x: x[:4])
    return [x[4] for x in keyed]


def _replay_topic(
    engine: Engine,
    by_id: dict[int, Topic],
    reserved: dict[int, int],
    topic_id: int,
    frames: list[Frame],
    report: RecoveryReport,
) -> None:
    """Apply one topic's frames in order; consecutive appends of one write form a run."""
    run: list[NewRecord] = []
    run_first = 0
    run_ts = -1
    for fr in frames:
        if fr.type == APPEND:
            if run and (fr.ts != run_ts or fr.seq != run_first + len(run)):
                _flush_run(by_id.get(topic_id), run_first, run_ts, run, report)
                run = []
            if not run:
                run_first, run_ts = fr.seq, fr.ts
            data = fr.data
            meta = fr.meta
            run.append(
                NewRecord(data, meta, fr.node, fr.tag, len(data) + (len(meta) if meta else 0))
            )
            continue
        _flush_run(by_id.get(topic_id), run_first, run_ts, run, report)
        run = []
        if fr.type == HEAD_WATERMARK:
            exact = False
            try:
                exact = bool(fr.control().get("exact"))
            except FrameError:
                pass
            # A clean stop logs the exact head; a reservation only ever raises it.
            reserved[topic_id] = fr.seq if exact else max(reserved.get(topic_id, 0), fr.seq)
        else:
            _apply_control(engine, by_id, topic_id, fr)
    _flush_run(by_id.get(topic_id), run_first, run_ts, run, report)


def _flush_run(
    t: Topic | None, first: int, ts: int, run: list[NewRecord], report: RecoveryReport
) -> None:
    if run and t is not None and t.alive:
        t.restore(first, ts, run)
        report.records += len(run)


def _apply_control(engine: Engine, by_id: dict[int, Topic], topic_id: int, fr: Frame) -> None:
    try:
        body = fr.control()
    except FrameError:
        return
    t = by_id.get(topic_id)
    typ = fr.type
    if typ == TOPIC_CREATE:
        name = str(body["name"])
        old = engine.topics.get(name)
        if old is not None:  # an older instance whose delete frame sits elsewhere
            engine.delete_topic(name)
        cfg = parse_topic_config(body.get("config"), name)
        t = Topic(name, topic_id, cfg, fr.ts, engine.totals, engine.nodes)
        t.on_floor_advance = engine._floor_advanced
        engine.topics[name] = t
        engine.on_topic_created(t)
        by_id[topic_id] = t
        return
    if t is None or not t.alive:
        return
    if typ == TOPIC_DELETE:
        engine.delete_topic(t.name)
    elif typ == CONFIG_UPDATE:
        t.config = parse_topic_config(body.get("config"), t.name)
    elif typ == DELETE:
        seqs = body.get("seqs")
        if seqs:
            t.delete_seqs([int(s) for s in seqs])
        else:
            m = body.get("match")
            pred = (str(m[0]), str(m[1])) if m else None
            before = body.get("before_seq")
            engine.apply_delete(
                t, None if before is None else int(before), pred, int(body["bound"])
            )
    elif typ == EVICT_WATERMARK:
        t.l_cap = max(t.l_cap, int(body.get("l_cap", 0)))
        t.l_ttl = max(t.l_ttl, int(body.get("l_ttl", 0)))
        t.l_trim = max(t.l_trim, int(body.get("l_trim", 0)))
        t._evict_to(min(max(t.l_cap, t.l_ttl, t.l_trim), t.head_seq))
    elif typ == LEASE:
        if engine.queues is not None and t.config.is_queue:
            engine.queues.state(t).replay(
                str(body["kind"]),
                fr.seq,
                str(body["node"]),
                int(body["lease_id"]),
                int(body["deadline"]),
                int(body["deliveries"]),
            )
