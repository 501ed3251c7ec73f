"""TagIndex: Eq point lookups, Glob prefix range scans, front reclaim by heap."""

from __future__ import annotations

import random

import pytest

from topics.engine.tags import TagIndex


def test_eq_prefix_and_bounds() -> None:
    t = TagIndex()
    for seq, tag in enumerate(["a", "ab", "b", "a", "abc", "ab"], start=1):
        t.add(tag, seq)
    assert t.eq("a", 100) == [1, 4] and t.eq("a", 4) == [1] and t.eq("zz", 9) == []
    assert t.prefix("a", 100) == [1, 2, 4, 5, 6]
    assert t.prefix("ab", 6) == [2, 5]
    assert t.prefix("", 100) == [1, 2, 3, 4, 5, 6]
    t.drop_upto(1)
    assert t.eq("a", 100) == [4] and t.prefix("", 100) == [2, 3, 4, 5, 6]
    t.drop_upto(5)
    assert t.eq("ab", 100) == [6] and t.eq("abc", 100) == []
    assert "abc" not in t._keys and len(t) == 1
    t.drop_upto(6)
    assert len(t) == 0 and t._keys == [] and t._heads == []


def test_drop_upto_touches_only_tags_with_old_postings() -> None:
    t = TagIndex()
    for i in range(1, 1001):
        t.add(f"k{i % 10}", i)
    t.drop_upto(995)
    assert sorted(s for k in list(t._post) for s in t.eq(k, 10_000)) == list(range(996, 1001))
    assert len(t) == 5 and len(t._heads) == 5


def test_unicode_prefix_is_bytewise_ordered() -> None:
    t = TagIndex()
    t.add("é1", 1)
    t.add("e1", 2)
    t.add("éz", 3)
    assert t.prefix("é", 10) == [1, 3]


@pytest.mark.parametrize("seed", range(6))
def test_add_many_is_add_for_each(seed: int) -> None:
    rnd = random.Random(seed)
    one, many = TagIndex(), TagIndex()
    seq = 1
    for _ in range(30):
        # Small batches insert their new keys, large ones (> 16 new) merge them in.
        n = rnd.choice([1, 5, 40, 300])
        tags = [
            rnd.choice([None, f"k{rnd.randrange(2000)}", f"a{rnd.randrange(9)}"]) for _ in range(n)
        ]
        for i, tag in enumerate(tags):
            if tag is not None:
                one.add(tag, seq + i)
        many.add_many(tags, seq)
        seq += n
        if rnd.random() < 0.3:
            cut = rnd.randrange(1, seq)
            one.drop_upto(cut)
            many.drop_upto(cut)
        assert many._post == one._post and many._keys == one._keys == sorted(one._post)
        assert sorted(many._heads) == sorted(one._heads)
        assert many.prefix("k1", seq) == one.prefix("k1", seq)
