"""fsck for a data directory: WAL shards, segments and snapshots (docs/FORMATS.md).

:func:`check` reads every durable file under a data dir through an injected
:class:`~topics.storage.fs.Fs` and returns a :class:`CheckReport`: counts plus a
list of :class:`Problem` values. It never writes, never repairs and never raises
on bad bytes (only on a missing data dir); an unreadable file is itself a
problem. Layout checked (README "Durability and the data directory")::

    <data>/wal/wal-*.log                 one shard (flat layout), or
    <data>/wal/shard-NN/wal-*.log        one dir per shard
    <data>/topics/<topic_id %016x>/seg-<first_seq %016d>.{data,idx}
    <data>/meta/snapshot.NNNN.bin

Each problem has a :attr:`Problem.severity`:

* ``corrupt`` -- bytes that the format or the crash contract says cannot be
  there: mid-log WAL damage (valid frames after the logical end of a shard),
  a bad frame or index entry in a sealed segment, an invalid snapshot, no valid
  snapshot at all. :attr:`CheckReport.ok` is False when any exists.
* ``warning`` -- a legal crash leftover that needs cleanup or a suspicious but
  recoverable state (a stray segment half, a WAL Append seq that goes back).
* ``info`` -- expected after a crash and handled by recovery: the torn tail of
  a WAL shard or of a topic's newest (possibly active) segment, `.tmp` files.

**WAL damage.** fsck classifies a shard exactly as recovery does
(:func:`~topics.storage.wal.scan_shard`, docs/FORMATS.md "Torn tail or
damage"): invalid bytes past the newest file's last SyncMark, with nothing
valid after them, are a ``torn_tail`` (info: the next start cuts them); every
other invalid range, and frames missing between files, is ``mid_log_damage``
(corrupt: the server refuses to start until `topics repair`), with the seqs at
risk and the number of valid frames after it (:attr:`CheckReport.lost_frames`
counts those frames).

**Active segments.** Only the active segment may have a torn tail, and fsck
cannot tell it from a sealed one on disk, so by default the newest segment of
each topic is treated as possibly active: a damaged *suffix* there (a partial
trailing `.idx` entry, entries past `.data`, bad trailing frames, unindexed
`.data` bytes) is ``segment_torn_tail`` (info), exactly what
:meth:`~topics.storage.segment.SegmentWriter.resume` cuts. Damage followed by
good entries is corrupt even there. `all_sealed=True` treats every segment as
sealed.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import orjson

from topics.format.frame import (
    APPEND,
    LOST,
    SEG_MIN_FRAME_SIZE,
    TOPIC_CREATE,
    TOPIC_DELETE,
    Frame,
    FrameError,
    Torn,
    decode_segment_frame,
)
from topics.format.idx import DELETED, IDX_ENTRY_DTYPE
from topics.format.snapshot import SnapshotInvalid, decode_snapshot
from topics.storage.fs import Fs, read_file
from topics.storage.objstore import cold_root, fs_for, is_object_url
from topics.storage.recovery import segment_damage
from topics.storage.segment import IDX_ENTRY_SIZE, SegmentPaths, scan_segments, topic_dir
from topics.storage.snapshot import list_snapshots
from topics.storage.topicstore import idx_to_check
from topics.storage.wal import ShardScan, scan_shard

__all__ = [
    "INFO",
    "WARNING",
    "CORRUPT",
    "SEVERITY",
    "Problem",
    "CheckReport",
    "Progress",
    "check",
    "list_shards",
    "list_topic_dirs",
    "list_wal_files",
]

INFO = "info"
WARNING = "warning"
CORRUPT = "corrupt"

#: Severity of every problem kind fsck reports.
SEVERITY: dict[str, str] = {
    # WAL
    "torn_tail": INFO,  # the shard ends on a torn frame; recovery truncates it
    "mid_log_damage": CORRUPT,  # valid frames after the logical end of a shard
    "wal_bad_name": CORRUPT,  # a wal-*.log name recovery cannot parse
    "wal_layout_mixed": WARNING,  # flat wal/*.log files next to shard-NN dirs
    "wal_current": INFO,  # CURRENT missing or not naming the newest file
    "wal_bad_payload": CORRUPT,  # checksum-valid frame whose payload does not decode
    "wal_seq_regress": WARNING,  # an Append seq not above the topic's previous one
    # segments
    "segment_torn_tail": INFO,  # damaged suffix of a topic's newest segment
    "segment_stray": WARNING,  # `.data` without `.idx` or the reverse
    "segment_gone": INFO,  # listed, then removed by a running server (relocated or dropped)
    "rewrite_pending": INFO,  # a reclaim rewrite cut short; the next start finishes it
    "segment_damage": CORRUPT,  # a segment the newest snapshot relies on is missing a part,
    # short, or its `.idx` disagrees with its `.data`: the server refuses to start
    "segment_overlap": CORRUPT,  # seq ranges of two segments overlap
    "idx_size": CORRUPT,  # sealed `.idx` not a multiple of 20 bytes
    "idx_entry": CORRUPT,  # entry offset/len not contiguous or outside `.data`
    "idx_mismatch": CORRUPT,  # entry len/ts/flags disagree with the frame
    "segment_frame": CORRUPT,  # frame does not decode (checksum, lengths, ...)
    "segment_seq": CORRUPT,  # frame carries another seq than its entry
    "segment_topic": CORRUPT,  # frame carries another topic id than its dir
    "segment_payload": CORRUPT,  # frame payload is not JSON
    "data_trailing": CORRUPT,  # sealed `.data` bytes no entry points at
    "more_problems": CORRUPT,  # the per-file problem cap was hit
    # snapshots
    "snapshot_invalid": CORRUPT,
    "no_valid_snapshot": CORRUPT,
    "snapshot_wal_missing": CORRUPT,  # the newest snapshot's replay start is a missing file
    "snapshot_pruned": INFO,  # listed, then dropped by a running server for a newer one
    # anywhere
    "tmp_leftover": INFO,
    "unknown_entry": INFO,
    "topic_dir_deleted": INFO,
    "unreadable": CORRUPT,  # an I/O error reading a file or dir
}

#: Problems reported per file before the rest are summarised in one `more_problems`.
MAX_PER_FILE = 20

Progress = Callable[[int, int], None]
"""`progress(done, total)`: files checked so far out of all files to check."""

_SHARD_RE = re.compile(r"^shard-(\d+)$")
_TOPIC_RE = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: `kind` (a :data:`SEVERITY` key), the file, where, and why.

    `offset` is a byte offset inside `path` (WAL frames, segment `.data`),
    `seq` the record seq involved (segment entries, WAL Appends), either may be
    None.
    """

    kind: str
    path: str
    detail: str
    offset: int | None = None
    seq: int | None = None

    @property
    def severity(self) -> str:
        return SEVERITY.get(self.kind, CORRUPT)

    @property
    def corrupt(self) -> bool:
        return self.severity == CORRUPT

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "path": self.path,
            "offset": self.offset,
            "seq": self.seq,
            "detail": self.detail,
        }

    def where(self) -> str:
        """`offset N, seq M` with the parts that are known, or `""`."""
        parts = []
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.seq is not None:
            parts.append(f"seq {self.seq}")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        at = f" ({where})" if where else ""
        return f"{self.severity.upper()} {self.kind} {self.path}{at}: {self.detail}"


@dataclass
class CheckReport:
    """What :func:`check` found. :attr:`ok` is True when nothing is corrupt."""

    data_dir: str
    problems: list[Problem] = field(default_factory=list)
    # WAL
    shards: int = 0
    wal_files: int = 0
    frames: int = 0  # valid frames in the logical logs
    torn_tails: int = 0
    mid_log_damage: int = 0  # damaged points with valid frames after them
    lost_frames: int = 0  # valid frames after the logical end (recovery drops them)
    # segments
    topics: int = 0
    segments: int = 0
    records: int = 0  # `.idx` entries
    deleted_records: int = 0  # entries flagged 0xD5
    # snapshots
    snapshots: int = 0
    valid_snapshots: int = 0
    files_checked: int = 0

    @property
    def ok(self) -> bool:
        return not any(p.corrupt for p in self.problems)

    @property
    def corruption(self) -> list[Problem]:
        return [p for p in self.problems if p.corrupt]

    def count(self, severity: str) -> int:
        return sum(1 for p in self.problems if p.severity == severity)

    def add(self, kind: str, path: str, detail: str, **where: int | None) -> None:
        self.problems.append(Problem(kind, path, detail, where.get("offset"), where.get("seq")))

    def as_dict(self) -> dict[str, Any]:
        """`data_dir`, `ok`, every count in field order, then `problems`."""
        out: dict[str, Any] = {"data_dir": self.data_dir, "ok": self.ok}
        for f in fields(self):
            if f.name not in ("data_dir", "problems"):
                out[f.name] = getattr(self, f.name)
        out["problems"] = [p.as_dict() for p in self.problems]
        return out


# -- discovery -------------------------------------------------------------------


def _listdir(fs: Fs, path: str) -> list[str]:
    if not fs.exists(path):
        return []
    return sorted(fs.listdir(path))


def list_wal_files(fs: Fs, shard_dir: str) -> list[str]:
    """`wal-*.log` names of a shard, sorted (the same selection as recovery)."""
    return sorted(n for n in _listdir(fs, shard_dir) if n.startswith("wal-") and n.endswith(".log"))


def list_shards(fs: Fs, data_dir: str) -> list[tuple[str, str]]:
    """`(label, dir)` of every WAL shard: `("wal", <data>/wal)` for the flat
    layout (when it holds `wal-*.log` files) and `("shard-NN", <data>/wal/shard-NN)`.

    Raises OSError when `<data>/wal` exists but cannot be listed.
    """
    wal = posixpath.join(data_dir, "wal")
    names = _listdir(fs, wal)
    out: list[tuple[str, str]] = []
    if any(n.startswith("wal-") and n.endswith(".log") for n in names):
        out.append(("wal", wal))
    shards = sorted((int(m.group(1)), n) for n in names if (m := _SHARD_RE.match(n)))
    out.extend((n, posixpath.join(wal, n)) for _, n in shards)
    return out


def list_topic_dirs(fs: Fs, root: str) -> list[tuple[int, str]]:
    """`(topic_id, dir)` of every `<root>/topics/<16 hex>` directory, by id."""
    base = posixpath.join(root, "topics")
    return [(int(n, 16), posixpath.join(base, n)) for n in _listdir(fs, base) if _TOPIC_RE.match(n)]


def _first_index(name: str) -> int | None:
    try:
        return int(name[4:-4])
    except ValueError:
        return None


# -- WAL -------------------------------------------------------------------------


class _ShardChecker:
    def __init__(self, fs: Fs, report: CheckReport, tick: Callable[[], None]) -> None:
        self.fs = fs
        self.report = report
        self.tick = tick
        self.last_seq: dict[int, int] = {}
        self.scans: list[ShardScan] = []

    def frame_content(self, path: str, fr: Frame) -> None:
        r = self.report
        if fr.type == APPEND:
            bad = _payload_ok(fr)
            if bad is not None:
                r.add("wal_bad_payload", path, f"Append {bad}", offset=fr.offset)
            prev = self.last_seq.get(fr.topic_id)
            if prev is not None and fr.seq <= prev:
                r.add(
                    "wal_seq_regress",
                    path,
                    f"topic {fr.topic_id:016x}: Append seq {fr.seq} after seq {prev}",
                    offset=fr.offset,
                    seq=fr.seq,
                )
            self.last_seq[fr.topic_id] = fr.seq
            return
        if fr.type == LOST and fr.topic_id == 0:
            return  # a repair filler: zero padding, not a msgpack body
        try:
            fr.control()
        except FrameError as e:
            r.add("wal_bad_payload", path, str(e), offset=fr.offset)
        if fr.type in (TOPIC_CREATE, TOPIC_DELETE):
            self.last_seq.pop(fr.topic_id, None)

    def check(self, d: str, files: list[str]) -> None:
        r = self.report
        r.shards += 1
        self.last_seq = {}
        good = []
        for name in files:
            if _first_index(name) is None:
                r.add(
                    "wal_bad_name",
                    posixpath.join(d, name),
                    "cannot parse the frame index in the file name",
                )
            else:
                good.append(name)
        r.wal_files += len(good)
        sc = None
        err: OSError | None = None
        for _attempt in range(3):
            try:
                sc = scan_shard(self.fs, d)
                break
            except FileNotFoundError as e:
                # A running server removes the WAL files a snapshot covers: scan again.
                err = e
            except OSError as e:
                err = e
                break
        if sc is None:
            r.add("unreadable", d, str(err))
            for _ in files:
                self.tick()
            return
        self.scans.append(sc)
        for name, fr in sc.frames:
            self.frame_content(posixpath.join(d, name), fr)
            r.frames += 1
        if sc.damage:
            # Every valid frame after the first damage is at risk (counted once).
            r.lost_frames += sc.damage[0].valid_after
        for dmg in sc.damage:
            r.mid_log_damage += 1
            r.add(
                "mid_log_damage",
                posixpath.join(d, dmg.file),
                f"bytes [{dmg.start}, {dmg.end}): {dmg.reason}; {dmg.valid_after} valid frames "
                f"follow; at risk: {dmg.at_risk()}; the server refuses to start until "
                "`topics repair`",
                offset=dmg.start,
            )
        if sc.torn is not None and sc.end_file is not None:
            r.torn_tails += 1
            r.add(
                "torn_tail",
                posixpath.join(d, sc.end_file),
                f"log ends on a torn write past the last durable mark: {sc.torn.reason}",
                offset=sc.torn.offset,
            )
        for _ in files:
            self.tick()
        self._current(d, files)

    def _current(self, d: str, files: list[str]) -> None:
        fs = self.fs
        names = _listdir(fs, d)
        for n in names:
            if n.endswith(".tmp"):
                self.report.add("tmp_leftover", posixpath.join(d, n), "leftover temporary file")
        cur = posixpath.join(d, "CURRENT")
        if not files:
            return
        if "CURRENT" not in names:
            self.report.add("wal_current", cur, "missing (recovery does not need it)")
            return
        try:
            named = read_file(fs, cur).decode("utf-8", "replace").strip()
        except OSError as e:
            self.report.add("unreadable", cur, str(e))
            return
        if named not in files:
            self.report.add("wal_current", cur, f"names {named!r}, which does not exist")


# -- segments ----------------------------------------------------------------------


def _payload_ok(fr: Frame) -> str | None:
    try:
        orjson.loads(fr.data)
        meta = fr.meta
        if meta is not None:
            orjson.loads(meta)
    except (orjson.JSONDecodeError, FrameError) as e:
        return f"payload is not JSON: {e}"
    return None


def _check_segment(
    fs: Fs,
    report: CheckReport,
    topic_id: int,
    first: int,
    paths: SegmentPaths,
    active: bool,
) -> tuple[int, int] | None:
    """Check one segment; returns `(first_seq, entries)` or None when unreadable."""
    try:
        # A rewrite cut short after its `.data` went in pairs it with its
        # `.idx.rw` until the next start finishes it (docs/FORMATS.md, "Reclaim").
        idx_path = idx_to_check(fs, paths)
        if idx_path != paths.idx:
            report.add("rewrite_pending", idx_path, "a reclaim rewrite the next start finishes")
        raw_idx = read_file(fs, idx_path)
        data = read_file(fs, paths.data)
    except FileNotFoundError as e:
        if not fs.exists(paths.data) and not fs.exists(paths.idx):
            # Both halves were listed, and both are gone: a running server relocated
            # or dropped the segment meanwhile. Whether the newest snapshot still
            # relies on its seqs is checked with the snapshots (`segment_damage`).
            report.add("segment_gone", paths.data, "removed while verify ran")
        else:
            report.add("unreadable", paths.data, str(e))
        return None
    except OSError as e:
        report.add("unreadable", paths.data, str(e))
        return None
    whole = len(raw_idx) // IDX_ENTRY_SIZE
    partial = len(raw_idx) % IDX_ENTRY_SIZE
    entries = np.frombuffer(raw_idx, IDX_ENTRY_DTYPE, count=whole)
    offs = entries["offset"].tolist()
    lens = entries["len"].tolist()
    tss = entries["ts"].tolist()
    flags = entries["flags"].tolist()
    # (entry index, kind, path, detail, offset)
    bad: list[tuple[int, str, str, str, int | None]] = []
    end = 0
    for i in range(whole):
        off, ln, ts, fl = offs[i], lens[i], tss[i], flags[i]
        seq = first + i
        found: tuple[str, str, str] | None = None
        if off != end:
            found = ("idx_entry", paths.idx, f"entry offset {off}, expected {end} (contiguous)")
        elif ln < SEG_MIN_FRAME_SIZE or off + ln > len(data):
            found = (
                "idx_entry",
                paths.idx,
                f"entry [{off}, +{ln}) is not a frame inside .data ({len(data)} bytes)",
            )
        else:
            fr = decode_segment_frame(data, off)
            if not isinstance(fr, Frame):
                why = fr.reason if isinstance(fr, Torn) else "zeroed bytes"
                found = ("segment_frame", paths.data, why)
            elif fr.size != ln:
                found = ("idx_mismatch", paths.idx, f"entry len {ln}, frame is {fr.size} bytes")
            elif fr.seq != seq:
                found = ("segment_seq", paths.data, f"frame carries seq {fr.seq}")
            elif fr.topic_id != topic_id:
                found = ("segment_topic", paths.data, f"frame carries topic {fr.topic_id:016x}")
            elif fl != fr.flags and fl != DELETED:
                found = (
                    "idx_mismatch",
                    paths.idx,
                    f"entry flags {fl:#04x}, frame flags {fr.flags:#04x}",
                )
            elif ts != fr.ts:
                found = ("idx_mismatch", paths.idx, f"entry ts {ts}, frame ts {fr.ts}")
            elif fl != DELETED:  # a deleted entry's payload may be gone (a hole frame)
                why_payload = _payload_ok(fr)
                if why_payload is not None:
                    found = ("segment_payload", paths.data, why_payload)
        if found is not None:
            bad.append((i, found[0], found[1], found[2], off))
        end = off + ln
    report.records += whole
    report.deleted_records += sum(1 for f in flags if f == DELETED)

    first_bad = bad[0][0] if bad else whole
    suffix_only = [b[0] for b in bad] == list(range(first_bad, whole))
    trailing = max(0, len(data) - end)
    if active and suffix_only and (bad or partial or trailing):
        parts = []
        if bad:
            parts.append(
                f"{len(bad)} trailing entries invalid (seq {first + first_bad}: {bad[0][3]})"
            )
        if partial:
            parts.append(f"partial trailing .idx entry ({partial} bytes)")
        if trailing > 0:
            parts.append(f"{trailing} unindexed .data bytes")
        report.add(
            "segment_torn_tail",
            paths.data,
            "; ".join(parts) + " (cut when the segment is resumed)",
            seq=first + first_bad if bad else None,
        )
        return first, whole
    if partial:
        report.add(
            "idx_size",
            paths.idx,
            f"size {len(raw_idx)} is not a multiple of {IDX_ENTRY_SIZE}",
        )
    for i, kind, path, detail, off in bad[:MAX_PER_FILE]:
        report.add(kind, path, detail, offset=off, seq=first + i)
    if len(bad) > MAX_PER_FILE:
        report.add("more_problems", paths.data, f"{len(bad) - MAX_PER_FILE} more bad entries")
    if trailing > 0:
        report.add(
            "data_trailing",
            paths.data,
            f"{trailing} bytes after the last indexed frame",
            offset=end,
        )
    return first, whole


def _check_topic(
    fs: Fs,
    report: CheckReport,
    topic_id: int,
    d: str,
    all_sealed: bool,
    tick: Callable[[], None],
) -> None:
    try:
        sc = scan_segments(fs, d)
    except OSError as e:
        report.add("unreadable", d, str(e))
        return
    for p in sc.strays:
        report.add("segment_stray", p, "segment half without its partner (never served)")
    for p in sc.temps:
        report.add("tmp_leftover", p, "leftover temporary file of an interrupted put")
    prev: tuple[int, int] | None = None  # (first, count) of the previous segment
    newest = sc.segments[-1][0] if sc.segments else None
    for first, paths in sc.segments:
        report.segments += 1
        got = _check_segment(fs, report, topic_id, first, paths, not all_sealed and first == newest)
        tick()
        if got is None:
            continue
        if prev is not None and prev[1] and first <= prev[0] + prev[1] - 1:
            report.add(
                "segment_overlap",
                paths.data,
                f"starts at seq {first}, inside the previous segment "
                f"[{prev[0]}, {prev[0] + prev[1] - 1}]",
                seq=first,
            )
        prev = got


# -- snapshots ---------------------------------------------------------------------


def _check_snapshots(
    fs: Fs, report: CheckReport, meta: str, snaps: list[tuple[int, str]], tick: Callable[[], None]
) -> dict[str, Any] | None:
    """Check every snapshot of `snaps`; returns the newest valid one's body (None: none).

    A running server writes a snapshot and then drops the oldest one it keeps, so a
    snapshot listed before that and gone when it is read was pruned, not lost, when a
    newer one is there now: that is reported as `snapshot_pruned` (info) and the newer
    snapshots are checked in its place (docs/CLI.md, "The server and the offline tools").
    """
    for name in _listdir(fs, meta):
        if name.endswith(".tmp"):
            report.add("tmp_leftover", posixpath.join(meta, name), "leftover snapshot temp file")
    newest: tuple[str, dict[Any, Any]] | None = None
    pending = list(snaps)
    seen = {n for n, _ in snaps}
    i = 0
    while i < len(pending):
        n, path = pending[i]
        listed = i < len(snaps)
        i += 1
        raw: bytes | OSError | None  # None: pruned by a running server
        try:
            raw = read_file(fs, path)
        except FileNotFoundError as e:
            try:
                newer = [s for s in list_snapshots(fs, meta) if s[0] > n]
            except OSError:
                newer = []
            raw = None if newer else e
            if newer:
                report.add(
                    "snapshot_pruned",
                    path,
                    "removed after it was listed: a running server wrote a newer snapshot "
                    "and dropped this one",
                )
                pending.extend(s for s in newer if s[0] not in seen)
                seen.update(s[0] for s in newer)
        except OSError as e:
            raw = e
        finally:
            if listed:
                tick()
        if raw is None:
            continue
        report.snapshots += 1
        if isinstance(raw, OSError):
            report.add("unreadable", path, str(raw))
            continue
        result = decode_snapshot(raw)
        if isinstance(result, SnapshotInvalid):
            report.add("snapshot_invalid", path, result.reason)
        else:
            report.valid_snapshots += 1
            newest = (path, result)
    if snaps and not report.valid_snapshots:
        report.add("no_valid_snapshot", meta, f"none of {report.snapshots} snapshots is valid")
    if newest is None:
        return None
    _check_replay_start(fs, report, posixpath.dirname(meta), *newest)
    return newest[1]


def _check_replay_start(fs: Fs, report: CheckReport, data_dir: str, path: str, body: Any) -> None:
    """Recovery replays each shard from the WAL file the newest snapshot names: it must exist
    whenever its shard still holds files (an older layout's absorbed directory may be gone)."""
    wal = body.get("wal") if isinstance(body, dict) else None
    if not isinstance(wal, dict):
        return
    for rel, pos in wal.items():
        d = posixpath.join(data_dir, str(rel))
        files = list_wal_files(fs, d) if fs.exists(d) else []
        name = str(pos[0]) if isinstance(pos, (list, tuple)) and pos else ""
        if files and name and name not in files:
            report.add(
                "snapshot_wal_missing",
                path,
                f"replay of {rel} starts in {name}, which is missing ({len(files)} files left)",
            )


# -- entry point ---------------------------------------------------------------------


def check(
    fs: Fs,
    data_dir: str,
    *,
    progress: Progress | None = None,
    all_sealed: bool = False,
    cold_dir: str | None = None,
) -> CheckReport:
    """fsck `data_dir` (read-only) and return a :class:`CheckReport`.

    `progress(done, total)` is called once with `done == 0` after the files are
    enumerated and after each WAL file, segment and snapshot. `all_sealed`
    treats the newest segment of every topic as sealed too; `cold_dir` also
    checks the cold tier's `<cold_dir>/topics/` (every cold segment is sealed).
    `cold_dir` may be an `s3://bucket/prefix` url (docs/FORMATS.md, "Object-store
    cold tier"): its objects are then read through that store's read-only
    :class:`~topics.storage.objstore.ObjectFs` (the `AWS_*` environment), the
    rest through `fs`, and problems name them by url. A missing cold directory
    (an empty prefix) is an empty cold tier.

    Raises:
        FileNotFoundError: `data_dir` does not exist.
        NotADirectoryError: `data_dir` is not a directory.
        ColdStoreError: the object store of an `s3://` `cold_dir` failed a request
            (unreachable, a missing bucket, denied): nothing can be concluded, so
            it is not reported as a problem.
        ValueError: `cold_dir` is a malformed `s3://` url.
    """
    if cold_dir is not None and is_object_url(cold_dir):
        cold_dir = cold_root(cold_dir).url
        fs = fs_for(fs, cold_dir)
    if not fs.exists(data_dir):
        raise FileNotFoundError(data_dir)
    fs.listdir(data_dir)  # NotADirectoryError for a plain file
    report = CheckReport(data_dir)

    # Enumerate everything first so progress has a total.
    shards: list[tuple[str, str, list[str]]] = []
    try:
        for label, d in list_shards(fs, data_dir):
            shards.append((label, d, list_wal_files(fs, d)))
    except OSError as e:
        report.add("unreadable", posixpath.join(data_dir, "wal"), str(e))
    if len(shards) > 1 and shards[0][0] == "wal":
        report.add(
            "wal_layout_mixed",
            shards[0][1],
            "flat wal/*.log files next to shard-NN directories",
        )
    tiers: list[tuple[str, bool]] = [(data_dir, all_sealed)]
    if cold_dir is not None and fs.isdir(cold_dir):
        tiers.append((cold_dir, True))
    topics: list[tuple[int, str, bool, int]] = []
    for root, sealed in tiers:
        base = posixpath.join(root, "topics")
        try:
            for name in _listdir(fs, base):
                if not _TOPIC_RE.match(name):
                    kind = "topic_dir_deleted" if name.endswith(".deleted") else "unknown_entry"
                    report.add(kind, posixpath.join(base, name), "not a topic directory")
            for tid, d in list_topic_dirs(fs, root):
                n = len(scan_segments(fs, d).segments)
                topics.append((tid, d, sealed, n))
        except OSError as e:
            report.add("unreadable", base, str(e))
    meta = posixpath.join(data_dir, "meta")
    try:
        snaps = list_snapshots(fs, meta)
    except OSError as e:
        report.add("unreadable", meta, str(e))
        snaps = []

    total = sum(len(f) for _, _, f in shards) + sum(t[3] for t in topics) + len(snaps)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        report.files_checked = done
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    wal = _ShardChecker(fs, report, tick)
    for _label, d, files in shards:
        try:
            wal.check(d, files)
        except OSError as e:
            report.add("unreadable", d, str(e))
    report.topics = len({t[0] for t in topics})
    for tid, d, sealed, _n in topics:
        _check_topic(fs, report, tid, d, sealed, tick)
    newest = _check_snapshots(fs, report, meta, snaps, tick)
    if newest is not None:
        _check_published(fs, report, data_dir, newest, wal.scans, cold_dir)
    return report


def _check_published(
    fs: Fs,
    report: CheckReport,
    data_dir: str,
    body: dict[str, Any],
    scans: list[ShardScan],
    cold_dir: str | None = None,
) -> None:
    """Segments the newest valid snapshot (`body`, read once by the snapshot check) relies
    on, checked as recovery checks them."""
    ids = sorted(int(m["id"]) for m in body.get("topics") or [])
    try:
        damaged = segment_damage(fs, data_dir, ids, body, scans, cold_dir)
    except OSError as e:
        report.add("unreadable", posixpath.join(data_dir, "topics"), str(e))
        return
    for exc in damaged:
        d = topic_dir(data_dir, exc.topic_id)
        for problem, (a, b) in zip(exc.problems, exc.ranges, strict=True):
            report.add(
                "segment_damage",
                d,
                f"{problem}; seqs {a}..{b} at risk; the server refuses to start until "
                "`topics repair` (or rebuilds it when the WAL still holds them)",
                seq=a,
            )
