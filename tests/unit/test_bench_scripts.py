"""Smoke tests of bench/bench_invariant.py, compare_revs.py, bench_peers.py and bench_spark.py.

The unit tests check the scripts' own logic (which metric is worse, pooling, page-cache
helpers). The e2e ones run each script once at its smallest size and check the shape of
what it writes: no number is asserted, performance is measured side by side, never here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import bench_invariant  # noqa: E402
import bench_peers  # noqa: E402
import bench_spark  # noqa: E402
import compare_revs  # noqa: E402


def _run(phase: str, **fields: object) -> dict[str, object]:
    return {phase: fields}


def test_compare_flags_only_what_got_worse_by_more_than_the_threshold() -> None:
    before = {
        "write_ack": [_run("write_ack", p50_us=100.0, p99_us=200.0)],
        "batched": [_run("batched", records_per_s=100_000, req_p99_ms=10.0)],
    }
    after = {
        "write_ack": [_run("write_ack", p50_us=104.0, p99_us=230.0)],
        "batched": [_run("batched", records_per_s=94_000, req_p99_ms=9.0)],
    }
    rows = compare_revs.compare(["write_ack", "batched"], before, after, 0.05)
    got = {r["metric"]: (r["ratio"], r["slower"]) for r in rows}
    assert got == {
        "p50 µs": (1.04, False),
        "p99 µs": (1.15, True),
        "records/s": (0.94, True),  # 6% less throughput
        "request p99 ms": (0.9, False),
    }


def test_compare_takes_medians_and_expands_every_level() -> None:
    def diff(n: int) -> dict[str, object]:
        return {"diff": {"1": {"records_per_s": n}, "1000": {"records_per_s": 10 * n}}}

    before = {"diff": [diff(10), diff(30), diff(20)]}
    after = {"diff": [diff(20), diff(20), diff(40)]}
    rows = compare_revs.compare(["diff"], before, after, 0.05)
    assert [(r["metric"], r["before"], r["after"]) for r in rows] == [
        ("limit 1 records/s", 20, 20),
        ("limit 1000 records/s", 200, 200),
    ]
    assert not any(r["slower"] for r in rows)
    missing = compare_revs.compare(["sse"], {"sse": []}, {"sse": []}, 0.05)
    assert missing == []


def test_compare_refuses_options_it_sets_itself(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH / "compare_revs.py"), "--before", "HEAD", "--", "--repeat", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "--repeat" in r.stderr


def test_invariant_helpers(tmp_path: Path) -> None:
    f = tmp_path / "seg-0000000000000001.data"
    f.write_bytes(b"x" * 100_000)
    (tmp_path / "seg-0000000000000001.idx").write_bytes(b"i" * 40)
    (tmp_path / "other.log").write_bytes(b"z")
    paths = bench_invariant.segment_files(tmp_path, tmp_path)
    assert [p.name for p in paths] == [
        "seg-0000000000000001.data",
        "seg-0000000000000001.idx",
    ]
    assert bench_invariant.warm_files(paths) == 100_040
    resident, total = bench_invariant.resident_bytes(paths)
    assert total == 100_040 and 0 < resident <= total
    assert bench_invariant.fadvise_dontneed(paths) == 2  # eviction itself is the kernel's call
    assert bench_invariant.ms([1_000_000, 2_000_000, 3_500_000])["max"] == 3.5
    assert bench_invariant.ratio(3.0, 2.0) == 1.5 and bench_invariant.ratio(1.0, 0.0) is None


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_invariant_smallest_run(tmp_path: Path) -> None:
    out = tmp_path / "inv.json"
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_invariant.py"),
            "--history-bytes",
            "2e7",
            "--seconds",
            "1",
            "--warmup",
            "0.5",
            "--rate",
            "50",
            "--scanners",
            "1",
            "--warm",
            "--no-drop-caches",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["verdict"] in ("PASS", "FAIL")
    report = json.loads(out.read_text())
    assert report["history_segments"]["segment_files"] >= 1
    assert report["after_restart"]["history_head_seq"] >= 19_000
    for name in ("A", "B", "W"):
        ph = report["phases"][name]
        assert ph["writes"] > 0 and ph["write_errors"] == 0
        assert ph["sse_deliveries"] == ph["writes"]
    assert report["phases"]["B"]["scan"]["records"] > 0
    assert report["phases"]["B"]["scan"]["errors"] == 0


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_overload_smallest_run(tmp_path: Path) -> None:
    out = tmp_path / "overload.json"
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_overload.py"),
            "--cold-topics",
            "4",
            "--cold-conns",
            "2",
            "--hot-watchers",
            "2",
            "--seconds",
            "1",
            "--warmup",
            "0.3",
            "--settle",
            "0.5",
            "--rate",
            "50",
            "--stalled",
            "2",
            "--json",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [(x["mode"], x["stalled"]) for x in report["runs"]] == [
        ("priority", 0),
        ("fifo", 0),
        ("priority", 2),
    ]
    for run in report["runs"]:
        assert run["hot_ms"]["n"] >= 2 * run["hot_acked"] > 0  # every watcher got every record
        assert run["lost"] == 0 and run["disordered"] == 0
        assert run["scheduler"]["mode"] == run["mode"]
    assert set(report["ratios"]) == {
        "hot_p99_fifo_over_priority",
        "hot_p99_stalled_over_unstalled",
    }


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compare_revs_smallest_run(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    out = tmp_path / "cmp.json"
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH / "compare_revs.py"),
            "--before",
            "HEAD",
            "--after",
            str(ROOT),
            "--rounds",
            "1",
            "--only",
            "write_ack",
            "--json",
            str(out),
            "--",
            "--quick",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["trees"]["before"]["exported"] and not report["trees"]["after"]["exported"]
    assert report["trees"]["before"]["imports"].startswith(report["trees"]["before"]["path"])
    assert [row["metric"] for row in report["rows"]] == ["p50 µs", "p99 µs"]
    assert all(row["before"] and row["after"] for row in report["rows"])


def test_peers_nats_parser_frames_across_chunks() -> None:
    wire = (
        b'INFO {"server_id":"x"}\r\nMSG _INBOX.0 1  27\r\n{"stream":"BENCH", "seq":1}\r\n'
        b"PING\r\nMSG bench.a 1 $JS.ACK.BENCH.cu.1.2.2.9.0 5\r\nhe\r\no\r\n"
        b"HMSG _INBOX.0 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    )
    for cut in range(1, len(wire)):  # every split point gives the same messages
        p = bench_peers.NatsParser()
        msgs = p.feed(wire[:cut]) + p.feed(wire[cut:])
        assert [(op, payload) for op, _, payload in msgs] == [
            (b"INFO", b""),
            (b"MSG", b'{"stream":"BENCH", "seq":1}'),
            (b"PING", b""),
            (b"MSG", b"he\r\no"),
            (b"HMSG", b"NATS/1.0 503\r\n\r\n"),
        ]
    assert bench_peers.nats_error(msgs[1]) is None
    assert bench_peers.nats_error(msgs[4]) == "NATS/1.0 503"
    assert bench_peers.nats_error((b"MSG", [], b'{"error":{"code":503}}'))


def test_peers_ws_parser_and_resp() -> None:
    big = b"x" * 300
    wire = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
        + bytes([0x81, 5])
        + b"hello"
        + bytes([0x01, 2])  # a text message in two fragments
        + b"ab"
        + bytes([0x80, 1])
        + b"c"
        + bytes([0x81, 126])
        + len(big).to_bytes(2, "big")
        + big
    )
    for cut in (1, 40, 70, 72, len(wire) - 1):
        p = bench_peers.WSParser()
        assert p.feed(wire[:cut]) + p.feed(wire[cut:]) == [b"hello", b"abc", big]
    frame = bench_peers.ws_frame(b"hi")
    assert frame[0] == 0x81 and frame[1] == 0x82
    assert bytes(b ^ frame[2 + (i & 3)] for i, b in enumerate(frame[6:])) == b"hi"
    assert bench_peers.resp(b"XLEN", b"k") == b"*2\r\n$4\r\nXLEN\r\n$1\r\nk\r\n"
    assert len(bench_peers.REC) == len(bench_peers.live_record(12345)) == 100


def test_peers_table_medians_and_ratios() -> None:
    def run(system: str, rps: int) -> dict[str, object]:
        return {"workload": "ingest", "class": "fast", "system": system, "records_per_s": rps}

    runs = [run("topics", 100), run("topics", 300), run("topics", 200), run("redis", 400)]
    runs.append({"workload": "ingest", "class": "fast", "system": "nats", "error": "boom"})
    text = bench_peers.table(runs, (1,))
    line = next(x for x in text.splitlines() if "records/s" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:8] == ["**200** (100 / 300 / 200)", "400", "", "0.50", ""]
    assert "durable" not in text  # rows nobody ran are left out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_peers_quick_topics_alone(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    r = subprocess.run(
        [sys.executable, str(BENCH / "bench_peers.py"), "--quick", "--peers", "none"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| ingest | durable | records/s |" in r.stdout
    report = json.loads(out.read_text())
    assert report["params"]["peers"] == {
        "redis": "not selected (--peers)",
        "nats": "not selected (--peers)",
    }
    runs = report["runs"]
    assert {r["system"] for r in runs} == {"topics"}
    failed = [(run["workload"], run["class"], run["error"]) for run in runs if "error" in run]
    assert not failed, (failed, r.stderr[-3000:])
    done = {(r["workload"], r["class"]) for r in runs}
    assert done == {
        ("ingest", "durable"),
        ("ingest", "fast"),
        ("ack", "durable"),
        ("ack", "fast"),
        ("live", "durable"),
        ("live", "fast"),
        ("catchup", "fast"),
        ("restart", "fast"),
    }
    for r in runs:
        if r["workload"] == "ingest":
            assert r["records"] > 0 and r["stored_after"] >= r["records"] and r["errors"] == 0
        if r["workload"] == "live":
            assert set(r["levels"]) == {"sse_1", "ws_1", "sse_10", "ws_10"}
            assert all(v["delivered"] == v["expected"] for v in r["levels"].values())
        if r["workload"] == "catchup":
            assert r["records"] == report["params"]["sizes"]["history"]
        if r["workload"] == "restart":
            assert r["restart_s"] > 0


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(420)
def test_bench_spark_smallest_run(tmp_path: Path) -> None:
    """Two JVM presets (two child sessions), every read, both consumers, warm and cold."""
    pytest.importorskip("pyspark")
    from topics.spark.jvm import jar_path
    from topics.spark.session import FAST_JVM_OPTIONS

    if jar_path() is None:
        pytest.skip("the JVM reader's jar is not built (python spark-jvm/build_jar.py)")
    out = tmp_path / "spark.json"
    r = subprocess.run(
        [sys.executable, str(BENCH / "bench_spark.py"), "--records", "20000", "--repeat", "1"]
        + ["--segment-events", "10000", "--skip-stream", "--jvm-flags", "session", "default"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| consumer | cache | parquet | jvm | python | ceiling |" in r.stdout
    assert "| preset | JVM options | session start s |" in r.stdout
    report = json.loads(out.read_text())
    bulk = report["bulk"]
    assert bulk["records"] == 20000 and bulk["segments"] == 2
    assert set(bulk["reads"]) == set(report["sessions"]) == {"session", "default"}
    for by_consumer in bulk["reads"].values():
        assert set(by_consumer) == {"noop", "hash"}
        for by_cache in by_consumer.values():
            assert set(by_cache) == {"warm", "cold"}
            for cache, res in by_cache.items():
                for read in ("parquet", "jvm", "python", "ceiling"):
                    assert res[read]["best_rows_s"] > 0 and res[read]["median_rows_s"] > 0
                    assert len(res[read]["seconds"]) == 1
                assert set(res["ratios"]) == {"jvm_parquet", "python_parquet"}
                assert all(v > 0 for q in res["ratios"].values() for v in q.values())
                if cache == "cold":
                    assert 0 <= res["resident_after_max"] <= 1
    # Each preset's flags reached its JVM: local_session's own, and none for "default".
    sessions = report["sessions"]
    assert all(s["session_start_s"] > 0 for s in sessions.values())
    assert set(FAST_JVM_OPTIONS.split()) <= set(sessions["session"]["jvm_args"])
    assert not set(bench_spark.PRESETS["c1"].split()) & set(sessions["default"]["jvm_args"])
    rows = {row["preset"]: row for row in report["jvm_presets"]}
    assert set(rows) == {"session", "default"}
    for row in rows.values():
        assert row["jvm_warm_noop_rows_s"] > 0 and row["parquet_warm_noop_rows_s"] > 0
        assert row["jvm_parquet_warm_noop"] > 0
