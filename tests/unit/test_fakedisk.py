"""Test the tester: FakeDisk, FaultFs, MonitorFs and crash_points.

The doubles decide what survives a crash in every reliability test, so their
semantics are pinned here, and the live view is checked against the real OS
(`RealFs` on `tmp_path`) so the double cannot drift from POSIX.
"""

from __future__ import annotations

import errno
import posixpath
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.fakedisk import (
    SECTOR,
    FakeDisk,
    FaultFs,
    FaultRule,
    MonitorFs,
    crash_points,
)

from topics.storage.fs import Fs, RealFs, write_all

# ----------------------------------------------------------------- helpers


def put(fs: Fs, path: str, data: bytes, *, sync: bool = True) -> None:
    """Create/overwrite `path` with `data` (fdatasync'ed when `sync`)."""
    f = fs.open(path, create=True, write=True)
    f.truncate(0)
    write_all(f, data, 0)
    if sync:
        f.fdatasync()
    f.close()


def read(fs: Fs, path: str) -> bytes:
    f = fs.open(path)
    try:
        return f.pread(f.size(), 0)
    finally:
        f.close()


def durable_disk(files: dict[str, bytes]) -> FakeDisk:
    """A disk where `files` (and their directories) are fully durable."""
    disk = FakeDisk()
    for path, data in files.items():
        disk.makedirs(posixpath.dirname(path))
        put(disk, path, data)
        disk.fsync_dir(posixpath.dirname(path))
    return disk


def crash_recover(disk: FakeDisk, mode: str = "drop_all", **kw: object) -> dict[str, bytes]:
    disk.crash(mode, **kw)  # type: ignore[arg-type]
    disk.recover()
    disk.check_invariants()
    return disk.snapshot_durable()


# ---------------------------------------------------- FakeDisk: live view


def test_missing_paths_raise_like_the_os() -> None:
    disk = FakeDisk()
    with pytest.raises(FileNotFoundError):
        disk.open("/nope")
    with pytest.raises(FileNotFoundError):
        disk.open("/no/dir/f", create=True, write=True)
    with pytest.raises(FileNotFoundError):
        disk.listdir("/nope")
    with pytest.raises(FileNotFoundError):
        disk.fsync_dir("/nope")
    with pytest.raises(FileNotFoundError):
        disk.unlink("/nope")
    with pytest.raises(FileNotFoundError):
        disk.replace("/nope", "/x")
    with pytest.raises(FileNotFoundError):
        disk.open("")
    disk.makedirs("/d")
    disk.makedirs("/d")  # idempotent
    put(disk, "/d/f", b"x")
    with pytest.raises(NotADirectoryError):
        disk.listdir("/d/f")
    with pytest.raises(NotADirectoryError):
        disk.open("/d/f/g", create=True)
    with pytest.raises(NotADirectoryError):
        disk.makedirs("/d/f/g")
    with pytest.raises(FileExistsError):
        disk.makedirs("/d/f")
    with pytest.raises(IsADirectoryError):
        disk.open("/d")
    with pytest.raises(IsADirectoryError):
        disk.unlink("/d")
    disk.makedirs("/e")
    with pytest.raises(IsADirectoryError):
        disk.replace("/d/f", "/e")
    assert disk.exists("/d") and disk.exists("/d/f") and disk.exists("/")
    assert not disk.exists("/d/f/g") and not disk.exists("/zz")
    assert disk.listdir("/") == ["d", "e"] and disk.listdir("/d") == ["f"]


def test_directories_exclusive_create_map_and_lock() -> None:
    disk = FakeDisk()
    disk.mkdir("/d")
    with pytest.raises(FileExistsError):
        disk.mkdir("/d")
    with pytest.raises(FileNotFoundError):
        disk.mkdir("/x/y")
    disk.makedirs("/d/a/b")
    put(disk, "/d/a/b/f", b"x")
    assert disk.isdir("/d/a") and not disk.isdir("/d/a/b/f") and not disk.isdir("/zz")
    assert disk.lexists("/d/a/b/f") and not disk.lexists("/zz")
    a = disk.open("/d/lock", create=True, write=True, exclusive=True)
    with pytest.raises(FileExistsError):
        disk.open("/d/lock", create=True, write=True, exclusive=True)
    assert a.map() is None  # no descriptor to map: readers use pread
    b = disk.open("/d/lock", write=True)
    assert a.lock() and not b.lock()
    a.close()  # closing releases the lock
    assert b.lock()
    b.unlock()
    disk.unlink("/d/lock")
    with pytest.raises(FileNotFoundError):
        b.lock()  # the name is gone: the lock would guard nothing
    disk.rmtree("/d")
    assert disk.listdir("/") == []
    with pytest.raises(FileNotFoundError):
        disk.rmtree("/d")


def test_positional_io_holes_truncate_and_modes() -> None:
    disk = FakeDisk()
    f = disk.open("/f", create=True, write=True)
    assert f.pwrite(b"abc", 5) == 3
    assert f.size() == 8 and f.pread(100, 0) == b"\0" * 5 + b"abc"
    f.truncate(2)
    assert f.pread(100, 0) == b"\0\0"
    f.truncate(4)
    assert f.pread(100, 0) == b"\0" * 4 and f.pread(10, 100) == b""
    with pytest.raises(OSError) as ei:
        f.pread(1, -1)
    assert ei.value.errno == errno.EINVAL
    ro = disk.open("/f")
    with pytest.raises(OSError) as ei:
        ro.pwrite(b"x", 0)
    assert ei.value.errno == errno.EBADF
    with pytest.raises(OSError) as ei:
        ro.truncate(0)
    assert ei.value.errno == errno.EINVAL
    ro.fsync()  # allowed on a read-only descriptor, as on Linux
    f.close()
    f.close()  # idempotent
    with pytest.raises(OSError) as ei:
        f.pread(1, 0)
    assert ei.value.errno == errno.EBADF


def test_paths_are_normalised() -> None:
    disk = FakeDisk()
    disk.makedirs("d/sub")
    put(disk, "/d//sub/./f", b"1")
    assert read(disk, "/d/sub/../sub/f") == b"1"
    assert read(disk, "d/sub/f") == b"1"
    assert disk.listdir("/d/") == ["sub"]


def test_handles_keep_their_inode_across_unlink_and_replace() -> None:
    disk = FakeDisk()
    put(disk, "/a", b"old")
    h = disk.open("/a", write=True)
    put(disk, "/a.tmp", b"new")
    disk.replace("/a.tmp", "/a")
    assert h.pread(10, 0) == b"old" and read(disk, "/a") == b"new"
    disk.unlink("/a")
    h.pwrite(b"O", 0)
    assert h.pread(10, 0) == b"Old" and disk.listdir("/") == []


# ---------------------------------------------- FakeDisk: bytes vs names


@pytest.mark.parametrize("sync", ["fdatasync", "fsync"])
def test_synced_bytes_survive_unsynced_bytes_are_lost(sync: str) -> None:
    disk = durable_disk({"/d/f": b""})
    f = disk.open("/d/f", write=True)
    f.pwrite(b"durable", 0)
    getattr(f, sync)()
    f.pwrite(b"-lost", 7)
    f.truncate(3)  # pending truncate: lost too
    assert read(disk, "/d/f") == b"dur"
    assert disk.snapshot_durable() == {"/d/f": b"durable"}
    assert crash_recover(disk) == {"/d/f": b"durable"}
    assert read(disk, "/d/f") == b"durable"


def test_new_name_needs_dir_fsync_even_if_file_is_synced() -> None:
    disk = durable_disk({"/d/keep": b"k"})
    put(disk, "/d/new", b"data")  # fdatasync'ed, but the entry is not durable
    assert disk.snapshot_live() == {"/d/keep": b"k", "/d/new": b"data"}
    assert crash_recover(disk) == {"/d/keep": b"k"}
    put(disk, "/d/new", b"data")
    disk.fsync_dir("/d")
    assert crash_recover(disk) == {"/d/keep": b"k", "/d/new": b"data"}


def test_rename_is_durable_only_after_dir_fsync() -> None:
    disk = durable_disk({"/m/snap": b"OLD"})
    put(disk, "/m/snap.tmp", b"NEW")
    disk.fsync_dir("/m")  # the tmp name is durable
    disk.replace("/m/snap.tmp", "/m/snap")
    assert read(disk, "/m/snap") == b"NEW" and disk.listdir("/m") == ["snap"]
    assert crash_recover(disk) == {"/m/snap": b"OLD", "/m/snap.tmp": b"NEW"}
    disk.replace("/m/snap.tmp", "/m/snap")
    disk.fsync_dir("/m")
    assert crash_recover(disk) == {"/m/snap": b"NEW"}


def test_unlink_is_durable_only_after_dir_fsync() -> None:
    disk = durable_disk({"/d/a": b"a", "/d/b": b"b"})
    disk.unlink("/d/a")
    assert crash_recover(disk) == {"/d/a": b"a", "/d/b": b"b"}
    disk.unlink("/d/a")
    disk.fsync_dir("/d")
    assert crash_recover(disk) == {"/d/b": b"b"}


def test_cross_directory_rename_is_two_independent_dir_ops() -> None:
    disk = durable_disk({"/hot/s": b"S"})
    disk.makedirs("/cold")
    disk.replace("/hot/s", "/cold/s")
    disk.fsync_dir("/cold")  # the link is durable, the unlink is not
    assert crash_recover(disk) == {"/cold/s": b"S", "/hot/s": b"S"}


def test_mkdir_durable_by_default_strict_mode_needs_parent_fsync() -> None:
    disk = FakeDisk()
    disk.makedirs("/a/b")
    assert crash_recover(disk) == {} and disk.listdir("/a") == ["b"]

    strict = FakeDisk(durable_mkdir=False)
    strict.makedirs("/a/b")
    put(strict, "/a/b/f", b"x")
    strict.fsync_dir("/a/b")  # f is durable inside b, but b itself is not
    assert strict.durable_dirs() == ["/"]
    strict.crash()
    strict.recover()
    assert not strict.exists("/a") and strict.snapshot_durable() == {}
    strict.makedirs("/a/b")
    put(strict, "/a/b/f", b"x")
    for d in ("/a/b", "/a", "/"):
        strict.fsync_dir(d)
    assert crash_recover(strict) == {"/a/b/f": b"x"}


def test_mkdir_supersedes_a_pending_unlink_of_the_same_name() -> None:
    for seed in range(16):
        disk = durable_disk({"/d/x": b"file"})
        disk.unlink("/d/x")
        disk.makedirs("/d/x")
        disk.check_invariants()
        crash_recover(disk, "subset", seed=seed)
        assert disk.listdir("/d/x") == []


def test_poke_edits_the_durable_image() -> None:
    disk = durable_disk({"/w": b"abcdef"})
    disk.poke("/w", 2, b"ZZ")
    assert read(disk, "/w") == b"abZZef"
    disk.crash()
    disk.poke("/w", 0, b"Q")  # edit the image while the power is off
    disk.recover()
    assert read(disk, "/w") == b"QbZZef"
    with pytest.raises(FileNotFoundError):
        disk.poke("/missing", 0, b"x")


# ----------------------------------------- FakeDisk: crash, freeze, count


def test_frozen_after_crash_until_recover() -> None:
    disk = durable_disk({"/d/f": b"x"})
    h = disk.open("/d/f", write=True)
    h2 = disk.open("/d/f")
    disk.crash()
    assert disk.frozen
    calls: list[Callable[[], object]] = [
        lambda: disk.open("/d/f"),
        lambda: disk.replace("/d/f", "/d/g"),
        lambda: disk.unlink("/d/f"),
        lambda: disk.listdir("/d"),
        lambda: disk.makedirs("/e"),
        lambda: disk.exists("/d/f"),
        lambda: disk.fsync_dir("/d"),
        lambda: disk.crash(),
        lambda: disk.crash_after(1),
        lambda: h.pread(1, 0),
        lambda: h.pwrite(b"y", 0),
        lambda: h.truncate(0),
        lambda: h.fdatasync(),
        lambda: h.fsync(),
        lambda: h.size(),
    ]
    for call in calls:
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == errno.EIO and "frozen" in str(ei.value)
    h.close()  # never raises
    disk.snapshot_durable()  # the image can be inspected while frozen
    with pytest.raises(OSError):
        disk.snapshot_live()
    disk.recover()
    assert not disk.frozen and read(disk, "/d/f") == b"x"
    assert disk.open("/d/f").pread(1, 0) == b"x"
    with pytest.raises(OSError, match="stale handle") as ei:
        h2.pread(1, 0)
    assert ei.value.errno == errno.EBADF  # the pre-crash handle is dead
    with pytest.raises(RuntimeError):
        disk.recover()
    assert disk.crashes == 1


def test_op_counting() -> None:
    disk = FakeDisk()
    steps: list[tuple[Callable[[], object], int]] = [
        (lambda: disk.makedirs("/d"), 1),
        (lambda: disk.makedirs("/d"), 0),  # nothing created
        (lambda: disk.open("/d/f", create=True, write=True), 1),  # create
        (lambda: disk.open("/d/f", create=True, write=True), 0),  # exists
        (lambda: disk.open("/d/f", write=True).pwrite(b"ab", 0), 1),
        (lambda: disk.open("/d/f", write=True).truncate(1), 1),
        (lambda: disk.open("/d/f").fdatasync(), 1),
        (lambda: disk.open("/d/f").fsync(), 1),
        (lambda: disk.open("/d/f").pread(1, 0), 0),
        (lambda: disk.open("/d/f").size(), 0),
        (lambda: disk.listdir("/d"), 0),
        (lambda: disk.exists("/d/f"), 0),
        (lambda: disk.replace("/d/f", "/d/g"), 1),
        (lambda: disk.fsync_dir("/d"), 1),
        (lambda: disk.unlink("/d/g"), 1),
    ]
    for call, delta in steps:
        before = disk.ops
        call()
        assert disk.ops - before == delta
    before = disk.ops
    with pytest.raises(FileNotFoundError):
        disk.unlink("/d/g")  # failed ops are not counted
    assert disk.ops == before
    assert [op for op, _ in disk.trace] == [
        "makedirs",
        "create",
        "pwrite",
        "truncate",
        "fdatasync",
        "fsync",
        "replace",
        "fsync_dir",
        "unlink",
    ]


def _workload(fs: Fs) -> None:
    fs.makedirs("/m")
    put(fs, "/m/a.tmp", b"hello")
    fs.replace("/m/a.tmp", "/m/a")
    fs.fsync_dir("/m")


def test_crash_after_n_ops_completes_exactly_n() -> None:
    probe = FakeDisk()
    _workload(probe)
    m = probe.ops
    assert m == 7  # makedirs, create, truncate, pwrite, fdatasync, replace, fsync_dir
    for k in range(m + 1):
        disk = FakeDisk()
        disk.crash_after(k)
        if k < m:
            with pytest.raises(OSError) as ei:
                _workload(disk)
            assert ei.value.errno == errno.EIO
        else:
            _workload(disk)  # the last op completes, then the disk dies
        assert disk.frozen and disk.ops == k
        assert disk.trace == probe.trace[:k]
        disk.recover()
        assert disk.snapshot_durable() in ({}, {"/m/a": b"hello"})
        assert (disk.snapshot_durable() == {"/m/a": b"hello"}) == (k == m)


def test_crash_after_counts_from_now_and_validates() -> None:
    disk = FakeDisk()
    disk.makedirs("/d")
    disk.crash_after(2)
    with pytest.raises(OSError):
        put(disk, "/d/f", b"x", sync=False)  # create, truncate -> crash; pwrite fails
    assert disk.frozen and disk.ops == 3 and disk.trace[-1] == ("truncate", "/d/f")
    disk.recover()
    disk.crash_after(0)
    assert disk.frozen
    disk.recover()
    with pytest.raises(ValueError):
        disk.crash_after(-1)
    with pytest.raises(ValueError):
        disk.crash("bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        disk.crash("drop_all", "prefix")
    with pytest.raises(ValueError):
        disk.crash("torn_last", "bogus")  # type: ignore[arg-type]
    assert not disk.frozen


# ------------------------------------------------------ crash modes


def _subset_setup() -> FakeDisk:
    disk = durable_disk({"/d/f": b"", "/d/s.tmp": b"NEW", "/d/s": b"OLD"})
    f = disk.open("/d/f", write=True)
    f.pwrite(b"AAAA", 0)
    f.pwrite(b"BBBB", 4)
    disk.replace("/d/s.tmp", "/d/s")
    return disk


def test_subset_crash_is_deterministic_and_reaches_reordered_states() -> None:
    seen: set[tuple[bytes, bytes | None, bytes | None]] = set()
    for seed in range(64):
        a = crash_recover(_subset_setup(), "subset", seed=seed)
        b = crash_recover(_subset_setup(), "subset", seed=seed)
        assert a == b
        # each pending op either landed or not; nothing else is possible
        assert a["/d/f"] in (b"", b"AAAA", b"\0\0\0\0BBBB", b"AAAABBBB")
        assert (a.get("/d/s"), a.get("/d/s.tmp")) in ((b"OLD", b"NEW"), (b"NEW", None))
        seen.add((a["/d/f"], a.get("/d/s"), a.get("/d/s.tmp")))
    files = {f for f, _, _ in seen}
    assert files == {b"", b"AAAA", b"\0\0\0\0BBBB", b"AAAABBBB"}  # incl. later-without-earlier
    assert {s for _, s, _ in seen} == {b"OLD", b"NEW"}  # an un-synced rename may survive


def test_drop_all_loses_every_pending_op() -> None:
    assert crash_recover(_subset_setup()) == {
        "/d/f": b"",
        "/d/s": b"OLD",
        "/d/s.tmp": b"NEW",
    }


def _torn_setup() -> FakeDisk:
    disk = durable_disk({"/w": b"S" * 10, "/v": b""})
    f = disk.open("/w", write=True)
    f.pwrite(b"x" * 5, 10)  # earlier pending write: dropped
    f.pwrite(b"\xab" * (3 * SECTOR), 100)  # last pending write: torn
    f.truncate(4000)  # truncates are not writes: dropped
    disk.open("/v", write=True).pwrite(b"v" * 50, 0)
    return disk


def test_torn_last_prefix() -> None:
    for seed in range(8):
        img = crash_recover(_torn_setup(), "torn_last", damage="prefix", seed=seed)
        w, v = img["/w"], img["/v"]
        assert w[:100] == b"S" * 10 + b"\0" * 90
        assert 1 <= len(w) - 100 < 3 * SECTOR and set(w[100:]) == {0xAB}
        assert 1 <= len(v) < 50 and set(v) == {ord("v")}  # every file tears its own last write


def test_torn_last_zero_sector() -> None:
    for seed in range(8):
        w = crash_recover(_torn_setup(), "torn_last", damage="zero_sector", seed=seed)["/w"]
        assert len(w) == 100 + 3 * SECTOR and w[:100] == b"S" * 10 + b"\0" * 90
        zeros = [i for i in range(100, len(w)) if w[i] == 0]
        assert zeros and zeros == list(range(zeros[0], zeros[-1] + 1))  # one run
        sector = zeros[0] // SECTOR
        lo, hi = max(sector * SECTOR, 100), min((sector + 1) * SECTOR, len(w))
        assert (zeros[0], zeros[-1] + 1) == (lo, hi)  # exactly one aligned sector


def test_torn_last_garble() -> None:
    for seed in range(8):
        w = crash_recover(_torn_setup(), "torn_last", damage="garble", seed=seed)["/w"]
        body = w[100:]
        assert len(body) == 3 * SECTOR
        diff = [i for i, b in enumerate(body) if b != 0xAB]
        assert len(diff) == 1 and body[diff[0]] == 0xAB ^ 0xFF


@pytest.mark.parametrize("damage", ["prefix", "zero_sector", "garble"])
def test_torn_damage_is_deterministic_per_seed(damage: str) -> None:
    def image(seed: int) -> bytes:
        return crash_recover(_torn_setup(), "torn_last", damage=damage, seed=seed)["/w"]

    assert all(image(s) == image(s) for s in range(5))
    assert len({image(s) for s in range(12)}) > 1


def test_lying_fsync_loses_everything_on_crash() -> None:
    disk = durable_disk({"/d/f": b"old"})
    disk.lying_fsync = True
    put(disk, "/d/f", b"new")
    put(disk, "/d/g", b"g")
    disk.open("/d/f").fsync()
    disk.fsync_dir("/d")
    assert read(disk, "/d/f") == b"new"
    assert crash_recover(disk) == {"/d/f": b"old"}


# ------------------------------------------------------------ fsyncgate


def test_failed_fsync_without_fsyncgate_keeps_pages_dirty() -> None:
    disk = durable_disk({"/f": b""})
    fs = FaultFs(disk, [("fdatasync", 1, "EIO")])
    f = fs.open("/f", write=True)
    f.pwrite(b"data", 0)
    with pytest.raises(OSError):
        f.fdatasync()
    f.fdatasync()  # the retry promotes the still-dirty pages
    assert crash_recover(disk) == {"/f": b"data"}


@pytest.mark.parametrize("where", ["rule", "disk"])
def test_fsyncgate_discards_dirty_pages_and_later_fsync_succeeds(where: str) -> None:
    disk = durable_disk({"/f": b"base"})
    fs = FaultFs(disk)
    if where == "rule":
        fs.fail("fdatasync", 1, "EIO", fsyncgate=True)
    else:
        disk.fsyncgate = True
        fs.fail("fdatasync", 1, "EIO")
    f = fs.open("/f", write=True)
    f.pwrite(b"LOST", 4)
    with pytest.raises(OSError) as ei:
        f.fdatasync()
    assert ei.value.errno == errno.EIO
    assert f.pread(8, 0) == b"baseLOST"  # still in the page cache
    f.fdatasync()  # reports success, persists nothing
    f.pwrite(b"KEPT", 8)
    f.fdatasync()
    assert crash_recover(disk) == {"/f": b"base\0\0\0\0KEPT"}


def test_fsyncgate_rule_needs_a_fakedisk(tmp_path: Path) -> None:
    fs = FaultFs(RealFs(), [FaultRule("fsync", 1, "EIO", fsyncgate=True)])
    f = fs.open(str(tmp_path / "f"), create=True, write=True)
    with pytest.raises(TypeError):
        f.fsync()
    f.close()


# --------------------------------------------------------------- FaultFs


def _fault_env() -> tuple[FakeDisk, FaultFs, Callable[[str, int], None]]:
    """A FaultFs over a FakeDisk and a driver making the i-th call of an op class."""
    disk = FakeDisk()
    disk.makedirs("/d")
    for i in range(6):
        put(disk, f"/d/f{i}", b"0123456789")
    disk.fsync_dir("/d")
    fs = FaultFs(disk)
    h = fs.open("/d/f0", write=True)

    def call(op: str, i: int) -> None:
        if op == "pwrite":
            assert h.pwrite(b"x", i) == 1
        elif op == "pread":
            h.pread(1, i)
        elif op == "fdatasync":
            h.fdatasync()
        elif op == "fsync":
            h.fsync()
        elif op == "truncate":
            h.truncate(10 - i)
        elif op == "open":
            fs.open(f"/d/new{i}", create=True, write=True).close()
        elif op == "replace":
            fs.replace(f"/d/f{i + 1}", f"/d/r{i}")
        elif op == "unlink":
            fs.unlink(f"/d/f{i + 1}")
        elif op == "makedirs":
            fs.makedirs(f"/d/sub{i}")
        elif op == "fsync_dir":
            fs.fsync_dir("/d")
        elif op == "listdir":
            fs.listdir("/d")
        else:  # pragma: no cover
            raise AssertionError(op)

    return disk, fs, call


OPS = [
    "pwrite",
    "pread",
    "fdatasync",
    "fsync",
    "truncate",
    "open",
    "replace",
    "unlink",
    "makedirs",
    "fsync_dir",
    "listdir",
]
ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "ESTALE": errno.ESTALE, "EAGAIN": errno.EAGAIN}


@pytest.mark.parametrize("kind", list(ERRNOS))
@pytest.mark.parametrize("op", OPS)
def test_faultfs_once_fails_only_the_nth_call(op: str, kind: str) -> None:
    disk, fs, call = _fault_env()
    rule = fs.fail(op, 2, kind)  # type: ignore[arg-type]
    call(op, 0)
    ops_before, live_before = disk.ops, disk.snapshot_live()
    with pytest.raises(OSError) as ei:
        call(op, 1)
    assert ei.value.errno == ERRNOS[kind] and "injected" in str(ei.value)
    assert (disk.ops, disk.snapshot_live()) == (ops_before, live_before)  # no effect
    call(op, 2)
    call(op, 3)
    assert rule.fired == 1 and fs.counts[op] - rule.base == 4


@pytest.mark.parametrize("op", OPS)
def test_faultfs_persistent_fails_nth_and_every_later_call(op: str) -> None:
    _, fs, call = _fault_env()
    rule = fs.fail(op, 2, "ENOSPC", persistent=True)  # type: ignore[arg-type]
    call(op, 0)
    for i in (1, 2, 3):
        with pytest.raises(OSError) as ei:
            call(op, i)
        assert ei.value.errno == errno.ENOSPC
    assert rule.fired == 3
    fs.clear()
    call(op, 4)  # the fault clears


def test_faultfs_counter_is_shared_by_all_handles() -> None:
    disk = durable_disk({"/a": b"", "/b": b""})
    fs = FaultFs(disk, [("pwrite", 3, "EIO", False)])
    a, b = fs.open("/a", write=True), fs.open("/b", write=True)
    a.pwrite(b"1", 0)
    b.pwrite(b"2", 0)
    with pytest.raises(OSError):
        a.pwrite(b"3", 1)  # third pwrite overall, on the first handle
    b.pwrite(b"4", 1)
    assert fs.counts["pwrite"] == 4 and read(disk, "/a") == b"1"


def test_faultfs_rules_count_from_when_they_are_added() -> None:
    disk = durable_disk({"/a": b""})
    fs = FaultFs(disk)
    f = fs.open("/a", write=True)
    for i in range(5):
        f.pwrite(b"x", i)
    rule = fs.fail("pwrite")  # nth=1: the very next call
    with pytest.raises(OSError):
        f.pwrite(b"y", 0)
    assert rule.fired == 1 and fs.rules == [rule]
    f.pwrite(b"z", 0)
    fs.clear()
    assert fs.rules == [] and fs.counts["pwrite"] == 7


def test_faultfs_rule_validation() -> None:
    with pytest.raises(ValueError):
        FaultRule("bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FaultRule("pwrite", 1, "EWHAT")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FaultRule("pwrite", 0)
    with pytest.raises(ValueError):
        FaultRule("fsync", 1, "short")
    with pytest.raises(ValueError):
        FaultRule("pwrite", 1, "EIO", fsyncgate=True)


def test_short_write_is_looped_by_write_all() -> None:
    disk = durable_disk({"/w": b""})
    fs = FaultFs(disk, [("pwrite", 1, "short")])
    f = fs.open("/w", write=True)
    assert f.pwrite(b"abcdefgh", 0) == 4  # short: only a prefix lands
    assert read(disk, "/w") == b"abcd"
    fs.fail("pwrite", 1, "short")
    write_all(f, b"0123456789", 0)
    assert read(disk, "/w") == b"0123456789" and fs.counts["pwrite"] == 3


def test_persistent_short_write_ends_in_eio_not_a_spin() -> None:
    disk = durable_disk({"/w": b""})
    fs = FaultFs(disk, [FaultRule("pwrite", 1, "short", persistent=True)])
    with pytest.raises(OSError) as ei:
        write_all(fs.open("/w", write=True), b"0123456789", 0)
    assert ei.value.errno == errno.EIO
    assert read(disk, "/w") == b"012345678"  # 5 + 2 + 1 + 1, then a 0-byte write


def test_short_write_keep_count() -> None:
    disk = durable_disk({"/w": b""})
    fs = FaultFs(disk)
    f = fs.open("/w", write=True)
    fs.fail("pwrite", 1, "short", short_keep=3)
    assert f.pwrite(b"abcdef", 0) == 3
    fs.fail("pwrite", 1, "short", short_keep=99)
    assert f.pwrite(b"XY", 0) == 2  # capped at len(data)
    fs.fail("pwrite", 1, "short", short_keep=0)
    with pytest.raises(OSError) as ei:
        write_all(f, b"zz", 0)  # a zero-byte write is a stuck device
    assert ei.value.errno == errno.EIO and read(disk, "/w") == b"XYc"
    with pytest.raises(ValueError):
        FaultRule("pwrite", 1, "EIO", short_keep=1)


def test_faultfs_over_realfs(tmp_path: Path) -> None:
    p = str(tmp_path / "f")
    fs = FaultFs(RealFs(), [("pwrite", 2, "ENOSPC")])
    f = fs.open(p, create=True, write=True)
    f.pwrite(b"ok", 0)
    with pytest.raises(OSError) as ei:
        f.pwrite(b"full", 2)
    assert ei.value.errno == errno.ENOSPC and ei.value.filename == p
    f.close()
    assert Path(p).read_bytes() == b"ok"


# -------------------------------------------------------------- MonitorFs


def _snapshot_swap(fs: Fs, *, fsync_tmp: bool = True, prune_early: bool = False) -> None:
    """Write snapshot.2 and prune snapshot.1; the flags inject the two bugs."""
    f = fs.open("/meta/snapshot.2.bin.tmp", create=True, write=True)
    write_all(f, b"NEW-SNAPSHOT", 0)
    if fsync_tmp:
        f.fdatasync()
    f.close()
    fs.replace("/meta/snapshot.2.bin.tmp", "/meta/snapshot.2.bin")
    if prune_early:
        fs.unlink("/meta/snapshot.1.bin")
    fs.fsync_dir("/meta")
    if not prune_early:
        fs.unlink("/meta/snapshot.1.bin")
        fs.fsync_dir("/meta")


OLD_SNAP = {"/meta/snapshot.1.bin": b"OLD-SNAPSHOT"}


def test_monitor_allows_the_correct_snapshot_protocol() -> None:
    mon = MonitorFs(durable_disk(OLD_SNAP))
    _snapshot_swap(mon)
    mon.assert_clean()


def test_monitor_catches_tmp_renamed_before_fsync() -> None:
    disk = durable_disk(OLD_SNAP)
    mon = MonitorFs(disk)
    with pytest.raises(AssertionError, match="before it was fsynced"):
        _snapshot_swap(mon, fsync_tmp=False)
    assert len(mon.violations) == 1
    assert disk.exists("/meta/snapshot.2.bin.tmp")  # the rename never reached the disk
    with pytest.raises(AssertionError):
        mon.assert_clean()


def test_monitor_tmp_dirtied_again_after_fsync() -> None:
    for dirty in ("pwrite", "truncate"):
        mon = MonitorFs(FakeDisk())
        f = mon.open("/x.tmp", create=True, write=True)
        f.pwrite(b"abc", 0)
        f.fsync()
        if dirty == "pwrite":
            f.pwrite(b"d", 3)
        else:
            f.truncate(1)
        with pytest.raises(AssertionError):
            mon.replace("/x.tmp", "/x")
        f.fdatasync()
        mon.replace("/x.tmp", "/x")


def test_monitor_catches_old_snapshot_pruned_before_dir_fsync() -> None:
    mon = MonitorFs(durable_disk(OLD_SNAP))
    with pytest.raises(AssertionError, match="snapshot.1.bin unlinked before"):
        _snapshot_swap(mon, prune_early=True)
    # unlinking the not-yet-durable snapshot itself is not a prune of an old one
    mon2 = MonitorFs(durable_disk(OLD_SNAP))
    put(mon2, "/meta/snapshot.2.bin.tmp", b"x")
    mon2.replace("/meta/snapshot.2.bin.tmp", "/meta/snapshot.2.bin")
    mon2.unlink("/meta/snapshot.2.bin")
    mon2.assert_clean()


def test_monitor_catches_idx_written_before_data_fsync() -> None:
    mon = MonitorFs(FakeDisk())
    mon.makedirs("/t")
    data = mon.open("/t/seg-1.data", create=True, write=True)
    idx = mon.open("/t/seg-1.idx", create=True, write=True)
    data.pwrite(b"frame", 0)
    with pytest.raises(AssertionError, match="seg-1.idx written before"):
        idx.pwrite(b"entry", 0)
    data.fdatasync()
    idx.pwrite(b"entry", 0)
    other = mon.open("/t/seg-2.data", create=True, write=True)
    other.pwrite(b"unsynced", 0)  # another segment's dirty .data is irrelevant
    idx.pwrite(b"entry", 5)
    assert len(mon.violations) == 1


def test_monitor_follows_the_inode_across_rename() -> None:
    mon = MonitorFs(FakeDisk())
    data = mon.open("/seg-1.data.part", create=True, write=True)
    data.pwrite(b"frame", 0)
    mon.replace("/seg-1.data.part", "/seg-1.data")
    idx = mon.open("/seg-1.idx", create=True, write=True)
    with pytest.raises(AssertionError):
        idx.pwrite(b"e", 0)
    data.fsync()
    idx.pwrite(b"e", 0)


def test_monitor_forgets_pre_crash_state_and_existing_files_are_clean() -> None:
    disk = durable_disk({"/s.tmp": b"", "/seg.data": b"d"})
    mon = MonitorFs(FaultFs(disk))  # finds the disk through .inner
    f = mon.open("/s.tmp", write=True)
    f.pwrite(b"dirty", 0)
    disk.crash()
    disk.recover()
    mon.replace("/s.tmp", "/s")  # what survived is durable by definition
    mon.open("/seg.idx", create=True, write=True).pwrite(b"i", 0)  # .data untouched
    mon.assert_clean()


# ------------------------------------------------------------ crash_points


def test_crash_points_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOPICS_TEST_EXHAUSTIVE", raising=False)
    assert crash_points(0) == [0]
    assert crash_points(3) == [0, 1, 2, 3]
    for m in (4, 5, 10, 37, 1000):
        pts = crash_points(m)
        assert pts == sorted(set(pts)) == crash_points(m)
        assert pts[0] == 0 and pts[-1] == m and 3 <= len(pts) <= 4
    assert crash_points(10) == [0, 3, 7, 10]
    with pytest.raises(ValueError):
        crash_points(-1)


def test_crash_points_exhaustive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPICS_TEST_EXHAUSTIVE", "1")
    assert crash_points(12) == list(range(13))


# --------------------------------------- the doubles catch real bugs (sweep)


def _valid_snapshot_survives(img: dict[str, bytes]) -> bool:
    snaps = {p: b for p, b in img.items() if p.endswith(".bin")}
    return any(b in (b"OLD-SNAPSHOT", b"NEW-SNAPSHOT") for b in snaps.values())


def _sweep(workload: Callable[[Fs], None], modes: list[tuple[str, str | None]]) -> list[str]:
    """Crash at every op under every mode/seed; return the failing cases."""
    probe = durable_disk(OLD_SNAP)
    start = probe.ops
    workload(probe)
    m = probe.ops - start
    failures = []
    for k in range(m + 1):
        for mode, damage in modes:
            for seed in range(8 if mode == "subset" else 1):
                disk = durable_disk(OLD_SNAP)
                disk.crash_after(k, mode, damage, seed)  # type: ignore[arg-type]
                try:
                    workload(disk)
                except OSError:
                    pass
                if not disk.frozen:
                    disk.crash(mode, damage, seed)  # type: ignore[arg-type]
                disk.recover()
                if not _valid_snapshot_survives(disk.snapshot_durable()):
                    failures.append(f"k={k} mode={mode} damage={damage} seed={seed}")
    return failures


ALL_MODES: list[tuple[str, str | None]] = [
    ("drop_all", None),
    ("subset", None),
    ("torn_last", "prefix"),
    ("torn_last", "zero_sector"),
    ("torn_last", "garble"),
]


def test_sweep_passes_the_correct_protocol() -> None:
    assert _sweep(_snapshot_swap, ALL_MODES) == []


def test_sweep_catches_rename_before_fsync() -> None:
    assert _sweep(lambda fs: _snapshot_swap(fs, fsync_tmp=False), [("drop_all", None)])


def test_only_subset_mode_catches_prune_before_dir_fsync() -> None:
    def buggy(fs: Fs) -> None:
        _snapshot_swap(fs, prune_early=True)

    assert _sweep(buggy, [("drop_all", None)]) == []  # unlink and rename are lost together
    assert _sweep(buggy, [("subset", None)])  # the unlink can land without the rename


# ----------------------------------------------- FakeDisk agrees with the OS


def _tree(fs: Fs, root: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in fs.listdir(root):
        p = f"{root}/{name}"
        try:
            out[name] = read(fs, p)
        except IsADirectoryError:
            out[name] = _tree(fs, p)
    return out


def _outcome(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except OSError as e:
        return (type(e).__name__, e.errno)


def _scenario_bytes(fs: Fs, b: str) -> list[object]:
    f = fs.open(f"{b}/f", create=True, write=True)
    out: list[object] = [f.pwrite(b"hello", 0), f.pwrite(b"XY", 8), f.size(), f.pread(20, 0)]
    f.truncate(3)
    out += [f.size(), f.pread(20, 0), f.pread(5, 10)]
    f.truncate(6)
    f.fdatasync()
    f.fsync()
    out += [f.pread(20, 0)]
    ro = fs.open(f"{b}/f")
    out += [_outcome(lambda: ro.pwrite(b"z", 0)), _outcome(lambda: ro.truncate(0))]
    out += [_outcome(lambda: ro.pread(1, -1)), ro.pread(2, 1)]
    ro.close()
    f.close()
    return out


def _scenario_names(fs: Fs, b: str) -> list[object]:
    fs.makedirs(f"{b}/d/sub")
    fs.makedirs(f"{b}/d")
    put(fs, f"{b}/d/a", b"A")
    put(fs, f"{b}/d/b.tmp", b"B")
    keep = fs.open(f"{b}/d/a")
    fs.replace(f"{b}/d/b.tmp", f"{b}/d/a")
    out: list[object] = [fs.listdir(f"{b}/d"), keep.pread(9, 0), read(fs, f"{b}/d/a")]
    fs.fsync_dir(f"{b}/d")
    fs.replace(f"{b}/d/a", f"{b}/d/sub/moved")
    fs.unlink(f"{b}/d/sub/moved")
    out += [keep.pread(9, 0), fs.listdir(f"{b}/d"), fs.listdir(f"{b}/d/sub")]
    out += [fs.exists(f"{b}/d"), fs.exists(f"{b}/d/a"), fs.exists(f"{b}/d/sub/moved")]
    keep.close()
    return out


def _scenario_errors(fs: Fs, b: str) -> list[object]:
    fs.makedirs(f"{b}/d")
    put(fs, f"{b}/file", b"x")
    return [
        _outcome(lambda: fs.open(f"{b}/missing")),
        _outcome(lambda: fs.open(f"{b}/nodir/f", create=True, write=True)),
        _outcome(lambda: fs.open(f"{b}/file/f", create=True, write=True)),
        _outcome(lambda: fs.open(f"{b}/d", write=True)),
        _outcome(lambda: fs.listdir(f"{b}/missing")),
        _outcome(lambda: fs.listdir(f"{b}/file")),
        _outcome(lambda: fs.unlink(f"{b}/missing")),
        _outcome(lambda: fs.unlink(f"{b}/d")),
        _outcome(lambda: fs.replace(f"{b}/missing", f"{b}/x")),
        _outcome(lambda: fs.replace(f"{b}/file", f"{b}/d")),
        _outcome(lambda: fs.makedirs(f"{b}/file")),
        _outcome(lambda: fs.makedirs(f"{b}/file/sub")),
        _outcome(lambda: fs.fsync_dir(f"{b}/missing")),
        _outcome(lambda: fs.fsync_dir(f"{b}/file")),
        fs.exists(f"{b}/file/sub"),
        fs.exists(f"{b}/missing"),
    ]


@pytest.mark.parametrize("scenario", [_scenario_bytes, _scenario_names, _scenario_errors])
def test_fakedisk_live_view_matches_realfs(
    tmp_path: Path, scenario: Callable[[Fs, str], list[object]]
) -> None:
    real, fake = RealFs(), FakeDisk()
    fake.makedirs("/base")
    real_out = scenario(real, str(tmp_path))
    fake_out = scenario(fake, "/base")
    assert fake_out == real_out
    assert _tree(fake, "/base") == _tree(real, str(tmp_path))
    fake.check_invariants()


FILES = ["a", "b", "d/a", "d/b", "e/f/a"]
DIRS = ["d", "e", "e/f"]
_op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(FILES), st.integers(0, 12), st.binary(max_size=6)),
    st.tuples(st.just("trunc"), st.sampled_from(FILES), st.integers(0, 12)),
    st.tuples(st.just("replace"), st.sampled_from(FILES), st.sampled_from(FILES)),
    st.tuples(st.just("unlink"), st.sampled_from(FILES)),
    st.tuples(st.just("mkdir"), st.sampled_from(DIRS)),
    st.tuples(st.just("listdir"), st.sampled_from(DIRS)),
    st.tuples(st.just("sync"), st.sampled_from(FILES)),
    st.tuples(st.just("sync_dir"), st.sampled_from(DIRS)),
)


def _step(fs: Fs, b: str, op: tuple[object, ...]) -> object:
    def run() -> object:
        kind, *args = op
        if kind == "write":
            f = fs.open(f"{b}/{args[0]}", create=True, write=True)
            try:
                return f.pwrite(args[2], args[1])  # type: ignore[arg-type]
            finally:
                f.close()
        if kind == "trunc":
            f = fs.open(f"{b}/{args[0]}", write=True)
            try:
                f.truncate(args[1])  # type: ignore[arg-type]
                return f.size()
            finally:
                f.close()
        if kind == "replace":
            fs.replace(f"{b}/{args[0]}", f"{b}/{args[1]}")
            return None
        if kind == "unlink":
            fs.unlink(f"{b}/{args[0]}")
            return None
        if kind == "mkdir":
            fs.makedirs(f"{b}/{args[0]}")
            return None
        if kind == "listdir":
            return fs.listdir(f"{b}/{args[0]}")
        if kind == "sync":
            f = fs.open(f"{b}/{args[0]}")
            try:
                f.fsync()
                return None
            finally:
                f.close()
        fs.fsync_dir(f"{b}/{args[0]}")
        return None

    return _outcome(run)


def _fresh(strict: bool) -> FakeDisk:
    disk = FakeDisk(durable_mkdir=not strict)
    disk.makedirs("/base")
    disk.fsync_dir("/")
    return disk


def _run(disk: FakeDisk, ops: list[tuple[object, ...]]) -> list[object]:
    return [_step(disk, "/base", op) for op in ops]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=25), seed=st.integers(0, 2**16), strict=st.booleans())
def test_random_ops_match_realfs_and_crash_model_is_consistent(
    ops: list[tuple[object, ...]], seed: int, strict: bool
) -> None:
    fake = _fresh(strict)
    with tempfile.TemporaryDirectory() as tmp:
        real = RealFs()
        for op in ops:
            assert _step(fake, "/base", op) == _step(real, tmp, op), op
            fake.check_invariants()
        assert _tree(fake, "/base") == _tree(real, tmp)

    # sync every file and every directory: the durable image is the live view
    synced = _fresh(strict)
    _run(synced, ops)
    for path in synced.snapshot_live():
        synced.open(path).fsync()
    for d in synced.live_dirs():
        synced.fsync_dir(d)
    live = synced.snapshot_live()
    assert synced.snapshot_durable() == live
    assert crash_recover(synced) == live

    # a subset crash is deterministic, keeps the model consistent and only
    # surfaces names the workload wrote
    images = []
    for _ in range(2):
        disk = _fresh(strict)
        _run(disk, ops)
        images.append(crash_recover(disk, "subset", seed=seed))
    assert images[0] == images[1]
    written = {f"/base/{op[1]}" for op in ops if op[0] == "write"}
    written |= {f"/base/{op[2]}" for op in ops if op[0] == "replace"}
    assert set(images[0]) <= written
