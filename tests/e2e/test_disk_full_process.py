"""A real `topics serve` on a small tmpfs: it starts, fills the disk, and recovers.

* The data dir lives on a 24 MiB tmpfs: the 64 MiB WAL files do not fit, so
  preallocation shrinks them and the server starts.
* A filler file takes the rest of the space: writes that need a new WAL file
  get `507 insufficient_storage` with the canonical body and `Retry-After`,
  `/v0/ready` answers 200 with `"status": "degraded"`, reads go on, and the
  log says "disk is full" once, not once per request.
* The filler goes: writes resume without a restart, and after a restart every
  acknowledged record is there.
* On a filesystem too small for even the smallest WAL file, the start fails
  with one line and leaves no partial file behind.

Mounting needs root (CAP_SYS_ADMIN); elsewhere the tests are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENV = {
    "TOPICS_WAL_SHARDS": "1",
    "TOPICS_CHECKPOINT_INTERVAL_MS": "0",
    "TOPICS_CHECKPOINT_WAL_BYTES": "0",
}


@pytest.fixture
def small_fs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    size = getattr(request, "param", "24m")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_disk_full_is_507_reads_go_on_and_writes_resume(tmp_path: Path, small_fs: Path) -> None:
    env = {**ENV, "TOPICS_DATA_DIR": str(small_fs / "data")}
    srv = ServerProcess(tmp_path, env)
    acked: list[int] = []
    try:
        wal_files = list((small_fs / "data" / "wal").glob("wal-*.log"))
        assert wal_files and all(f.stat().st_size < 64 << 20 for f in wal_files)
        assert _call(srv.base, "PUT", "/v0/topics/t", {"durability": "fsync"})[0] in (200, 201)
        # Leave less room than one more WAL file needs.
        filler = small_fs / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * max(_free(small_fs) - (256 << 10), 0))
        rec = {"records": [{"data": {"p": "x" * 2000}} for _ in range(20)]}
        status = 200
        for _ in range(2000):
            status, body, headers = _call(srv.base, "POST", "/v0/topics/t", rec)
            if status != 200:
                break
            acked += body["seqs"]
        assert status == 507, (status, body)
        assert body["error"]["code"] == "insufficient_storage", body
        assert int(headers.get("Retry-After", headers.get("retry-after", "0"))) >= 1
        # Refused at once while full; reads go on; the state is visible.
        for _ in range(20):
            assert _call(srv.base, "POST", "/v0/topics/t", rec)[0] == 507
        st, ready, _h = _call(srv.base, "GET", "/v0/ready")
        assert st == 200 and ready["status"] == "degraded" and ready["degraded"]["disk_full"]
        st, diff, _h = _call(srv.base, "POST", "/v0/topics/t/diff", {"from_seq": 0, "limit": 1000})
        got = [r["$seq"] for r in diff["records"]]
        assert st == 200 and got and got == acked[: len(got)]
        assert srv.log_text().count("the disk is full") == 1
        # Space returns: writes resume, no restart.
        filler.unlink()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status, body, _h = _call(srv.base, "POST", "/v0/topics/t", rec)
            if status == 200:
                acked += body["seqs"]
                break
            time.sleep(0.2)
        assert status == 200, body
        assert _call(srv.base, "GET", "/v0/ready")[1]["status"] == "ready"
        assert "writes resume" in srv.log_text()
    finally:
        srv.stop()
    srv = ServerProcess(tmp_path, env)
    try:
        seqs: list[int] = []
        cur = 0
        while True:
            st, d, _h = _call(
                srv.base, "POST", "/v0/topics/t/diff", {"from_seq": cur, "limit": 1000}
            )
            seqs += [r["$seq"] for r in d["records"]]
            if d["caught_up"]:
                break
            cur = d["next_from_seq"]
        assert seqs == acked
    finally:
        srv.stop()


@pytest.mark.parametrize("small_fs", ["600k"], indirect=True)
def test_a_filesystem_too_small_for_the_wal_fails_with_one_line(
    tmp_path: Path, small_fs: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    env.update(ENV, TOPICS_DATA_DIR=str(small_fs / "data"), TOPICS_PORT="0", TOPICS_KAFKA_PORT="0")
    r = subprocess.run(
        [sys.executable, "-m", "topics", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    assert "No space left" in r.stderr or "space" in r.stderr.lower(), r.stderr
    left = [str(p) for p in small_fs.rglob("wal-*.log")]
    assert left == [], f"partial WAL files left behind: {left}"
