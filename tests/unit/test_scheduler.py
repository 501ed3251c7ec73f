"""The delivery scheduler's ready set (banded DWRR, aging) and governor (docs/SCHEDULER.md)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topics.engine.scheduler import (
    AGE_CAP_MS,
    AGE_TICK_MS,
    BAND_WEIGHTS,
    COALESCE_MAX_MS,
    COMMIT_WINDOW_MAX_MS,
    DEFER_SAMPLES,
    Governor,
    ReadySet,
    age_boost,
    band_of,
)


def test_bands_follow_the_priority_floors() -> None:
    assert [band_of(p) for p in (1000, 750, 749, 500, 499, 250, 249, 0, -1, -1000)] == [
        4, 4, 3, 3, 2, 2, 1, 1, 0, 0,
    ]  # fmt: skip


def test_aging_is_100_per_second_capped_at_1000() -> None:
    assert age_boost(0) == 0
    assert age_boost(500) == 50
    assert age_boost(10_000) == 1000
    assert age_boost(60_000) == 1000


def test_marking_twice_keeps_one_entry_and_the_first_enqueued_at() -> None:
    rs: ReadySet[str] = ReadySet(lambda k: 0)
    assert rs.mark("a", 10.0)
    assert not rs.mark("a", 20.0)
    assert len(rs) == 1 and rs.enqueued_ms("a") == 10.0 and rs.coalesced == 1
    assert rs.pop() == "a"
    assert rs.pop() is None
    assert rs.mark("a", 30.0) and rs.enqueued_ms("a") == 30.0  # reset only by service


def test_fifo_within_a_band() -> None:
    rs: ReadySet[str] = ReadySet(lambda k: 100)
    for i, k in enumerate("abcde"):
        rs.mark(k, float(i))
    assert [rs.pop() for _ in range(5)] == list("abcde")


def drain_shares(prio: dict[str, int], services: int) -> Counter[int]:
    """Serve `services` keys while every key is re-marked right after its service."""
    rs: ReadySet[str] = ReadySet(lambda k: prio[k])
    for k in prio:
        rs.mark(k, 0.0)
    by_band: Counter[int] = Counter()
    for _ in range(services):
        k = rs.pop()
        assert k is not None
        by_band[band_of(prio[k])] += 1
        rs.mark(k, 0.0)
    return by_band


def test_dwrr_serves_bands_in_proportion_to_their_weights() -> None:
    prio = {f"b{b}-{i}": p for b, p in enumerate((-100, 100, 300, 600, 900)) for i in range(3)}
    shares = drain_shares(prio, 16 * 100)
    for b, w in enumerate(BAND_WEIGHTS):
        assert shares[b] == w * 100, shares


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=3),
        st.integers(-1000, 1000),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 8),
)
def test_dwrr_shares_by_weight_over_rounds(prio: dict[str, int], rounds: int) -> None:
    bands = {band_of(p) for p in prio.values()}
    per_round = sum(BAND_WEIGHTS[b] for b in bands)
    shares = drain_shares(prio, per_round * rounds)
    assert {b: shares[b] for b in bands} == {b: BAND_WEIGHTS[b] * rounds for b in bands}


def test_no_starvation_under_sustained_top_band_load() -> None:
    """A B0 topic is served within the aging bound while B4 topics never stop."""
    prio = {f"hot{i}": 900 for i in range(50)}
    prio["cold"] = -1000
    rs: ReadySet[str] = ReadySet(lambda k: prio[k])
    now = 0.0
    for k in prio:
        rs.mark(k, now)
    served_cold_at = None
    while served_cold_at is None:
        now += 1.0  # one service per ms, far more work than one round
        if now % AGE_TICK_MS == 0:
            rs.age(now)
        k = rs.pop()
        assert k is not None
        if k == "cold":
            served_cold_at = now
        else:
            rs.mark(k, now)
    assert served_cold_at <= AGE_CAP_MS + AGE_TICK_MS


def test_aging_moves_a_waiting_key_up_and_keeps_its_place_by_age() -> None:
    prio = {"old": 0, "new": 700}
    rs: ReadySet[str] = ReadySet(lambda k: prio[k])
    rs.mark("old", 0.0)
    rs.mark("new", 999.0)
    assert rs.band("old") == 1 and rs.band("new") == 3
    assert rs.age(7_600.0) == 2  # old: 0 + 760 -> B4; new: 700 + 660 -> B4
    assert rs.band("old") == 4
    assert rs.pop() == "old"  # the same band now, and it waited longer


def test_deferred_b0_gets_no_credit_until_resumed() -> None:
    prio = {"low": -5, "mid": 100}
    rs: ReadySet[str] = ReadySet(lambda k: prio[k])
    rs.defer_b0 = True
    rs.mark("low", 0.0)
    assert rs.pop() is None and "low" in rs
    rs.mark("mid", 0.0)
    assert rs.pop() == "mid"
    assert rs.pop() is None
    rs.defer_b0 = False
    assert rs.pop() == "low"


def test_a_demoted_key_sits_one_band_lower() -> None:
    rs: ReadySet[str] = ReadySet(lambda k: 600)
    rs.mark("t", 0.0, demoted=True)
    assert rs.band("t") == 2


def test_discard_forgets_a_key() -> None:
    rs: ReadySet[str] = ReadySet(lambda k: 0)
    rs.mark("a", 0.0)
    rs.mark("b", 0.0)
    rs.discard("a")
    rs.discard("zzz")
    assert len(rs) == 1 and rs.depth()[1] == 1
    assert rs.pop() == "b" and rs.pop() is None


# ------------------------------------------------------------------- governor


def test_pressure_is_the_largest_of_its_three_terms() -> None:
    g = Governor(workers=1)
    assert g.sample(depth=0, pool_busy=0.0) == 0.0
    assert g.sample(depth=1 + 32, pool_busy=0.1) == pytest.approx(0.5)
    assert g.sample(depth=0, pool_busy=0.7) == pytest.approx(0.7)
    for _ in range(50):
        g.observe(10.0)
    assert g.sample(depth=0, pool_busy=0.0) == pytest.approx(1.0, abs=0.01)


def test_the_ladder_steps_at_its_thresholds() -> None:
    g = Governor()
    g.sample(0, 0.2)
    assert g.coalesce_ms == 0.0 and g.commit_window_ms == 0.0
    g.sample(0, 0.3)
    assert 0.0 < g.coalesce_ms < COALESCE_MAX_MS and g.commit_window_ms == 0.0
    g.sample(0, 0.4)
    assert g.commit_window_ms == 0.0
    g.sample(0, 0.5)
    assert g.commit_window_ms == pytest.approx(0.5 + 9.5 * 0.5)
    g.sample(0, 1.0)
    assert g.coalesce_ms == COALESCE_MAX_MS and g.commit_window_ms == COMMIT_WINDOW_MAX_MS


def test_deferral_needs_sustained_pressure_and_ends_below_the_lower_threshold() -> None:
    g = Governor()
    for _ in range(DEFER_SAMPLES - 1):
        g.sample(0, 0.9)
    assert not g.deferring
    g.sample(0, 0.5)  # the run is broken
    for _ in range(DEFER_SAMPLES - 1):
        g.sample(0, 0.9)
    assert not g.deferring
    g.sample(0, 0.85)
    assert g.deferring
    g.sample(0, 0.7)  # between the thresholds: still deferring (hysteresis)
    assert g.deferring
    g.sample(0, 0.59)
    assert not g.deferring
    assert g.deferrals == 2


def test_writes_are_refused_only_with_the_queue_full_and_pressure_high() -> None:
    g = Governor()
    g.sample(0, 0.9)
    assert not g.refuse_write(queue_full=True)
    g.sample(0, 1.0)
    assert not g.refuse_write(queue_full=True)  # a burst: not sustained yet
    g.sample(0, 1.0)
    assert g.deferring and g.refuse_write(queue_full=True)
    assert not g.refuse_write(queue_full=False)
    g.sample(0, 0.9)
    assert g.deferring and not g.refuse_write(queue_full=True)


def test_a_disabled_governor_never_presses() -> None:
    g = Governor(enabled=False)
    for _ in range(10):
        g.observe(100.0)
        assert g.sample(1000, 1.0) == 0.0
    assert not g.deferring and not g.refuse_write(True) and g.coalesce_ms == 0.0


def test_pacing_climbs_with_pressure_and_decays_slowly() -> None:
    g = Governor()
    g.sample(0, 0.5)
    assert g.pace == 0.25
    for _ in range(5):
        g.sample(0, 0.9)
    assert g.pace == 1.0
    assert [g.pace_ms_for(b) for b in range(5)] == [20.0, 15.0, 10.0, 5.0, 0.0]
    g.sample(0, 0.3)  # between the steps: held
    assert g.pace == 1.0
    g.sample(0, 0.1)
    assert g.pace == pytest.approx(0.95)
    for _ in range(30):
        g.sample(0, 0.0)
    assert g.pace == 0.0
