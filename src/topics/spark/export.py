"""`topics spark-export DATA_DIR --to parquet OUT`: bulk export of topic history.

See docs/SPARK.md, "Bulk export to Parquet".

Writes Parquet with pyarrow straight from the offline segment reader
(:mod:`topics.spark.segments`): no JVM and no server, the same planning,
verification and record schema as `spark.read.format("topics").option("path",
...)`. One file per topic, `OUT/topic-<topic id, 16 hex>.parquet` (topic names
may hold `:`, which Hadoop paths reject; the `topic` column carries the name),
one row group per Arrow batch. Files are written under a `.`-prefixed temporary
name and renamed when complete, so Spark (which skips `.` and `_` files) never
reads a partial export. `spark.read.parquet(OUT)` reads the result.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from topics.clock import SystemClock
from topics.storage.fs import RealFs

__all__ = ["ExportReport", "export_parquet"]


@dataclass(frozen=True, slots=True)
class ExportReport:
    """Records and files written, topics and segments read, wall seconds."""

    records: int
    files: int
    topics: int
    segments: int
    seconds: float


def export_parquet(
    data_dir: str,
    out_dir: str,
    *,
    cold_dir: str | None = None,
    topics: Sequence[str] | None = None,
    pattern: str | None = None,
    value_format: str = "json",
    compression: str = "snappy",
    progress: bool = True,
) -> ExportReport:
    """Export the live records of the selected topics (all by default) to Parquet in `out_dir`.

    `out_dir` (a local directory) must not exist or be empty. `cold_dir` is the
    cold-tier root: a directory or an `s3://bucket/prefix` url, read with ranged
    GETs through a client made from the `AWS_*` environment (docs/SPARK.md,
    "Cold tier in an object store"). The progress bar (tqdm, stderr) counts
    planned seqs.

    Raises FileExistsError for a non-empty `out_dir`; FileNotFoundError for a
    missing `data_dir` or cold directory; :class:`~topics.spark.segments.SegmentMissing`
    (a FileNotFoundError) for a segment the snapshot relies on that neither tier
    holds; FrameCorrupt for a frame that does not verify;
    :class:`~topics.storage.objstore.ColdStoreError` when the object store fails;
    OSError on other I/O errors. Nothing is renamed into place after an error.
    """
    import pyarrow.parquet as pq
    from tqdm import tqdm

    from topics.spark.segments import (
        Bounds,
        arrow_schema,
        load_offline,
        plan_slices,
        read_slice,
        select_topics,
    )

    fs, clock = RealFs(), SystemClock()
    if fs.isdir(out_dir) and fs.listdir(out_dir):
        raise FileExistsError(f"output directory {out_dir} is not empty")
    t0 = clock.monotonic()
    found = load_offline(data_dir, cold_dir, fs=fs)
    names = select_topics(found, topics, pattern)
    slices = plan_slices(found, {n: Bounds() for n in names}, data_dir, cold_dir, fs=fs)
    fs.makedirs(out_dir)
    schema = arrow_schema(value_format)
    total = sum(s.seqs for s in slices)
    records = 0
    files: list[tuple[str, str]] = []
    bar = tqdm(
        total=total,
        unit="rec",
        unit_scale=True,
        disable=not progress,
        file=sys.stderr,
        desc="export",
    )
    writer = None
    current: str | None = None
    try:
        for sl in slices:
            if sl.topic != current:
                if writer is not None:
                    writer.close()
                current = sl.topic
                final = os.path.join(out_dir, f"topic-{sl.topic_id:016x}.parquet")
                tmp = os.path.join(out_dir, f".topic-{sl.topic_id:016x}.parquet.tmp")
                files.append((tmp, final))
                writer = pq.ParquetWriter(tmp, schema, compression=compression)
            assert writer is not None
            for batch in read_slice(sl, value_format, fs=fs):
                writer.write_batch(batch)
                records += batch.num_rows
            bar.update(sl.seqs)
        if writer is not None:
            writer.close()
            writer = None
    except BaseException:
        if writer is not None:
            writer.close()
        for tmp, _ in files:
            try:
                fs.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    finally:
        bar.close()
    for tmp, final in files:
        fs.replace(tmp, final)
    return ExportReport(records, len(files), len(names), len(slices), clock.monotonic() - t0)
