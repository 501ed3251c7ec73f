"""`topics verify` / `topics dump` (topics.tools): output, exit codes, JSON, subprocess."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.unit.test_check import (
    TOPIC,
    DataDir,
    build_data_dir,
    flip,
    poke,
    wal_frames,
)

from topics import tools
from topics.storage.snapshot import snapshot_name

Capsys = pytest.CaptureFixture[str]


# -- verify ------------------------------------------------------------------------


def test_verify_clean_dir_exits_0_with_table(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path)
    assert tools.main_verify([str(dd.root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "WAL frames" in out and "segments" in out and "snapshots" in out
    assert "2 (2 valid)" in out and "10 (1 deleted)" in out
    assert out.rstrip().endswith("result: OK")


def torn_write(tmp_path: Path, appends: int = 10) -> tuple[DataDir, int]:
    """A data dir whose WAL ends on a write past the last SyncMark, never synced,
    with its last byte (in the checksum) wrong: a genuine torn tail at the returned offset."""
    dd = build_data_dir(tmp_path, appends=appends)
    path, end = dd.end()
    fr = wal_frames(TOPIC, 1)[1]
    poke(path, end, fr[:-1] + bytes([fr[-1] ^ 0x40]))
    return dd, end


def test_verify_torn_tail_is_fine(tmp_path: Path, capsys: Capsys) -> None:
    dd, end = torn_write(tmp_path)
    assert tools.main_verify([str(dd.root)]) == 0
    out = capsys.readouterr().out
    assert "INFO" in out and "torn_tail" in out and f"offset {end}" in out
    assert "checksum mismatch" in out and "CORRUPT" not in out
    assert "result: OK" in out


def test_verify_damaged_last_synced_frame_exits_1(tmp_path: Path, capsys: Capsys) -> None:
    # The same flip in the log's last frame, which was synced (a SyncMark follows): damage.
    dd = build_data_dir(tmp_path)
    off, size = dd.frame_offsets()[-1]
    marks = 0  # SyncMarks are not counted as frames at risk
    flip(dd.wal_file(), off + size - 1)
    assert tools.main_verify([str(dd.root)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "mid_log_damage" in out and f"[offset {off}]" in out
    assert f"{marks} valid frames follow" in out and "torn_tail" not in out
    assert "result: CORRUPT (1 corrupt problem)" in out


def test_verify_mid_log_damage_exits_1(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path)
    off, _ = dd.frame_offsets()[2]
    flip(dd.wal_file(), off + 20)
    assert tools.main_verify([str(dd.root)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "mid_log_damage" in out and "wal/wal-" in out
    assert "result: CORRUPT (1 corrupt problem)" in out


def test_verify_corrupt_sealed_segment_exits_1(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path)
    data, _ = dd.seg(TOPIC, 1)
    flip(data, 45)
    assert tools.main_verify([str(dd.root)]) == 1
    assert "segment_frame" in capsys.readouterr().out


def test_verify_json_report(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path)
    flip(dd.root / "meta" / snapshot_name(2), 22)
    assert tools.main_verify([str(dd.root), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is False and rep["valid_snapshots"] == 1
    assert [p["kind"] for p in rep["problems"]] == ["snapshot_invalid"]


def test_verify_usage_errors_exit_2(tmp_path: Path, capsys: Capsys) -> None:
    assert tools.main_verify([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert tools.main_verify([str(tmp_path / "file")]) == 2
    assert tools.main_verify([]) == 2
    assert tools.main_verify([str(tmp_path), "--bogus"]) == 2
    assert tools.main_verify(["--help"]) == 0


def test_verify_progress_bar_goes_to_stderr(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path)
    seen: list[tuple[int, int]] = []

    class Bar:
        def __init__(self, **kw: object) -> None:
            assert kw["file"] is sys.stderr
            self.total = kw["total"]
            self.n = 0

        def refresh(self) -> None:
            pass

        def update(self, k: int) -> None:
            self.n += k
            seen.append((self.n, int(self.total)))  # type: ignore[call-overload]

        def close(self) -> None:
            pass

    mp = pytest.MonkeyPatch()
    mp.setattr(tools, "tqdm", Bar)
    try:
        assert tools.main_verify([str(dd.root)]) == 0
    finally:
        mp.undo()
    assert seen[-1] == (6, 6)


# -- dump --------------------------------------------------------------------------


def test_dump_text_lists_frames_and_records(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path, appends=4)
    assert tools.main_dump([str(dd.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    wal = [ln for ln in out if ln.startswith("wal ")]
    assert len(wal) == 6
    assert "TopicCreate" in wal[0] and '"name":"t7"' in wal[0]
    assert "Append" in wal[1] and "seq=1" in wal[1] and 'data={"i":1,"pad":""}' in wal[1]
    assert "tag=tag-x" in wal[1] and "node=-" in wal[1]
    assert "node=node-a" in wal[2] and 'meta={"m":2}' in wal[2]
    assert "Delete" in wal[-1] and '"before_seq":2' in wal[-1]
    assert any(ln.startswith("# wal wal: 6 frames") for ln in out)
    seg = [ln for ln in out if ln.startswith("seg ")]
    assert len(seg) == 10
    assert any("seq=3 " in ln and "deleted" in ln for ln in seg)
    assert any('data={"s":8}' in ln for ln in seg)


def test_dump_json_is_line_delimited(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path, appends=4)
    assert tools.main_dump([str(dd.root), "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    frames = [r for r in rows if r["kind"] == "wal_frame"]
    assert [f["type"] for f in frames] == ["TopicCreate"] + ["Append"] * 4 + ["Delete"]
    assert frames[0]["body"] == {"name": "t7", "config": {}, "epoch": 1}
    assert frames[1]["data"] == {"i": 1, "pad": ""} and frames[1]["topic_id"] == f"{TOPIC:016x}"
    assert frames[2]["meta"] == {"m": 2} and frames[2]["node"] == "node-a"
    assert all(f["shard"] == "wal" and f["file"].startswith("wal-") for f in frames)
    ends = [r for r in rows if r["kind"] == "wal_end"]
    assert ends == [
        {
            "kind": "wal_end",
            "shard": "wal",
            "file": ends[0]["file"],
            "offset": ends[0]["offset"],
            "frames": 6,
            "torn": None,
            "damage": [],
        }
    ]
    recs = [r for r in rows if r["kind"] == "record"]
    assert len(recs) == 10
    deleted = [r for r in recs if r["deleted"]]
    assert [(r["topic_id"], r["seq"]) for r in deleted] == [(f"{TOPIC:016x}", 3)]
    assert deleted[0]["flags"] == 0xD5 and deleted[0]["data"] == {"s": 3}


def test_dump_filters(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path, shards=2, appends=2)
    assert tools.main_dump([str(dd.root), "--wal", "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert {r["kind"] for r in rows} == {"wal_frame", "wal_end"}
    assert {r["shard"] for r in rows} == {"shard-00", "shard-01"}
    assert tools.main_dump([str(dd.root), "--segments", "--topic", "9", "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r["topic_id"], r["seq"]) for r in rows] == [
        ("record", "0000000000000009", 1),
        ("record", "0000000000000009", 2),
    ]
    assert tools.main_dump([str(dd.root), "--wal", "--topic", "0x8", "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    frames = [r for r in rows if r["kind"] == "wal_frame"]
    assert frames and {r["topic_id"] for r in frames} == {"0000000000000008"}


def test_dump_shows_torn_end_and_bad_records(tmp_path: Path, capsys: Capsys) -> None:
    dd, off = torn_write(tmp_path, appends=3)
    data, _ = dd.seg(TOPIC, 1)
    flip(data, 45)
    assert tools.main_dump([str(dd.root), "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    end = next(r for r in rows if r["kind"] == "wal_end")
    # The log ends where the torn write began; its 5 frames (SyncMarks aside) are listed.
    assert end["torn"] == "checksum mismatch" and end["offset"] == off and end["frames"] == 5
    assert len([r for r in rows if r["kind"] == "wal_frame"]) == 5
    bad = [r for r in rows if r["kind"] == "record_error"]
    assert [r["seq"] for r in bad] == [1] and bad[0]["error"]
    assert tools.main_dump([str(dd.root)]) == 0
    assert "ERROR" in capsys.readouterr().out


def test_dump_usage_errors(tmp_path: Path, capsys: Capsys) -> None:
    assert tools.main_dump([str(tmp_path / "missing")]) == 2
    (tmp_path / "wal").mkdir()
    assert tools.main_dump([str(tmp_path), "--topic", "xyz"]) == 2
    assert "not a hex topic id" in capsys.readouterr().err


def test_dump_and_repair_refuse_a_directory_that_is_not_a_data_dir(
    tmp_path: Path, capsys: Capsys
) -> None:
    (tmp_path / "notes.txt").write_text("x")
    for argv in (["dump", str(tmp_path)], ["repair", str(tmp_path), "--dry-run"]):
        assert tools.main(argv) == 2
        assert "is not a topics data directory" in capsys.readouterr().err
    # Refused before the lock was taken: no `.topics.lock` makes it look like one.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# -- wiring ------------------------------------------------------------------------


def test_add_subcommands_and_run(tmp_path: Path, capsys: Capsys) -> None:
    dd = build_data_dir(tmp_path, appends=2)
    parser = argparse.ArgumentParser(prog="topics")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve")
    tools.add_subcommands(sub)
    args = parser.parse_args(["verify", str(dd.root), "--no-progress"])
    assert args.cmd == "verify" and tools.run(args) == 0
    args = parser.parse_args(["dump", str(dd.root), "--wal"])
    assert tools.run(args) == 0
    assert "TopicCreate" in capsys.readouterr().out
    assert tools.main(["verify", str(dd.root)]) == 0
    assert tools.main(["nope"]) == 2


def test_module_entry_point_exit_codes(tmp_path: Path) -> None:
    dd = build_data_dir(tmp_path)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "topics.tools", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = run("verify", str(dd.root))
    assert ok.returncode == 0, ok.stderr
    assert "result: OK" in ok.stdout
    off, _ = dd.frame_offsets()[1]
    flip(dd.wal_file(), off + 20)
    bad = run("verify", str(dd.root))
    assert bad.returncode == 1 and "mid_log_damage" in bad.stdout
    missing = run("verify", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert run("verify").returncode == 2
    dumped = run("dump", str(dd.root), "--json")
    assert dumped.returncode == 0
    assert all(json.loads(ln)["kind"] for ln in dumped.stdout.splitlines())
