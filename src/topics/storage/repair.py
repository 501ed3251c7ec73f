"""`topics repair`: salvage a data directory whose WAL holds damage (docs/FORMATS.md, "Repair").

Recovery refuses to start over damage (:class:`~topics.storage.wal.WalDamage`);
this is the explicit operator step that lets it start again. For each shard
with damage it:

1. works out, per topic, which seqs the damaged bytes may have held: the seqs
   missing between the last readable record before the damage and the first
   after it, the seqs named by headers inside the damaged bytes that still
   parse, and, for topics with nothing readable after the damage, as many seqs
   past their last readable one as the unparsed bytes could hold (so that no
   seq is ever handed out twice);
2. copies every damaged file into `quarantine/<stamp>/` of the data dir
   (durably, before anything else: the bytes are kept, never deleted) and
   atomically replaces it under the original name with the same bytes with each damaged range replaced by one
   `Lost` filler frame of exactly its size, so every valid frame on both sides
   keeps its offset and frame index; frames missing between files (a lost file)
   get a new file holding one filler that stands for them;
3. appends one `Lost` frame per topic range to the newest file of the shard;
   replay turns each into a `corrupt` tombstone over exactly that range and
   raises the topic's head past it.

Nothing is repaired in place: the originals stay in the quarantine, and a
`manifest.json` there lists what was moved, why, and the seq ranges recorded
as lost. Run it only while no server uses the directory (it takes the lock).
"""

from __future__ import annotations

import json
import posixpath
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topics.clock import Clock, SystemClock
from topics.format.frame import (
    APPEND,
    CONFIG_UPDATE,
    DELETE,
    FRAME_TYPES,
    HEADER,
    LEASE,
    LOST,
    MIN_FRAME_SIZE,
    ROUTER_CREATE,
    ROUTER_DELETE,
    SYNC_MARK,
    TOPIC_CREATE,
    TOPIC_DELETE,
    TYPE_NAMES,
    encode_control,
    encode_frame,
    frame_len_for,
)
from topics.storage.fs import Fs, read_file, write_all, write_file
from topics.storage.journal import shard_dirs, shard_of
from topics.storage.recovery import (
    existing_shard_dirs,
    segment_damage,
    segment_starts,
    topic_ids,
)
from topics.storage.segment import segment_paths, topic_dir
from topics.storage.snapshot import load_latest
from topics.storage.wal import (
    Damage,
    ShardScan,
    WalPosition,
    scan_shard,
    wal_file_name,
)

__all__ = ["RepairPlan", "ShardRepair", "plan_repair", "apply_repair"]

_U32 = struct.Struct("<I")

# What losing a control frame means, said in the plan and the manifest.
_CONTROL_LOSS = {
    TOPIC_CREATE: "a topic created after the last checkpoint with no readable record "
    "is gone; one with records comes back as `recovered.<topic id>`",
    TOPIC_DELETE: "the topic may come back",
    DELETE: "records it deleted may come back",
    CONFIG_UPDATE: "the topic's config may be the one before it",
    ROUTER_CREATE: "the router may be missing or older",
    ROUTER_DELETE: "the router may come back",
    LEASE: "a queue lease may be in an older state",
}


@dataclass
class ShardRepair:
    """What repair does to one shard.

    `fillers[file]` lists `(start, end, frames)`: the byte range replaced by a
    filler standing for `frames` frame indexes; `new_files` maps a new file's
    name to the frame count its filler stands for; `lost[topic id]` is the list
    of `(first, last)` seq ranges recorded as lost.
    """

    dir: str
    damage: list[Damage]
    fillers: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    new_files: dict[str, int] = field(default_factory=dict)
    lost: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # `(type, topic id)` of the control frames whose headers still read inside the
    # damaged bytes: what the repair cannot bring back (reported, never guessed).
    controls: list[tuple[int, int]] = field(default_factory=list)
    # The scan the plan was made from, and the replay start it used.
    scan: ShardScan | None = None
    start: WalPosition | None = None


@dataclass
class SegmentRepair:
    """A damaged segment the snapshot relies on: its surviving files move to the
    quarantine and `ranges` (its seqs) are recorded as lost."""

    topic_id: int
    files: list[str]
    ranges: list[tuple[int, int]]
    problems: list[str]


@dataclass
class RepairPlan:
    """Every shard and segment that needs repair; `ok` is False when some damage
    cannot be salvaged."""

    data_dir: str
    shards: list[ShardRepair]
    segments: list[SegmentRepair] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(s.problems for s in self.shards)

    def lines(self) -> list[str]:
        """A human-readable plan, one line per action."""
        out: list[str] = []
        for sg in self.segments:
            for p in sg.problems:
                out.append(f"damage  {p}")
            for f in sg.files:
                out.append(f"move    {posixpath.relpath(f, self.data_dir)} to the quarantine")
        for sr in self.shards:
            rel = posixpath.relpath(sr.dir, self.data_dir)
            for d in sr.damage:
                out.append(f"damage  {rel}/{d.file} [{d.start}, {d.end}): {d.reason}")
            for name, rngs in sr.fillers.items():
                for a, b, k in rngs:
                    out.append(
                        f"replace {rel}/{name} bytes [{a}, {b}) by a Lost filler ({k} frames); "
                        "the original moves to the quarantine"
                    )
            for name, k in sr.new_files.items():
                out.append(f"create  {rel}/{name}: a Lost filler for {k} missing frames")
            for tid, lost in sorted(sr.lost.items()):
                for a, b in lost:
                    out.append(f"lost    topic {tid:016x} seqs {a}..{b} (reads get a tombstone)")
            for typ, tid in sr.controls:
                out.append(
                    f"gone    a {TYPE_NAMES.get(typ, str(typ))} frame"
                    + (f" of topic {tid:016x}" if tid else "")
                    + f": {_CONTROL_LOSS.get(typ, 'its effect is lost')}"
                )
            for p in sr.problems:
                out.append(f"cannot  {rel}: {p}")
        return out


def _parse_headers(
    buf: bytes, start: int, end: int, controls: list[tuple[int, int]] | None = None
) -> tuple[list[tuple[int, int]], int]:
    """Walk frame headers inside damaged bytes without trusting checksums.

    Returns the `(topic id, seq)` of the Append headers whose lengths are
    consistent, and how many bytes could not be walked that way; the
    `(type, topic id)` of other frames found are added to `controls`.
    """
    found: list[tuple[int, int]] = []
    off = start
    while off + HEADER.size <= end:
        fl, typ, _flags, tid, seq, _ts, nl, tl, dl = HEADER.unpack_from(buf, off)
        if typ not in FRAME_TYPES:
            break
        body = frame_len_for(nl, tl, dl)
        if body == end - off - 4:
            fl = body  # the length prefix is the damaged part: the other fields agree
        elif fl + 4 == end - off and fl >= MIN_FRAME_SIZE - 4:
            pass  # a length field is the damaged part, and the frame ends the range
        elif fl < MIN_FRAME_SIZE - 4 or off + 4 + fl > end or body != fl:
            break
        if typ == APPEND:
            found.append((tid, seq))
        elif controls is not None and typ not in (SYNC_MARK, LOST):
            controls.append((typ, tid))
        off += 4 + fl
    return found, max(end - off, 0)


def _add(lost: dict[int, list[tuple[int, int]]], tid: int, a: int, b: int) -> None:
    if b >= a >= 1:
        lost.setdefault(tid, []).append((a, b))


def _merge(rngs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(rngs):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _plan_shard(fs: Fs, sc: ShardScan, heads: dict[int, int]) -> ShardRepair:
    heads_ids = set(heads)
    sr = ShardRepair(sc.dir, list(sc.damage))
    bufs = {f.name: f.buf for f in sc.files}
    # Every topic the readable part of the log names (a TopicCreate counts too).
    seen: set[int] = set()
    for f in sc.files:
        seen.update(np.unique(f.cols["topic_id"]).tolist())
    seen.discard(0)
    for d in sc.damage:
        if d.index >= 0:
            if d.frames > 0:
                sr.new_files[wal_file_name(d.index)] = d.frames
        elif d.end > d.start:
            if d.end - d.start < MIN_FRAME_SIZE:
                sr.problems.append(
                    f"{d.file} [{d.start}, {d.end}) is too short for a filler frame; "
                    "salvage it by hand from the quarantine copy"
                )
                continue
            sr.fillers.setdefault(d.file, []).append((d.start, d.end, d.frames))
        # The seqs at risk, per topic.
        parsed: list[tuple[int, int]] = []
        unparsed = 0
        buf = bufs.get(d.file)
        if d.end > d.start and buf is not None:
            parsed, unparsed = _parse_headers(buf, d.start, min(d.end, len(buf)), sr.controls)
        elif d.index >= 0 or d.end == d.start:
            unparsed = max(d.frames, 1) * MIN_FRAME_SIZE
        known = set(d.before) | set(d.after) | set(heads) | seen
        span = max((d.end - d.start) // MIN_FRAME_SIZE, 1)  # records the bytes could hold
        for tid, seq in parsed:
            lo = d.before.get(tid, heads.get(tid, 0))
            hi = d.after.get(tid)
            if tid in known and lo < seq <= lo + span and (hi is None or seq < hi):
                _add(sr.lost, tid, seq, seq)
            else:
                unparsed += MIN_FRAME_SIZE  # a header we cannot trust
        # Topics with records on both sides lost what lies between; when some bytes
        # cannot be read at all, every topic without a readable record after them
        # (the log names it, or the snapshot does) may have had records there.
        for tid in set(d.before) | set(d.after) | ((seen | heads_ids) if unparsed else set()):
            lo = d.before.get(tid, heads.get(tid, 0))
            hi = d.after.get(tid)
            if hi is not None:
                _add(sr.lost, tid, lo + 1, hi - 1)
            elif unparsed:
                # Nothing readable follows: the unparsed bytes could hold this many of
                # its records; never hand those seqs out again.
                _add(sr.lost, tid, lo + 1, lo + max(unparsed // MIN_FRAME_SIZE, 1))
    sr.lost = {t: _merge(r) for t, r in sr.lost.items()}
    return sr


def _filler(frames: int, size: int) -> bytes:
    """A shard-level Lost frame standing for `frames` frame indexes (its header `seq`),
    exactly `size` bytes long (zero padding as payload), or the smallest (46
    bytes) when `size` is 0. Raises ValueError when `size` is below 46."""
    if size == 0:
        size = MIN_FRAME_SIZE
    if size < MIN_FRAME_SIZE:
        raise ValueError(f"no filler frame is {size} bytes (the smallest is {MIN_FRAME_SIZE})")
    return encode_frame(LOST, 0, frames, 0, bytes(size - MIN_FRAME_SIZE))


def plan_repair(fs: Fs, data_dir: str) -> RepairPlan:
    """Scan every shard from the newest snapshot's positions and every topic's
    segments the snapshot relies on; plan the salvage.

    Reads only. Raises OSError when a file cannot be read.
    """
    found = load_latest(fs, posixpath.join(data_dir, "meta"))
    body = found[1] if found is not None else {}
    positions: dict[str, WalPosition] = {}
    for rel, pos in (body.get("wal") or {}).items():
        positions[posixpath.normpath(posixpath.join(data_dir, str(rel)))] = WalPosition(
            str(pos[0]), int(pos[1]), int(pos[2])
        )
    heads = {int(m["id"]): int(m.get("head", 0)) for m in body.get("topics") or []}
    shards: list[ShardRepair] = []
    dirs = existing_shard_dirs(fs, data_dir) or shard_dirs(data_dir, 1)
    scans: dict[str, ShardScan] = {}
    for d in dirs:
        sc = scan_shard(fs, d, positions.get(posixpath.normpath(d)))
        scans[d] = sc
        if sc.damage:
            sr = _plan_shard(fs, sc, heads)
            sr.scan = sc
            sr.start = positions.get(posixpath.normpath(d))
            shards.append(sr)
    plan = RepairPlan(data_dir, shards)
    for exc in segment_damage(fs, data_dir, topic_ids(fs, data_dir), body, list(scans.values())):
        tid = exc.topic_id
        d = topic_dir(data_dir, tid)
        starts = segment_starts(fs, d)
        files: list[str] = []
        ranges: list[tuple[int, int]] = []
        for a, b in exc.ranges:
            # The whole segment holding the damage moves aside (an active one cut
            # short loses the seqs it held, said as lost rather than truncated).
            first = max([x for x in starts if x <= a], default=a)
            paths = segment_paths(d, first)
            files += [p for p in (paths.data, paths.idx) if fs.exists(p)]
            ranges.append((first, b))
        plan.segments.append(SegmentRepair(tid, sorted(set(files)), ranges, exc.problems))
        # The lost seqs are logged in the topic's shard, like WAL damage.
        shard = dirs[shard_of(tid, len(dirs))] if len(dirs) > 1 else dirs[0]
        sr2 = next((x for x in plan.shards if x.dir == shard), None)
        if sr2 is None:
            sr2 = ShardRepair(shard, [])
            sr2.scan = scans.get(shard) or scan_shard(fs, shard)
            sr2.start = positions.get(posixpath.normpath(shard))
            plan.shards.append(sr2)
        for a, b in ranges:
            _add(sr2.lost, tid, a, b)
        sr2.lost = {t: _merge(r) for t, r in sr2.lost.items()}
    return plan


def apply_repair(fs: Fs, plan: RepairPlan, *, clock: Clock | None = None) -> str:
    """Carry out `plan`; returns the quarantine directory holding the originals.

    Every original is copied into the quarantine (and synced) before its
    replacement is written (tmp file, fdatasync, rename, directory fsync), so a
    crash at any point leaves either the original or the replacement under its
    name, and the original always in the quarantine. Raises OSError from the filesystem,
    ValueError when the plan has ranges it cannot salvage.
    """
    if not plan.ok:
        raise ValueError("the plan has damage that cannot be salvaged automatically")
    clock = clock or SystemClock()
    now = clock.now_ms()
    stamp = f"repair-{now}"
    qroot = posixpath.join(plan.data_dir, "quarantine", stamp)
    manifest: dict[str, Any] = {"stamp": stamp, "shards": [], "segments": []}
    for sg in plan.segments:
        for path in sg.files:
            dest = posixpath.join(qroot, posixpath.relpath(path, plan.data_dir))
            fs.makedirs(posixpath.dirname(dest))
            write_file(fs, dest, read_file(fs, path))
            fs.fsync_dir(posixpath.dirname(dest))
            fs.unlink(path)  # moved: the bytes are in the quarantine, synced
        if sg.files:
            fs.fsync_dir(posixpath.dirname(sg.files[0]))
        manifest["segments"].append(
            {
                "topic": f"{sg.topic_id:016x}",
                "moved": [posixpath.relpath(p, plan.data_dir) for p in sg.files],
                "problems": sg.problems,
                "lost": [list(r) for r in sg.ranges],
            }
        )
    for sr in plan.shards:
        rel = posixpath.relpath(sr.dir, plan.data_dir)
        qdir = posixpath.join(qroot, rel)
        fs.makedirs(qdir)
        moved: list[str] = []
        for name, rngs in sr.fillers.items():
            buf = bytearray(read_file(fs, posixpath.join(sr.dir, name)))
            for a, b, k in rngs:
                buf[a:b] = _filler(k, b - a)
            _replace(fs, sr.dir, name, bytes(buf), posixpath.join(qdir, name))
            moved.append(name)
        for name, k in sr.new_files.items():
            _replace(fs, sr.dir, name, _filler(k, 0), None)
        # One Lost frame per topic range, appended at the end of the log.
        tail = b"".join(
            encode_control(LOST, tid, {"first": a, "last": b}, seq=a, ts=now, durable=True)
            for tid, rngs in sorted(sr.lost.items())
            for a, b in rngs
        )
        # The log as it reads now: where it ends, and no damage left.
        after = scan_shard(fs, sr.dir, sr.start)
        if after.damage:
            raise ValueError(
                "the salvaged log still reads as damaged: " + after.damage[0].describe(sr.dir)
            )
        if tail and after.end_file is not None:
            _append_tail(fs, sr.dir, after, tail, qdir, moved, after.end_offset)
        fs.fsync_dir(sr.dir)
        manifest["shards"].append(
            {
                "shard": rel,
                "moved": moved,
                "created": sorted(sr.new_files),
                "damage": [
                    {"file": d.file, "start": d.start, "end": d.end, "reason": d.reason}
                    for d in sr.damage
                ],
                "lost": [[f"{tid:016x}", a, b] for tid, r in sorted(sr.lost.items()) for a, b in r],
                "control_frames_gone": [
                    {"type": TYPE_NAMES.get(t, str(t)), "topic": f"{tid:016x}"}
                    for t, tid in sr.controls
                ],
            }
        )
    write_file(fs, posixpath.join(qroot, "manifest.json"), json.dumps(manifest, indent=1).encode())
    fs.fsync_dir(qroot)
    return qroot


def _append_tail(
    fs: Fs, d: str, sc: ShardScan, tail: bytes, qdir: str, moved: list[str], end: int
) -> None:
    assert sc.end_file is not None
    name = sc.end_file
    path = posixpath.join(d, name)
    f = fs.open(path, write=True)
    try:
        size = f.size()
        if end + len(tail) > size:
            f.close()
            nxt = posixpath.join(d, wal_file_name(sc.next_index))
            write_file(fs, nxt, tail)
            return
        # A torn tail past the end is kept aside before the Lost frames cover it.
        if name not in moved and f.pread(max(size - end, 0), end).strip(b"\0"):
            keep = f.pread(size, 0)
            write_file(fs, posixpath.join(qdir, name), keep)
            moved.append(name)
        write_all(f, tail, end)
        zero = sc.torn_end - (end + len(tail)) if sc.torn is not None else 0
        if zero > 0:
            write_all(f, bytes(zero), end + len(tail))
        f.fdatasync()
    finally:
        f.close()


def _replace(fs: Fs, d: str, name: str, data: bytes, quarantine: str | None) -> None:
    """Put `data` under `d/name`; the old file (if any) goes to `quarantine` first."""
    path = posixpath.join(d, name)
    if quarantine is not None:
        write_file(fs, quarantine, read_file(fs, path))
        fs.fsync_dir(posixpath.dirname(quarantine))
    tmp = posixpath.join(d, name + ".repair-tmp")
    write_file(fs, tmp, data)
    fs.replace(tmp, path)
    fs.fsync_dir(d)
