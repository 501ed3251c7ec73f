"""Row 6: replay is idempotent and independent of the shard count.

* recover 3 times (graceful restarts and power losses, nothing written in
  between) ⇒ identical fingerprints: topics, configs, heads, earliest, counts,
  tombstones, every record's seq/ts/node/tag/data/meta, routers;
* the shard count changes between runs (1 → 3 → 2 → 1): every acked record is
  recovered, in order, with its deletes and configs, and new writes continue at
  head + 1.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.durable import Durable, check_oracle, fingerprint_equal, make_records
from tests.support.fakedisk import FakeDisk


def _tagged(prefix: str, n: int, tag: str | None = None, node: str | None = None) -> list[Any]:
    recs: list[dict[str, Any]] = []
    for i in range(n):
        r: dict[str, Any] = {"data": {"u": f"{prefix}.{i}", "v": [i, "é" * i]}}
        if tag is not None:
            r["tag"] = f"{tag}{i % 2}"
        if node is not None:
            r["node"] = node
        if i % 3 == 0:
            r["meta"] = {"k": i}
        recs.append(r)
    return recs


def _rich_workload(h: Durable) -> None:
    for name, cls in (
        ("f1", "fsync"),
        ("f2", "fsync"),
        ("dk", "disk"),
        ("mem", "memory"),
        ("eph", "ephemeral"),
        ("tmp", "fsync"),
        ("rsrc", "fsync"),
        ("capf", "fsync"),
    ):
        assert h.put_topic(name, {"durability": cls})
    eng = h.eng()
    assert eng.routers is not None
    eng.routers.put("r1", {"source": "rsrc", "dest": "rdest"})
    h.settle()
    for i in range(3):
        for name in ("f1", "f2", "dk", "mem", "eph", "tmp", "rsrc", "capf"):
            out = h.write(name, _tagged(f"{name}{i}", 3, tag="t", node=f"n{i}"))
            assert out.ok, out
    h.read_all("rdest")  # let the router forward (derived copies)
    _res, ok = h.delete_records("f2", {"match": ["tag", "Eq", "t1"]})
    assert ok
    _res, ok = h.delete_records("f1", {"before_seq": 3})
    assert ok
    assert h.put_topic("capf", {"durability": "fsync", "cap_records": 5})
    assert h.write("capf", _tagged("capf-more", 4)).ok
    assert h.write("dk", _tagged("dk-more", 4)).ok
    eng.delete_topic("tmp")
    h.settle()
    assert h.put_topic("tmp", {"durability": "fsync", "ttl_ms": 0})
    assert h.write("tmp", _tagged("tmp-new", 2)).ok
    assert h.write("f1", _tagged("f1-late", 2, tag="t")).ok
    assert h.write("rsrc", _tagged("rsrc-late", 2, tag="t")).ok
    h.read_all("rdest")
    h.settle(sync=True)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_recover_three_times_gives_identical_fingerprints(shards: int) -> None:
    disk = FakeDisk()
    with Durable(disk, shards=shards) as h:
        h.open()
        _rich_workload(h)
        live = h.fingerprint()
        h.restart()
        fp1 = h.fingerprint()
        h.crash_and_recover()
        fp2 = h.fingerprint()
        h.restart()
        fp3 = h.fingerprint()
        assert not fingerprint_equal(fp1, fp2)
        assert not fingerprint_equal(fp2, fp3)
        # Against the live state: fsync topics identical, the router's dest re-derived
        # identically, the ephemeral topic keeps only its config, the disk topic keeps
        # its records (its head may jump to the durable reservation).
        for name in ("f1", "f2", "tmp", "rsrc", "rdest", "mem", "capf"):
            assert fp1[name]["records"] == live[name]["records"], name
            assert fp1[name]["tombstone"] == live[name]["tombstone"], name
        assert fp1["f1"]["head"] == live["f1"]["head"]
        assert fp1["dk"]["records"] == live["dk"]["records"]
        assert fp1["dk"]["head"] >= live["dk"]["head"]
        assert fp1["eph"]["records"] == [] and fp1["eph"]["config"] == live["eph"]["config"]
        assert fp1["$routers"] == ["r1"]
        assert "tmp" in fp1 and fp1["tmp"]["config"]["durability"] == "fsync"
        h.close()


def test_shard_count_changes_between_runs_recover_everything_in_order() -> None:
    disk = FakeDisk()
    names = ["s1", "s2", "s3", "s4", "s5"]
    with Durable(disk, shards=1) as h:
        h.open()
        for n in names:
            assert h.put_topic(n, {"durability": "fsync"})
        for run, count in enumerate([1, 3, 2, 1, 4]):
            if run:
                if run % 2:
                    h.restart(shards=count)
                else:
                    h.crash_and_recover(shards=count)
            assert h.report is not None
            for n in names:
                head = h.eng().require(n).head_seq
                out = h.write(n, make_records(f"{n}.r{run}", 2))
                assert out.ok and out.first_seq == head + 1, out
            # A delete and a config change in every run, on whatever shard now owns the topic.
            _res, ok = h.delete_records(names[run % len(names)], {"before_seq": 2 + run})
            assert ok
            assert h.put_topic(
                names[(run + 1) % len(names)], {"durability": "fsync", "priority": run}
            )
            fp = h.fingerprint()
            for n in names:
                seqs = [r["$seq"] for r in fp[n]["records"]]
                assert seqs == sorted(seqs)
            errs = check_oracle(h, context=f"run {run} shards={count}")
            assert not errs, "\n".join(errs)
        final = h.fingerprint()
        h.restart(shards=2)
        assert not fingerprint_equal(final, h.fingerprint())
        h.close()


def test_config_update_order_survives_a_shard_count_change() -> None:
    disk = FakeDisk()
    with Durable(disk, shards=3) as h:
        h.open()
        # Topic id 1 lives on shard 2 of 3 and on shard 0 of 2.
        assert h.put_topic("x", {"durability": "fsync", "ttl_ms": 1000})
        assert h.write("x", make_records("x", 1)).ok
        assert h.put_topic("x", {"durability": "fsync", "ttl_ms": 1500})
        h.restart(shards=2)
        assert h.put_topic("x", {"durability": "fsync", "ttl_ms": 2000})  # same head (1)
        h.restart(shards=2)
        assert h.eng().require("x").config.ttl_ms == 2000
        h.close()
