"""The offline tools' topic names: `topics dump --topic NAME` and
`topics spark-export --file-names name`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.support import run
from tests.support.process import ServerProcess
from topics.client import Client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A stopped server's data dir: `orders` (deleted and created again), `a:b`, `abc`."""
    tmp = tmp_path_factory.mktemp("tools")
    s = ServerProcess(tmp)
    try:
        with Client(s.base) as c:
            c.append("orders", ["first life"])
            c.delete_topic("orders")
            c.append("orders", ["second life", "more"])
            c.append("a:b", [{"x": 1}])
            c.append("abc", ["hex-looking name"])
    finally:
        assert s.stop() == 0, s.log_text()
    yield tmp / "data"


def _records(stdout: str) -> list[tuple[str, object]]:
    out = []
    for line in stdout.splitlines():
        obj = json.loads(line)
        if obj["kind"] == "record":
            out.append((obj["topic_id"], obj["data"]))
    return out


def test_dump_topic_by_name_covers_every_instance(data_dir: Path) -> None:
    p = run("dump", str(data_dir), "--topic", "orders", "--json")
    assert p.returncode == 0, p.stderr
    wal = [json.loads(x) for x in p.stdout.splitlines() if '"wal_frame"' in x]
    datas = [f.get("data") for f in wal if f["type"] == "Append"]
    assert datas == ["first life", "second life", "more"]
    assert len({f["topic_id"] for f in wal}) == 2  # deleted and created again: two ids


def test_dump_name_wins_over_hex_and_0x_is_an_id(data_dir: Path) -> None:
    by_name = run("dump", str(data_dir), "--topic", "abc", "--segments", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert [d for _t, d in _records(by_name.stdout)] == ["hex-looking name"]
    tid = _records(by_name.stdout)[0][0]
    by_id = run("dump", str(data_dir), "--topic", "0x" + tid.lstrip("0"), "--segments", "--json")
    assert _records(by_id.stdout) == _records(by_name.stdout)
    colon = run("dump", str(data_dir), "--topic", "a:b", "--segments", "--json")
    assert [d for _t, d in _records(colon.stdout)] == [{"x": 1}]


def test_dump_unknown_topic_is_a_usage_error(data_dir: Path) -> None:
    p = run("dump", str(data_dir), "--topic", "nope")
    assert p.returncode == 2
    assert p.stderr == (
        f"topics: --topic 'nope': no topic of that name in {data_dir}, and not a hex topic id\n"
    )


def test_spark_export_file_names(data_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    by_id = run(
        "spark-export",
        str(data_dir),
        "--to",
        "parquet",
        str(tmp_path / "ids"),
        "--file-names",
        "id",
        "--no-progress",
    )
    assert by_id.returncode == 0, by_id.stderr
    assert all(p.name[6:-8].isalnum() and len(p.name) == 30 for p in (tmp_path / "ids").iterdir())
    p = run(
        "spark-export",
        str(data_dir),
        "--to",
        "parquet",
        str(tmp_path / "names"),
        "--no-progress",
    )
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in (tmp_path / "names").iterdir()) == [
        "topic-abc.parquet",
        "topic-a~b.parquet",
        "topic-orders.parquet",
    ]
