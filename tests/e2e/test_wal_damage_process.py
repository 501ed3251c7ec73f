"""A flipped byte in a WAL file, against the real `topics serve` and `topics repair`.

The server writes fsync-class records into small WAL files (several per shard)
and is killed (SIGKILL: no final checkpoint, so the WAL is the only copy). One
byte of one record is flipped: in the first, a middle or the last record of the
first, a middle or the last file, at a seeded random offset inside the frame.
Then:

* `topics serve` refuses to start: a non-zero exit, one line naming the file,
  the offset and the seqs at risk, no traceback, and nothing under the data
  dir changed;
* `topics repair --dry-run` reports the plan and changes nothing (exit 1);
* `topics repair` salvages (exit 0): after it the server starts, every
  acknowledged record but the flipped one reads back, a read across the
  flipped seq gets a `corrupt` tombstone starting exactly there, and the next
  write gets a seq above every seq the server ever handed out.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import ServerProcess
from topics.format.frame import APPEND
from topics.storage.fs import RealFs
from topics.storage.wal import scan_shard

pytestmark = pytest.mark.e2e

ENV = {
    "TOPICS_WAL_SHARDS": "1",
    "TOPICS_WAL_FILE_BYTES": "65536",
    "TOPICS_CHECKPOINT_INTERVAL_MS": "0",
    "TOPICS_CHECKPOINT_WAL_BYTES": "0",
}
RECORDS = 420


def _call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".topics.lock":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _read_all(base: str, topic: str) -> tuple[list[int], list[dict[str, Any]]]:
    seqs: list[int] = []
    tombs: list[dict[str, Any]] = []
    cur = 0
    for _ in range(1000):
        st, r = _call(base, "POST", f"/v0/topics/{topic}/diff", {"from_seq": cur, "limit": 1000})
        assert st == 200, r
        seqs += [x["$seq"] for x in r["records"]]
        if r.get("tombstone"):
            tombs.append(r["tombstone"])
        if r["caught_up"] or r["next_from_seq"] <= cur:
            break
        cur = r["next_from_seq"]
    return seqs, tombs


def _topics(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topics", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("file_pos", ["first", "middle", "last"])
@pytest.mark.parametrize("frame_pos", ["first", "middle", "last"])
def test_flipped_wal_byte_refuses_then_repair_salvages(
    tmp_path: Path, file_pos: str, frame_pos: str
) -> None:
    rng = random.Random(f"{file_pos}/{frame_pos}")
    srv = ServerProcess(tmp_path, ENV)
    try:
        assert _call(srv.base, "PUT", "/v0/topics/t", {"durability": "fsync"})[0] in (200, 201)
        assert _call(srv.base, "PUT", "/v0/topics/other", {"durability": "fsync"})[0] in (200, 201)
        acked: list[int] = []
        for i in range(RECORDS):
            st, r = _call(
                srv.base, "POST", "/v0/topics/t", {"records": [{"data": {"i": i, "p": "x" * 200}}]}
            )
            assert st == 200, r
            acked += r["seqs"]
        assert _call(srv.base, "POST", "/v0/topics/other", {"records": [{"data": 1}]})[0] == 200
    finally:
        srv.stop(signal.SIGKILL)
    data = tmp_path / "data"
    wal = data / "wal"
    files = sorted(wal.glob("wal-*.log"))
    assert len(files) >= 3, files
    victim_file = {"first": files[0], "middle": files[len(files) // 2], "last": files[-1]}[file_pos]
    frames = [
        fr
        for name, fr in scan_shard(RealFs(), str(wal)).frames
        if name == victim_file.name and fr.type == APPEND and fr.data.startswith(b'{"i"')
    ]
    assert frames, f"no record frames in {victim_file.name}"
    victim = {"first": frames[0], "middle": frames[len(frames) // 2], "last": frames[-1]}[frame_pos]
    raw = bytearray(victim_file.read_bytes())
    at = rng.randrange(victim.offset, victim.offset + victim.size)
    raw[at] ^= 1 << rng.randrange(8)
    victim_file.write_bytes(bytes(raw))
    before = _tree(data)

    # 1. The start is refused, with one clear line and nothing changed.
    log = tmp_path / "refused.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    env.update(ENV, TOPICS_DATA_DIR=str(data), TOPICS_PORT="0", TOPICS_KAFKA_PORT="0")
    r = subprocess.run(
        [sys.executable, "-m", "topics", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    log.write_text(r.stdout + r.stderr)
    assert r.returncode != 0, log.read_text()
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert "WAL damage" in out and victim_file.name in out and f"[{victim.offset}, " in out, out
    assert "seqs" in out, out
    assert _tree(data) == before, "a refused start changed the data dir"

    # 2. A dry run changes nothing; the repair salvages.
    dry = _topics("repair", str(data), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 1 and "lost" in dry.stdout, dry.stdout + dry.stderr
    assert _tree(data) == before
    rep = _topics("repair", str(data), cwd=tmp_path)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    kept = list((data / "quarantine").glob("repair-*/manifest.json"))
    assert len(kept) == 1
    assert (kept[0].parent / "wal" / victim_file.name).read_bytes() == bytes(raw)

    # 3. Every other acknowledged record reads back; the lost seq is a tombstone.
    srv = ServerProcess(tmp_path, ENV)
    try:
        seqs, tombs = _read_all(srv.base, "t")
        assert seqs == [s for s in acked if s != victim.seq]
        corrupt = [t for t in tombs if t["reason"] == "corrupt"]
        assert corrupt and corrupt[0]["gap_from"] == victim.seq, tombs
        assert corrupt[0]["gap_to"] >= victim.seq
        assert _read_all(srv.base, "other")[0] == [1]
        st, w = _call(srv.base, "POST", "/v0/topics/t", {"records": [{"data": "after"}]})
        assert st == 200 and w["seqs"][0] > max(max(acked), corrupt[0]["gap_to"])
    finally:
        srv.stop()
