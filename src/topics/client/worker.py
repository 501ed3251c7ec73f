"""What the sync and async queue workers share (docs/API.md, "14. Queues")."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerStats", "lease_interval_s"]

#: The shortest lease the server grants (ms): it clamps `lease_ms` to 100-86400000.
MIN_LEASE_MS = 100


@dataclass(slots=True)
class WorkerStats:
    """What a worker did: jobs `handled` (the handler returned or raised), `acked`,
    `failed` (the handler raised; the job was nacked), `lost` (the lease was gone
    when the job was settled), and lease-extension requests sent (`extends`)."""

    handled: int = 0
    acked: int = 0
    failed: int = 0
    lost: int = 0
    extends: int = 0


def lease_interval_s(lease_ms: int, extend_every_ms: int | None) -> float:
    """Seconds between two extensions: `extend_every_ms`, else a third of the lease."""
    lease = max(lease_ms, MIN_LEASE_MS)
    every = extend_every_ms if extend_every_ms else lease // 3
    return max(every, 20) / 1000
