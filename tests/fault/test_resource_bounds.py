"""Resource bounds of the storage: open file descriptors and checkpoint memory.

* Descriptors do not grow with topics or segments: segment reads go through one
  LRU of handles capped by ``TOPICS_MAX_OPEN_SEGMENT_FILES`` (an mmap or a pread
  file each), and an active segment's writer gives its two descriptors back
  after every checkpoint and after recovery resumed it.
* A checkpoint converts and writes segment frames a bounded step at a time, so
  its peak memory does not grow with the bytes it moves.

Everything runs on the real filesystem (real descriptors, mmap, fsync). The two
heavy cases run the storage in a child process of their own, so the descriptor
limit can be lowered to the usual ``ulimit -n`` of 1024 and the RSS measured
without the test runner's own history; the child's entry point is this module
(``python -m tests.fault.test_resource_bounds CMD ...``), and it prints one JSON
line of measurements.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.realstore import RealStore, open_fds, proc_status_kib
from topics.format.frame import encode_record
from topics.storage.checkpoint import CheckpointConfig
from topics.storage.fs import RealFs
from topics.storage.segment import SegmentWriter, scan_segments, topic_dir
from topics.storage.topicstore import (
    DEFAULT_MAX_OPEN_SEGMENT_FILES,
    SegmentSource,
    open_files,
    set_max_open_segment_files,
)

ROOT = Path(__file__).resolve().parents[2]
NOFILE = 1024  # the usual default `ulimit -n`
FD_SLACK = 64  # stdio, epoll, the WAL shards' files, checkpoint I/O threads, the lock...
MIB = 1024 * 1024


# ------------------------------------------------------------------ helpers


class FdWatch:
    """Samples this process's open descriptor count in a thread; `.peak` is the max seen."""

    def __init__(self, every_s: float = 0.01) -> None:
        self.every_s = every_s
        self.peak = open_fds()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                n = open_fds() - 1  # listdir's own descriptor
            except OSError:
                n = NOFILE  # could not even list: count it as exhausted
            self.peak = max(self.peak, n)
            self._stop.wait(self.every_s)

    def __enter__(self) -> FdWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, open_fds() - 1)


class RssWatch:
    """Peak RSS (KiB) from now on: VmHWM after resetting it, or sampled VmRSS."""

    def __init__(self) -> None:
        self.base = proc_status_kib("VmRSS")
        self.reset = False
        try:  # "5" resets the peak-RSS watermark to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = proc_status_kib("VmHWM") <= self.base + 1024
        except OSError:
            pass
        self.sampled = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sampled = max(self.sampled, proc_status_kib("VmRSS"))
            self._stop.wait(0.002)

    def __enter__(self) -> RssWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    @property
    def peak(self) -> int:
        hwm = proc_status_kib("VmHWM") if self.reset else 0
        return max(hwm, self.sampled)


def _limit_fds() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))


def _child(cmd: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run `python -m tests.fault.test_resource_bounds cmd args` and parse its JSON line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fault.test_resource_bounds", cmd, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit_fds,  # the child starts under `ulimit -n 1024`
    )
    assert proc.returncode == 0, f"child {cmd} failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _topic_name(i: int) -> str:
    return f"t{i:06d}"


def _records(i: int, n: int) -> list[dict[str, Any]]:
    return [{"data": {"t": i, "k": k}} for k in range(n)]


# ------------------------------------------------------------------ children


def child_many_write(data_dir: str, n_topics: int, per_topic: int) -> dict[str, Any]:
    """Create `n_topics` disk-class topics of `per_topic` records, then stop gracefully.

    The graceful stop's final checkpoint moves every record into a segment.
    """
    t0 = time.perf_counter()
    with FdWatch() as fw:
        st = RealStore(data_dir)
        st.open()
        group = (
            1000  # writes staged at once (each also logs a TopicCreate): under the WAL queue bound
        )
        for g in range(0, n_topics, group):
            st.write_many(
                [
                    (_topic_name(i), _records(i, per_topic), {"durability": "disk"})
                    for i in range(g, min(n_topics, g + group))
                ]
            )
        wrote_s = time.perf_counter() - t0
        st.close()  # final checkpoint: segments for every topic, snapshot, WAL pruned
    return {
        "peak_fds": fw.peak,
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "write_s": round(wrote_s, 1),
        "total_s": round(time.perf_counter() - t0, 1),
    }


def child_many_read(data_dir: str, n_topics: int, per_topic: int) -> dict[str, Any]:
    """Recover the data dir and read every record of every topic back."""
    t0 = time.perf_counter()
    with FdWatch() as fw:
        st = RealStore(data_dir)
        st.open()
        rep = st.storage.report if st.storage is not None else None
        assert rep is not None
        recovered_s = time.perf_counter() - t0
        eng = st.eng()
        bad: list[str] = []
        for i in range(n_topics):
            name = _topic_name(i)
            if name not in eng.topics:
                bad.append(f"{name} missing")
                continue
            got = [(r["$seq"], r["data"]) for r in st.read_all(name)]
            want = [(k + 1, d["data"]) for k, d in enumerate(_records(i, per_topic))]
            if got != want:
                bad.append(f"{name}: {got!r}")
        fds_after_reads = open_fds()
        st.abort()  # nothing was written: no final checkpoint needed
    return {
        "peak_fds": fw.peak,
        "fds_after_reads": fds_after_reads,
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "topics": len(eng.topics),
        "segment_records": rep.segment_records,
        "wal_records": rep.records,
        "bad": bad[:20],
        "n_bad": len(bad),
        "recover_s": round(recovered_s, 1),
        "total_s": round(time.perf_counter() - t0, 1),
    }


def _payload(i: int, size: int) -> str:
    # Distinct per record, incompressible enough to be honest bytes.
    seed = hashlib.sha256(str(i).encode()).hexdigest()
    return (seed * (size // len(seed) + 1))[:size]


def child_ckpt_rss(data_dir: str, total_mib: int, record_kib: int) -> dict[str, Any]:
    """Write `total_mib` of `record_kib` KiB disk-class records, then checkpoint and measure.

    One big topic (three quarters of the bytes: segments seal at their 64 MiB
    trigger in the middle of it) and two smaller ones, so the parallel path
    of the checkpoint is exercised too.
    """
    size = record_kib * 1024
    n = total_mib * MIB // size
    names = ["big"] * 6 + ["s1", "s2"]  # 3/4 of the records go to "big"
    sent: dict[str, list[int]] = {name: [] for name in set(names)}
    with RealStore(data_dir) as st:
        i = step = 0
        while i < n:
            writes = []
            for _ in range(8):
                if i >= n:
                    break
                name = names[step % len(names)]
                step += 1
                batch = list(range(i, min(n, i + 16)))
                sent[name].extend(batch)
                writes.append(
                    (
                        name,
                        [{"data": {"i": j, "p": _payload(j, size - 40)}} for j in batch],
                        {"durability": "disk"},
                    )
                )
                i += len(batch)
            st.write_many(writes)
        gc.collect()
        chunk_bytes = sum(st.eng().require(name).chunk_bytes() for name in sent)
        with RssWatch() as rw:
            t0 = time.perf_counter()
            rep = st.checkpoint()
            ckpt_s = time.perf_counter() - t0
        peak = rw.peak
        chunks_after = sum(st.eng().require(name).chunk_bytes() for name in sent)
        bad = 0
        for name, ids in sent.items():
            got = [r["data"]["i"] for r in st.read_all(name)]
            if got != ids:
                bad += 1
        sample = st.read_all("big")[:3]
        sample_ok = all(r["data"]["p"] == _payload(r["data"]["i"], size - 40) for r in sample)
    return {
        "records": rep.records,
        "bytes": rep.bytes,
        "sealed": rep.sealed,
        "chunk_mib": round(chunk_bytes / MIB, 1),
        "base_mib": round(rw.base / 1024, 1),
        "peak_mib": round(peak / 1024, 1),
        "delta_mib": round((peak - rw.base) / 1024, 1),
        "chunk_mib_after": round(chunks_after / MIB, 1),
        "hwm_reset": rw.reset,
        "ckpt_s": round(ckpt_s, 2),
        "bad_topics": bad,
        "sample_ok": sample_ok,
        "n": n,
    }


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "many-write": child_many_write,
    "many-read": child_many_read,
    "ckpt-rss": child_ckpt_rss,
}


# ------------------------------------------------------------------ slow, child processes


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_100k_topics_checkpoint_and_restart_under_ulimit_1024(tmp_path: Path) -> None:
    n, per = 100_000, 3
    data = str(tmp_path / "data")
    w = _child("many-write", data, str(n), str(per))
    print("write:", w)
    assert w["nofile"] == NOFILE
    assert w["peak_fds"] <= DEFAULT_MAX_OPEN_SEGMENT_FILES + FD_SLACK, w
    # Every topic got its segment on disk (the final checkpoint), no WAL replay needed.
    topics_root = Path(data) / "topics"
    assert sum(1 for _ in topics_root.iterdir()) == n
    r = _child("many-read", data, str(n), str(per))
    print("read:", r)
    assert r["nofile"] == NOFILE
    assert r["n_bad"] == 0, r["bad"]
    assert r["topics"] == n
    assert r["segment_records"] == n * per and r["wal_records"] == 0, r
    assert r["peak_fds"] <= DEFAULT_MAX_OPEN_SEGMENT_FILES + FD_SLACK, r


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_checkpoint_of_200_mib_of_32_kib_records_stays_under_300_mib_above_steady(
    tmp_path: Path,
) -> None:
    m = _child("ckpt-rss", str(tmp_path / "data"), "200", "32")
    print("checkpoint memory:", m)
    assert m["records"] == m["n"] and m["bytes"] >= 200 * MIB
    assert m["sealed"] >= 2  # "big" crossed the 64 MiB trigger twice
    assert m["bad_topics"] == 0 and m["sample_ok"]
    assert m["delta_mib"] < 300, m
    # The in-memory copies of the records (the steady state) were all moved.
    assert m["chunk_mib"] >= 200 and m["chunk_mib_after"] == 0, m


# ------------------------------------------------------------------ in-process (quick tier)


@pytest.fixture
def cap64() -> Iterator[int]:
    before = open_files.cap
    open_files.clear()
    set_max_open_segment_files(64)
    try:
        yield 64
    finally:
        open_files.clear()
        set_max_open_segment_files(before)


def test_reading_many_segments_of_many_topics_keeps_fds_under_the_cap(
    tmp_path: Path, cap64: int
) -> None:
    topics, per, seg = 120, 22, 4  # 6 segments a topic: 600 sealed + 120 active
    base = open_fds()
    st = RealStore(
        str(tmp_path / "data"),
        checkpoint=CheckpointConfig(segment_max_events=seg, interval_ms=0, wal_bytes=0),
    )
    st.open()
    try:
        st.write_many(
            [(_topic_name(i), _records(i, per), {"durability": "disk"}) for i in range(topics)]
        )
        rep = st.checkpoint()
        assert rep.records == topics * per and rep.sealed == topics * (per // seg)
        idle = open_fds()
        # No descriptor per topic is left behind by the checkpoint (the writers released theirs).
        assert idle <= base + 16, (base, idle)
        opened_before = open_files.opened
        peak = 0
        for _round in range(2):  # the second round reopens what the first evicted
            for i in range(topics):
                got = [r["data"] for r in st.read_all(_topic_name(i))]
                assert got == [d["data"] for d in _records(i, per)], i
                peak = max(peak, open_fds())
        assert len(open_files) <= cap64
        assert peak <= idle + cap64 + 4, (idle, peak)
        # Every segment was opened, and evicted ones were reopened on the second round.
        assert open_files.opened - opened_before >= 2 * topics * (per // seg + 1)
    finally:
        st.abort()  # stopping without a final checkpoint gives the handles back too
    assert len(open_files) == 0
    assert open_fds() <= base + 4, (base, open_fds())


def test_restart_resumes_active_segments_without_holding_their_descriptors(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    with RealStore(data) as st:
        st.write_many(
            [(_topic_name(i), _records(i, 3), {"durability": "disk"}) for i in range(300)]
        )
    base = open_fds()
    st = RealStore(data)
    st.open()
    try:
        # 300 resumed active segments (600 files) and not one descriptor per topic.
        assert open_fds() <= base + 16
        stores = st.storage.checkpointer.stores if st.storage is not None else {}
        writers = [s.writer for s in stores.values() if s.writer is not None]
        assert len(writers) == 300 and not any(w.holds_files for w in writers)
        # The next checkpoint appends to them (reopening on demand) and lets go again.
        st.write_many([(_topic_name(i), _records(i, 2), None) for i in range(0, 300, 3)])
        rep = st.checkpoint()
        assert rep.records == 200 and not any(w.holds_files for w in writers)
        assert open_fds() <= base + 16
        for i in (0, 1, 150, 297):
            got = [r["data"] for r in st.read_all(_topic_name(i))]
            want = [d["data"] for d in _records(i, 3)]
            if i % 3 == 0:
                want += [d["data"] for d in _records(i, 2)]
            assert got == want, i
        tid = st.eng().require(_topic_name(0)).topic_id
    finally:
        st.close()
    # Still one segment holding all five records (appended to, not replaced).
    segs = scan_segments(RealFs(), topic_dir(data, tid))
    assert len(segs.segments) == 1 and not segs.strays and not segs.temps
    idx = Path(segs.segments[0][1].idx).stat().st_size
    assert idx == 5 * 20


def test_an_evicted_map_stays_valid_for_the_read_that_holds_it(tmp_path: Path) -> None:
    fs = RealFs()
    d = str(tmp_path / "seg")
    frames: list[bytes] = []
    for first in (1, 100):
        w = SegmentWriter(fs, d, first)
        fr = [
            encode_record(
                7, first + k, 1000, None, None, b'"x%d"' % k, None, durable=True, segment=True
            )
            for k in range(3)
        ]
        frames.extend(fr)
        w.append_many(fr, [1000] * 3, [fr[0][4]] * 3)
        w.seal()
    before = open_files.cap
    open_files.clear()
    set_max_open_segment_files(1)
    try:
        a = SegmentSource(fs, os.path.join(d, "seg-0000000000000001.data"), sealed=True)
        b = SegmentSource(fs, os.path.join(d, "seg-0000000000000100.data"), sealed=True)
        buf_a, base_a = a.span(0, 10)
        assert a.is_open and base_a == 0
        buf_b, _ = b.span(0, 10)  # evicts a's map: the pool drops it...
        assert not a.is_open and b.is_open and len(open_files) == 1
        # ...but the read holding it still sees the bytes (never closed under it).
        assert bytes(buf_a[: len(frames[0])]) == frames[0]
        assert bytes(buf_b[: len(frames[3])]) == frames[3]
        # A later read of `a` reopens transparently.
        buf_a2, _ = a.span(0, 10)
        assert bytes(buf_a2[: len(frames[0])]) == frames[0]
        assert a.is_open and not b.is_open
        a.close()
        b.close()
        assert len(open_files) == 0
    finally:
        set_max_open_segment_files(before)


def test_active_source_preads_reopen_after_eviction_and_close_returns_the_fd(
    tmp_path: Path,
) -> None:
    fs = RealFs()
    d = str(tmp_path / "seg")
    w = SegmentWriter(fs, d, 1)
    fr = encode_record(7, 1, 1000, None, None, b'"a"', None, durable=True, segment=True)
    w.append_many([fr], [1000], [fr[4]])
    w.flush()
    assert w.release() and not w.holds_files
    before = open_files.cap
    open_files.clear()
    set_max_open_segment_files(1)
    base = open_fds()
    try:
        srcs = [SegmentSource(fs, w.paths.data, sealed=False) for _ in range(5)]
        for s in srcs:
            buf, lo = s.span(0, len(fr))
            assert bytes(buf) == fr and lo == 0
        assert sum(s.is_open for s in srcs) == 1 and open_fds() == base + 1
        # The writer reopens on demand for the next append, then lets go again.
        fr2 = encode_record(7, 2, 1001, None, None, b'"b"', None, durable=True, segment=True)
        w.append_many([fr2], [1001], [fr2[4]])
        assert w.holds_files and not w.release()  # not flushed yet: keeps its files
        w.flush()
        assert w.release()
        buf, lo = srcs[0].span(len(fr), len(fr) + len(fr2))
        assert bytes(buf) == fr2 and lo == len(fr)
        for s in srcs:
            s.close()
        assert open_fds() == base
    finally:
        set_max_open_segment_files(before)
        w.close()


def test_the_cap_comes_from_topics_max_open_segment_files(monkeypatch: pytest.MonkeyPatch) -> None:
    from topics.storage import topicstore

    monkeypatch.delenv("TOPICS_MAX_OPEN_SEGMENT_FILES", raising=False)
    assert topicstore._cap_from_env() == DEFAULT_MAX_OPEN_SEGMENT_FILES == 256
    monkeypatch.setenv("TOPICS_MAX_OPEN_SEGMENT_FILES", "100")
    assert topicstore._cap_from_env() == 100
    monkeypatch.setenv("TOPICS_MAX_OPEN_SEGMENT_FILES", "0")
    assert topicstore._cap_from_env() == 1
    monkeypatch.setenv("TOPICS_MAX_OPEN_SEGMENT_FILES", "lots")
    assert topicstore._cap_from_env() == DEFAULT_MAX_OPEN_SEGMENT_FILES


if __name__ == "__main__":
    out = CHILDREN[sys.argv[1]](sys.argv[2], *(int(a) for a in sys.argv[3:]))
    print(json.dumps(out), flush=True)
