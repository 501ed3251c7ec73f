"""Row 14 (basics): the commit sequencer under concurrent submissions and faults.

* many writes staged at once (they share group commits) get unique, dense seqs
  and all survive a power loss;
* visible ⇒ durable for `fsync`: a reader polling while batches commit only ever
  sees a dense prefix, and every seq it saw survives a crash; a batch held inside
  its fdatasync is invisible, and is gone (500) when the power fails there;
* every staged write resolves exactly once, also when the device dies with
  writes queued (no lost wakeups, no hang on shutdown);
* submissions after the journal closed are refused, not lost.
"""

from __future__ import annotations

from tests.support.durable import Durable, GateFs, check_oracle, make_records
from tests.support.fakedisk import FakeDisk


def test_concurrent_writes_get_unique_dense_seqs_and_survive() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=2) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.put_topic("b", {"durability": "fsync"})
        writes = [(("a", "b")[i % 2], make_records(f"w{i}", 1 + i % 3), None) for i in range(60)]
        outs = h.write_many(writes)
        assert all(o.ok for o in outs)
        for topic in ("a", "b"):
            seqs = sorted(s for o in outs if o.topic == topic for s in o.seqs)
            assert seqs == list(range(1, len(seqs) + 1))
            assert h.eng().require(topic).head_seq == len(seqs)
        # Far fewer fsyncs than writes: they were group-committed.
        assert h.journal is not None
        assert sum(s.metrics.fsyncs for s in h.journal.shards) < len(writes)
        h.crash_and_recover()
        errs = check_oracle(h, context="concurrent")
        assert not errs, "\n".join(errs)
        h.close()


def test_reader_sees_only_durable_dense_prefix() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        staged = h.submit([("a", make_records(f"w{i}", 2), None) for i in range(40)])
        seen: set[int] = set()
        for _ in range(2000):
            h.spin()
            seqs = [r["$seq"] for r in h.read_all("a") or []]
            assert seqs == list(range(1, len(seqs) + 1)), "a reader saw a gap"
            seen |= set(seqs)
            if all(st.pw is not None and st.pw.published for st in staged):
                break
        outs = h.wait(staged)
        assert all(o.ok for o in outs)
        h.crash_and_recover()
        survivors = {r["$seq"] for r in h.read_all("a") or []}
        assert seen <= survivors, "a record was visible before it was durable"
        h.close()


def test_batch_inside_fsync_is_invisible_and_lost_on_power_failure() -> None:
    disk = FakeDisk()
    gate = GateFs(disk, "none")
    with Durable(gate, shards=1) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", make_records("ok", 1)).ok
        gate.arm("fdatasync", 1)
        held = h.submit([("a", make_records("held", 2), None)])
        assert gate.reached.wait(5)
        queued = h.submit([("a", make_records(f"q{i}", 1), None) for i in range(3)])
        h.spin()
        assert [r["data"]["u"] for r in h.read_all("a") or []] == ["ok.0"]
        assert h.eng().require("a").head_seq == 1
        disk.crash()  # power fails while the batch is inside fdatasync
        gate.release()
        outs = h.wait(held) + h.wait(queued)  # every staged write resolves (HarnessHang otherwise)
        assert not any(o.ok for o in outs)
        assert all(o.status == 500 for o in outs)
        h.crash_and_recover(fs=disk)
        assert [r["data"]["u"] for r in h.read_all("a") or []] == ["ok.0"]
        errs = check_oracle(h, allow_unacked=False, context="held batch")
        assert not errs, "\n".join(errs)
        h.close()


def test_every_write_resolves_exactly_once_when_the_device_dies() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=2) as h:
        h.open()
        for t in ("a", "b", "c"):
            assert h.put_topic(t, {"durability": "fsync"})
        calls: dict[int, int] = {}
        disk.crash_after(3)  # dies a few ops into the burst
        staged = h.submit(
            [(("a", "b", "c")[i % 3], make_records(f"w{i}", 1), None) for i in range(30)]
        )
        for i, st in enumerate(staged):
            assert st.pw is not None
            st.pw.waiters.append(lambda i=i: calls.__setitem__(i, calls.get(i, 0) + 1))
        outs = h.wait(staged)
        assert sorted(calls) == list(range(len(staged))) and set(calls.values()) == {1}
        acked = [o for o in outs if o.ok]
        h.crash_and_recover()
        errs = check_oracle(h, context="device died mid-burst")
        assert not errs, "\n".join(errs)
        assert len(acked) < len(outs)
        h.close()


def test_submit_after_close_is_refused() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=1) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        journal = h.journal
        assert journal is not None
        journal.close()
        out = h.write("a", make_records("late", 1))
        assert not out.ok and out.status == 500
        assert h.read_all("a") == []
        h.restart()
        assert h.read_all("a") == []
        h.close()
