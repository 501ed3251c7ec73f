"""`topics spark-export DATA_DIR --to parquet OUT`, read back with Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import History
from tests.spark.support import copy_tree, corrupt_data, diff_rows, spark_rows
from topics.spark.segments import load_offline

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topics", "spark-export", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_export_to_parquet_equals_the_engine_diff(
    spark: Any, history: History, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = _export(
        str(history.data_dir), "--to", "parquet", str(out), "--cold-dir", str(history.cold_dir)
    )
    assert r.returncode == 0, r.stderr
    want: set[Any] = set()
    for t, recs in history.diff.items():
        want |= diff_rows(t, recs)
    assert f"exported {len(want)} records of 4 topic(s)" in r.stdout
    assert "export" in r.stderr and "rec" in r.stderr  # the progress bar
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"topic-{name.replace(':', '~')}.parquet" for name in load_offline(str(history.data_dir))
    )
    got = spark_rows(spark.read.parquet(str(out)))
    assert len(got) == len(want) and set(got) == want

    # A non-empty OUT is refused (exit 2) and left alone.
    before = sorted(p.read_bytes() for p in out.iterdir())
    r = _export(str(history.data_dir), "--to", "parquet", str(out), "--no-progress")
    assert r.returncode == 2 and "not empty" in r.stderr
    assert sorted(p.read_bytes() for p in out.iterdir()) == before


def test_export_of_a_corrupt_segment_fails_and_leaves_no_file(
    history: History, tmp_path: Path
) -> None:
    d = copy_tree(history.data_dir.parent, tmp_path / "h")
    seg = load_offline(str(d / "data"))["plain"].cat.segments[0]
    corrupt_data(Path(seg.data_path))
    out = tmp_path / "out"
    r = _export(str(d / "data"), "--to", "parquet", str(out), "--topics", "plain", "--no-progress")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "corrupt segment" in r.stderr
    assert list(out.iterdir()) == []
