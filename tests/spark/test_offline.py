"""Offline batch reads of segment files through Spark (docs/SPARK.md, "Three ways to read")."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.spark.conftest import History
from tests.spark.support import (
    client,
    copy_tree,
    corrupt_data,
    diff_rows,
    spark_rows,
    write,
)
from tests.support.process import ServerProcess
from topics.spark.segments import load_offline

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.fixture(params=["jvm", "python"])
def reader(request: pytest.FixtureRequest) -> str:
    """Each offline test runs with both readers (docs/SPARK.md, "Two readers")."""
    return str(request.param)


def _read(reader: str, spark: Any, h: History, data_dir: Path | None = None, **opts: str) -> Any:
    r = (
        spark.read.format("topics")
        .option("reader", reader)
        .option("path", str(data_dir or h.data_dir))
        .option("coldDir", str(h.cold_dir if data_dir is None else data_dir.parent / "cold"))
    )
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_offline_read_equals_engine_diff(spark: Any, history: History, reader: str) -> None:
    h = history
    topics = load_offline(str(h.data_dir), str(h.cold_dir))
    # The data covers what the test means to cover: several segments, both tiers,
    # cap eviction below the floor, deleted records flagged in .idx.
    assert len(topics["orders"].cat.segments) >= 6
    assert [s.tier for s in topics["orders"].cat.segments].count("cold") >= 4
    assert topics["capped"].cat.earliest_seq == 381
    assert topics["orders"].cat.earliest_seq == 20

    df = _read(reader, spark, h, topicPattern=".*")
    got = spark_rows(df)
    assert len(got) == len(set(got))  # no record twice
    want: set[Any] = set()
    for t, recs in h.diff.items():
        want |= diff_rows(t, recs)
    assert set(got) == want
    # Deleted (tag t3, before_seq 20) and evicted (capped below 381) are absent.
    assert not any(r[0] == "orders" and (r[3] == "t3" or r[1] < 20) for r in got)
    assert min(r[1] for r in got if r[0] == "capped") == 381
    # One input partition per segment holding readable seqs.
    n_segments = sum(
        1 for t in topics.values() for s in t.cat.segments if s.last_seq >= t.cat.earliest_seq
    )
    assert df.rdd.getNumPartitions() == n_segments


def test_value_format_binary_and_topic_list(spark: Any, history: History, reader: str) -> None:
    df = _read(reader, spark, history, topics="plain,capped", valueFormat="binary")
    assert dict(df.dtypes)["data"] == "binary"
    rows = {(r["topic"], r["seq"]): r["data"] for r in df.collect()}
    assert len(rows) == len(history.diff["plain"]) + len(history.diff["capped"])
    for r in history.diff["plain"]:
        assert orjson.loads(rows[("plain", r["$seq"])]) == r["data"]


def test_seq_pruning_reads_only_the_segments_it_must(
    spark: Any, history: History, reader: str, tmp_path: Path
) -> None:
    d = copy_tree(history.data_dir.parent, tmp_path / "h")
    data, cold = d / "data", d / "cold"
    topic = load_offline(str(data), str(cold))["orders"]
    segs = topic.cat.segments
    keep = segs[2:4]  # read exactly these two segments (one cold, one hot or both cold)
    start, end = keep[0].first_seq, keep[-1].last_seq + 1
    for s in segs:
        if s not in keep:
            corrupt_data(Path(s.data_path))
    df = _read(
        reader, spark, history, data, topics="orders", startingSeq=str(start), endingSeq=str(end)
    )
    assert df.rdd.getNumPartitions() == 2
    want = diff_rows("orders", [r for r in history.diff["orders"] if start <= r["$seq"] < end])
    assert set(spark_rows(df)) == want and want
    # The same bounds as a per-topic JSON object.
    df = _read(
        reader,
        spark,
        history,
        data,
        topics="orders",
        startingSeq=f'{{"orders": {start}}}',
        endingSeq=f'{{"orders": {end}}}',
    )
    assert set(spark_rows(df)) == want
    # A read that covers a corrupted segment fails and names the problem.
    with pytest.raises(Exception, match="checksum mismatch|frame_len|lengths inconsistent"):
        _read(reader, spark, history, data, topics="orders").count()


def test_timestamp_pruning_uses_the_idx_only(
    spark: Any, history: History, reader: str, tmp_path: Path
) -> None:
    d = copy_tree(history.data_dir.parent, tmp_path / "h")
    data, cold = d / "data", d / "cold"
    topic = load_offline(str(data), str(cold))["timed"]
    ts = history.timed_batches
    assert len(set(ts)) == 5
    # Batch 2 (seqs 101..150) is segment 3; read it by time, with the others unreadable.
    target = [s for s in topic.cat.segments if s.first_seq == 101]
    assert target
    for s in topic.cat.segments:
        if s.first_seq != 101:
            corrupt_data(Path(s.data_path))
    df = _read(
        reader,
        spark,
        history,
        data,
        topics="timed",
        startingTimestamp=str(ts[2]),
        endingTimestamp=str(ts[3]),
    )
    assert df.rdd.getNumPartitions() == 1
    rows = spark_rows(df)
    assert sorted(r[1] for r in rows) == list(range(101, 151))
    assert {r[2] for r in rows} == {ts[2]}


def test_filter_pushdown_on_seq_ts_and_topic(spark: Any, history: History, reader: str) -> None:
    from pyspark.sql import functions as F

    h = history

    def load() -> Any:  # a fresh DataFrame per query: see docs/SPARK.md "Filter pushdown"
        return _read(reader, spark, h, topicPattern=".*", filterPushdown="true")

    df = load().where((F.col("topic") == "timed") & F.col("seq").between(60, 140))
    assert df.rdd.getNumPartitions() == 2  # segments 51..100 and 101..150 only
    assert sorted(r["seq"] for r in df.collect()) == list(range(60, 141))
    t3 = h.timed_batches[3]
    df = load().where((F.col("topic") == "timed") & (F.unix_millis("ts") >= t3))
    # unix_millis(ts) is not pushed; the comparison on ts itself is:
    import datetime as dt

    cut = dt.datetime.fromtimestamp(t3 / 1000, tz=dt.UTC)
    df2 = load().where((F.col("topic") == "timed") & (F.col("ts") >= F.lit(cut)))
    assert df2.rdd.getNumPartitions() == 2
    assert sorted(r["seq"] for r in df2.collect()) == sorted(r["seq"] for r in df.collect())
    assert sorted(r["seq"] for r in df2.collect()) == list(range(151, 251))
    # Without the option the source has no pushFilters and Spark filters after the scan.
    plain = _read(reader, spark, h, topicPattern=".*").where(F.col("topic") == "timed")
    assert plain.count() == 250


def test_offline_read_while_the_server_writes(spark: Any, tmp_path: Path) -> None:
    """Reads taken while records stream in are each a complete prefix of what was written."""
    from pyspark.sql import functions as F

    srv = ServerProcess(
        tmp_path,
        env={"TOPICS_SEGMENT_MAX_EVENTS": "2000", "TOPICS_CHECKPOINT_INTERVAL_MS": "200"},
    )
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        with client(srv) as c:
            while not stop.is_set() and written[0] < 1_000_000:
                k = written[0]
                write(c, "live", [{"data": {"k": k + j}} for j in range(500)])
                written[0] += 500
                time.sleep(0.05)

    th = threading.Thread(target=writer)
    th.start()
    seen: list[int] = []
    try:
        while written[0] < 3000:
            time.sleep(0.05)
        for _ in range(4):
            df = (
                spark.read.format("topics")
                .option("path", str(tmp_path / "data"))
                .option("topics", "live")
                .load()
            )
            k = F.get_json_object("data", "$.k").cast("long")
            row = df.agg(
                F.count("*").alias("n"),
                F.countDistinct("seq").alias("distinct"),
                F.min("seq").alias("lo"),
                F.max("seq").alias("hi"),
                F.sum((k != F.col("seq") - 1).cast("int")).alias("bad"),
            ).collect()[0]
            # A prefix: seqs 1..n, each once, each with the data written at that seq (n may
            # be 0 while no checkpoint has run yet: only checkpointed seqs are in segments).
            if row["n"]:
                got = (row["distinct"], row["lo"], row["hi"], row["bad"])
                assert got == (row["n"], 1, row["n"], 0), row
            seen.append(row["n"])
        while written[0] <= seen[-1] and th.is_alive():
            time.sleep(0.05)  # the writer is still going past the last read
    finally:
        stop.set()
        th.join()
        assert srv.stop() == 0
    assert seen == sorted(seen) and 0 < seen[-1] < written[0]
    final = (
        spark.read.format("topics")
        .option("path", str(tmp_path / "data"))
        .option("topics", "live")
        .load()
    )
    assert final.count() == written[0]
