"""ENOSPC (or EIO) at every write of a checkpoint: nothing is lost, the next one succeeds.

The disk fills at the n-th `pwrite` of a checkpoint cycle (its CheckpointMark in
the WAL, a segment's `.data` or `.idx`, the snapshot, a delete flag), and stays
full. The cycle fails; every record still reads back; WAL writes get 507 while
the disk is full. Once space returns, writes resume without a restart, the next
checkpoint succeeds, and after a power loss the state is exactly what was
acknowledged.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.durable import Durable, check_oracle, fingerprint_equal, make_records
from tests.support.fakedisk import FakeDisk, FaultFs
from topics.errors import TopicsError
from topics.storage.checkpoint import CheckpointFailed


def _rich(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"data": {"u": f"{prefix}.{i}"}, "tag": f"t{i % 2}"} for i in range(n)]


def _count_checkpoint_pwrites() -> int:
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1, segment_max_events=8) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", _rich("a", 20)).ok
        before = fault.counts["pwrite"]
        h.checkpoint()
        n = fault.counts["pwrite"] - before
        h.close()
    return n


@pytest.mark.parametrize("kind", ["ENOSPC", "EIO"])
@pytest.mark.parametrize("nth", range(1, 11))
def test_a_failed_write_anywhere_in_a_checkpoint_loses_nothing(nth: int, kind: str) -> None:
    """ENOSPC stays until space returns; EIO fails one write. Either way the cycle
    fails, the next one rewrites what the failed one left, nothing is lost."""
    if nth > _count_checkpoint_pwrites():
        pytest.skip("the cycle has fewer writes")
    disk = FakeDisk()
    fault = FaultFs(disk)
    with Durable(fault, shards=1, segment_max_events=8) as h:
        h.open()
        assert h.put_topic("a", {"durability": "fsync"})
        assert h.write("a", _rich("a", 20)).ok
        want = h.fingerprint()
        rule = fault.fail("pwrite", nth, kind, persistent=kind == "ENOSPC")  # type: ignore[arg-type]
        try:
            h.checkpoint()
        except (CheckpointFailed, OSError, TopicsError):
            pass
        errs = fingerprint_equal(want, h.fingerprint())
        assert not errs, f"reads go on, unchanged: {errs}"
        fault.rules.remove(rule)  # space returns
        deadline = time.monotonic() + 5
        while True:
            out = h.write("a", make_records("after", 1))
            if out.ok or time.monotonic() > deadline:
                break
            assert out.status in (500, 507), out
            time.sleep(0.02)
        assert out.ok, out
        h.checkpoint()
        h.crash_and_recover(fs=disk)
        errs = check_oracle(h, allow_unacked=False, context=f"{kind} at pwrite {nth}")
        assert not errs, "\n".join(errs)
        h.close()
