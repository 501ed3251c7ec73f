"""A deleted topic's files: renamed to `topics/<id>.deleted` after the snapshot that
drops the topic, unlinked in the background, and finished at the next start when a
crash cut that short (docs/FORMATS.md, "Deleted topics")."""

from __future__ import annotations

import posixpath

import pytest

from tests.support.durable import DATA_DIR, Durable, make_records
from tests.support.fakedisk import FakeDisk


def _topic_dirs(disk: FakeDisk) -> list[str]:
    base = posixpath.join(DATA_DIR, "topics")
    return sorted(d[len(base) + 1 :] for d in disk.live_dirs() if posixpath.dirname(d) == base)


def _setup(h: Durable) -> str:
    """Topics `keep` and `gone` with records in segments; `gone` is deleted (logged).

    Returns the hex id of `gone`'s directory."""
    assert h.put_topic("keep", {"durability": "fsync"})
    assert h.put_topic("gone", {"durability": "fsync"})
    assert h.write("keep", make_records("k", 100)).ok
    assert h.write("gone", make_records("g", 100)).ok
    assert h.settle()
    h.checkpoint()
    gid = f"{h.eng().require('gone').topic_id:016x}"
    assert gid in _topic_dirs(h.disk)
    h.eng().delete_topic("gone")
    assert h.settle()
    return gid


def test_delete_renames_then_unlinks_in_the_background() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        gid = _setup(h)
        h.checkpoint()  # the snapshot without `gone`, then the rename
        h.checkpoint()
        assert h.storage is not None
        h.storage.checkpointer.reaper.stop()  # wait for the background unlink
        names = _topic_dirs(disk)
        assert gid not in names and gid + ".deleted" not in names
        assert h.storage.checkpointer.reaper.done == 1
        assert [r["data"]["u"] for r in h.read_all("keep") or []][:2] == ["k.0", "k.1"]
        h.close()


@pytest.mark.parametrize("mode", ["drop_all", "subset"])
def test_a_crash_at_every_step_of_a_topic_delete(mode: str) -> None:
    """Crash after each file operation of the checkpoint that drops a deleted topic
    and of its background unlink: the restarted server never shows the deleted
    records, keeps the other topic whole, and leaves neither `<id>` nor
    `<id>.deleted` behind once its own reaper has run."""
    probe = FakeDisk()
    with Durable(probe, shards=1) as h:
        h.open()
        _setup(h)
        start = len(probe.trace)
        h.checkpoint()
        assert h.storage is not None
        h.storage.checkpointer.reaper.stop()
        total = len(probe.trace) - start
        h.shutdown()
    assert total > 5
    for k in range(1, total + 1):
        disk = FakeDisk()
        with Durable(disk, shards=1) as h:
            h.open()
            gid = _setup(h)
            disk.crash_after(k, mode, seed=k)  # type: ignore[arg-type]
            try:
                h.checkpoint()
                assert h.storage is not None
                h.storage.checkpointer.reaper.stop()
            except Exception:
                pass  # the disk died under the cycle
            h.crash_and_recover()
            assert h.storage is not None
            h.storage.checkpointer.reaper.stop()
            assert h.read_all("gone") is None, f"crash point {k}: the deleted topic came back"
            keep = [r["data"]["u"] for r in h.read_all("keep") or []]
            assert keep == [f"k.{i}" for i in range(100)], f"crash point {k}"
            h.checkpoint()
            h.storage.checkpointer.reaper.stop()
            left = [n for n in _topic_dirs(disk) if n.startswith(gid)]
            assert left == [], f"crash point {k}: {left} left behind"
            h.shutdown()
