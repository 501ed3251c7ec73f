"""TagIndex: Eq point lookups and Glob prefix range scans over live seqs."""

from __future__ import annotations

from topics.engine.tags import TagIndex


def test_eq_prefix_and_bounds() -> None:
    t = TagIndex()
    for seq, tag in enumerate(["a", "ab", "b", "a", "abc", "ab"], start=1):
        t.add(tag, seq)
    assert t.eq("a", 100) == [1, 4] and t.eq("a", 4) == [1] and t.eq("zz", 9) == []
    assert t.prefix("a", 100) == [1, 2, 4, 5, 6]
    assert t.prefix("ab", 6) == [2, 5]
    assert t.prefix("", 100) == [1, 2, 3, 4, 5, 6]
    t.remove("a", 1)
    t.remove("a", 99)
    assert t.eq("a", 100) == [4]
    t.remove_upto("ab", 5)
    assert t.eq("ab", 100) == [6]
    t.remove("ab", 6)
    assert "ab" not in t._keys and len(t) == 3


def test_unicode_prefix_is_bytewise_ordered() -> None:
    t = TagIndex()
    t.add("é1", 1)
    t.add("e1", 2)
    t.add("éz", 3)
    assert t.prefix("é", 10) == [1, 3]
