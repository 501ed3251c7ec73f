"""Fixtures of the Spark tests: ONE local SparkSession for the run, and a real data directory.

The session is `local[2,4]`: two worker threads (as `local[2]`) and up to four
attempts per task, so a failed task is retried as on a cluster (the sink's
retry test needs that; plain `local[N]` never retries).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import client, diff_all, write
from tests.support.process import ServerProcess


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from topics.spark.session import local_session

    s = local_session("topics-tests", master="local[2,4]")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@dataclass
class History:
    """A data directory written by a real server and stopped gracefully.

    `diff` holds each topic's records as the engine's diff returned them (after
    a restart, which must agree with the diff before it). Segments hold 50
    records. Between the two runs the sealed segments of "orders" except the two
    newest are moved to the cold tier by hand, one more is copied (present in
    both), so each test knows which segment is where: the server's own relocator
    is held back (TOPICS_HOT_RETAIN_SEGMENTS far above the segment count).
    """

    data_dir: Path
    cold_dir: Path
    diff: dict[str, list[dict[str, Any]]]
    timed_batches: list[int]  # ts (ms) of each 50-record batch of topic "timed"


HISTORY_ENV = {
    "TOPICS_SEGMENT_MAX_EVENTS": "50",
    "TOPICS_WAL_SHARDS": "2",
    "TOPICS_HOT_RETAIN_SEGMENTS": "1000000",
}


def _archive_to_cold(data_dir: Path, cold_dir: Path, topic: str) -> None:
    from topics.spark.segments import load_offline

    segs = load_offline(str(data_dir))[topic].cat.segments
    sealed = [s for s in segs if s.sealed]
    for i, s in enumerate(sealed[:-2]):
        for p in (Path(s.data_path), Path(s.idx_path)):
            dst = cold_dir / p.relative_to(data_dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst)
            if i != 0:  # the first stays in both tiers (the hot copy wins)
                p.unlink()


@pytest.fixture(scope="session")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    tmp = tmp_path_factory.mktemp("history")
    env = dict(HISTORY_ENV, TOPICS_COLD_DIR=str(tmp / "cold"))
    srv = ServerProcess(tmp, env=env)
    try:
        with client(srv) as c:
            for b in range(4):
                write(
                    c,
                    "orders",
                    [
                        {
                            "data": {
                                "order": b * 100 + j,
                                "sku": f"S-{j % 7}",
                                "note": "é€" * (j % 3),
                            },
                            "tag": f"t{j % 5}",
                            "node": f"gw-{j % 2}",
                            **({"meta": {"trace": f"x{j}", "n": j}} if j % 4 == 0 else {}),
                        }
                        for j in range(100)
                    ],
                )
            r = c.post("/v0/topics/orders/delete", json={"match": "t3"})
            assert r.status_code == 200, r.text
            r = c.post("/v0/topics/orders/delete", json={"before_seq": 20})
            assert r.status_code == 200, r.text
            assert c.put("/v0/topics/capped", json={"cap_records": 120}).status_code in (200, 201)
            for b in range(5):
                write(c, "capped", [{"data": b * 100 + j} for j in range(100)])
            write(
                c,
                "plain",
                [
                    {"data": None},
                    {"data": [1, 2.5, {"x": "y"}]},
                    {"data": 'text with "quotes" and \\ and \n'},
                    {"data": {"nested": {"deep": [True, False, None]}}, "meta": {}},
                    {"data": 12345678901234},
                ],
            )
            timed: list[int] = []
            for b in range(5):
                out = write(c, "timed", [{"data": {"b": b, "j": j}} for j in range(50)])
                st = diff_all(c, "timed", out["first_seq"] - 1)
                timed.append(st[0]["$ts"])
                time.sleep(0.02)  # distinct commit ms per batch (and so per segment)
            before = {t: diff_all(c, t) for t in ("orders", "capped", "plain", "timed")}
    finally:
        assert srv.stop() == 0, (tmp / "server.log").read_text()
    _archive_to_cold(tmp / "data", tmp / "cold", "orders")
    srv = ServerProcess(tmp, env=env)  # the engine's view after recovery from the files
    try:
        with client(srv) as c:
            after = {t: diff_all(c, t) for t in before}
    finally:
        assert srv.stop() == 0, (tmp / "server.log").read_text()
    assert after == before
    return History(tmp / "data", tmp / "cold", after, timed)
