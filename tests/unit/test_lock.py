"""`topics.storage.lock.DataDirLock`: what it creates, refuses, and undoes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.support.fakedisk import FakeDisk

from topics.storage.fs import RealFile, RealFs
from topics.storage.lock import LOCK_NAME, DataDirError, DataDirLock, DataDirLocked


def test_creates_missing_dirs_and_discard_removes_only_them(tmp_path: Path) -> None:
    data = tmp_path / "a" / "b" / "data"
    lock = DataDirLock(str(data))
    assert lock.created_dirs == [str(tmp_path / "a"), str(data.parent), str(data)]
    assert lock.created_file
    assert (data / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    (data / "wal").mkdir()  # what recovery would have added
    (data / "wal" / "wal-0.log").write_bytes(b"\0" * 16)
    lock.discard()
    assert os.listdir(tmp_path) == []


def test_discard_keeps_what_existed_before(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "topics").mkdir(parents=True)
    (data / "topics" / "keep").write_text("old")
    (data / LOCK_NAME).write_text("12345\n")
    lock = DataDirLock(str(data))
    assert not lock.created_dirs and not lock.created_file
    (data / "meta").mkdir()
    (data / "topics" / "new-inside-old").write_text("x")  # inside an old entry: kept
    lock.discard()
    assert sorted(os.listdir(data)) == [LOCK_NAME, "topics"]
    assert (data / LOCK_NAME).read_text() == "12345\n"  # the old text is back
    assert sorted(os.listdir(data / "topics")) == ["keep", "new-inside-old"]


def test_release_keeps_the_lock_file_and_allows_a_new_lock(tmp_path: Path) -> None:
    lock = DataDirLock(str(tmp_path))
    with pytest.raises(
        DataDirLocked, match=rf"in use by another topics process \(pid {os.getpid()}\)"
    ):
        DataDirLock(str(tmp_path))  # flock is per open file: a second open conflicts
    lock.release()
    assert (tmp_path / LOCK_NAME).exists()
    again = DataDirLock(str(tmp_path))
    assert not again.created_file
    again.release()


def test_locked_dir_failure_leaves_nothing_new(tmp_path: Path) -> None:
    holder = DataDirLock(str(tmp_path / "d"))
    with pytest.raises(DataDirLocked):
        DataDirLock(str(tmp_path / "d"))
    assert (tmp_path / "d" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    holder.release()


class _RaceFile:
    """A RealFile whose first lock() lets a failed start discard the lock file first."""

    def __init__(self, inner: RealFile, race: list[DataDirLock]) -> None:
        self.inner = inner
        self.race = race

    def lock(self) -> bool:
        if self.race:
            self.race.pop().discard()  # the race: unlink + unlock between our open and lock
        return self.inner.lock()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class _RaceFs(RealFs):
    def __init__(self, race: list[DataDirLock]) -> None:
        self.race = race

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> RealFile:
        f = super().open(path, create=create, write=write, exclusive=exclusive)
        return _RaceFile(f, self.race)  # type: ignore[return-value]


def test_a_lock_on_an_unlinked_file_is_not_kept(tmp_path: Path) -> None:
    # A failed start unlinks the lock file it created while still holding it. A
    # start that opened that file just before must not keep a lock on the dead
    # inode (a third start would then lock a new file: two owners).
    race = [DataDirLock(str(tmp_path))]
    second = DataDirLock(str(tmp_path), fs=_RaceFs(race))
    assert not race, "the race was not triggered"
    assert second.created_file  # it retried and created a fresh lock file
    assert second.file is not None
    fd = second.file.inner.fd  # type: ignore[attr-defined]
    assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / LOCK_NAME))
    with pytest.raises(DataDirLocked):
        DataDirLock(str(tmp_path))
    second.release()


def test_the_lock_runs_on_any_fs() -> None:
    disk = FakeDisk()
    lock = DataDirLock("/srv/data", fs=disk)
    assert lock.created_dirs == ["/srv", "/srv/data"] and lock.created_file
    with pytest.raises(DataDirLocked, match=rf"\(pid {os.getpid()}\)"):
        DataDirLock("/srv/data", fs=disk)
    disk.makedirs("/srv/data/wal/0")
    lock.discard()
    assert disk.listdir("/") == []
    disk.makedirs("/f")
    disk.open("/f/file", create=True, write=True).close()
    with pytest.raises(DataDirError, match="exists and is not a directory"):
        DataDirLock("/f/file", fs=disk)
    with pytest.raises(DataDirError, match="/f/file is not a directory"):
        DataDirLock("/f/file/sub", fs=disk)


def test_unusable_paths_are_one_line_errors(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("not a dir")
    with pytest.raises(DataDirError, match="exists and is not a directory"):
        DataDirLock(str(f))
    with pytest.raises(DataDirError, match=f"{f} is not a directory"):
        DataDirLock(str(f / "sub" / "data"))
    assert os.listdir(tmp_path) == ["file"] and f.read_text() == "not a dir"
