"""The two offline readers: the JVM reader and the Python one agree row for row
(docs/SPARK.md, "Two readers"); damage fails the JVM task with the topic, file and
seq; a session without the jar falls back, says so, and can add the jar later."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import HISTORY_ENV, History
from tests.spark.support import client, copy_tree, run_session_script, write
from tests.support.process import ServerProcess
from topics.spark.jvm import gone, jar_path, slice_entry
from topics.spark.segments import Bounds, load_offline, plan_slices

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
JVM_SCAN = "topics (JVM reader)"


def _read(spark: Any, data: Path, cold: Path | None, reader: str, **opts: str) -> Any:
    r = spark.read.format("topics").option("path", str(data)).option("reader", reader)
    if cold is not None:
        r = r.option("coldDir", str(cold))
    if "topics" not in opts:
        opts = {"topicPattern": ".*", **opts}
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def _scan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def _same(jvm: Any, py: Any) -> int:
    """Both DataFrames hold the same rows (as multisets); returns the count."""
    assert JVM_SCAN in _scan(jvm)
    assert JVM_SCAN not in _scan(py)
    n = jvm.count()
    assert n == py.count()
    assert jvm.exceptAll(py).count() == 0
    assert py.exceptAll(jvm).count() == 0
    return int(n)


def test_the_jar_is_on_the_session_and_auto_picks_it(spark: Any, history: History) -> None:
    assert jar_path() is not None, "the package build or scripts/_bootstrap makes the jar"
    assert jar_path() in spark.conf.get("spark.jars")
    auto = _read(spark, history.data_dir, history.cold_dir, "auto")
    assert JVM_SCAN in _scan(auto)
    assert JVM_SCAN not in _scan(_read(spark, history.data_dir, history.cold_dir, "python"))


@pytest.mark.parametrize("value_format", ["json", "Binary"])  # option values ignore case
def test_both_readers_return_the_same_rows(spark: Any, history: History, value_format: str) -> None:
    """Several segments in two tiers, deletes by tag and before_seq, cap eviction,
    four topics: identical rows, and as many as the engine's own diff returns."""
    h = history
    jvm = _read(spark, h.data_dir, h.cold_dir, "jvm", valueFormat=value_format)
    py = _read(spark, h.data_dir, h.cold_dir, "python", valueFormat=value_format)
    assert jvm.dtypes == py.dtypes
    assert dict(jvm.dtypes)["data"] == value_format.lower().replace("json", "string")
    n = _same(jvm, py)
    assert n == sum(len(v) for v in h.diff.values())
    # A pruned projection in another order reads the same values.
    cols = ["data", "seq", "topic"]
    j = _read(spark, h.data_dir, h.cold_dir, "jvm", valueFormat=value_format).select(*cols)
    p = _read(spark, h.data_dir, h.cold_dir, "python", valueFormat=value_format).select(*cols)
    assert j.exceptAll(p).count() == 0 and p.exceptAll(j).count() == 0


BOUNDS: list[dict[str, str]] = [
    {"topics": "orders", "startingSeq": "40", "endingSeq": "260"},
    {"topics": "orders,capped", "startingSeq": '{"orders": 120, "capped": 400}'},
    {"topics": "capped", "endingSeq": "382"},
    {"topics": "plain", "startingSeq": "3", "endingSeq": "3"},
]


@pytest.mark.parametrize("opts", BOUNDS, ids=lambda o: ",".join(o))
def test_seq_bounds_agree(spark: Any, history: History, opts: dict[str, str]) -> None:
    h = history
    _same(
        _read(spark, h.data_dir, h.cold_dir, "jvm", **opts),
        _read(spark, h.data_dir, h.cold_dir, "python", **opts),
    )


def test_timestamp_bounds_and_pushed_filters_agree(spark: Any, history: History) -> None:
    import datetime as dt

    from pyspark.sql import functions as F

    h = history
    ts = h.timed_batches
    opts = {"startingTimestamp": str(ts[1]), "endingTimestamp": str(ts[4])}
    n = _same(
        _read(spark, h.data_dir, h.cold_dir, "jvm", **opts),
        _read(spark, h.data_dir, h.cold_dir, "python", **opts),
    )
    assert n == 150  # batches 1..3 of "timed"; the other topics were written earlier
    cut = dt.datetime.fromtimestamp(ts[2] / 1000, tz=dt.UTC)
    filters = [
        (F.col("topic") == "timed") & F.col("seq").between(60, 140),
        F.col("topic").isin("orders", "plain") & (F.col("seq") > 150),
        (F.col("topic") == "timed") & (F.col("ts") >= F.lit(cut)),
        (F.col("ts") < F.lit(cut)) & (F.col("seq") <= 30) & (F.col("tag") == "t1"),
    ]
    for cond in filters:
        j = _read(spark, h.data_dir, h.cold_dir, "jvm").where(cond)
        p = _read(spark, h.data_dir, h.cold_dir, "python", filterPushdown="true").where(cond)
        assert _same(j, p) > 0, cond
    # The planner applied the pushed bounds: two segments of "timed" hold seqs 60..140.
    j = _read(spark, h.data_dir, h.cold_dir, "jvm").where(filters[0])
    assert j.rdd.getNumPartitions() == 2


@pytest.fixture(scope="module")
def wal_tail(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """A data directory whose newest records are only in the WAL: 300 records written,
    a graceful stop (a checkpoint), then 120 more and a kill -9 before the next one."""
    tmp = tmp_path_factory.mktemp("wal-tail")
    env = dict(HISTORY_ENV, TOPICS_CHECKPOINT_INTERVAL_MS="600000")
    srv = ServerProcess(tmp, env=env)
    try:
        with client(srv) as c:
            for b in range(3):
                write(c, "w", [{"data": {"b": b, "j": j}, "tag": f"t{j % 3}"} for j in range(100)])
    finally:
        assert srv.stop() == 0, srv.log_text()
    srv = ServerProcess(tmp, env=env)
    try:
        with client(srv) as c:
            write(c, "w", [{"data": {"late": j}} for j in range(120)])
            r = c.post("/v0/topics/w/delete", json={"match": "t1"})
            assert r.status_code == 200, r.text
    finally:
        assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
    return tmp / "data", 300, 120


def test_records_only_in_the_wal_are_left_out_by_both(spark: Any, wal_tail: Any) -> None:
    data, checkpointed, _late = wal_tail
    n = _same(_read(spark, data, None, "jvm"), _read(spark, data, None, "python"))
    # The offline view is the newest snapshot's: the 300 checkpointed records, without
    # the late ones and without the delete that only the WAL holds.
    assert n == checkpointed


def _flip_payload_byte(idx: Path, data: Path, first_seq: int, seq: int) -> None:
    raw = idx.read_bytes()
    off, ln = struct.unpack_from("<II", raw, (seq - first_seq) * 20)
    buf = bytearray(data.read_bytes())
    buf[off + ln - 9] ^= 0x01  # the last payload byte, just before the checksum
    data.write_bytes(bytes(buf))


def test_a_flipped_byte_fails_the_jvm_task(spark: Any, history: History, tmp_path: Path) -> None:
    d = copy_tree(history.data_dir.parent, tmp_path / "h")
    seg = load_offline(str(d / "data"), str(d / "cold"))["plain"].cat.segments[0]
    _flip_payload_byte(Path(seg.idx_path), Path(seg.data_path), seg.first_seq, 3)
    with pytest.raises(Exception) as err:
        _read(spark, d / "data", d / "cold", "jvm", topics="plain").collect()
    msg = str(err.value)
    assert "FrameCorruptException" in msg, msg[:2000]
    assert f"topic plain, segment {seg.data_path}, seq 3: checksum mismatch" in msg
    # The Python reader refuses the same byte.
    with pytest.raises(Exception, match="checksum"):
        _read(spark, d / "data", d / "cold", "python", topics="plain").collect()
    # Seqs outside the damaged frame are still read by both.
    _same(
        _read(spark, d / "data", d / "cold", "jvm", topics="plain", endingSeq="3"),
        _read(spark, d / "data", d / "cold", "python", topics="plain", endingSeq="3"),
    )


def test_a_missing_segment_is_refused_by_both(spark: Any, history: History, tmp_path: Path) -> None:
    d = copy_tree(history.data_dir.parent, tmp_path / "h")
    segs = load_offline(str(d / "data"), str(d / "cold"))["timed"].cat.segments
    for p in (segs[1].data_path, segs[1].idx_path):
        os.unlink(p)
    for reader in ("jvm", "python"):
        with pytest.raises(Exception, match="SegmentMissing|cannot be read"):
            _read(spark, d / "data", d / "cold", reader, topics="timed").count()


def test_a_segment_gone_after_planning_is_skipped_only_when_no_longer_relied_on(
    history: History, tmp_path: Path
) -> None:
    d = copy_tree(history.data_dir.parent, tmp_path / "h")
    data, cold = str(d / "data"), str(d / "cold")
    offline = load_offline(data, cold)
    slices = plan_slices(offline, {"timed": Bounds()}, data, cold)
    entry = slice_entry(slices[1])
    msg = gone(entry)
    assert msg is not None and "still relies on" in msg and "timed" in msg
    # Seqs below the floor (evicted since planning, say) are not relied on any more.
    capped = offline["capped"]
    assert capped.cat.earliest_seq == 381
    assert gone(dict(entry, topic="capped", topic_id=capped.cat.topic_id, lo=1, hi=50)) is None


def test_reader_option_errors(spark: Any, history: History) -> None:
    h = history
    with pytest.raises(Exception, match="JVM reader cannot do this read"):
        spark.read.format("topics").option("url", "http://127.0.0.1:9").option(
            "reader", "jvm"
        ).option("topics", "x").load()
    with pytest.raises(Exception, match="auto, jvm, python"):
        _read(spark, h.data_dir, h.cold_dir, "fastest").count()
    # A stream over a data directory gets the source's own answer, as on the Python path.
    stream = spark.readStream.format("topics").option("path", str(h.data_dir))
    q = None
    with pytest.raises(Exception, match="streaming reads go through a server"):
        q = stream.option("topics", "orders").load().writeStream.format("noop").start()
        q.processAllAvailable()
    if q is not None:
        q.stop()
    # An option error from the planner reaches the JVM caller with its message.
    with pytest.raises(Exception, match="unknown option|not accepted|bogus"):
        _read(spark, h.data_dir, h.cold_dir, "jvm", bogus="1").count()


def test_a_session_without_the_jar_falls_back_and_can_add_it(
    history: History, tmp_path: Path
) -> None:
    out = run_session_script(
        "no_jar_session.py", str(history.data_dir), str(history.cold_dir), cwd=tmp_path
    )
    stderr = out.pop("_stderr")
    want = str(sum(len(v) for v in history.diff.values()))
    assert out == {
        "no_jar_scan_is_jvm": "False",
        "no_jar_count": want,
        "no_jar_forced": "refused",
        "add_jar_without_jar": "False",
        "add_jar": "True",
        "added_scan_is_jvm": "True",
        "added_count": want,
    }, out
    logged = [ln for ln in stderr.splitlines() if "JVM reader's jar is not in this install" in ln]
    assert len(logged) == 2, stderr[-3000:]  # local_session, and add_jar without the jar


@pytest.mark.skipif(
    shutil.which("javac") is None and not os.environ.get("CI"),
    reason="no JDK here (CI has one and runs this)",
)
def test_the_jar_builds_from_source_and_its_vector_checks_pass(tmp_path: Path) -> None:
    """javac --release 17 against pyspark's jars; the same classes as the packaged jar;
    our XXH3-64 and UTF-8 checks agree with Python's xxhash and bytes.decode."""
    out = tmp_path / "t.jar"
    r = subprocess.run(
        [sys.executable, str(ROOT / "spark-jvm/build_jar.py"), str(out), "--checks"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr
    packaged = jar_path()
    assert packaged is not None

    def names(p: str | Path) -> set[str]:
        with zipfile.ZipFile(p) as z:
            return set(z.namelist())

    assert names(out) == names(packaged)
    assert "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister" in names(out)
    test_classes = ROOT / "spark-jvm/build/test-classes"
    for gen, main in (
        ("xxh3_vectors.py", "topics.jvm.Xxh3Check"),
        ("utf8_vectors.py", "topics.jvm.Utf8Check"),
    ):
        vec = tmp_path / f"{gen}.txt"
        subprocess.run([sys.executable, str(ROOT / "spark-jvm" / gen), str(vec)], check=True)
        c = subprocess.run(
            ["java", "-cp", f"{test_classes}{os.pathsep}{out}", main, str(vec)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert c.returncode == 0, c.stdout + c.stderr


def test_the_jar_command_prints_the_path_spark_submit_takes() -> None:
    """`spark-submit --jars "$(python -m topics.spark.jvm jar)"` (README, cluster section)."""
    r = subprocess.run(
        [sys.executable, "-m", "topics.spark.jvm", "jar"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == jar_path() and Path(r.stdout.strip()).is_file()
    assert "RuntimeWarning" not in r.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "topics.spark.jvm", "nonsense"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "usage" in bad.stderr
