"""Offline data-dir tools: `topics verify DATA_DIR` (fsck), `topics dump DATA_DIR`,
and `topics spark-export DATA_DIR --to parquet OUT` (:mod:`topics.spark.export`).

Both only read, through :class:`~topics.storage.fs.RealFs`; run them on a data
dir no server is writing to (a live server's active WAL tail may read as torn).

* ``topics verify DATA_DIR [--json] [--no-progress] [--all-sealed] [--cold-dir DIR]``
  runs :func:`topics.storage.check.check`, prints a summary table and every
  problem, with a tqdm progress bar over the files on stderr (shown on a
  terminal). Exit 0 when nothing is corrupt (a torn tail is fine), 1 on
  corruption, 2 on a usage error or a missing data dir, or a directory that is
  not a data dir (none of `wal/`, `meta/`, `topics/`, `.topics.lock` in it), or
  a cold tier that cannot be read.
* ``topics dump DATA_DIR [--wal] [--segments] [--topic NAME_OR_ID] [--json] [--cold-dir DIR]``
  prints the WAL frames of every shard (the valid log, up to its end) and the
  segment records of every topic, then of the cold tier; with neither flag
  both. `--topic` takes a topic name (every id the data dir has known it by:
  snapshots and WAL TopicCreate frames) or a hex id. `--json` writes one JSON
  object per line. Exit 0, 1 when a file cannot be read, or 2 on a usage
  error, a missing data dir or an unknown topic.
* ``topics spark-export DATA_DIR --to parquet OUT [--file-names name|id]``: see
  :func:`spark_export`.

`--cold-dir` is a directory or an `s3://bucket/prefix` url: an object-store cold
tier (docs/FORMATS.md, "Object-store cold tier") is read through
:func:`topics.storage.objstore.fs_for`, with the `AWS_*` environment.

Entry points: :func:`main_verify` / :func:`main_dump` take the arguments after
the subcommand name and return the exit code; :func:`add_subcommands` +
:func:`run` plug both into an existing argparse CLI; :func:`main` (also
`python -m topics.tools verify DIR`) takes the subcommand first.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import numpy as np
import orjson
from tqdm import tqdm

from topics.format.frame import APPEND, TYPE_NAMES, Frame, FrameError, decode_segment_frame
from topics.format.idx import DELETED, IDX_ENTRY_DTYPE
from topics.storage.check import (
    CORRUPT,
    INFO,
    WARNING,
    CheckReport,
    check,
    list_shards,
    list_topic_dirs,
)
from topics.storage.fs import Fs, RealFs, read_file
from topics.storage.objstore import ColdStoreError, cold_root, fs_for, is_object_url
from topics.storage.segment import IDX_ENTRY_SIZE, scan_segments
from topics.storage.wal import scan_shard

__all__ = [
    "EXIT_OK",
    "EXIT_CORRUPT",
    "EXIT_USAGE",
    "add_subcommands",
    "run",
    "main_verify",
    "main_dump",
    "main",
    "verify",
    "dump",
]

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2


# -- argparse wiring ---------------------------------------------------------------


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", metavar="DATA_DIR", help="the server's data directory")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--all-sealed",
        action="store_true",
        help="treat every topic's newest segment as sealed (no torn tail allowed)",
    )
    p.add_argument(
        "--cold-dir",
        metavar="DIR",
        help="also check this cold-tier root: a directory or s3://bucket/prefix",
    )
    p.set_defaults(tools_command="verify")


def _dump_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", metavar="DATA_DIR", help="the server's data directory")
    p.add_argument("--wal", action="store_true", help="dump WAL frames")
    p.add_argument("--segments", action="store_true", help="dump segment records")
    p.add_argument(
        "--topic",
        metavar="NAME_OR_ID",
        help="only this topic: a name (every instance the data dir knows by it), or a "
        "hex topic id as in topics/ (0x... is always an id)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--cold-dir",
        metavar="DIR",
        help="also dump this cold-tier root's segments: a directory or s3://bucket/prefix",
    )
    p.set_defaults(tools_command="dump")


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", metavar="DATA_DIR", help="the server's data directory")
    p.add_argument("--to", required=True, choices=["parquet"], help="output format")
    p.add_argument("out", metavar="OUT", help="output directory (must not exist or be empty)")
    p.add_argument(
        "--cold-dir",
        metavar="DIR",
        help="the cold-tier root, when one is set: a directory or s3://bucket/prefix",
    )
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--topics", metavar="T1,T2", help="only these topics (default: all)")
    sel.add_argument("--topic-pattern", metavar="REGEX", help="only topics matching (whole name)")
    p.add_argument(
        "--value-format",
        choices=["json", "binary"],
        default="json",
        help="data as JSON text (string, default) or its UTF-8 bytes (binary)",
    )
    p.add_argument("--compression", default="snappy", help="Parquet codec (default snappy)")
    p.add_argument(
        "--file-names",
        choices=["id", "name"],
        default="name",
        help="name each file by topic name, topic-<name>.parquet with ':' written as '~' "
        "(Hadoop paths refuse ':'; the default), or by topic id, topic-<16 hex>.parquet",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(tools_command="spark-export")


def _repair_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", metavar="DATA_DIR", help="the server's data directory (stopped)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and change nothing (exit 1 if any)"
    )
    p.set_defaults(tools_command="repair")


_REPAIR_HELP = (
    "salvage a data directory whose WAL is damaged: keep every readable frame, "
    "quarantine the originals, record the lost seqs as tombstones"
)
_EXPORT_HELP = "export topic history from segment files to Parquet (no server, no JVM)"
_VERIFY_HELP = "check a data directory for corruption (fsck)"
_DUMP_HELP = "print WAL frames and segment records of a data directory"


def add_subcommands(subparsers: Any) -> None:
    """Add `verify`, `dump`, `spark-export` and `repair` to an argparse subparsers object.

    `subparsers` is what `ArgumentParser.add_subparsers()` returned; parsed
    args carry `tools_command` (the command's name), so :func:`run` can dispatch.
    """
    for name, help_, add_args, examples in (
        (
            "verify",
            _VERIFY_HELP,
            _verify_args,
            (
                "topics verify ./topics-data",
                "topics verify ./topics-data --json --no-progress",
                "topics verify ./topics-data --cold-dir s3://archive/topics",
            ),
        ),
        (
            "dump",
            _DUMP_HELP,
            _dump_args,
            (
                "topics dump ./topics-data --segments --topic orders",
                "topics dump ./topics-data --wal --json | head",
            ),
        ),
        (
            "spark-export",
            _EXPORT_HELP,
            _export_args,
            (
                "topics spark-export ./topics-data --to parquet ./export",
                "topics spark-export ./topics-data --to parquet ./export --topics orders,clicks",
            ),
        ),
        (
            "repair",
            _REPAIR_HELP,
            _repair_args,
            ("topics repair ./topics-data --dry-run", "topics repair ./topics-data"),
        ),
    ):
        add_args(
            subparsers.add_parser(
                name,
                help=help_,
                description=help_,
                epilog="examples:\n" + "".join(f"  {e}\n" for e in examples),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )


def run(args: argparse.Namespace) -> int:
    """Run the subcommand parsed by a parser set up with :func:`add_subcommands`."""
    cmd = getattr(args, "tools_command", None)
    if cmd == "verify":
        return verify(
            args.data_dir,
            as_json=args.json,
            progress=not args.no_progress,
            all_sealed=args.all_sealed,
            cold_dir=args.cold_dir,
        )
    if cmd == "dump":
        return dump(
            args.data_dir,
            wal=args.wal,
            segments=args.segments,
            topic=args.topic,
            as_json=args.json,
            cold_dir=args.cold_dir,
        )
    if cmd == "spark-export":
        return spark_export(args)
    if cmd == "repair":
        return repair(args.data_dir, dry_run=args.dry_run)
    print(f"topics: unknown tools command {cmd!r}", file=sys.stderr)
    return EXIT_USAGE


def repair(data_dir: str, *, dry_run: bool = False, fs: Fs | None = None) -> int:
    """`topics repair DATA_DIR`: salvage WAL damage (docs/FORMATS.md, "Repair").

    Takes the data dir's lock (refuses while a server runs), prints the plan,
    and unless `dry_run` carries it out. Exit 0: nothing to repair or repaired;
    1: damage found with `--dry-run`, or damage that cannot be salvaged
    automatically; 2: not a data directory, or it is in use.
    """
    # Checked before the lock is taken: taking it would create `.topics.lock` in a
    # directory that is not a data directory, and make it look like one.
    err = _data_dir_problem(data_dir)
    if err is not None:
        return _usage(err)
    fs = fs or RealFs()
    from topics.storage.lock import DataDirLock, DataDirLocked
    from topics.storage.repair import apply_repair, plan_repair

    try:
        lock = DataDirLock(data_dir)
    except DataDirLocked as exc:
        return _usage(str(exc))
    try:
        plan = plan_repair(fs, data_dir)
        if not plan.shards and not plan.segments:
            print(f"topics repair: {data_dir}: no damage found; nothing to do")
            return EXIT_OK
        for line in plan.lines():
            print(line)
        if not plan.ok:
            print("topics repair: some damage cannot be salvaged automatically", file=sys.stderr)
            return EXIT_CORRUPT
        if dry_run:
            print("topics repair: dry run, nothing changed")
            return EXIT_CORRUPT
        where = apply_repair(fs, plan)
        print(f"topics repair: done; the original files are in {where}")
        return EXIT_OK
    finally:
        lock.release()


def spark_export(args: argparse.Namespace) -> int:
    """`topics spark-export DATA_DIR --to parquet OUT` (docs/SPARK.md, "Bulk export to Parquet").

    `--cold-dir` is a directory or an `s3://bucket/prefix` url. Files are named
    by topic name (:func:`export_file_name`), or with `--file-names id` by topic
    id (`topic-<16 hex>.parquet`). Exit 0 on
    success; 1 when the history cannot be read whole (a frame does not verify, a
    segment the snapshot relies on is missing, the object store fails), with
    nothing left in OUT; 2 on a usage error (missing data or cold dir, non-empty
    OUT, a malformed url, pyarrow not installed).
    """
    err = _data_dir_error(args.data_dir) or _cold_dir_error(args.cold_dir)
    if err:
        return _usage(err)
    try:
        from topics.spark.export import export_parquet
    except ImportError as e:
        return _usage(f"spark-export needs pyarrow: pip install 'topics-server[spark]' ({e})")
    from topics.engine.frames import FrameCorrupt
    from topics.spark.segments import SegmentMissing

    names = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    try:
        rep = export_parquet(
            args.data_dir,
            args.out,
            cold_dir=args.cold_dir,
            topics=names,
            pattern=args.topic_pattern,
            value_format=args.value_format,
            compression=args.compression,
            progress=not args.no_progress,
        )
    except FileExistsError as e:
        return _usage(str(e))
    except FrameCorrupt as e:
        print(f"topics: corrupt segment, export abandoned: {e}", file=sys.stderr)
        return EXIT_CORRUPT
    except SegmentMissing as e:
        print(f"topics: missing segment, export abandoned: {e}", file=sys.stderr)
        return EXIT_CORRUPT
    except ColdStoreError as e:
        print(f"topics: cold tier unavailable, export abandoned: {e}", file=sys.stderr)
        return EXIT_CORRUPT
    except FileNotFoundError as e:
        return _usage(str(e))
    if args.file_names == "name":
        try:
            _name_export_files(args.data_dir, args.out, args.cold_dir)
        except OSError as e:
            print(f"topics: cannot rename the exported files by name: {e}", file=sys.stderr)
            return EXIT_CORRUPT
    print(
        f"exported {rep.records} records of {rep.topics} topic(s) from {rep.segments} "
        f"segment(s) into {rep.files} Parquet file(s) in {args.out} ({rep.seconds:.2f} s)"
    )
    return EXIT_OK


def export_file_name(topic: str) -> str:
    """The Parquet file of `topic` under `--file-names name`: ``topic-<name>.parquet``
    with ':' (valid in topic names, refused in Hadoop paths) written as '~' (never
    in a topic name, so the mapping can be undone)."""
    return f"topic-{topic.replace(':', '~')}.parquet"


def _name_export_files(data_dir: str, out: str, cold_dir: str | None) -> None:
    """Rename the export's `topic-<id>.parquet` files to :func:`export_file_name`.

    The id -> name map is the one the export planned with (the data dir's
    catalog, docs/SPARK.md "Bulk export to Parquet"); a file whose id is not in
    it keeps its id name.
    """
    from topics.storage.catalog import load_catalog

    names = {t.topic_id: name for name, t in load_catalog(data_dir, cold_dir).items()}
    for entry in sorted(os.listdir(out)):
        if not (entry.startswith("topic-") and entry.endswith(".parquet")):
            continue
        hex_id = entry[len("topic-") : -len(".parquet")]
        try:
            name = names.get(int(hex_id, 16))
        except ValueError:
            continue
        if name is not None:
            os.replace(os.path.join(out, entry), os.path.join(out, export_file_name(name)))


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        return parser.parse_args(list(argv))
    except SystemExit as e:  # argparse exits on --help (0) and on errors (2)
        code = e.code
        return code if isinstance(code, int) else EXIT_USAGE


def main_verify(argv: Sequence[str]) -> int:
    """`topics verify ...`: `argv` are the arguments after `verify`; returns the exit code."""
    p = argparse.ArgumentParser(prog="topics verify", description=_VERIFY_HELP)
    _verify_args(p)
    args = _parse(p, argv)
    return args if isinstance(args, int) else run(args)


def main_dump(argv: Sequence[str]) -> int:
    """`topics dump ...`: `argv` are the arguments after `dump`; returns the exit code."""
    p = argparse.ArgumentParser(prog="topics dump", description=_DUMP_HELP)
    _dump_args(p)
    args = _parse(p, argv)
    return args if isinstance(args, int) else run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m topics.tools {verify,dump} ...`; returns the exit code."""
    p = argparse.ArgumentParser(prog="topics", description="offline data-dir tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_subcommands(sub)
    args = _parse(p, sys.argv[1:] if argv is None else argv)
    return args if isinstance(args, int) else run(args)


# -- shared helpers -------------------------------------------------------------------


def _usage(msg: str) -> int:
    print(f"topics: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _data_dir_error(data_dir: str) -> str | None:
    if not os.path.exists(data_dir):
        return f"data dir {data_dir} does not exist"
    if not os.path.isdir(data_dir):
        return f"data dir {data_dir} is not a directory"
    return None


def _cold_dir_error(cold_dir: str | None, *, local: bool = True) -> str | None:
    """Why `--cold-dir` cannot be read, or None.

    An `s3://bucket/prefix` url is listed once (an unreachable store, a missing
    bucket or a denied LIST is reported here; an empty prefix is an empty cold
    tier); a directory must exist (checked only when `local`).
    """
    if cold_dir is None:
        return None
    if is_object_url(cold_dir):
        try:
            root = cold_root(cold_dir)
            root.fs.isdir(root.url)
        except (ValueError, ImportError) as e:
            return f"--cold-dir {cold_dir}: {e}"
        except ColdStoreError as e:
            return f"cannot read the cold tier {cold_dir}: {e}"
        return None
    if "://" in cold_dir:
        return f"--cold-dir {cold_dir}: a cold tier is a directory or an s3://bucket/prefix url"
    if local and not os.path.isdir(cold_dir):
        return f"cold dir {cold_dir} is not a directory"
    return None


# What every data directory a server has opened contains (README.md "Durability and
# the data directory"): at least the lock file, and the WAL once recovery ran.
_DATA_DIR_MARKERS = ("wal", "meta", "topics", ".topics.lock")


def _data_dir_problem(data_dir: str) -> str | None:
    """Why `data_dir` is no data directory to read: missing, a file, or a directory
    without any data-dir entry; None when it is one."""
    return _data_dir_error(data_dir) or _not_a_data_dir(data_dir)


def _not_a_data_dir(data_dir: str) -> str | None:
    """A message when the directory `data_dir` holds none of the data-dir entries."""
    if any(os.path.lexists(os.path.join(data_dir, m)) for m in _DATA_DIR_MARKERS):
        return None
    return (
        f"{data_dir} is not a topics data directory "
        "(it has no wal/, meta/, topics/ or .topics.lock)"
    )


def _rel(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)
    return path if rel.startswith("..") else rel


def _jsonable(x: Any) -> Any:
    """A msgpack value as JSON-encodable data (non-str keys -> str, bytes -> text or hex)."""
    if isinstance(x, dict):
        return {_key(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, bytes | bytearray | memoryview):
        b = bytes(x)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + b.hex()
    if x is None or isinstance(x, bool | int | float | str):
        return x
    return repr(x)


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, bytes):
        return k.decode("utf-8", "replace")
    return str(k)


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class _Out:
    """Writes lines to stdout (looked up per call, so tests can capture it)."""

    def __call__(self, line: str) -> None:
        out: IO[str] = sys.stdout
        out.write(line + "\n")


def _quiet_broken_pipe() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)  # noqa: TID251 (not data: stdout's sink)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# -- verify -------------------------------------------------------------------------------


def _table(rows: list[tuple[str, str]]) -> list[str]:
    w = max(len(k) for k, _ in rows)
    return [f"  {k.ljust(w)}  {v}" for k, v in rows]


def format_report(report: CheckReport) -> list[str]:
    """The human-readable verify output: a summary table, then each problem."""
    r = report
    rows = [
        ("WAL shards", str(r.shards)),
        ("WAL files", str(r.wal_files)),
        ("WAL frames", str(r.frames)),
        ("torn tails", str(r.torn_tails)),
        ("mid-log damage", f"{r.mid_log_damage} ({r.lost_frames} frames after it)"),
        ("topics", str(r.topics)),
        ("segments", str(r.segments)),
        ("records", f"{r.records} ({r.deleted_records} deleted)"),
        ("snapshots", f"{r.snapshots} ({r.valid_snapshots} valid)"),
        ("files checked", str(r.files_checked)),
        (
            "problems",
            f"{r.count(CORRUPT)} corrupt, {r.count(WARNING)} warning, {r.count(INFO)} info",
        ),
    ]
    lines = [f"topics verify {r.data_dir}", *_table(rows)]
    if r.problems:
        lines.append("")
        for p in r.problems:
            where = p.where()
            at = f" [{where}]" if where else ""
            lines.append(
                f"{p.severity.upper():8} {p.kind:18} {_rel(p.path, r.data_dir)}{at}: {p.detail}"
            )
    lines.append("")
    n = len(r.corruption)
    lines.append("result: OK" if r.ok else f"result: CORRUPT ({n} corrupt problem{'s' * (n != 1)})")
    return lines


def verify(
    data_dir: str,
    *,
    as_json: bool = False,
    progress: bool = True,
    all_sealed: bool = False,
    cold_dir: str | None = None,
    fs: Fs | None = None,
) -> int:
    """Check `data_dir`, print the report; returns 0 (ok), 1 (corrupt) or 2 (usage).

    `cold_dir` (a directory or an `s3://bucket/prefix` url) is checked too, every
    segment in it as sealed. 2 also when the object store cannot be read (down,
    a missing bucket, denied): that is not damage, and nothing was concluded.
    """
    err = _data_dir_problem(data_dir) if fs is None else None
    err = err or _cold_dir_error(cold_dir, local=fs is None)
    if err is not None:
        return _usage(err)
    bar = tqdm(
        total=0,
        desc="verify",
        unit="file",
        file=sys.stderr,
        disable=True if not progress else None,  # None: only on a terminal
        leave=False,
        dynamic_ncols=True,
    )

    def on_progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.refresh()
        if done > bar.n:
            bar.update(done - bar.n)

    try:
        report = check(
            fs or RealFs(),
            data_dir,
            progress=on_progress,
            all_sealed=all_sealed,
            cold_dir=cold_dir,
        )
    except (FileNotFoundError, NotADirectoryError) as e:
        return _usage(f"cannot check {data_dir}: {e}")
    except ColdStoreError as e:
        return _usage(f"cannot check the cold tier {cold_dir}: {e}")
    finally:
        bar.close()
    out = _Out()
    try:
        if as_json:
            out(_dumps(report.as_dict()))
        else:
            for line in format_report(report):
                out(line)
    except BrokenPipeError:
        _quiet_broken_pipe()
    return EXIT_OK if report.ok else EXIT_CORRUPT


# -- dump --------------------------------------------------------------------------------


def _parse_topic(text: str | None) -> int | None:
    if text is None:
        return None
    t = text.lower()
    if t.startswith("0x"):
        t = t[2:]
    if not t or len(t) > 16 or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"--topic {text!r} is not a hex topic id (up to 16 hex digits)")
    return int(t, 16)


def topic_names(fs: Fs, data_dir: str) -> dict[str, set[int]]:
    """Every topic name the data dir knows -> the ids it has had.

    From the valid metadata snapshots (the topics as of a checkpoint) and the
    WAL's TopicCreate frames (topics created since), read without changing
    anything: a name deleted and created again has several ids.
    """
    from topics.format.frame import TOPIC_CREATE
    from topics.format.snapshot import SnapshotInvalid, decode_snapshot
    from topics.storage.snapshot import list_snapshots

    out: dict[str, set[int]] = {}
    meta_dir = os.path.join(data_dir, "meta")
    if fs.exists(meta_dir):
        for _n, path in list_snapshots(fs, meta_dir):
            body = decode_snapshot(read_file(fs, path))
            if isinstance(body, SnapshotInvalid):
                continue
            for m in body.get("topics") or []:
                try:
                    out.setdefault(str(m["name"]), set()).add(int(m["id"]))
                except (KeyError, TypeError, ValueError):
                    continue
    for _label, d in list_shards(fs, data_dir):
        for _name, fr in scan_shard(fs, d).frames:
            if fr.type != TOPIC_CREATE:
                continue
            try:
                name = fr.control().get("name")
            except (FrameError, AttributeError):
                continue
            if isinstance(name, str):
                out.setdefault(name, set()).add(fr.topic_id)
    return out


def _resolve_topic(fs: Fs, data_dir: str, text: str | None) -> frozenset[int] | None:
    """The topic ids `--topic` selects: those a name has had, else a hex id.

    A value the data dir knows as a name is a name (even when it also reads as
    hex); `0x...` is always an id. Raises ValueError for neither.
    """
    if text is None:
        return None
    if not text.lower().startswith("0x"):
        ids = topic_names(fs, data_dir).get(text)
        if ids:
            return frozenset(ids)
    try:
        tid = _parse_topic(text)
    except ValueError:
        raise ValueError(
            f"--topic {text!r}: no topic of that name in {data_dir}, and not a hex topic id"
        ) from None
    return None if tid is None else frozenset({tid})


def _payload_value(raw: bytes) -> tuple[str, Any]:
    """("data", parsed JSON) or ("data_raw", text) when it is not JSON."""
    try:
        return "json", orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "raw", raw.decode("utf-8", "replace")


def _frame_fields(fr: Frame) -> dict[str, Any]:
    return {
        "type": TYPE_NAMES.get(fr.type, str(fr.type)),
        "topic_id": f"{fr.topic_id:016x}",
        "seq": fr.seq,
        "ts": fr.ts,
        "node": fr.node,
        "tag": fr.tag,
        "flags": fr.flags,
        "durable": fr.durable,
    }


def _record_payload(fr: Frame, obj: dict[str, Any]) -> None:
    try:
        data, meta = fr.data, fr.meta
    except FrameError as e:  # pragma: no cover - decoded frames always split
        obj["payload_error"] = str(e)
        return
    how, value = _payload_value(data)
    obj["data" if how == "json" else "data_raw"] = value
    if meta is not None:
        how, value = _payload_value(meta)
        obj["meta" if how == "json" else "meta_raw"] = value


def _text(v: Any) -> str:
    return "-" if v is None else str(v)


def _bytes_text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _wal_lines(
    fs: Fs, data_dir: str, topics: frozenset[int] | None, as_json: bool
) -> Iterator[str]:
    for label, d in list_shards(fs, data_dir):
        sc = scan_shard(fs, d)
        for name, fr in sc.frames:
            if topics is not None and fr.topic_id not in topics:
                continue
            obj: dict[str, Any] = {"kind": "wal_frame", "shard": label, "file": name}
            obj["offset"] = fr.offset
            obj.update(_frame_fields(fr))
            if fr.type == APPEND:
                _record_payload(fr, obj)
            else:
                try:
                    obj["body"] = _jsonable(fr.control())
                except FrameError as e:
                    obj["body_error"] = str(e)
            if as_json:
                yield _dumps(obj)
                continue
            head = (
                f"wal {label} {name}@{fr.offset} {obj['type']} topic={obj['topic_id']} "
                f"seq={fr.seq} ts={fr.ts} node={_text(fr.node)} tag={_text(fr.tag)} "
                f"flags={fr.flags:#04x}"
            )
            if fr.type == APPEND:
                meta = fr.meta
                tail = f" data={_bytes_text(fr.data)}"
                if meta is not None:
                    tail += f" meta={_bytes_text(meta)}"
            elif "body" in obj:
                tail = f" body={_dumps(obj['body'])}"
            else:
                tail = f" body_error={obj['body_error']}"
            yield head + tail
        end = {
            "kind": "wal_end",
            "shard": label,
            "file": sc.end_file,
            "offset": sc.end_offset,
            "frames": len(sc.frames),
            "torn": sc.torn.reason if sc.torn is not None else None,
            "damage": [
                {
                    "file": d.file,
                    "start": d.start,
                    "end": d.end,
                    "reason": d.reason,
                    "valid_after": d.valid_after,
                    "at_risk": d.at_risk(),
                }
                for d in sc.damage
            ],
        }
        if as_json:
            yield _dumps(end)
        else:
            torn = f" (torn: {sc.torn.reason})" if sc.torn is not None else ""
            yield (
                f"# wal {label}: {len(sc.frames)} frames, end at "
                f"{sc.end_file}@{sc.end_offset}{torn}"
            )
            for dmg in sc.damage:
                yield f"# wal {label}: DAMAGE {dmg.describe(label)}"


def _segment_lines(
    fs: Fs, root: str, topics: frozenset[int] | None, as_json: bool, tier: str = "hot"
) -> Iterator[str]:
    """Records of every segment under `root` (`tier` "hot": the data dir, lines
    `seg ...`; "cold": a cold-tier root, lines `cold ...`)."""
    prefix = "seg" if tier == "hot" else tier
    for tid, d in list_topic_dirs(fs, root):
        if topics is not None and tid not in topics:
            continue
        for first, paths in scan_segments(fs, d).segments:
            seg = posixpath.basename(paths.data)[: -len(".data")]
            raw_idx = read_file(fs, paths.idx)
            data = read_file(fs, paths.data)
            whole = len(raw_idx) // IDX_ENTRY_SIZE
            entries = np.frombuffer(raw_idx, IDX_ENTRY_DTYPE, count=whole)
            for i, (off, ln, ts, fl) in enumerate(
                zip(
                    entries["offset"].tolist(),
                    entries["len"].tolist(),
                    entries["ts"].tolist(),
                    entries["flags"].tolist(),
                    strict=True,
                )
            ):
                seq = first + i
                obj: dict[str, Any] = {
                    "kind": "record",
                    "tier": tier,
                    "topic_id": f"{tid:016x}",
                    "segment": seg,
                    "seq": seq,
                    "ts": ts,
                    "flags": fl,
                    "deleted": fl == DELETED,
                    "offset": off,
                }
                fr = decode_segment_frame(data, off) if off + ln <= len(data) else None
                if not isinstance(fr, Frame) or fr.size != ln or fr.seq != seq:
                    obj["kind"] = "record_error"
                    if isinstance(fr, Frame):
                        obj["error"] = f"frame seq {fr.seq}, {fr.size} bytes"
                    elif fr is None:
                        obj["error"] = "entry past the end of .data"
                    else:
                        obj["error"] = getattr(fr, "reason", "zeroed bytes")
                    yield (
                        _dumps(obj)
                        if as_json
                        else (f"{prefix} {obj['topic_id']} {seg} seq={seq} ERROR {obj['error']}")
                    )
                    continue
                obj["node"] = fr.node
                obj["tag"] = fr.tag
                obj["frame_flags"] = fr.flags
                _record_payload(fr, obj)
                if as_json:
                    yield _dumps(obj)
                    continue
                meta = fr.meta
                line = (
                    f"{prefix} {obj['topic_id']} {seg} seq={seq} ts={ts} flags={fl:#04x}"
                    f"{' deleted' if fl == DELETED else ''} node={_text(fr.node)} "
                    f"tag={_text(fr.tag)} data={_bytes_text(fr.data)}"
                )
                if meta is not None:
                    line += f" meta={_bytes_text(meta)}"
                yield line


def dump(
    data_dir: str,
    *,
    wal: bool = False,
    segments: bool = False,
    topic: str | None = None,
    as_json: bool = False,
    cold_dir: str | None = None,
    fs: Fs | None = None,
) -> int:
    """Print WAL frames and/or segment records (both when neither is asked for).

    With `cold_dir` (a directory or an `s3://bucket/prefix` url) the segment
    records of the cold tier follow those of the data dir (lines `cold ...`,
    JSON `"tier": "cold"`). Returns 0, 1 when a file or object cannot be read
    (the object store failing included), 2 on a usage error.
    """
    err = _data_dir_problem(data_dir) if fs is None else None
    err = err or _cold_dir_error(cold_dir, local=fs is None)
    if err is not None:
        return _usage(err)
    the_fs = fs_for(fs or RealFs(), cold_dir)
    try:
        tids = _resolve_topic(the_fs, data_dir, topic)
    except ValueError as e:
        return _usage(str(e))
    except (OSError, ColdStoreError) as e:
        print(f"topics: dump failed: {e}", file=sys.stderr)
        return EXIT_CORRUPT
    if not wal and not segments:
        wal = segments = True
    out: Callable[[str], None] = _Out()
    try:
        if wal:
            for line in _wal_lines(the_fs, data_dir, tids, as_json):
                out(line)
        if segments:
            for line in _segment_lines(the_fs, data_dir, tids, as_json):
                out(line)
            if cold_dir is not None:
                root = cold_root(cold_dir).url if is_object_url(cold_dir) else cold_dir
                for line in _segment_lines(the_fs, root, tids, as_json, "cold"):
                    out(line)
    except BrokenPipeError:
        _quiet_broken_pipe()
    except (OSError, ColdStoreError) as e:
        print(f"topics: dump failed: {e}", file=sys.stderr)
        return EXIT_CORRUPT
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
