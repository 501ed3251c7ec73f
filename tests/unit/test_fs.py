"""RealFs: positional I/O, atomic replace + directory fsync, short-write looping."""

from __future__ import annotations

from pathlib import Path

import pytest

from topics.storage.fs import RealFs, write_all


def test_pwrite_pread_truncate_size(tmp_path: Path) -> None:
    fs = RealFs()
    p = str(tmp_path / "f.bin")
    f = fs.open(p, create=True, write=True)
    assert f.pwrite(b"hello world", 0) == 11
    f.pwrite(b"W", 6)
    f.fdatasync()
    assert f.pread(100, 0) == b"hello World" and f.size() == 11
    f.truncate(5)
    f.fsync()
    assert f.pread(100, 0) == b"hello"
    f.close()
    f.close()  # idempotent
    assert fs.open(p).pread(5, 0) == b"hello"


def test_replace_listdir_unlink(tmp_path: Path) -> None:
    fs = RealFs()
    d = str(tmp_path / "meta")
    fs.makedirs(d)
    fs.makedirs(d)
    tmp = f"{d}/snap.tmp"
    f = fs.open(tmp, create=True, write=True)
    write_all(f, b"x" * 10, 0)
    f.fdatasync()
    f.close()
    fs.replace(tmp, f"{d}/snap.bin")
    fs.fsync_dir(d)
    assert fs.listdir(d) == ["snap.bin"] and fs.exists(f"{d}/snap.bin")
    fs.unlink(f"{d}/snap.bin")
    assert fs.listdir(d) == []


class _Short:
    def __init__(self, step: int) -> None:
        self.buf = bytearray(32)
        self.step = step

    def pwrite(self, data: bytes, offset: int) -> int:
        n = min(self.step, len(data))
        self.buf[offset : offset + n] = data[:n]
        return n


def test_write_all_loops_over_short_writes() -> None:
    f = _Short(3)
    write_all(f, b"abcdefghij", 2)  # type: ignore[arg-type]
    assert bytes(f.buf[2:12]) == b"abcdefghij"
    with pytest.raises(OSError):
        write_all(_Short(0), b"abc", 0)  # type: ignore[arg-type]


def test_write_all_hands_over_views_of_the_buffer_never_a_copy() -> None:
    seen: list[object] = []

    class _Seen(_Short):
        def pwrite(self, data: bytes, offset: int) -> int:
            seen.append(data.obj if isinstance(data, memoryview) else data)
            return super().pwrite(data, offset)

    for buf in (b"abcdefghij", bytearray(b"abcdefghij")):
        seen.clear()
        f = _Seen(4)
        write_all(f, buf, 0)  # type: ignore[arg-type]
        assert bytes(f.buf[:10]) == b"abcdefghij"
        assert len(seen) == 3 and all(o is buf for o in seen)


def test_map_is_a_read_only_view_that_outlives_the_handle(tmp_path: Path) -> None:
    fs = RealFs()
    p = str(tmp_path / "seg.data")
    f = fs.open(p, create=True, write=True)
    assert f.map() is None  # an empty file cannot be mapped
    write_all(f, b"frames", 0)
    m = f.map()
    f.close()
    assert m is not None and m[:] == b"frames"
    with pytest.raises(TypeError):
        m[0] = 1  # read-only


def test_lock_is_exclusive_per_open_and_follows_the_path(tmp_path: Path) -> None:
    fs = RealFs()
    p = str(tmp_path / "lock")
    a = fs.open(p, create=True, write=True, exclusive=True)
    with pytest.raises(FileExistsError):
        fs.open(p, create=True, write=True, exclusive=True)
    b = fs.open(p, write=True)
    assert a.lock() and a.lock()  # taking it again is fine
    assert not b.lock()
    a.unlock()
    assert b.lock()
    b.close()  # closing releases it
    assert a.lock()
    a.close()
    stale = fs.open(p, write=True)
    fs.unlink(p)
    with pytest.raises(FileNotFoundError):
        stale.lock()  # the path no longer names this file: nothing is held
    stale.close()


def test_directories_mkdir_isdir_lexists_rmtree(tmp_path: Path) -> None:
    fs = RealFs()
    d = str(tmp_path / "d")
    fs.mkdir(d)
    with pytest.raises(FileExistsError):
        fs.mkdir(d)
    with pytest.raises(FileNotFoundError):
        fs.mkdir(str(tmp_path / "x" / "y"))
    fs.makedirs(f"{d}/a/b")
    fs.open(f"{d}/a/b/f", create=True, write=True).close()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    assert fs.isdir(d) and fs.isdir(str(tmp_path / "link"))
    assert not fs.isdir(f"{d}/a/b/f") and not fs.isdir(str(tmp_path / "nowhere"))
    assert fs.lexists(str(tmp_path / "dangling")) and not fs.exists(str(tmp_path / "dangling"))
    fs.rmtree(str(tmp_path / "link"))  # the link goes, not what it points at
    assert fs.exists(f"{d}/a/b/f")
    fs.rmtree(d)
    fs.rmtree(str(tmp_path / "dangling"))
    assert fs.listdir(str(tmp_path)) == []
    with pytest.raises(FileNotFoundError):
        fs.rmtree(d)
