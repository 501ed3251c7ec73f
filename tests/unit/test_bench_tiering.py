"""Smoke test of bench/bench_tiering.py: one run at its smallest size, the shape of its JSON.

No number is asserted: performance is measured side by side, never here. The run starts a
real server, a moto S3 server and the script's latency proxy, all on 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiering_smallest_run(tmp_path: Path) -> None:
    pytest.importorskip("moto.server")
    out = tmp_path / "tiering.json"
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_tiering.py"),
            "--history-bytes",
            "2e7",
            "--seconds",
            "1",
            "--warmup",
            "0.5",
            "--slow-scan-seconds",
            "1",
            "--rate",
            "50",
            "--scanners",
            "1",
            "--json",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["verdict"] in ("PASS", "FAIL")
    assert set(line["relocation_mb_per_s"]) == {"local", "s3"}
    assert set(line["diff_records_per_s"]) == {"hot", "local", "s3", "s3_slow"}
    report = json.loads(out.read_text())
    assert report["history"]["segment_files"] >= 3
    for tier in ("local", "s3"):
        rel = report["relocation"][tier]
        assert rel["done"] and rel["failures"] == 0
        assert rel["relocated_segments"] == rel["expected_segments"] > 0
        assert (
            rel["hot_segments_left"]
            == report["history"]["segment_files"] - rel["expected_segments"]
        )
    diff = report["diff"]
    for tier in ("hot", "local", "s3"):
        assert diff[tier]["complete"] and diff[tier]["records"] == diff[tier]["head_seq"]
    assert diff["hot"]["cold_segments_read"] == 0
    for tier in ("local", "s3", "s3_slow"):
        assert diff[tier]["cold_segments_read"] > 0
    assert diff["s3_slow"]["store_requests"]["ranged_gets"] > 0
    inv = report["invariant"]
    for name in ("A", "B"):
        ph = inv["phases"][name]
        assert ph["writes"] > 0 and ph["write_errors"] == 0
        assert ph["sse_deliveries"] == ph["writes"]
        assert ph["scheduler_at_end"][0]["pressure"] is not None
    scan = inv["phases"]["B"]["scan"]
    assert scan["records"] > 0 and scan["errors"] == 0 and scan["cold_segments_read"] > 0
    assert inv["phases"]["B"]["store_requests"]["ranged_gets"] > 0
    assert set(inv["ratios"]) >= {"write_ack_p99", "sse_p99"}
