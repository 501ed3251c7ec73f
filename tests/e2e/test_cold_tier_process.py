"""A real `topics serve` with a cold tier: a local directory, and an S3-compatible
object store (moto on 127.0.0.1) behind a proxy that can fail on purpose.

* Sealed segments beyond TOPICS_HOT_RETAIN_SEGMENTS move to the cold tier; a diff
  of that history reads from there and says so (`cold_segments_read`); after a
  restart every record reads back the same.
* With the object store answering 500 or not answering at all, a diff that needs
  it gets `503 cold_tier_unavailable` with the canonical body, while writes and
  reads of hot records go on; a cold object that is gone is a `500`, never a
  silent gap. When the store is back, the same diff succeeds.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import ServerProcess
from tests.support.s3 import FaultProxy, moto_s3, s3_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUCKET = "cold-archive"
ENV = {
    "TOPICS_WAL_SHARDS": "1",
    "TOPICS_SEGMENT_MAX_EVENTS": "100",
    "TOPICS_HOT_RETAIN_SEGMENTS": "1",
    "TOPICS_CHECKPOINT_INTERVAL_MS": "200",
    "TOPICS_RELOCATE_BYTES_PER_S": "0",
    "TOPICS_WAL_FILE_BYTES": str(4 << 20),
}
N = 1000


def _call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    req.add_header("accept", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _fill(base: str) -> None:
    for k in range(0, N, 250):
        recs = [{"data": {"i": i}} for i in range(k, k + 250)]
        st, body = _call(base, "POST", "/v0/topics/hist?return_seqs=false", {"records": recs})
        assert st in (200, 201), body


def _metrics(base: str) -> dict[str, Any]:
    st, body = _call(base, "GET", "/v0/metrics")
    assert st == 200
    return body["storage"]


def _wait_relocated(base: str, at_least: int, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = _metrics(base)
        if m.get("relocated_segments", 0) >= at_least and m.get("cold_segments", 0) >= at_least:
            return m
        time.sleep(0.1)
    raise AssertionError(f"segments did not relocate: {_metrics(base)}")


def _all(base: str) -> list[int]:
    out: list[int] = []
    frm = 0
    while True:
        st, body = _call(base, "POST", "/v0/topics/hist/diff", {"from_seq": frm, "limit": 1000})
        assert st == 200, body
        out += [r["data"]["i"] for r in body["records"]]
        frm = body["next_from_seq"]
        if body["caught_up"]:
            return out


def test_local_cold_dir_relocation_and_reads(tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    srv = ServerProcess(tmp_path, {**ENV, "TOPICS_COLD_DIR": str(cold)})
    try:
        _fill(srv.base)
        m = _wait_relocated(srv.base, 8)
        assert m["relocation_failures"] == 0
        files = sorted(p.name for p in cold.glob("topics/*/seg-*.data"))
        assert len(files) >= 8
        st, body = _call(srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": 0, "limit": 50})
        assert st == 200 and body["performance"]["cold_segments_read"] == 1
        assert [r["data"]["i"] for r in body["records"]] == list(range(50))
        st, body = _call(srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": N - 5})
        assert st == 200 and "cold_segments_read" not in body["performance"]
        assert _all(srv.base) == list(range(N))
        _, prom = 0, urllib.request.urlopen(srv.base + "/v0/metrics", timeout=10).read().decode()
        assert "topics_relocated_segments_total" in prom and "topics_cold_segments" in prom
    finally:
        assert srv.stop() == 0
    srv = ServerProcess(tmp_path, {**ENV, "TOPICS_COLD_DIR": str(cold)})
    try:
        assert _all(srv.base) == list(range(N))
        assert _metrics(srv.base)["cold_segments"] >= 8
    finally:
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with moto_s3(BUCKET) as endpoint:
        yield endpoint


def test_object_store_cold_tier_errors_never_touch_writes(tmp_path: Path, s3: str) -> None:
    proxy = FaultProxy(s3)
    env = {
        **s3_env(proxy.url),
        **ENV,
        "TOPICS_COLD_DIR": f"s3://{BUCKET}/archive",
        "TOPICS_COLD_RETRIES": "0",
        "TOPICS_COLD_TIMEOUT_MS": "1000",
    }
    srv = ServerProcess(tmp_path, env)
    try:
        _fill(srv.base)
        _wait_relocated(srv.base, 8)
        import obstore
        from obstore.store import S3Store

        client = S3Store(BUCKET, config={"endpoint": s3}, client_options={"allow_http": True})
        keys = [m["path"] for chunk in obstore.list(client, "archive/topics/") for m in chunk]
        assert sum(k.endswith(".data") for k in keys) >= 8
        st, body = _call(srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": 0, "limit": 10})
        assert st == 200 and body["performance"]["cold_segments_read"] == 1
        assert [r["data"]["i"] for r in body["records"]] == list(range(10))

        for mode in ("500", "hang"):
            proxy.mode = mode
            # A segment not read yet (the range cache would answer for one that was).
            frm = {"500": 300, "hang": 500}[mode]
            st, body = _call(
                srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": frm, "limit": 10}
            )
            assert st == 503, (mode, body)
            assert body["error"]["code"] == "cold_tier_unavailable", body
            assert body["error"]["detail"] == {"retryable": True}
            # Writes and hot reads do not wait on the cold tier.
            t0 = time.monotonic()
            st, ack = _call(srv.base, "POST", "/v0/topics/live", {"records": [{"data": mode}]})
            assert st in (200, 201), ack
            assert time.monotonic() - t0 < 0.5
            st, body = _call(srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": N - 3})
            assert st == 200 and [r["data"]["i"] for r in body["records"]] == [N - 3, N - 2, N - 1]
        proxy.mode = "pass"
        st, body = _call(srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": 300, "limit": 10})
        assert st == 200 and [r["data"]["i"] for r in body["records"]] == list(range(300, 310))

        # A restart recovers the topic from the hot segments, the objects and the WAL.
        assert srv.stop() == 0
        srv = ServerProcess(tmp_path, env)
        assert _all(srv.base)[:N] == list(range(N))
        assert _metrics(srv.base)["cold_segments"] >= 8

        # A cold object that is gone: a 500 with the canonical body, not a gap (a
        # segment this process has not read, so no cached range answers for it).
        st, ack = _call(srv.base, "POST", "/v0/topics/hist", {"records": [{"data": {"i": N}}]})
        assert st == 200, ack
        assert srv.stop() == 0
        srv = ServerProcess(tmp_path, env)
        gone = next(k for k in keys if k.endswith(f"seg-{701:016d}.data"))
        obstore.delete(client, gone)
        st, body = _call(srv.base, "POST", "/v0/topics/hist/diff", {"from_seq": 700, "limit": 10})
        assert st == 500 and body["error"]["code"] == "internal", body
        assert _all_or_error(srv.base) == 500
        # The next start refuses: the snapshot relies on a segment no tier holds whole.
        assert srv.stop() == 0
        with pytest.raises(RuntimeError, match="segment 701"):
            srv = ServerProcess(tmp_path, env)
    finally:
        srv.stop()
        proxy.close()


def _all_or_error(base: str) -> int:
    frm = 0
    while True:
        st, body = _call(base, "POST", "/v0/topics/hist/diff", {"from_seq": frm, "limit": 1000})
        if st != 200:
            return st
        frm = body["next_from_seq"]
        if body["caught_up"]:
            return 200


def test_deleting_a_topic_deletes_its_objects(tmp_path: Path, s3: str) -> None:
    """Objects cannot be renamed: once a snapshot no longer lists the deleted topic,
    the reaper deletes its objects; the other topic's stay."""
    import obstore
    from obstore.store import S3Store

    env = {
        **s3_env(s3),
        **ENV,
        "TOPICS_COLD_DIR": f"s3://{BUCKET}/deletes",
        "TOPICS_COLD_RETRIES": "0",
    }
    srv = ServerProcess(tmp_path, env)
    client = S3Store(BUCKET, config={"endpoint": s3}, client_options={"allow_http": True})

    def keys() -> set[str]:
        return {m["path"] for chunk in obstore.list(client, "deletes/topics/") for m in chunk}

    try:
        _fill(srv.base)  # topic `hist`
        recs = [{"data": {"j": i}} for i in range(500)]
        st, body = _call(srv.base, "POST", "/v0/topics/other?return_seqs=false", {"records": recs})
        assert st in (200, 201), body
        _wait_relocated(srv.base, 8 + 3)
        before = keys()
        dirs = {k.split("/")[2] for k in before}
        assert len(dirs) == 2
        st, body = _call(srv.base, "DELETE", "/v0/topics/hist")
        assert st == 200, body
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len({k.split("/")[2] for k in keys()}) != 1:
            time.sleep(0.1)
        left = keys()
        assert len({k.split("/")[2] for k in left}) == 1, sorted(left)[:4]
        assert left == {k for k in before if k.split("/")[2] in {k2.split("/")[2] for k2 in left}}
        st, body = _call(srv.base, "POST", "/v0/topics/other/diff", {"from_seq": 0, "limit": 5})
        assert st == 200 and [r["data"]["j"] for r in body["records"]] == list(range(5))
    finally:
        srv.stop()
