"""What the engine needs from durable storage: the journal seam.

The engine hands every mutation to a :class:`Journal` before (or, for staged
writes, instead of) making it visible. :class:`MemoryJournal` is the in-memory
implementation: it commits every staged write at once and keeps nothing. The
WAL-backed journal (sharded, group-committed; docs/ARCHITECTURE.md, "The write path")
implements the same protocol and completes writes from its writer threads through the
event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from topics.engine.params import Predicate
    from topics.engine.routers import Router
    from topics.engine.topic import PendingWrite, Topic
    from topics.engine.topic_config import TopicConfig

__all__ = ["Journal", "MemoryJournal"]


class Journal(Protocol):
    """Durable log of engine mutations (the WAL, or nothing for memory mode)."""

    def submit_write(self, pw: PendingWrite) -> None:
        """Log a staged batch; call `pw.topic.complete(pw, ok)` once committed."""
        ...

    def topic_created(self, t: Topic, on_failure: Callable[[], None] | None = None) -> None:
        """Log a topic create; `on_failure()` runs on the loop if it cannot be committed.

        Raises TopicsError when the log refuses it (nothing is called then).
        """
        ...

    def config_updated(
        self, t: Topic, cfg: TopicConfig, on_failure: Callable[[], None] | None = None
    ) -> None:
        """Log a config change; `on_failure()` as for :meth:`topic_created`."""
        ...

    def topic_deleted(self, t: Topic) -> None: ...

    def records_deleted(
        self,
        t: Topic,
        before_seq: int | None,
        pred: Predicate | None,
        bound: int,
        on_commit: Callable[[bool], None],
    ) -> None:
        """Log a record delete; `on_commit(ok)` runs on the loop once it is committed.

        The engine applies the delete only in `on_commit(True)` (WAL-first:
        logged before applied). Raises TopicsError when the log refuses it (nothing
        is called then).
        """
        ...

    def seqs_deleted(self, t: Topic, seqs: list[int], on_commit: Callable[[bool], None]) -> None:
        """An explicit-seq delete (queue acks, dead-letter moves); as :meth:`records_deleted`."""
        ...

    def router_put(self, r: Router) -> None:
        """A router created or updated (definition, cursor, dest base)."""
        ...

    def router_deleted(self, r: Router) -> None: ...

    def evict_watermark(self, t: Topic) -> None:
        """The topic's involuntary floors (`l_cap`, `l_ttl`, `l_trim`) advanced."""
        ...

    def lease_event(
        self,
        t: Topic,
        kind: str,
        seq: int,
        node: str,
        lease_id: int,
        deadline: int,
        deliveries: int,
    ) -> None:
        """A leases-log event (`claimed`, `released`, `extended`, `acked`)."""
        ...


class MemoryJournal:
    """No durability: every staged write commits immediately."""

    def submit_write(self, pw: PendingWrite) -> None:
        pw.topic.complete(pw, True)

    def topic_created(self, t: Topic, on_failure: Callable[[], None] | None = None) -> None:
        pass

    def config_updated(
        self, t: Topic, cfg: TopicConfig, on_failure: Callable[[], None] | None = None
    ) -> None:
        pass

    def topic_deleted(self, t: Topic) -> None:
        pass

    def records_deleted(
        self,
        t: Topic,
        before_seq: int | None,
        pred: Predicate | None,
        bound: int,
        on_commit: Callable[[bool], None],
    ) -> None:
        on_commit(True)

    def seqs_deleted(self, t: Topic, seqs: list[int], on_commit: Callable[[bool], None]) -> None:
        on_commit(True)

    def router_put(self, r: Router) -> None:
        pass

    def router_deleted(self, r: Router) -> None:
        pass

    def evict_watermark(self, t: Topic) -> None:
        pass

    def lease_event(
        self,
        t: Topic,
        kind: str,
        seq: int,
        node: str,
        lease_id: int,
        deadline: int,
        deliveries: int,
    ) -> None:
        pass
