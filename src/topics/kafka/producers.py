"""Idempotent-producer bookkeeping: producer ids and per-partition sequence checks.

Kafka's idempotent producer numbers its batches per partition (`baseSequence`,
wrapping at 2^31). The broker keeps, per (producer id, topic instance), the
epoch, the next expected sequence and the last five batches with the offset
each got. A retried batch that matches one of those is answered with the
original offset and written nothing (offsets must stay
contiguous: a retry must not append twice); a gap is refused with
OUT_OF_ORDER_SEQUENCE_NUMBER and an older epoch with INVALID_PRODUCER_EPOCH.

This state lives in memory. After a restart a producer's next batch is taken
as-is (whatever its sequence), like a Kafka broker whose producer state has
expired; duplicates of batches acknowledged before the restart are then not
detected.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from topics.kafka import errors as E

__all__ = ["ProducerIds", "SequenceTable", "Accept", "Duplicate"]

SEQ_MOD = 1 << 31
KEEP_BATCHES = 5
MAX_STATES = 100_000


class ProducerIds:
    """Allocates producer ids that do not repeat across restarts.

    Ids start at the wall-clock milliseconds at startup times 1000 (well inside
    int64), so a restarted server does not hand out an id an old producer may
    still be using unless it allocated more than 1000 ids per millisecond of uptime.
    """

    def __init__(self, now_ms: int) -> None:
        self._next = now_ms * 1000

    def allocate(self) -> int:
        pid = self._next
        self._next += 1
        return pid


class Accept:
    """The batch is new: write it, then call :meth:`SequenceTable.record`."""

    __slots__ = ()


class Duplicate:
    """The batch was already written: answer with its offset (`staged` may still commit)."""

    __slots__ = ("entry",)

    def __init__(self, entry: list[Any]) -> None:
        self.entry = entry


_ACCEPT = Accept()


class _State:
    __slots__ = ("epoch", "next_seq", "batches")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.next_seq = -1  # unknown: the first batch seen sets it
        # [first_seq, last_seq, base_offset, ts, staged]
        self.batches: deque[list[Any]] = deque(maxlen=KEEP_BATCHES)


class SequenceTable:
    """Per (producer id, topic instance) sequence state, bounded in size (LRU)."""

    def __init__(self) -> None:
        self._states: OrderedDict[tuple[int, int], _State] = OrderedDict()

    def check(
        self, pid: int, epoch: int, instance: int, first: int, count: int
    ) -> Accept | Duplicate | int:
        """Classify a batch: :class:`Accept`, :class:`Duplicate`, or a Kafka error code."""
        key = (pid, instance)
        st = self._states.get(key)
        if st is None:
            return _ACCEPT
        self._states.move_to_end(key)
        if epoch < st.epoch:
            return E.INVALID_PRODUCER_EPOCH
        if epoch > st.epoch:
            return _ACCEPT if first == 0 else E.OUT_OF_ORDER_SEQUENCE_NUMBER
        last = (first + count - 1) % SEQ_MOD
        for b in st.batches:
            if b[0] == first and b[1] == last:
                return Duplicate(b)
        if st.next_seq >= 0 and first != st.next_seq:
            return E.OUT_OF_ORDER_SEQUENCE_NUMBER
        return _ACCEPT

    def record(
        self,
        pid: int,
        epoch: int,
        instance: int,
        first: int,
        count: int,
        base_offset: int,
        ts: int,
        staged: Any,
    ) -> list[Any]:
        """Remember an accepted batch; returns its entry (for :meth:`forget`)."""
        key = (pid, instance)
        st = self._states.get(key)
        if st is None or epoch != st.epoch:
            st = _State(epoch)
            self._states[key] = st
            if len(self._states) > MAX_STATES:
                self._states.popitem(last=False)
        last = (first + count - 1) % SEQ_MOD
        entry = [first, last, base_offset, ts, staged]
        st.batches.append(entry)
        st.next_seq = (last + 1) % SEQ_MOD
        return entry

    def forget(self, pid: int, instance: int) -> None:
        """Drop a producer's state for a topic (its batch failed to commit)."""
        self._states.pop((pid, instance), None)
