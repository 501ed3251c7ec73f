"""A read-only catalog of a data directory: topic names, floors and segment files.

For readers that work on the files directly (the Spark source, exports): the
newest valid metadata snapshot gives each topic's name, id and floors; each
topic directory (hot, and the cold tier when given) gives its segments. No
lock is taken and nothing is written, so it is safe while the server runs. It
reflects the last checkpoint: records still only in the WAL are not listed, and
deletes newer than the checkpoint are not yet flagged in `.idx`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from topics.storage.fs import Fs, RealFs
from topics.storage.segment import IDX_ENTRY_SIZE, scan_segments, topic_dir
from topics.storage.snapshot import load_latest

__all__ = ["SegmentRef", "CatalogTopic", "load_catalog"]


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment pair. `last_seq` counts the whole `.idx` entries present when listed."""

    first_seq: int
    last_seq: int
    data_path: str
    idx_path: str
    tier: str  # "hot" or "cold"
    sealed: bool  # False for the topic's newest segment (it may still grow)


@dataclass(frozen=True, slots=True)
class CatalogTopic:
    """A live topic instance as of the last checkpoint.

    Records with `seq < earliest_seq` are gone (evicted or deleted by
    `before_seq`); `evict_floor` is where involuntary loss ends (README "Durability and the data directory").
    """

    name: str
    topic_id: int
    earliest_seq: int
    evict_floor: int
    head_seq: int
    segments: list[SegmentRef]


def _segments(fs: Fs, root: str, topic_id: int, tier: str) -> dict[int, SegmentRef]:
    d = topic_dir(root, topic_id)
    out: dict[int, SegmentRef] = {}
    for first, paths in scan_segments(fs, d).segments:
        try:
            f = fs.open(paths.idx)
            try:
                n = f.size() // IDX_ENTRY_SIZE
            finally:
                f.close()
        except FileNotFoundError:
            continue  # removed while listing (a drop or a relocation)
        out[first] = SegmentRef(first, first + n - 1, paths.data, paths.idx, tier, True)
    return out


def load_catalog(
    data_dir: str, cold_dir: str | None = None, *, fs: Fs | None = None
) -> dict[str, CatalogTopic]:
    """Topic name -> :class:`CatalogTopic` for every live topic of the last snapshot.

    Segments are ascending by first seq; a segment present in both tiers is
    listed once, from the hot tier. Raises OSError when the directory cannot be
    read; an empty dict when no snapshot exists yet.
    """
    fs = fs or RealFs()
    found = load_latest(fs, os.path.join(data_dir, "meta"))
    if found is None:
        return {}
    _n, body = found
    out: dict[str, CatalogTopic] = {}
    for m in body.get("topics") or []:
        tid = int(m["id"])
        head = int(m.get("head", 0))
        l_inv = max(int(m.get("l_cap", 0)), int(m.get("l_ttl", 0)), int(m.get("l_trim", 0)))
        l_del = max(int(m.get("delete_below", 0)) - 1, 0)
        evict_floor = min(max(l_inv + 1, 1), head + 1)
        earliest = min(max(l_inv, l_del) + 1, head + 1)
        segs = _segments(fs, cold_dir, tid, "cold") if cold_dir else {}
        segs.update(_segments(fs, data_dir, tid, "hot"))
        ordered = [segs[k] for k in sorted(segs)]
        if ordered:
            last = ordered[-1]
            ordered[-1] = SegmentRef(
                last.first_seq, last.last_seq, last.data_path, last.idx_path, last.tier, False
            )
        name = str(m["name"])
        out[name] = CatalogTopic(name, tid, earliest, evict_floor, head, ordered)
    return out
