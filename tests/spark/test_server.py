"""Reads and writes through a running server: batch, stream, sink, data loss."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.spark.support import AckLosingProxy, client, diff_all, diff_rows, spark_rows, write
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _stop(srv: ServerProcess) -> None:
    assert srv.stop() == 0, srv.log_text()


def _seqs_of_parquet(spark: Any, path: Path) -> list[tuple[str, int]]:
    return sorted((r["topic"], r["seq"]) for r in spark.read.parquet(str(path)).collect())


def _available_now_to_parquet(
    spark: Any, base: str, out: Path, ckpt: Path, **opts: str
) -> list[tuple[str, int]]:
    """Run a `Trigger.AvailableNow` stream of the source into Parquet; (topic, seq) of `out`."""
    rd = spark.readStream.format("topics").option("url", base)
    for k, v in opts.items():
        rd = rd.option(k, v)
    q = (
        rd.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None
    return _seqs_of_parquet(spark, out) if out.exists() else []


def test_server_batch_read_equals_diff(spark: Any, tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    try:
        with client(srv) as c:
            write(
                c,
                "a",
                [{"data": {"i": i}, "tag": f"t{i % 3}", "meta": {"m": i}} for i in range(250)],
            )
            write(c, "b", [{"data": [i, "x"], "node": "n1"} for i in range(40)])
            r = c.post("/v0/topics/a/delete", json={"match": "t1"})
            assert r.status_code == 200, r.text
            want = diff_rows("a", diff_all(c, "a")) | diff_rows("b", diff_all(c, "b"))

        def load(**opts: str) -> Any:
            rd = spark.read.format("topics").option("url", srv.base)
            for k, v in opts.items():
                rd = rd.option(k, v)
            return rd.load()

        df = load(topicPattern="a|b", maxSeqsPerPartition="100")
        got = spark_rows(df)
        assert len(got) == len(set(got)) and set(got) == want
        assert df.rdd.getNumPartitions() == 4  # a: (0,100] (100,200] (200,250]; b: (0,40]
        # startingSeq inclusive, endingSeq exclusive (Kafka's offsets convention).
        df = load(topics="a", startingSeq="10", endingSeq="20")
        assert sorted(r["seq"] for r in df.collect()) == [s for s in range(10, 20) if s % 3 != 2]
        df = load(topics="a,b", startingSeq='{"a": 245, "b": -2}')
        assert sorted((r["topic"], r["seq"]) for r in df.collect()) == [
            *(("a", s) for s in range(245, 251) if s % 3 != 2),
            *(("b", s) for s in range(1, 41)),
        ]
        with pytest.raises(Exception, match="does not exist"):
            load(topics="nope").count()
    finally:
        _stop(srv)


def test_stream_restarts_from_its_checkpoint_without_loss_or_duplicates(
    spark: Any, tmp_path: Path
) -> None:
    """A stream stopped mid-way, and a server restarted, resume exactly where the checkpoint is."""
    data = tmp_path / "srv"
    data.mkdir()
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    srv = ServerProcess(data)
    try:
        with client(srv) as c:
            for b in range(6):
                write(c, "ev", [{"data": {"b": b, "j": j}} for j in range(100)])
        q = (
            spark.readStream.format("topics")
            .option("url", srv.base)
            .option("topics", "ev")
            .option("startingSeq", "earliest")
            .option("maxRecordsPerTrigger", "70")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            deadline = time.monotonic() + 120
            while len(q.recentProgress) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
                assert q.exception() is None, q.exception()
        finally:
            q.stop()
        first = _seqs_of_parquet(spark, out)
        assert 0 < len(first) < 600  # stopped part-way through the backlog
        assert len(first) % 70 == 0  # each micro-batch took exactly maxRecordsPerTrigger
    finally:
        _stop(srv)
    # Restart the server (new port: the url option changes, the offsets do not).
    srv = ServerProcess(data)
    try:
        with client(srv) as c:
            write(c, "ev", [{"data": {"b": 6, "j": j}} for j in range(50)])
            want = {("ev", r["$seq"]) for r in diff_all(c, "ev")}
        got = _available_now_to_parquet(spark, srv.base, out, ckpt, topics="ev")
        assert len(got) == len(set(got)) == 650  # no duplicate across the restart
        assert set(got) == want  # no loss
        rows = {r["seq"]: orjson.loads(r["data"]) for r in spark.read.parquet(str(out)).collect()}
        assert all(rows[s] == {"b": (s - 1) // 100, "j": (s - 1) % 100} for s in rows)
    finally:
        _stop(srv)


def test_sink_does_not_duplicate_under_a_forced_task_retry(spark: Any, tmp_path: Path) -> None:
    """Each task's third append is stored but its answer is lost (a 500 from a proxy), so the
    task fails and Spark retries it; the retry re-sends every chunk with the same idempotency
    keys and the server answers the ones it has as duplicates."""
    srv = ServerProcess(tmp_path)
    proxy = AckLosingProxy(srv.base, (":sunk:2",), max_lost=2)
    n = 4000
    try:
        df = spark.range(n, numPartitions=2).selectExpr(
            "to_json(named_struct('k', id)) AS data", "concat('t', id % 4) AS tag"
        )
        (
            df.write.format("topics")
            .option("url", proxy.base)
            .option("topic", "sunk")
            .option("maxRecordsPerRequest", "500")
            .mode("append")
            .save()
        )
        assert len(proxy.lost) == 2, proxy.lost  # one lost answer per task: two retries
        with client(srv) as c:
            recs = diff_all(c, "sunk")
            st = c.get("/v0/topics/sunk").json()
        keys = sorted(r["data"]["k"] for r in recs)
        assert keys == list(range(n))  # every row once: the replayed chunks were deduped
        assert st["head_seq"] == n  # and no seq was spent on a duplicate
        assert {r["$tag"] for r in recs} == {"t0", "t1", "t2", "t3"}
    finally:
        proxy.close()
        _stop(srv)


def test_fail_on_data_loss_both_ways_after_cap_eviction(spark: Any, tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    ckpt_true, ckpt_false = tmp_path / "ck1", tmp_path / "ck2"
    try:
        with client(srv) as c:
            assert c.put("/v0/topics/capped", json={"cap_records": 100}).status_code in (200, 201)
            write(c, "capped", [{"data": i} for i in range(1, 51)])

        def stream(ckpt: Path, fail: bool, name: str) -> Any:
            return (
                spark.readStream.format("topics")
                .option("url", srv.base)
                .option("topics", "capped")
                .option("startingSeq", "earliest")
                .option("failOnDataLoss", str(fail).lower())
                .load()
                .writeStream.format("parquet")
                .option("path", str(tmp_path / name))
                .option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True)
                .start()
            )

        for ck, fail, name in ((ckpt_true, True, "out_t"), (ckpt_false, False, "out_f")):
            q = stream(ck, fail, name)
            q.awaitTermination(120)
            assert q.exception() is None
            assert spark.read.parquet(str(tmp_path / name)).count() == 50
        # The cap evicts records 51.. that neither query has read yet.
        with client(srv) as c:
            write(c, "capped", [{"data": i} for i in range(51, 351)])
            st = c.get("/v0/topics/capped").json()
        floor = st["earliest_seq"]
        assert 51 < floor <= 251
        q = stream(ckpt_true, True, "out_t")
        with pytest.raises(Exception, match=rf"records 51\.\.{floor - 1} were lost \(cap\)"):
            q.awaitTermination(120)
        q = stream(ckpt_false, False, "out_f")
        q.awaitTermination(120)
        assert q.exception() is None
        got = sorted(r["seq"] for r in spark.read.parquet(str(tmp_path / "out_f")).collect())
        assert got == [*range(1, 51), *range(floor, 351)]  # the gap skipped, the rest read once
        # Batch reads through the server follow the same option.
        rd = spark.read.format("topics").option("url", srv.base).option("topics", "capped")
        with pytest.raises(Exception, match=rf"records 1\.\.{floor - 1} were lost"):
            rd.option("startingSeq", "1").load().count()
        rows = rd.option("startingSeq", "1").option("failOnDataLoss", "false").load()
        assert sorted(r["seq"] for r in rows.collect()) == list(range(floor, 351))
    finally:
        _stop(srv)


def test_stream_from_latest_and_topics_that_appear_later(spark: Any, tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> list[tuple[str, int]]:
        return _available_now_to_parquet(
            spark, srv.base, out, ckpt, topicPattern=r"s\..*", startingSeq="latest"
        )

    try:
        with client(srv) as c:
            write(c, "s.a", [{"data": i} for i in range(100)])
            write(c, "other", [{"data": i} for i in range(10)])
        assert run() == []  # latest: what was there when the query started is not read
        with client(srv) as c:
            write(c, "s.a", [{"data": i} for i in range(50)])
            write(c, "s.b", [{"data": i} for i in range(30)])  # a new topic matching the pattern
            write(c, "other", [{"data": i} for i in range(10)])
        got = run()
        # s.a from where the query started; s.b whole (new topics are read from earliest).
        assert got == [*(("s.a", s) for s in range(101, 151)), *(("s.b", s) for s in range(1, 31))]
    finally:
        _stop(srv)


def test_token_scopes_and_prefixes_apply_to_reads_and_writes(spark: Any, tmp_path: Path) -> None:
    """With auth on, the source and sink act as their key: its tenant prefix, its scopes."""
    srv = ServerProcess(tmp_path, env={"TOPICS_API_KEYS": "ka:rw:a.,kb:rw:b.,kr:r:a."})
    try:
        with client(srv, "ka") as c:
            write(c, "a.x", [{"data": i} for i in range(20)])
        with client(srv, "kb") as c:
            write(c, "b.y", [{"data": i} for i in range(5)])

        def read(token: str | None, **opts: str) -> Any:
            rd = spark.read.format("topics").option("url", srv.base)
            if token:
                rd = rd.option("token", token)
            for k, v in opts.items():
                rd = rd.option(k, v)
            return rd.load()

        # A pattern sees only the key's own topics.
        rows = read("kr", topicPattern=".*").collect()
        assert sorted((r["topic"], r["seq"]) for r in rows) == [("a.x", s) for s in range(1, 21)]
        with pytest.raises(Exception, match="401"):
            read(None, topics="a.x").count()
        with pytest.raises(Exception, match="403|404"):
            read("kr", topics="b.y").count()
        df = spark.createDataFrame([("1",), ("2",)], "data string")
        # A read-only key cannot write; nothing is stored.
        with pytest.raises(Exception, match="403"):
            df.write.format("topics").option("url", srv.base).option("token", "kr").option(
                "topic", "a.x"
            ).mode("append").save()
        df.write.format("topics").option("url", srv.base).option("token", "ka").option(
            "topic", "a.x"
        ).mode("append").save()
        with client(srv, "ka") as c:
            data = [r["data"] for r in diff_all(c, "a.x")]
        assert data[:20] == list(range(20)) and sorted(data[20:]) == [1, 2]
    finally:
        _stop(srv)
