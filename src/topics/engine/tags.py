"""Tag index: tag -> ascending seqs, with ordered keys for prefix scans.

Maintained on publish and front reclaim; consulted only by deletes (`match`
Eq / Glob), never by reads. Postings may still name seqs that
were deleted in the middle of the log: the delete path skips them (a deleted
slot carries the flag), and they leave with the front reclaim, like the slot
itself. Front reclaim is cheap however many tags exist: a min-heap keyed by
each tag's oldest posting finds exactly the tags that lose postings.

Python string order is code point order, which equals UTF-8 byte order, so the
sorted key list gives the bytewise range scan a `Glob` prefix needs.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable

__all__ = ["TagIndex"]

# More new keys than this in one batch are merged in with a sort, fewer inserted.
_BULK_KEYS = 16


class TagIndex:
    """Sorted-key map from tag to the ascending list of seqs carrying it."""

    __slots__ = ("_post", "_keys", "_heads")

    def __init__(self) -> None:
        self._post: dict[str, list[int]] = {}
        self._keys: list[str] = []
        # (oldest posting, tag): one entry per tag, always equal to its list's head.
        self._heads: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._post)

    def add(self, tag: str, seq: int) -> None:
        """Record `seq` (always >= every seq already present for `tag`)."""
        lst = self._post.get(tag)
        if lst is None:
            self._post[tag] = [seq]
            insort(self._keys, tag)
            heapq.heappush(self._heads, (seq, tag))
        else:
            lst.append(seq)

    def add_many(self, tags: Iterable[str | None], first_seq: int) -> None:
        """Record the `i`-th of `tags` at seq `first_seq + i` (None: that seq has no tag).

        The same as :meth:`add` for each, with the same precondition, but the
        new keys of a large batch are sorted in once rather than inserted one by
        one.
        """
        post = self._post
        new: list[str] = []
        seq = first_seq
        for tag in tags:
            if tag is not None:
                lst = post.get(tag)
                if lst is None:
                    post[tag] = [seq]
                    new.append(tag)
                else:
                    lst.append(seq)
            seq += 1
        if not new:
            return
        keys = self._keys
        if len(new) > _BULK_KEYS:
            new.sort()
            keys.extend(new)
            keys.sort()  # two sorted runs: one merge
        else:
            for tag in new:
                insort(keys, tag)
        heads = self._heads
        for tag in new:
            heapq.heappush(heads, (post[tag][0], tag))

    def drop_upto(self, seq: int) -> None:
        """Forget every posting with a seq <= `seq` (front reclaim), across all tags."""
        heads = self._heads
        while heads and heads[0][0] <= seq:
            _s, tag = heapq.heappop(heads)
            lst = self._post[tag]
            del lst[: bisect_right(lst, seq)]
            if lst:
                heapq.heappush(heads, (lst[0], tag))
            else:
                del self._post[tag]
                i = bisect_left(self._keys, tag)
                del self._keys[i]

    def eq(self, tag: str, below: int) -> list[int]:
        """Seqs tagged exactly `tag` with seq < `below` (deleted ones included)."""
        lst = self._post.get(tag)
        if not lst:
            return []
        return lst[: bisect_left(lst, below)]

    def prefix(self, prefix: str, below: int) -> list[int]:
        """Seqs whose tag starts with `prefix` (ordered key range scan), seq < `below`."""
        out: list[int] = []
        keys = self._keys
        i = bisect_left(keys, prefix)
        while i < len(keys) and keys[i].startswith(prefix):
            lst = self._post[keys[i]]
            out.extend(lst[: bisect_left(lst, below)])
            i += 1
        out.sort()
        return out

    def clear(self) -> None:
        self._post.clear()
        self._keys.clear()
        self._heads.clear()
