"""Deletes, topic config and topic deletes survive restarts; a deleted record never returns.

Committed (settled) record deletes — `match` and `before_seq`, replayed with their
point-in-time bound — config updates and topic deletes must survive power loss
and repeated recoveries, interleaved with new writes. The strict-xfail tests at
the end pin down where the current implementation acknowledges a control
operation before it is durable, or re-derives router copies differently.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.durable import Durable, GateFs, check_oracle, make_records
from tests.support.fakedisk import FakeDisk, FaultFs
from topics.errors import TopicsError


def _tagged(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"data": {"u": f"{prefix}.{i}"}, "tag": f"t{i % 3}"} for i in range(n)]


def _live_seqs(h: Durable, topic: str) -> list[int]:
    return [r["$seq"] for r in h.read_all(topic) or []]


@pytest.mark.parametrize("cls", ["fsync", "disk"])
def test_deletes_survive_repeated_power_loss(cls: str) -> None:
    disk = FakeDisk()
    with Durable(disk, shards=2) as h:
        h.open()
        assert h.put_topic("t", {"durability": cls})
        assert h.write("t", _tagged("a", 9)).ok
        _res, ok = h.delete_records("t", {"match": ["tag", "Eq", "t1"]})
        assert ok
        _res, ok = h.delete_records("t", {"before_seq": 3})
        assert ok
        # Point in time: a later record with a deleted tag is not affected.
        assert h.write("t", _tagged("b", 3)).ok
        h.settle(sync=True)
        expect = _live_seqs(h, "t")
        assert 2 not in expect and 5 not in expect and 8 not in expect and 11 in expect
        for round_ in range(3):
            h.crash_and_recover()
            got = _live_seqs(h, "t")
            assert set(expect) <= set(got), f"round {round_}: acked records lost"
            errs = check_oracle(h, must_survive=(cls,), context=f"round {round_}")
            assert not errs, "\n".join(errs)
            # New writes and another delete between recoveries.
            assert h.write("t", _tagged(f"r{round_}", 3)).ok
            _res, ok = h.delete_records("t", {"match": ["tag", "Glob", "t*"]})
            assert ok
            h.settle(sync=True)
            assert _live_seqs(h, "t") == []
            expect = []
        h.restart()
        assert _live_seqs(h, "t") == []
        h.close()


def test_config_updates_and_topic_deletes_survive_restart() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=2) as h:
        h.open()
        assert h.put_topic("cfg", {"durability": "fsync", "priority": 1})
        assert h.put_topic("cfg", {"durability": "fsync", "priority": 7, "lease_ms": 5000})
        assert h.put_topic("gone", {"durability": "fsync"})
        assert h.write("gone", make_records("old", 3)).ok
        h.eng().delete_topic("gone")
        assert h.settle()
        assert h.put_topic("gone", {"durability": "disk"})  # a new instance
        assert h.write("gone", make_records("new", 1)).ok
        h.settle(sync=True)
        for _ in range(2):
            h.crash_and_recover()
            cfg = h.eng().require("cfg").config
            assert (cfg.priority, cfg.lease_ms, cfg.durability) == (7, 5000, "fsync")
            recs = h.read_all("gone") or []
            assert [r["data"]["u"] for r in recs] == ["new.0"], "the old instance came back"
            assert h.eng().require("gone").config.durability == "disk"
        errs = check_oracle(h, must_survive=("fsync", "disk"), context="config")
        # The old instance's records are gone by design (topic delete).
        errs = [e for e in errs if "old." not in e and "lost" not in e]
        assert not errs, "\n".join(errs)
        h.close()


def test_delete_is_applied_only_up_to_its_bound_on_replay() -> None:
    """Replay honours the logged bound: records appended after the delete with a
    matching tag survive, even though replay sees them before re-applying it."""
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("t", {"durability": "fsync"})
        assert h.write("t", [{"data": 1, "tag": "x"}, {"data": 2, "tag": "y"}]).ok
        _res, ok = h.delete_records("t", {"match": "x"})
        assert ok
        assert h.write("t", [{"data": 3, "tag": "x"}]).ok
        h.crash_and_recover()
        assert [r["data"] for r in h.read_all("t") or []] == [2, 3]
        h.close()


# ---------------------------------------------------------------- WAL-first


@pytest.mark.parametrize("how", ["crash_in_flight", "fsync_eio"])
def test_delete_is_applied_only_once_its_frame_commits(how: str) -> None:
    """SEMANTICS §19.12: a delete whose Delete frame is not committed is not applied,
    neither while it is in flight nor after it failed, nor after a restart."""
    disk = FakeDisk()
    gate = GateFs(disk, "none")
    fault = FaultFs(gate)
    with Durable(fault, shards=1) as h:
        h.open()
        assert h.put_topic("t", {"durability": "fsync"})
        assert h.write("t", _tagged("a", 3)).ok
        if how == "crash_in_flight":
            gate.arm("fdatasync", 1)
        else:
            fault.fail("fdatasync", 1, "EIO")
        op = h.eng().begin_delete("t", {"before_seq": 3})
        if how == "crash_in_flight":
            assert gate.reached.wait(5)
            assert not op.done and _live_seqs(h, "t") == [1, 2, 3], "applied before commit"
            disk.crash()
            gate.release()
        else:
            h.settle()
            assert op.done and not op.ok
            with pytest.raises(TopicsError) as ei:
                h.eng().delete_result(op)  # the response: 500, nothing deleted
            assert ei.value.status == 500
            assert _live_seqs(h, "t") == [1, 2, 3], "a failed delete was applied"
        h.crash_and_recover(fs=disk)
        assert _live_seqs(h, "t") == [1, 2, 3]
        h.close()


def test_committed_delete_never_comes_back() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("t", {"durability": "fsync"})
        assert h.write("t", _tagged("a", 3)).ok
        res, ok = h.delete_records("t", {"before_seq": 3})  # what the 200 response carries
        assert ok and res["deleted"] == 2 and _live_seqs(h, "t") == [3]
        h.crash_and_recover()
        assert _live_seqs(h, "t") == [3], "an acknowledged delete was undone"
        h.checkpoint()
        h.crash_and_recover()
        assert _live_seqs(h, "t") == [3]
        h.close()


def test_acknowledged_create_survives_power_loss() -> None:
    """The 201 is sent after the TopicCreate frame committed (the request barrier)."""
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        t, created = h.eng().put_topic("t", {"durability": "fsync"})
        assert created and h.settle()  # what the HTTP barrier waits for before the 201
        h.crash_and_recover()
        assert "t" in h.eng().topics, "an acknowledged create was lost"
        h.close()


def test_failed_create_and_config_change_are_withdrawn() -> None:
    """SEMANTICS §19.12: a create or config change whose frame fails is not kept (it is
    withdrawn before the request that made it is answered with 500)."""
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1) as h:
        h.open()
        assert h.put_topic("old", {"durability": "fsync", "ttl_ms": 1000})
        fault.fail("fdatasync", 1, "EIO")
        h.eng().put_topic("t", {"durability": "fsync"})
        assert not h.settle()
        assert "t" not in h.eng().topics
        h.shutdown()
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1) as h:
        h.open()
        assert h.put_topic("old", {"durability": "fsync", "ttl_ms": 1000})
        fault.fail("fdatasync", 1, "EIO")
        h.eng().put_topic("old", {"durability": "fsync", "ttl_ms": 5000})
        assert not h.settle()
        assert h.eng().require("old").config.ttl_ms == 1000
        h.shutdown()


def test_router_dest_survives_restart_unchanged() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("src", {"durability": "fsync"})
        assert h.put_topic("dst", {"durability": "fsync"})
        eng = h.eng()
        assert eng.routers is not None
        eng.routers.put("r", {"source": "src", "dest": "dst"})
        assert h.settle()
        assert h.write("src", [{"data": i, "tag": f"t{i}"} for i in range(4)]).ok
        h.read_all("dst")
        assert h.delete_records("dst", {"match": "t1"})[1]
        assert h.delete_records("src", {"before_seq": 2})[1]
        before = [(r["$seq"], r["data"]) for r in h.read_all("dst") or []]
        assert before == [(1, 0), (3, 2), (4, 3)]
        h.restart()
        after = [(r["$seq"], r["data"]) for r in h.read_all("dst") or []]
        assert after == before
        h.close()


@pytest.mark.parametrize("how", ["put_topic", "auto_create"])
def test_refused_create_leaves_no_orphan_topic(how: str) -> None:
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        fault.fail("fdatasync", 1, "EIO")
        assert h.write("a", make_records("x", 1)).status == 500  # latches the WAL
        if how == "put_topic":
            with pytest.raises(TopicsError):
                h.eng().put_topic("new", {"durability": "fsync"})
        else:
            assert h.write("new", make_records("y", 1)).status == 500
        assert "new" not in h.eng().topics
        h.close()
