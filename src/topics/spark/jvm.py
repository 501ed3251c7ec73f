"""The JVM reader's Python half: its jar, and the planner it asks (docs/SPARK.md, "Two readers").

The jar (`topics/spark/jars/topics-spark-jvm.jar`, built from `spark-jvm/` by the
package build when a JDK is present) registers the format `topics` on the JVM
side. On a session that has it, `spark.read.format("topics").option("path", ...)`
is read by Java tasks straight into columnar batches; everything else (`url`
reads, streams, writes, `reader=python`) is handed to the Python source.

The Java side does not plan. It runs `python -m topics.spark.jvm serve` once per
JVM and asks it, one JSON line per request:

* `{"op": "plan", "options": {...}, "filters": [...]}`: the offline reader of
  :mod:`topics.spark.source` plans the read with those options and pushed
  filters (`{"op": "EqualTo"|"GreaterThan"|..|"In", "column", "value"}`, a ts
  value in µs since the epoch); the answer is `{"value_format", "partitions":
  [...]}`, one entry per :class:`~topics.spark.segments.SegmentSlice`.
* `{"op": "gone", "slice": {...}}`: a slice's segment is in neither tier at read
  time; the answer is `{"error": null}` when the newest snapshot no longer relies
  on it (the rows are skipped, as the Python reader skips them) or the
  SegmentMissing message.

An error is answered as `{"error": {"type", "message"}}`; the Java side raises it
with the same message (an OptionError as IllegalArgumentException).

A slice the Java side cannot reach (its segment is in an object-store cold tier)
is read by `python -m topics.spark.jvm read`, one process per slice: the request
line `{"slice": {...}, "value_format"}` on stdin, an Arrow IPC stream on stdout.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["JAR_NAME", "add_jar", "gone", "jar_path", "plan", "read", "serve", "slice_entry"]

log = logging.getLogger(__name__)

JAR_NAME = "topics-spark-jvm.jar"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def jar_path() -> str | None:
    """The JVM reader's jar shipped in this package, or None when it was not built
    (a checkout or sdist installed without a JDK)."""
    p = Path(__file__).with_name("jars") / JAR_NAME
    return str(p) if p.is_file() else None


def add_jar(spark: Any) -> bool:
    """Add the JVM reader to a running session (`ADD JAR`); True when it was added.

    Without the jar this logs one line and returns False: `format("topics")`
    then stays on the Python reader.
    """
    jar = jar_path()
    if jar is None:
        log.info(NO_JAR)
        return False
    spark.sql(f"ADD JAR '{jar}'")
    return True


NO_JAR = (
    "topics: the JVM reader's jar is not in this install (built only where a JDK is "
    "present); format('topics') reads with the Python reader"
)


def slice_entry(sl: Any) -> dict[str, Any]:
    """One partition of a plan: a SegmentSlice's fields, as the Java side reads them."""
    return dataclasses.asdict(sl)


def _filter(f: Mapping[str, Any]) -> Any:
    from pyspark.sql import datasource as ds

    cls = {
        "EqualTo": ds.EqualTo,
        "GreaterThan": ds.GreaterThan,
        "GreaterThanOrEqual": ds.GreaterThanOrEqual,
        "LessThan": ds.LessThan,
        "LessThanOrEqual": ds.LessThanOrEqual,
        "In": ds.In,
    }.get(str(f.get("op")))
    if cls is None:
        return None
    col = str(f.get("column"))
    value = f.get("value")

    def lit(v: Any) -> Any:
        if col == "ts" and isinstance(v, int):
            return _EPOCH + timedelta(microseconds=v)
        return v

    if cls is ds.In:
        return cls((col,), tuple(lit(v) for v in value or ()))
    return cls((col,), lit(value))


def plan(options: Mapping[str, str], filters: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Plan an offline read for the Java reader: the same reader object, option checks
    and pushdown as the Python path (:class:`topics.spark.source.TopicsDataSource`),
    with every pushed filter applied (the Java side leaves them all to Spark as well).

    Raises OptionError, SegmentMissing, NotADataDir, OSError as the Python path does.
    """
    from pyspark.sql.datasource import CaseInsensitiveDict

    from topics.spark.source import TopicsDataSource, _OfflineReader, _SlicePartition

    opts = CaseInsensitiveDict({k: v for k, v in options.items() if k.lower() != "reader"})
    src = TopicsDataSource(opts)
    reader = src.reader(_schema(src))
    if not isinstance(reader, _OfflineReader):
        raise TypeError("the JVM reader plans offline reads (option path) only")
    for spec in filters:
        f = _filter(spec)
        if f is not None:
            reader.pushed.absorb(f)
    parts = reader.partitions()
    return {
        "value_format": reader.value_format,
        "partitions": [slice_entry(p.slice) for p in parts if isinstance(p, _SlicePartition)],
    }


def _schema(src: Any) -> Any:
    """The source's columns (only their names are checked when planning; parsing the
    DDL would need a session)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from topics.spark.source import _COLUMNS

    return StructType([StructField(n, StringType()) for n in _COLUMNS])


def _slice(entry: Mapping[str, Any]) -> Any:
    """The SegmentSlice a plan entry (:func:`slice_entry`) stands for."""
    from topics.spark.segments import SegmentSlice

    return SegmentSlice(**{**entry, "deleted": tuple(entry.get("deleted") or ())})


def read(entry: Mapping[str, Any], value_format: str, out: IO[bytes]) -> int:
    """Read one plan entry with the Python reader and write it to `out` as an Arrow IPC
    stream of :func:`~topics.spark.segments.arrow_schema`; returns the rows written.

    This is how the JVM reader reads slices it cannot reach (an object-store cold
    tier). Raises what :func:`~topics.spark.segments.read_slice` raises.
    """
    import pyarrow as pa

    from topics.spark.segments import arrow_schema, read_slice

    rows = 0
    with pa.ipc.new_stream(out, arrow_schema(value_format)) as w:
        for batch in read_slice(_slice(entry), value_format, 32768):
            w.write_batch(batch)
            rows += batch.num_rows
    return rows


def gone(entry: Mapping[str, Any]) -> str | None:
    """The SegmentMissing message for a slice gone from both tiers, or None when the
    newest snapshot no longer relies on it (docs/SPARK.md, "Errors")."""
    from topics.spark.segments import _gone_error, _view

    sl = _slice(entry)
    err = _gone_error(_view(None, sl.cold_dir), sl)
    if err is None:
        log.info("topic %s: segment %d is gone and no longer relied on", sl.topic, sl.first_seq)
        return None
    return str(err)


def _answer(req: Mapping[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "plan":
        return plan(req.get("options") or {}, req.get("filters") or [])
    if op == "gone":
        msg = gone(req["slice"])
        return {"error": None if msg is None else {"type": "SegmentMissing", "message": msg}}
    raise ValueError(f"unknown request {op!r}")


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer JSON-line requests from `inp` on `out` until `inp` ends."""
    for line in inp:
        if not line.strip():
            continue
        try:
            ans = _answer(orjson.loads(line))
        except Exception as e:  # every failure goes back to the Java side, named
            ans = {"error": {"type": type(e).__name__, "message": str(e)}}
        out.write(orjson.dumps(ans) + b"\n")
        out.flush()


def _own_stdout() -> IO[bytes]:
    """The process's stdout for the answers alone: fd 1 is pointed at stderr, so whatever
    else prints (a library, a warning) cannot corrupt them. Logging goes to stderr."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return answers


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["serve"]:
        serve(sys.stdin.buffer, _own_stdout())
        return 0
    if args == ["read"]:
        answers = _own_stdout()
        req = orjson.loads(sys.stdin.buffer.readline())
        read(req["slice"], req.get("value_format", "json"), answers)
        answers.close()
        return 0
    if args == ["jar"]:
        jar = jar_path()
        if jar is None:
            print(NO_JAR, file=sys.stderr)
            return 1
        print(jar)
        return 0
    print("usage: python -m topics.spark.jvm {jar|serve|read}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
