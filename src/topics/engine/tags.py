"""Tag index: tag -> ascending live seqs, with ordered keys for prefix scans.

Maintained on publish, delete and front reclaim; consulted only by deletes
(`match` Eq / Glob), never by reads (SEMANTICS §4). Python string order is code
point order, which equals UTF-8 byte order, so the sorted key list gives the
bytewise range scan a `Glob` prefix needs.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

__all__ = ["TagIndex"]


class TagIndex:
    """Sorted-key map from tag to the ascending list of live seqs carrying it."""

    __slots__ = ("_post", "_keys")

    def __init__(self) -> None:
        self._post: dict[str, list[int]] = {}
        self._keys: list[str] = []

    def __len__(self) -> int:
        return len(self._post)

    def add(self, tag: str, seq: int) -> None:
        """Record `seq` (always >= every seq already present for `tag`)."""
        lst = self._post.get(tag)
        if lst is None:
            self._post[tag] = [seq]
            insort(self._keys, tag)
        else:
            lst.append(seq)

    def _drop_key_if_empty(self, tag: str, lst: list[int]) -> None:
        if not lst:
            del self._post[tag]
            i = bisect_left(self._keys, tag)
            if i < len(self._keys) and self._keys[i] == tag:
                del self._keys[i]

    def remove(self, tag: str, seq: int) -> None:
        """Forget one (tag, seq) posting; a no-op if absent."""
        lst = self._post.get(tag)
        if lst is None:
            return
        i = bisect_left(lst, seq)
        if i < len(lst) and lst[i] == seq:
            del lst[i]
            self._drop_key_if_empty(tag, lst)

    def remove_upto(self, tag: str, seq: int) -> None:
        """Forget every posting of `tag` with a seq <= `seq` (front reclaim)."""
        lst = self._post.get(tag)
        if lst is None:
            return
        del lst[: bisect_right(lst, seq)]
        self._drop_key_if_empty(tag, lst)

    def eq(self, tag: str, below: int) -> list[int]:
        """Live seqs tagged exactly `tag` with seq < `below`."""
        lst = self._post.get(tag)
        if not lst:
            return []
        return lst[: bisect_left(lst, below)]

    def prefix(self, prefix: str, below: int) -> list[int]:
        """Live seqs whose tag starts with `prefix` (ordered key range scan), seq < `below`."""
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
