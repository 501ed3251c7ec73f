"""The Spark source as a user meets it (docs/SPARK.md, "Which Python the workers run"
and "Options"): a plain `.venv/bin/python` script works without an activated venv,
and mistakes fail the query with a message that names them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import History

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCRIPT = """
import sys
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .getOrCreate()
)
n = spark.read.format("topics").option("path", sys.argv[1]).option("topics", "plain").load().count()
print("COUNT", n)
spark.stop()
"""


def test_a_plain_venv_python_script_needs_no_activation(history: History, tmp_path: Path) -> None:
    """Spark starts its Python workers with PYSPARK_PYTHON, else `python3` from PATH; with
    the venv not activated that is a Python without this package. The package's start-up
    hook points the workers at the interpreter running the script."""
    script = tmp_path / "count.py"
    script.write_text(SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # no .venv/bin: not activated
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    r = subprocess.run(
        [sys.executable, str(script), str(history.data_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"COUNT {len(history.diff['plain'])}" in r.stdout


def _fails(df: Any, match: str) -> None:
    with pytest.raises(Exception, match=match):
        df.load().count()


def test_mistakes_name_what_is_wrong(spark: Any, history: History, tmp_path: Path) -> None:
    path = str(history.data_dir)

    def r() -> Any:  # a fresh reader each time: a DataFrameReader keeps its options
        return spark.read.format("topics")

    _fails(
        r().option("path", str(tmp_path)).option("topics", "plain"), "not a topics data directory"
    )
    _fails(
        r().option("path", path).option("topics", "nope"), "topic nope is not in the data directory"
    )
    _fails(
        r().option("path", path).option("topics", "plain").option("startingOffsets", "earliest"),
        "startingOffsets is the Kafka source's; the topics source takes startingSeq",
    )
    _fails(
        r()
        .option("path", path)
        .option("topics", "plain")
        .option("startingSeq", "9")
        .option("endingSeq", "3"),
        "startingSeq=9 is past endingSeq=3",
    )
    _fails(
        r().option("path", path).option("topics", "plain").option("batchrow", "9"),
        "unknown option batchrow.*did you mean batchRows",
    )
