"""`topics verify` / `topics dump` with the cold tier in an object store (`--cold-dir s3://...`).

The data dir is test_check's (topic 7: sealed segment 1..5 with seq 3 deleted,
active segment 6..8; topic 9: segment 1..2). Topic 7's sealed segment is moved
to the cold tier: into a local cold dir for the reference run, into a moto S3
server (one for the module) for the run under test, and its hot copy removed.
The newest snapshot lists the segments it relies on, the cold one included, so
a cold object that goes missing is damage to a relied-on segment.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.s3 import moto_s3
from tests.unit.test_check import TOPIC, build_data_dir, flip

from topics import tools
from topics.storage.check import check
from topics.storage.fs import RealFs
from topics.storage.objstore import ColdStoreError, cold_root
from topics.storage.segment import segment_paths, topic_dir
from topics.storage.segstore import SegmentPart
from topics.storage.snapshot import write_snapshot

Capsys = pytest.CaptureFixture[str]
BUCKET = "verify-bucket"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    with moto_s3(BUCKET) as endpoint:
        yield endpoint


_prefix = iter(range(1 << 30))


def archive(tmp_path: Path, *, damage: int | None = None) -> tuple[Path, Path, str]:
    """(data dir, local cold dir, s3 url): topic 7's segment 1 in the cold tier only,
    the same bytes in both cold tiers; `damage` flips that `.data` byte in both."""
    dd = build_data_dir(tmp_path)
    data, idx = dd.seg(TOPIC, 1)
    cold = tmp_path / "cold"
    cold_paths = segment_paths(topic_dir(str(cold), TOPIC), 1)
    Path(cold_paths.data).parent.mkdir(parents=True)
    shutil.move(data, cold_paths.data)
    shutil.move(idx, cold_paths.idx)
    if damage is not None:
        flip(Path(cold_paths.data), damage)
    # The newest snapshot relies on segment 1 in the cold tier and 6 in the hot one.
    topic = {"id": TOPIC, "name": "t7", "head": 8, "segs": [[6, 3]], "cold": [[1, 5]]}
    write_snapshot(RealFs(), str(dd.root / "meta"), 3, {"next_topic_id": 11, "topics": [topic]})
    url = f"s3://{BUCKET}/arch-{next(_prefix)}"
    cold_root(url).store(TOPIC).put(
        1, Path(cold_paths.data).read_bytes(), Path(cold_paths.idx).read_bytes()
    )
    return dd.root, cold, url


def verify_json(capsys: Capsys, data: Path, cold: str) -> tuple[int, dict[str, Any]]:
    code = tools.main_verify([str(data), "--cold-dir", cold, "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def _same_but_root(report: dict[str, Any], root: str) -> dict[str, Any]:
    """`report` with `root` in problem paths written as `<cold>`."""
    out = dict(report, data_dir="")
    out["problems"] = [dict(p, path=p["path"].replace(root, "<cold>")) for p in report["problems"]]
    return out


def test_verify_a_clean_object_store_cold_tier(s3: str, tmp_path: Path, capsys: Capsys) -> None:
    data, cold, url = archive(tmp_path)
    code, got = verify_json(capsys, data, url)
    assert code == 0 and got["ok"] and got["problems"] == [], got["problems"]
    # The cold segment was checked: 3 segments, 10 records, the deleted one among them.
    assert (got["segments"], got["records"], got["deleted_records"]) == (3, 10, 1)
    code, local = verify_json(capsys, data, str(cold))
    assert code == 0 and _same_but_root(local, str(cold)) == _same_but_root(got, url)
    # Without the cold tier the snapshot's cold segment is in neither tier.
    assert tools.main_verify([str(data), "--json", "--no-progress"]) == 1
    assert "neither tier" in capsys.readouterr().out
    # The table output, as for a local cold dir.
    assert tools.main_verify([str(data), "--cold-dir", url + "/", "--no-progress"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("result: OK")


def test_verify_reports_a_damaged_cold_object(s3: str, tmp_path: Path, capsys: Capsys) -> None:
    data, cold, url = archive(tmp_path, damage=60)  # inside the second frame
    code, got = verify_json(capsys, data, url)
    assert code == 1 and not got["ok"]
    bad = [p for p in got["problems"] if p["severity"] == "corrupt"]
    assert bad and all(p["path"].startswith(url + "/topics/") for p in bad), bad
    assert {p["kind"] for p in bad} <= {"segment_frame", "idx_mismatch", "segment_payload"}
    assert bad[0]["seq"] == 2
    # Exactly what the same damage in a local cold dir gives.
    code, local = verify_json(capsys, data, str(cold))
    assert code == 1 and _same_but_root(local, str(cold)) == _same_but_root(got, url)
    assert tools.main_verify([str(data), "--cold-dir", url, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"{url}/topics/{TOPIC:016x}/seg-0000000000000001.data" in out
    assert "result: CORRUPT" in out


def test_verify_reports_a_missing_cold_object(s3: str, tmp_path: Path, capsys: Capsys) -> None:
    data, _cold, url = archive(tmp_path)
    st = cold_root(url).store(TOPIC)
    cold_root(url).fs.unlink(st.path(1, SegmentPart.DATA))  # .idx left without its .data
    code, got = verify_json(capsys, data, url)
    assert code == 1
    kinds = {(p["kind"], p["severity"]) for p in got["problems"]}
    assert ("segment_stray", "warning") in kinds and ("segment_damage", "corrupt") in kinds
    damage = next(p for p in got["problems"] if p["kind"] == "segment_damage")
    assert "cold tier is in neither tier" in damage["detail"] and damage["seq"] == 1


def test_verify_a_store_that_cannot_be_read_is_not_damage(
    s3: str, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, _cold, _url = archive(tmp_path)
    assert tools.main_verify([str(data), "--cold-dir", "s3://no-such-bucket/x"]) == 2
    err = capsys.readouterr().err
    assert "cannot read the cold tier s3://no-such-bucket/x" in err and "500" in err
    assert tools.main_verify([str(data), "--cold-dir", "s3:///x"]) == 2
    assert "no bucket" in capsys.readouterr().err
    assert tools.main_verify([str(data), "--cold-dir", "gs://b/x"]) == 2
    assert "s3://bucket/prefix" in capsys.readouterr().err
    # A failure in the middle of the check (after the first LIST worked) too.
    monkeypatch.setattr(tools, "_cold_dir_error", lambda *a, **k: None)
    assert tools.main_verify([str(data), "--cold-dir", "s3://no-such-bucket/x"]) == 2
    assert "cannot check the cold tier" in capsys.readouterr().err
    with pytest.raises(ColdStoreError):
        check(RealFs(), str(data), cold_dir="s3://no-such-bucket/x")


def test_dump_includes_the_object_store_cold_tier(s3: str, tmp_path: Path, capsys: Capsys) -> None:
    data, cold, url = archive(tmp_path)
    assert tools.main_dump([str(data), "--segments", "--cold-dir", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    cold_lines = [ln for ln in lines if ln.startswith("cold ")]
    assert [ln.split()[1:3] for ln in cold_lines] == [[f"{TOPIC:016x}", "seg-0000000000000001"]] * 5
    assert any("seq=3 " in ln and "deleted" in ln for ln in cold_lines)
    assert len([ln for ln in lines if ln.startswith("seg ")]) == 5  # 6..8 of 7, 1..2 of 9
    assert tools.main_dump([str(data), "--segments", "--json", "--cold-dir", url]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["tier"], r["seq"]) for r in rows if r["topic_id"] == f"{TOPIC:016x}"] == [
        ("hot", 6),
        ("hot", 7),
        ("hot", 8),
        *[("cold", s) for s in range(1, 6)],
    ]
    # The same records as from the local cold dir.
    assert tools.main_dump([str(data), "--segments", "--json", "--cold-dir", str(cold)]) == 0
    local = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert local == rows
    assert tools.main_dump([str(data), "--cold-dir", "s3://no-such-bucket/x"]) == 2
