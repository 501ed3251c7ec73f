"""Row 1: crash after every mutating fs op of a tiny fsync workload, recover, check the oracle.

The workload (open a fresh data dir with 2 WAL shards, create 2 `fsync` topics
that land on different shards, three appends) settles after every step, so it is
the same sequence of fs ops on every run. A probe run counts the M mutating ops;
then for each k in ``crash_points(M)`` (every k with ``TOPICS_TEST_EXHAUSTIVE=1``)
and every power-loss flavour, a fresh FakeDisk runs the workload armed with
``crash_after(k)``, powers back on, recovers and checks:

* acked ⊆ survivors ⊆ attempted, byte-identical (no fabrication);
* each batch all-or-nothing; survivors dense per topic (no acked batch missing
  behind a surviving later one);
* committed topic creates survive;
* recovering twice more gives the identical fingerprint (topics, heads,
  earliest, records), and the WAL accepts and keeps new writes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fault.conftest import CRASH_FLAVOURS, flavour_id
from tests.support.durable import Durable, check_oracle, fingerprint_equal, make_records
from tests.support.fakedisk import FakeDisk, crash_points
from topics.errors import TopicsError


def _workload(h: Durable, batches: list[tuple[str, int]]) -> list[Callable[[], object]]:
    steps: list[Callable[[], object]] = [
        h.open,
        lambda: h.put_topic("a", {"durability": "fsync"}),
        lambda: h.put_topic("b", {"durability": "fsync"}),
    ]
    for i, (topic, n) in enumerate(batches):
        steps.append(lambda t=topic, n=n, i=i: h.write(t, make_records(f"{t}{i}", n)))
    return steps


def _run(h: Durable, steps: list[Callable[[], object]]) -> None:
    for step in steps:
        if h.disk.frozen:
            return
        try:
            step()
        except (OSError, TopicsError):
            if not h.disk.frozen:
                raise


SINGLE = [("a", 1), ("b", 1), ("a", 1)]
MULTI = [("a", 2), ("b", 1), ("a", 3)]


def _probe(batches: list[tuple[str, int]]) -> int:
    disk = FakeDisk()
    h = Durable(disk)
    try:
        _run(h, _workload(h, batches))
        assert h.history.acked() and all(b.ok for b in h.history.batches)
        assert h.shard_index("a") != h.shard_index("b"), "topics should use both shards"
        h.close()
    finally:
        h.shutdown()
    return disk.ops


def _sweep_one(
    batches: list[tuple[str, int]],
    k: int,
    flavour: tuple[str, str | None, int],
    *,
    atomic: bool = True,
) -> list[str]:
    mode, damage, seed = flavour
    disk = FakeDisk()
    h = Durable(disk)
    ctx = f"k={k} {flavour_id(flavour)}"
    try:
        if k == 0:
            disk.crash(mode, damage, seed)  # type: ignore[arg-type]
        else:
            disk.crash_after(k, mode, damage, seed)  # type: ignore[arg-type]
        _run(h, _workload(h, batches))
        ctx = f"k={k} {flavour_id(flavour)} crashed after {disk.trace[-1:]}"
        if not disk.frozen:  # k == M: the crash lands after everything
            h.crash(mode, damage, seed)
        h.crash_and_recover()  # no-op crash (already frozen): power back + recover
        errs = check_oracle(h, context=ctx, atomic_batches=atomic)
        fp1 = h.fingerprint()
        h.crash_and_recover()
        fp2 = h.fingerprint()
        h.crash_and_recover()
        fp3 = h.fingerprint()
        errs += [f"recover #2 differs: {d} [{ctx}]" for d in fingerprint_equal(fp1, fp2)]
        errs += [f"recover #3 differs: {d} [{ctx}]" for d in fingerprint_equal(fp2, fp3)]
        # The recovered WAL is writable and what it acks survives the next power loss.
        for topic in ("a", "b"):
            if topic in h.eng().topics:
                out = h.write(topic, make_records(f"{topic}-after", 1))
                if not out.ok:
                    errs.append(f"write to {topic} after recovery failed: {out} [{ctx}]")
        h.crash_and_recover()
        errs += check_oracle(h, context=ctx + " after post-recovery writes", atomic_batches=atomic)
        h.close()
        return errs
    finally:
        h.shutdown()


@pytest.mark.parametrize("flavour", CRASH_FLAVOURS, ids=flavour_id)
def test_sweep_durable_append_power_loss(flavour: tuple[str, str | None, int]) -> None:
    """Single-record batches: every flavour, every sampled crash point."""
    m = _probe(SINGLE)
    errs: list[str] = []
    for k in crash_points(m, samples=8):
        errs += _sweep_one(SINGLE, k, flavour)
    assert not errs, "\n".join(errs)


@pytest.mark.parametrize("flavour", CRASH_FLAVOURS, ids=flavour_id)
def test_sweep_multi_record_batches_power_loss(flavour: tuple[str, str | None, int]) -> None:
    """Multi-record batches. A torn multi-frame write may leave a valid prefix of an
    *unacked* batch (see test_torn_multi_record_batch_is_all_or_nothing), so for the
    torn flavours the oracle only insists that such a partial batch is an unacked
    prefix; everything else (acked ⇒ durable, density, no fabrication) is strict."""
    m = _probe(MULTI)
    atomic = flavour[0] != "torn_last"
    errs: list[str] = []
    for k in crash_points(m, samples=8):
        errs += _sweep_one(MULTI, k, flavour, atomic=atomic)
    assert not errs, "\n".join(errs)


def test_torn_multi_record_batch_is_all_or_nothing() -> None:
    """SEMANTICS §19.3: a write is all-or-nothing, even when its pwrite is torn."""
    errs: list[str] = []
    for seed in range(6):
        disk = FakeDisk()
        with Durable(disk) as h:
            h.open()
            h.put_topic("a", {"durability": "fsync"})
            # Crash right after the batch's pwrite (before its fdatasync), tearing it.
            disk.crash_after(1, "torn_last", "prefix", seed)
            out = h.write("a", make_records("big", 4, size=200))
            assert not out.ok
            h.crash_and_recover()
            errs += check_oracle(h, context=f"seed={seed}")
            h.close()
    assert not errs, "\n".join(errs)


# The torn flavours of the every-point sweep run in the full tier only: the quick
# tier keeps drop_all and subset.
EVERY_POINT = [
    pytest.param(f, id=flavour_id(f), marks=[pytest.mark.slow] if f[0] == "torn_last" else [])
    for f in CRASH_FLAVOURS
]


@pytest.mark.parametrize("flavour", EVERY_POINT)
def test_sweep_every_point_single_record(flavour: tuple[str, str | None, int]) -> None:
    """The full sweep (every op) for single-record batches: the CrashMonkey-sized
    check (about 2 s per flavour)."""
    m = _probe(SINGLE)
    errs: list[str] = []
    for k in range(m + 1):
        errs += _sweep_one(SINGLE, k, flavour)
    assert not errs, "\n".join(errs)


ROTATING = [("a", 1), ("b", 2), ("a", 2), ("b", 1), ("a", 1), ("a", 3), ("b", 1), ("a", 1)]


def _rotating_workload(h: Durable) -> list[Callable[[], object]]:
    steps: list[Callable[[], object]] = [
        h.open,
        lambda: h.put_topic("a", {"durability": "fsync"}),
        lambda: h.put_topic("b", {"durability": "fsync"}),
    ]
    for i, (topic, n) in enumerate(ROTATING):
        steps.append(lambda t=topic, n=n, i=i: h.write(t, make_records(f"{t}{i}", n, size=120)))
    return steps


@pytest.mark.parametrize("flavour", CRASH_FLAVOURS, ids=flavour_id)
def test_sweep_across_wal_file_rotation(flavour: tuple[str, str | None, int]) -> None:
    """1 KiB WAL files: the workload rotates several times; crash at (sampled) every op,
    including between the full file's sync, the new file's zero-fill/sync/dir-sync
    and the CURRENT update."""
    errs = _rotation_sweep(flavour, samples=10)
    assert not errs, "\n".join(errs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["subset", "torn_last"])
def test_sweep_rotation_every_point_many_seeds(mode: str) -> None:
    """Full tier: every crash point of the rotating workload under 12 damage seeds."""
    errs: list[str] = []
    damages = ["prefix", "zero_sector", "garble"] if mode == "torn_last" else [None]
    for seed in range(100, 112):
        damage = damages[seed % len(damages)]
        errs += _rotation_sweep((mode, damage, seed), samples=None)
    assert not errs, "\n".join(errs)


def _rotation_sweep(flavour: tuple[str, str | None, int], samples: int | None) -> list[str]:
    mode, damage, seed = flavour

    def make(disk: FakeDisk) -> Durable:
        return Durable(disk, shards=1, file_bytes=1024)

    probe = FakeDisk()
    hp = make(probe)
    try:
        _run(hp, _rotating_workload(hp))
        assert all(b.ok for b in hp.history.batches)
        assert hp.journal is not None and hp.journal.shards[0].metrics.rotations >= 2
        hp.close()
    finally:
        hp.shutdown()
    errs: list[str] = []
    points = range(probe.ops + 1) if samples is None else crash_points(probe.ops, samples)
    for k in points:
        disk = FakeDisk()
        h = make(disk)
        try:
            if k == 0:
                disk.crash(mode, damage, seed)  # type: ignore[arg-type]
            else:
                disk.crash_after(k, mode, damage, seed)  # type: ignore[arg-type]
            _run(h, _rotating_workload(h))
            ctx = f"k={k} {flavour_id(flavour)} crashed after {disk.trace[-1:]}"
            if not disk.frozen:
                h.crash(mode, damage, seed)
            h.crash_and_recover()
            atomic = mode != "torn_last"
            errs += check_oracle(h, context=ctx, atomic_batches=atomic)
            fp = h.fingerprint()
            for topic in ("a", "b"):
                if topic in h.eng().topics:
                    out = h.write(topic, make_records(f"{topic}-after", 2, size=120))
                    if not out.ok:
                        errs.append(f"write after recovery failed: {out.status} [{ctx}]")
            h.crash_and_recover()
            errs += check_oracle(h, context=ctx + " (2)", atomic_batches=atomic)
            if not set(fp) <= set(h.fingerprint()):
                errs.append(f"topics lost on the second recovery [{ctx}]")
            h.close()
        finally:
            h.shutdown()
    return errs


def test_lying_fsync_loses_acks_but_never_fabricates_or_leaves_a_gap() -> None:
    """fsync that returns success without persisting (anchors f_nfs_fsync_lies): acked
    writes may be lost, but what survives is a dense prefix with nothing fabricated."""
    disk = FakeDisk()
    with Durable(disk, shards=2) as h:
        _run(h, _workload(h, MULTI))
        h.settle()
        pre = list(h.history.acked())
        disk.lying_fsync = True
        for i in range(4):
            assert h.write("a", make_records(f"lie{i}", 2)).ok
        h.crash_and_recover()
        disk.lying_fsync = False
        errs = check_oracle(h, must_survive=(), context="lying fsync")
        assert not errs, "\n".join(errs)
        # Everything acked before the lies began is durable.
        live = {(t, r["$seq"]) for t in ("a", "b") for r in h.read_all(t) or []}
        for b in pre:
            assert {(b.topic, s) for s in b.seqs} <= live, (
                f"batch {b.id} acked before the lies lost"
            )
        h.close()
