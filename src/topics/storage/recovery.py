"""Recovery: rebuild the engine from a data directory (docs/FORMATS.md, "Checkpoints and WAL pruning").

Order of work:

1. (worker thread) load the newest valid metadata snapshot; scan every shard
   directory (read-only) from the position the snapshot names and refuse to
   start on damage (docs/FORMATS.md, "Torn tail or damage"); load every topic
   directory's segments (`.idx` in bulk, the active segment resumed); then open
   the shards of the current layout (cutting each torn tail after keeping its
   bytes aside).
2. (event loop) restore the snapshot's topics and attach their segments; then
   replay the WAL frames logged after the snapshot, per topic in log order:
   appends in bulk (seqs at or below the head are skipped, jumps are padded
   with deleted holes; the frames stay in the read file buffers until the next
   checkpoint copies them into segments), control frames one by one. Frames
   of one topic found in several shard directories (the shard count changed)
   are merged by their position in the topic's seq space.
3. raise each `disk` topic's head to its durable reservation (silent holes),
   apply retention, reinstall routers whose source and dest instances exist,
   re-derive their copies.

Everything recovery changes in the engine it changes by decoding log events
(:mod:`topics.engine.events`: snapshot maps, frames decoded by
:mod:`topics.storage.eventcodec`) and handing them to :meth:`Engine.apply`
(docs/ARCHITECTURE.md, "The event log").

Frames that a snapshot already reflects are never applied twice: replay starts
at the snapshot's marks, and TopicCreate / router frames older than the capture
(by topic id / router op number) are skipped.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topics.engine.core import Engine
from topics.engine.events import (
    HeadReserved,
    RecordsReplayed,
    RouterPut,
    SegmentsAttached,
    SeqsDeleted,
    TopicCreated,
    TopicIdsUsed,
)
from topics.engine.topic_config import parse_topic_config
from topics.format.frame import (
    APPEND,
    CHECKPOINT_MARK,
    HEAD_WATERMARK,
    LOST,
    ROUTER_CREATE,
    ROUTER_DELETE,
    SYNC_MARK,
    TOPIC_CREATE,
    Frame,
    FrameError,
    decode_frame,
)
from topics.storage.checkpoint import expand_ranges
from topics.storage.eventcodec import decode_control, router_from_body
from topics.storage.fs import Fs, list_names, read_file, write_file
from topics.storage.journal import shard_dirs, shard_of
from topics.storage.meta import router_states, topic_restored
from topics.storage.segment import scan_segments, segment_paths, topic_dir
from topics.storage.snapshot import list_snapshots, load_latest, load_valid
from topics.storage.topicstore import (
    RELIES_ON_NOTHING,
    LoadedTopic,
    SegmentDamage,
    TopicStore,
    check_published,
    cold_store,
    load_topic,
    published_upto,
)
from topics.storage.wal import (
    ScannedFile,
    ShardScan,
    WalDamage,
    WalPosition,
    WalShard,
    scan_shard,
)

__all__ = ["recover_async", "RecoveryReport", "load_data_dir", "replay"]

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
    snapshot: int = 0  # number of the snapshot loaded (0: none)
    segments: int = 0  # segment files loaded
    segment_records: int = 0  # slots loaded from segments
    router_ops: int = 0
    stores: dict[int, TopicStore] = field(default_factory=dict)
    absorbed: dict[str, WalPosition] = field(default_factory=dict)
    layout_changed: bool = False


@dataclass
class Loaded:
    """Everything read from disk before the replay (no engine state)."""

    snapshot_n: int
    snapshot: dict[str, Any] | None
    shards: list[WalShard]
    scans: list[ShardScan]
    leftovers: list[str]  # scanned shard dirs outside the current layout
    topics: dict[int, LoadedTopic]
    data_dir: str = ""


def existing_shard_dirs(fs: Fs, data_dir: str) -> list[str]:
    root = posixpath.join(data_dir, "wal")
    names = list_names(fs, root)
    out = []
    if any(n.startswith("wal-") and n.endswith(".log") for n in names):
        out.append(root)
    out += [posixpath.join(root, n) for n in sorted(names) if n.startswith("shard-")]
    return out


def topic_ids(fs: Fs, data_dir: str) -> list[int]:
    root = posixpath.join(data_dir, "topics")
    names = list_names(fs, root)
    out = []
    for n in names:
        if len(n) == 16:
            try:
                out.append(int(n, 16))
            except ValueError:
                continue
    return sorted(out)


class SnapshotDamage(OSError):
    """No valid snapshot where one is needed: recovery refuses to start.

    The message names the snapshot files; nothing on disk is changed
    (docs/FORMATS.md, "Snapshots").
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)


def _positions(data_dir: str, body: dict[str, Any] | None) -> dict[str, WalPosition]:
    positions: dict[str, WalPosition] = {}
    for rel, pos in ((body or {}).get("wal") or {}).items():
        positions[posixpath.normpath(posixpath.join(data_dir, str(rel)))] = WalPosition(
            str(pos[0]), int(pos[1]), int(pos[2])
        )
    return positions


def _scan_all(
    fs: Fs, data_dir: str, layout: list[str], body: dict[str, Any] | None
) -> tuple[list[ShardScan], list[str]]:
    """Scan (read-only) every shard of `layout`, then every other shard directory."""
    positions = _positions(data_dir, body)
    scans = [scan_shard(fs, d, positions.get(posixpath.normpath(d))) for d in layout]
    leftovers: list[str] = []
    for d in existing_shard_dirs(fs, data_dir):
        if d not in layout:
            scans.append(scan_shard(fs, d, positions.get(posixpath.normpath(d))))
            leftovers.append(d)
    return scans, leftovers


def segment_damage(
    fs: Fs,
    data_dir: str,
    ids: list[int],
    body: dict[str, Any] | None,
    scans: list[ShardScan],
    cold_dir: str | None = None,
) -> list[SegmentDamage]:
    """Every damaged segment the snapshot `body` relies on, for topics `ids`, one
    error per topic (read-only; recovery, `topics repair` and `topics verify` share
    it). Raises OSError when a file cannot be read."""
    ckpts = {int(m["id"]): published_upto(m) for m in (body or {}).get("topics") or []}
    lost = lost_ranges(body, scans)
    out: list[SegmentDamage] = []
    for tid in ids:
        d = topic_dir(data_dir, tid)
        segs = scan_segments(fs, d)
        try:
            check_published(
                fs,
                d,
                tid,
                ckpts.get(tid),
                [first for first, _p in segs.segments],
                segs.strays,
                lost.get(tid, []),
                cold_firsts(fs, cold_dir, tid),
            )
        except SegmentDamage as exc:
            out.append(exc)
    return out


def segment_starts(fs: Fs, d: str) -> list[int]:
    segs = scan_segments(fs, d)
    return sorted(
        {first for first, _p in segs.segments}
        | {int(posixpath.basename(p)[4:20]) for p in segs.strays}
    )


def cold_firsts(fs: Fs, cold_dir: str | None, tid: int) -> list[int]:
    """First seqs of the whole segments topic `tid` has in the cold tier (a directory
    on `fs`, or an object store)."""
    store = cold_store(fs, cold_dir, tid)
    return store.list() if store is not None else []


def _rebuild_plan(
    fs: Fs, data_dir: str, fallback: dict[str, Any], damaged: list[SegmentDamage]
) -> dict[int, list[int]] | None:
    """Per damaged topic, the segments to set aside so that replay from `fallback`
    rebuilds them: every segment starting after what the fallback relies on.
    None when some damage lies in a segment the fallback relies on too (the WAL
    no longer holds those records)."""
    pubs = {int(m["id"]): published_upto(m)[0] for m in fallback.get("topics") or []}
    out: dict[int, list[int]] = {}
    for e in damaged:
        pub = pubs.get(e.topic_id, 0)
        starts = segment_starts(fs, topic_dir(data_dir, e.topic_id))
        for a, _b in e.ranges:
            first = max([x for x in starts if x <= a], default=a)
            if first <= pub:
                return None
        out[e.topic_id] = [x for x in starts if x > pub]
    return out


def _set_aside(
    fs: Fs, data_dir: str, plan: dict[int, list[int]], damaged: list[SegmentDamage], stamp: int
) -> None:
    """Move the listed segments' files into `quarantine/rebuild-<stamp>/` (copied and
    synced, then unlinked)."""
    why = {e.topic_id: "; ".join(e.problems) for e in damaged}
    for tid, firsts in plan.items():
        d = topic_dir(data_dir, tid)
        for first in firsts:
            paths = segment_paths(d, first)
            for path in (paths.data, paths.idx):
                if not fs.exists(path):
                    continue
                dest = posixpath.join(
                    data_dir, "quarantine", f"rebuild-{stamp}", posixpath.relpath(path, data_dir)
                )
                fs.makedirs(posixpath.dirname(dest))
                write_file(fs, dest, read_file(fs, path))
                fs.fsync_dir(posixpath.dirname(dest))
                fs.unlink(path)
        fs.fsync_dir(d)
        log.warning(
            "topic %016x: damaged segment (%s); the WAL still holds the records of "
            "segments %s, so they are set aside (kept in quarantine/rebuild-%d) and "
            "rebuilt from the WAL, starting from the previous snapshot",
            tid,
            why.get(tid, ""),
            firsts,
            stamp,
        )


def load_data_dir(
    fs: Fs, data_dir: str, n_shards: int, cold_dir: str | None = None, **shard_kw: Any
) -> Loaded:
    """Step 1: snapshot, shards (opened from their snapshot positions), segments.

    Pure I/O, no engine state: safe in a worker thread. Every shard and every
    segment the snapshot relies on is checked (read-only) before anything on
    disk changes. WAL damage raises :class:`WalDamage`; a damaged segment
    raises :class:`SegmentDamage`, unless the fallback snapshot does not rely on
    it yet (so the WAL still holds its records): then the damaged files are
    moved to the quarantine and recovery starts from the fallback snapshot,
    which replays those records from the WAL (docs/FORMATS.md, "Segments the
    snapshot relies on"). Raises OSError when a file cannot be read.
    """
    meta = posixpath.join(data_dir, "meta")
    found = load_latest(fs, meta)
    snap_n, body = found if found is not None else (0, None)
    if found is None:
        # Without a snapshot the WAL must start at its very first frame: a snapshot
        # that existed but no longer verifies (its WAL prefix pruned, its segments
        # unnamed) would otherwise make the start silently lose what it covered.
        listed = list_snapshots(fs, meta)
        if listed:
            raise SnapshotDamage(
                f"none of the {len(listed)} snapshots in {meta} verifies "
                f"({', '.join(posixpath.basename(p) for _n, p in listed)}): the topics, "
                "segments and WAL they cover cannot be read; refusing to start with "
                "nothing changed on disk (see `topics verify`)"
            )
        for d in existing_shard_dirs(fs, data_dir):
            names = sorted(n for n in fs.listdir(d) if n.startswith("wal-") and n.endswith(".log"))
            if names and names[0] != "wal-0000000000000000.log":
                raise SnapshotDamage(
                    f"{d} starts at {names[0]} but there is no snapshot covering the frames "
                    "before it; refusing to start with nothing changed on disk"
                )
    layout = shard_dirs(data_dir, n_shards)
    shards: list[WalShard] = []
    scans, leftovers = _scan_all(fs, data_dir, layout, body)
    for sc in scans:
        if sc.damage:
            raise WalDamage(sc.dir, sc.damage)
    ids = sorted(
        set(topic_ids(fs, data_dir)) | (set(topic_ids(fs, cold_dir)) if cold_dir else set())
    )
    damaged = segment_damage(fs, data_dir, ids, body, scans, cold_dir)
    if damaged:
        older = [x for x in load_valid(fs, meta) if x[0] < snap_n]
        fb = older[0] if older else None
        plan = _rebuild_plan(fs, data_dir, fb[1], damaged) if fb is not None else None
        if fb is None or plan is None:
            raise damaged[0]
        fb_scans, fb_left = _scan_all(fs, data_dir, layout, fb[1])
        if any(sc.damage for sc in fb_scans):
            raise damaged[0]
        _set_aside(fs, data_dir, plan, damaged, int(body.get("taken_ms", 0)) if body else 0)
        snap_n, body = fb
        scans, leftovers = fb_scans, fb_left
        again = segment_damage(fs, data_dir, ids, body, scans, cold_dir)
        if again:
            raise again[0]
    try:
        pubs = {int(m["id"]): published_upto(m) for m in (body or {}).get("topics") or []}
        topics = {
            tid: load_topic(fs, data_dir, tid, cold_dir, pubs.get(tid, RELIES_ON_NOTHING))
            for tid in ids
        }
        for sc in scans[: len(layout)]:
            shards.append(WalShard.open_scanned(fs, sc, **shard_kw))
    except BaseException:
        for sh in shards:
            sh.close()
        raise
    return Loaded(snap_n, body, shards, scans, leftovers, topics, data_dir)


def lost_ranges(
    body: dict[str, Any] | None, scans: list[ShardScan]
) -> dict[int, list[tuple[int, int]]]:
    """Per topic id, the seq ranges recorded as lost: the snapshot's `lost` lists and
    the Lost frames of the scanned WAL (written by `topics repair`)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for m in (body or {}).get("topics") or []:
        for a, b in m.get("lost") or []:
            out.setdefault(int(m["id"]), []).append((int(a), int(b)))
    for sc in scans:
        for f in sc.files:
            sel = (f.cols["type"] == LOST) & (f.cols["topic_id"] != 0)
            for off in f.cols["off"][sel].tolist():
                fr = decode_frame(f.buf, off)
                if not isinstance(fr, Frame):
                    continue
                try:
                    lb = fr.control()
                    out.setdefault(fr.topic_id, []).append((int(lb["first"]), int(lb["last"])))
                except (FrameError, KeyError, TypeError, ValueError):
                    continue
    return out


async def recover_async(
    engine: Engine,
    fs: Fs,
    data_dir: str,
    n_shards: int,
    *,
    progress: Callable[[float], None] | None = None,
    cold_dir: str | None = None,
    **shard_kw: Any,
) -> tuple[list[WalShard], RecoveryReport]:
    """Rebuild `engine` (fresh, in-memory journal) from `data_dir`; return the open
    shards, keeping the event loop responsive.

    Files are read in a worker thread; replay runs on the loop in slices so
    `/v0/ready` can answer 503 with progress meanwhile. Raises OSError when a
    shard or segment cannot be read or repaired. `progress(fraction)` is called
    as frames are applied.
    """
    t0 = engine.clock.monotonic()
    loaded = await asyncio.to_thread(load_data_dir, fs, data_dir, n_shards, cold_dir, **shard_kw)
    report = RecoveryReport()
    try:
        for _ in replay(engine, loaded, report, progress=progress):
            await asyncio.sleep(0)
    except BaseException:
        for sh in loaded.shards:
            sh.close()
        raise
    report.seconds = engine.clock.monotonic() - t0
    return loaded.shards, report


# ---------------------------------------------------------------- replay


@dataclass
class _Piece:
    """Rows of one topic inside one scanned file, in log order."""

    si: int
    file: ScannedFile
    rows: np.ndarray[Any, Any]


class _Ctx:
    def __init__(self, engine: Engine, loaded: Loaded, report: RecoveryReport) -> None:
        self.engine = engine
        self.loaded = loaded
        self.report = report
        self.reserved: dict[int, int] = {}
        body = loaded.snapshot or {}
        self.snap_next_id = int(body.get("next_topic_id", 0)) if loaded.snapshot else 0
        self.snap_router_ops = int(body.get("router_ops", 0)) if loaded.snapshot else -1

    def attach(self, topic_id: int) -> None:
        """Hand a topic instance just created its records loaded from segments."""
        lt = self.loaded.topics.get(topic_id)
        if lt is None or self.engine.topic_by_id(topic_id) is None:
            return
        self.engine.apply(SegmentsAttached(topic_id, lt.base_seq, lt.rows, dict(lt.sources)))
        self.report.segments += len(lt.sources)
        self.report.segment_records += len(lt.rows)
        self.report.stores[topic_id] = lt.store


def replay(
    engine: Engine,
    loaded: Loaded,
    report: RecoveryReport,
    *,
    progress: Callable[[float], None] | None = None,
    slice_frames: int = 50_000,
) -> Iterator[None]:
    """Step 2 and 3 on `engine`; yields between slices of about `slice_frames` frames."""
    ctx = _Ctx(engine, loaded, report)
    scans = loaded.scans
    report.shards = len(scans)
    report.snapshot = loaded.snapshot_n
    # A shard-count change must be absorbed by a checkpoint before the next one.
    report.layout_changed = bool(loaded.leftovers)
    body = loaded.snapshot
    if body is not None:
        listed = {str(k) for k in (body.get("wal") or {})}
        here = {posixpath.relpath(sh.dir, loaded.data_dir) for sh in loaded.shards}
        report.layout_changed |= not here <= listed
    routers_state: dict[str, RouterPut] = {}
    if body is not None:
        engine.apply(TopicIdsUsed(ctx.snap_next_id))
        for m in body.get("topics") or []:
            ev = topic_restored(m)
            engine.apply(ev)
            res = int(m.get("reserved", 0))
            if res:
                ctx.reserved[ev.topic_id] = res
            ctx.attach(ev.topic_id)
        for rp in router_states(body):
            routers_state[rp.router.name] = rp
        # Deletes the snapshot lists but whose `.idx` flags may not be on disk yet.
        for tid, runs in body.get("flips") or []:
            engine.apply(SeqsDeleted(int(tid), tuple(expand_ranges(runs))))
    report.router_ops = max(ctx.snap_router_ops, 0)

    # Group every scanned frame by topic id, in log order per shard directory.
    pieces: dict[int, list[_Piece]] = {}
    dirs_of: dict[int, set[int]] = {}
    globals_: list[tuple[int, int, ScannedFile, int]] = []
    for si, sc in enumerate(scans):
        if sc.torn is not None:
            report.torn.append(f"{sc.dir}/{sc.end_file}@{sc.torn.offset}: {sc.torn.reason}")
        for fi, f in enumerate(sc.files):
            cols = f.cols
            if not len(cols):
                continue
            report.frames += len(cols)
            tids = cols["topic_id"]
            order = np.argsort(tids, kind="stable")
            uniq, starts = np.unique(tids[order], return_index=True)
            bounds = [*starts.tolist(), len(order)]
            for k, tid in enumerate(uniq.tolist()):
                rows = order[bounds[k] : bounds[k + 1]]
                if tid == 0:
                    for r in rows.tolist():
                        globals_.append((si, fi, f, r))
                    continue
                pieces.setdefault(tid, []).append(_Piece(si, f, rows))
                dirs_of.setdefault(tid, set()).add(si)

    # After `topics repair`, a topic whose TopicCreate was in the damaged bytes still
    # has readable records: keep them under a name that says so (docs/FORMATS.md,
    # "Repair") rather than drop them for want of a name.
    repaired = any(
        bool(np.any((f.cols["type"] == LOST) & (f.cols["topic_id"] == 0)))
        for sc in scans
        for f in sc.files
    )
    if repaired:
        for tid, plist in pieces.items():
            if engine.topic_by_id(tid) is not None or any(
                bool(np.any(pc.file.cols["type"][pc.rows] == TOPIC_CREATE)) for pc in plist
            ):
                continue
            name = f"recovered.{tid:016x}"
            if name in engine.topics:
                continue
            engine.apply(
                TopicCreated(tid, name, parse_topic_config({}, name), 1, engine.clock.now_ms())
            )
            ctx.attach(tid)
            log.error(
                "topic %016x lost its TopicCreate to damage; its records are served as %r",
                tid,
                name,
            )

    total = max(report.frames, 1)
    done = 0
    since_yield = 0
    max_id = 0
    for tid in sorted(pieces):
        max_id = max(max_id, tid)
        plist = pieces[tid]
        if len(dirs_of[tid]) > 1:
            report.layout_changed = True
            cur = shard_of(tid, len(loaded.shards))
            n = _replay_merged(ctx, tid, plist, cur)
        else:
            n = 0
            for pc in plist:
                n += _replay_piece(ctx, tid, pc)
        done += n
        since_yield += n
        if progress is not None:
            progress(min(done / total, 0.99))
        if since_yield >= slice_frames:
            since_yield = 0
            yield

    # Routers (shard 0, topic id 0), in log order; frames the snapshot reflects are skipped.
    globals_.sort(key=lambda x: (x[0], x[1], int(x[2].cols["off"][x[3]])))
    for _si, _fi, f, r in globals_:
        typ = int(f.cols["type"][r])
        if typ not in (ROUTER_CREATE, ROUTER_DELETE):
            continue
        fr = decode_frame(f.buf, int(f.cols["off"][r]))
        if not isinstance(fr, Frame):
            continue
        try:
            rb = fr.control()
        except FrameError:
            continue
        op = int(rb.get("op", 0))
        report.router_ops = max(report.router_ops, op)
        if op and op <= ctx.snap_router_ops:
            continue
        if typ == ROUTER_CREATE:
            rp = router_from_body(rb)
            routers_state[rp.router.name] = rp
        else:
            routers_state.pop(str(rb.get("name")), None)

    # Disk-class seqs are never reused: the head jumps to the durable reservation.
    for topic_id, head in ctx.reserved.items():
        engine.apply(HeadReserved(topic_id, head))
    engine.apply(TopicIdsUsed(max_id + 1))
    engine.apply_retention_all()

    if engine.routers is not None:
        # Installed only while the source and dest instances they name are live.
        for rp in routers_state.values():
            engine.apply(rp)
            if engine.routers.by_name(rp.router.name) is not None:
                report.routers += 1
        engine.routers.drain_all()
    # Segment stores of topic instances that are gone: the first checkpoint removes them.
    for tid, lt in loaded.topics.items():
        report.stores.setdefault(tid, lt.store)
    for d, sc in zip(loaded.leftovers, scans[len(loaded.shards) :], strict=True):
        report.absorbed[d] = WalPosition(sc.end_file or "", sc.end_offset, sc.next_index)
    report.topics = len(engine.topics)
    report.reserved = ctx.reserved
    if progress is not None:
        progress(1.0)


def _replay_piece(ctx: _Ctx, tid: int, pc: _Piece) -> int:
    """Apply one topic's rows of one file: appends in bulk runs, controls one by one."""
    cols = pc.file.cols
    rows = pc.rows
    types = cols["type"][rows]
    ctl = np.flatnonzero(types != APPEND)
    start = 0
    for c in [*ctl.tolist(), len(rows)]:
        if c > start:
            _restore_appends(ctx, tid, pc.file, rows[start:c])
        if c < len(rows):
            _control_row(ctx, tid, pc.file, int(rows[c]))
        start = c + 1
    return len(rows)


def _restore_appends(ctx: _Ctx, tid: int, f: ScannedFile, rows: np.ndarray[Any, Any]) -> None:
    if ctx.engine.topic_by_id(tid) is None:
        return  # never created here, or deleted: its appends are dropped
    ctx.report.records += ctx.engine.apply(RecordsReplayed(tid, f.buf, f.cols[rows]))


def _control_row(ctx: _Ctx, tid: int, f: ScannedFile, row: int) -> None:
    fr = decode_frame(f.buf, int(f.cols["off"][row]))
    if isinstance(fr, Frame):
        _apply_frame(ctx, tid, fr, f)


def _apply_frame(ctx: _Ctx, tid: int, fr: Frame, f: ScannedFile | None) -> None:
    engine = ctx.engine
    if fr.type == APPEND:
        if f is not None and engine.topic_by_id(tid) is not None:
            c = np.zeros(1, f.cols.dtype)
            c["off"], c["size"], c["flags"], c["seq"], c["ts"] = (
                fr.offset,
                fr.size,
                fr.flags,
                fr.seq,
                fr.ts,
            )
            c["dl"] = len(fr.payload)
            ctx.report.records += engine.apply(RecordsReplayed(tid, f.buf, c))
        return
    if fr.type == HEAD_WATERMARK:
        exact = False
        try:
            exact = bool(fr.control().get("exact"))
        except FrameError:
            pass
        # A clean stop logs the exact head; a reservation only ever raises it.
        r = ctx.reserved
        r[tid] = fr.seq if exact else max(r.get(tid, 0), fr.seq)
        return
    if fr.type in (CHECKPOINT_MARK, SYNC_MARK):
        return
    if fr.type == TOPIC_CREATE and (tid < ctx.snap_next_id or engine.topic_by_id(tid) is not None):
        return  # the snapshot reflects this create (and whatever followed it)
    ev = decode_control(fr)
    if ev is None:
        return
    engine.apply(ev)
    if fr.type == TOPIC_CREATE:
        ctx.attach(tid)


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


def _replay_merged(ctx: _Ctx, tid: int, plist: list[_Piece], current: int) -> int:
    """One topic's frames from several shard directories: merge by seq position.

    At one position, frames of the topic's current shard (index `current` in the
    scan list) come last: the other directories were written under an older
    shard count. Between older directories the order is a guess (later-listed
    first); recovery checkpoints right after any layout change, so at most one
    change is ever pending.
    """
    keyed: list[tuple[int, int, int, int, int, Frame, ScannedFile]] = []
    for pc in plist:
        for r in pc.rows.tolist():
            fr = decode_frame(pc.file.buf, int(pc.file.cols["off"][r]))
            if isinstance(fr, Frame):
                pos, rank = _position(fr)
                cur = 1 if pc.si == current else 0
                keyed.append((pos, rank, cur, -pc.si, fr.offset, fr, pc.file))
    keyed.sort(key=lambda x: x[:5])
    for *_k, fr, f in keyed:
        _apply_frame(ctx, tid, fr, f)
    return len(keyed)
