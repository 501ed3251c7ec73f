"""Offline reads with the cold tier in an object store (`coldDir=s3://bucket/prefix`).

The session's `history` data dir (tests/spark/conftest.py) has a local cold dir;
its files are uploaded to a moto S3 server (one for this module) and the local
cold dir is left out of every read here, so the records of the cold-only
segments exist only in the object store. The Spark workers reach the store
through the `AWS_*` variables of the Spark context's environment (what
`spark.executorEnv.*` sets on a cluster), pointed at a counting proxy in front of
moto so that the requests they make can be inspected.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import History
from tests.spark.support import diff_rows, run_session_script, spark_rows
from tests.support.s3 import AWS_TEST_ENV, CountingProxy, moto_s3, s3_env
from topics.spark.segments import (
    SegmentMissing,
    load_offline,
    plan_slices,
    read_slice,
)
from topics.storage.objstore import cold_root

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

BUCKET = "archive"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """The moto endpoint (AWS_* set in this process meanwhile)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    with moto_s3(BUCKET) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def proxy(s3: str) -> Iterator[CountingProxy]:
    p = CountingProxy(s3)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def s3_spark(spark: Any, proxy: CountingProxy) -> Iterator[Any]:
    """The session with AWS_* (endpoint: the proxy) in the environment of its Python
    workers. The format is registered again so that its workers get that environment
    (Spark hands a data source the context's environment when it is registered)."""
    from topics.spark import register

    env = spark.sparkContext.environment
    saved = dict(env)
    env.update({**AWS_TEST_ENV, "AWS_ENDPOINT_URL": proxy.url})
    register(spark, force=True)
    try:
        yield spark
    finally:
        env.clear()
        env.update(saved)
        register(spark, force=True)


def upload(cold_dir: Path, url: str) -> list[tuple[int, int]]:
    """Put every segment of a local cold dir under `url`; returns (topic id, first seq)."""
    root = cold_root(url)
    done = []
    for tdir in sorted((cold_dir / "topics").iterdir()):
        tid = int(tdir.name, 16)
        for idx in sorted(tdir.glob("seg-*.idx")):
            first = int(idx.stem[4:])
            root.store(tid).put(first, idx.with_suffix(".data").read_bytes(), idx.read_bytes())
            done.append((tid, first))
    return done


@pytest.fixture(scope="module")
def archive(s3: str, history: History) -> str:
    """`s3://archive/h`: the history's cold tier, uploaded."""
    url = f"s3://{BUCKET}/h"
    assert upload(history.cold_dir, url)
    return url


def _read(spark: Any, h: History, cold: str, **opts: str) -> Any:
    r = spark.read.format("topics").option("path", str(h.data_dir)).option("coldDir", cold)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def _want(h: History, *topics: str) -> set[Any]:
    want: set[Any] = set()
    for t, recs in h.diff.items():
        if not topics or t in topics:
            want |= diff_rows(t, recs)
    return want


def _object_gets(proxy: CountingProxy) -> list[tuple[str, str | None]]:
    """(key path, Range header or None) of every GET of a segment object since the reset."""
    raw = proxy.sent_bytes().decode("latin-1")
    out = []
    for m in re.finditer(r"(?s)(GET|HEAD) (\S+) HTTP/1\.1\r\n(.*?)\r\n\r\n", raw):
        method, path, headers = m.groups()
        if method != "GET" or not re.search(r"/seg-\d{16}\.(data|idx)$", path):
            continue
        rng = re.search(r"(?im)^range: (.*)$", headers)
        out.append((path, rng.group(1).strip() if rng else None))
    return out


def test_offline_read_of_an_archive_held_only_in_the_object_store_equals_the_server_diff(
    s3_spark: Any, history: History, archive: str
) -> None:
    h = history
    topics = load_offline(str(h.data_dir), archive)
    segs = topics["orders"].cat.segments
    cold = [s for s in segs if s.tier == "cold"]
    # Segments whose records are in the object store only: not in the hot dir.
    only_cold = [s for s in cold if not Path(h.data_dir, *s.data_path.split("/")[-3:]).exists()]
    assert len(only_cold) >= 3
    assert all(s.data_path.startswith(archive + "/topics/") for s in cold)
    # The same plan as with the local cold dir: one partition per segment, same seqs.
    local = load_offline(str(h.data_dir), str(h.cold_dir))
    assert {
        n: [(s.first_seq, s.last_seq, s.tier) for s in t.cat.segments] for n, t in topics.items()
    } == {n: [(s.first_seq, s.last_seq, s.tier) for s in t.cat.segments] for n, t in local.items()}

    df = _read(s3_spark, h, archive, topicPattern=".*")
    got = spark_rows(df)
    assert len(got) == len(set(got))
    assert set(got) == _want(h)
    only_cold_seqs = {q for s in only_cold for q in range(s.first_seq, s.last_seq + 1)}
    assert {r[1] for r in got if r[0] == "orders"} & only_cold_seqs  # read from the store
    n_segments = sum(
        1 for t in topics.values() for s in t.cat.segments if s.last_seq >= t.cat.earliest_seq
    )
    assert df.rdd.getNumPartitions() == n_segments
    # The same rows as the read with the local cold dir.
    assert set(spark_rows(_read(s3_spark, h, str(h.cold_dir), topicPattern=".*"))) == set(got)


def test_a_read_inside_one_cold_segment_fetches_ranges_only(
    s3_spark: Any, history: History, archive: str, proxy: CountingProxy
) -> None:
    h = history
    seg = next(
        s
        for s in load_offline(str(h.data_dir), archive)["orders"].cat.segments
        if s.tier == "cold" and s.first_seq > 100
    )
    start, end = seg.first_seq + 10, seg.first_seq + 20  # 10 seqs of 50
    data_size = cold_root(archive).fs.open(seg.data_path).size()
    proxy.reset()
    df = _read(s3_spark, h, archive, topics="orders", startingSeq=str(start), endingSeq=str(end))
    assert df.rdd.getNumPartitions() == 1
    want = diff_rows("orders", [r for r in h.diff["orders"] if start <= r["$seq"] < end])
    assert set(spark_rows(df)) == want and want
    gets = _object_gets(proxy)
    assert gets, "the workers did not go through the proxy"
    assert all(rng is not None and rng.startswith("bytes=") for _, rng in gets), gets
    fetched = 0
    for path, rng in gets:
        assert path.endswith((".data", ".idx"))
        a, b = (int(x) for x in rng.removeprefix("bytes=").split("-"))  # type: ignore[union-attr]
        if path.endswith(".idx"):
            assert b - a + 1 == (end - start) * 20  # the entries of the wanted seqs only
        else:
            fetched += b - a + 1
    assert 0 < fetched < data_size / 2


def test_planning_refuses_an_archive_missing_an_object(
    s3_spark: Any, history: History, s3: str, tmp_path: Path
) -> None:
    h = history
    url = f"s3://{BUCKET}/lost-data"
    upload(h.cold_dir, url)
    seg = next(
        s
        for s in load_offline(str(h.data_dir), url)["orders"].cat.segments
        if s.tier == "cold" and not Path(h.data_dir, *s.data_path.split("/")[-3:]).exists()
    )
    cold_root(url).fs.unlink(seg.data_path)  # the .idx stays: a stray, never listed
    name = f"seg-{seg.first_seq:016d}"

    topics = load_offline(str(h.data_dir), url)
    assert [m[0] for m in topics["orders"].missing] == [seg.first_seq]
    with pytest.raises(SegmentMissing, match=f"{name}.*neither tier") as ei:
        plan_slices(topics, {"orders": _bounds()}, str(h.data_dir), url)
    assert (ei.value.lo, ei.value.hi) == (seg.first_seq, seg.last_seq)
    # Reads that do not reach the lost seqs are served; one that does fails, naming it.
    assert plan_slices(topics, {"plain": _bounds()}, str(h.data_dir), url)
    after = _read(s3_spark, h, url, topics="orders", startingSeq=str(seg.last_seq + 1))
    assert set(spark_rows(after)) == {r for r in _want(h, "orders") if r[1] > seg.last_seq}
    with pytest.raises(Exception, match=f"SegmentMissing|{name}") as ei2:
        _read(s3_spark, h, url, topics="orders").count()
    assert name in str(ei2.value) and "neither tier" in str(ei2.value)

    # spark-export: exit 1, nothing left in OUT.
    out = tmp_path / "out"
    r = _export(s3, str(h.data_dir), "--to", "parquet", str(out), "--cold-dir", url)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "missing segment" in r.stderr and name in r.stderr
    assert not out.exists() or list(out.iterdir()) == []


def test_an_object_gone_after_planning_fails_the_read(history: History, s3: str) -> None:
    h = history
    url = f"s3://{BUCKET}/gone-later"
    upload(h.cold_dir, url)
    topics = load_offline(str(h.data_dir), url)
    slices = plan_slices(topics, {"orders": _bounds()}, str(h.data_dir), url)
    sl = next(s for s in slices if s.data_path.startswith(url) and s.alt_data_path)
    assert sl.cold_dir == url and sl.data_dir == str(h.data_dir)
    hot = Path(sl.alt_data_path)  # type: ignore[arg-type]
    assert not hot.exists()  # its records are in the object store only
    assert sum(b.num_rows for b in read_slice(sl)) > 0
    cold_root(url).fs.unlink(sl.data_path)
    with pytest.raises(SegmentMissing, match="still relies on, is gone from both tiers"):
        list(read_slice(sl))


def test_store_errors_are_errors(history: History, s3: str) -> None:
    with pytest.raises(Exception, match="500: LIST s3://no-such-bucket"):
        load_offline(str(history.data_dir), "s3://no-such-bucket/x")
    from topics.spark.options import OptionError
    from topics.spark.source import _cold_dir

    with pytest.raises(OptionError, match="coldDir"):
        _cold_dir({"coldDir": "s3a://bucket/x"})
    with pytest.raises(OptionError, match="coldDir.*no bucket"):
        _cold_dir({"coldDir": "s3:///x"})
    assert _cold_dir({"coldDir": "s3://b/p/"}) == "s3://b/p/"


def _bounds() -> Any:
    from topics.spark.segments import Bounds

    return Bounds()


def _export(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topics", "spark-export", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=s3_env(endpoint),
    )


def test_spark_export_from_the_object_store(
    spark: Any, history: History, archive: str, s3: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = _export(
        s3,
        str(history.data_dir),
        "--to",
        "parquet",
        str(out),
        "--cold-dir",
        archive,
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    want = _want(history)
    assert f"exported {len(want)} records of 4 topic(s)" in r.stdout
    got = spark_rows(spark.read.parquet(str(out)))
    assert len(got) == len(want) and set(got) == want
    # A store that cannot be reached is an error (exit 2 at the start), not an empty tier.
    r = _export(
        s3,
        str(history.data_dir),
        "--to",
        "parquet",
        str(tmp_path / "out2"),
        "--cold-dir",
        f"s3://no-{BUCKET}/h",
        "--no-progress",
    )
    assert r.returncode == 2 and "cannot read the cold tier" in r.stderr, r.stderr
    assert os.path.isdir(history.cold_dir)  # the local copy was never needed


def test_the_jvm_reader_hands_object_store_slices_to_python_in_the_same_query(
    history: History, s3: str, archive: str, tmp_path: Path
) -> None:
    """A fresh session with `AWS_*` in its environment from the start: reader=jvm reads
    the hot segments in Java and the archived ones through the Python reader, in one
    query, with the same rows as reader=python (docs/SPARK.md, "Two readers")."""
    out = run_session_script(
        "s3_session.py", str(history.data_dir), archive, cwd=tmp_path, env=s3_env(s3)
    )
    out.pop("_stderr")
    n = str(len(_want(history)))
    assert out == {
        "jvm_scan": "True",
        "jvm_count": n,
        "python_count": n,
        "jvm_minus_python": "0",
        "python_minus_jvm": "0",
    }, out
