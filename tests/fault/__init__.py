"""WAL/recovery fault tests on FakeDisk (reliability-anchors §5 rows 1-4, 6, 12, 14).

All tests drive the real Engine + WalJournal + recovery through
:class:`tests.support.durable.Durable` and check the set oracle
(:func:`tests.support.durable.check_oracle`). Sweeps sample crash points with
``crash_points``; ``TOPICS_TEST_EXHAUSTIVE=1`` runs every point. Strict-xfail
tests document known gaps (their reasons say what is wrong); when one starts to
pass, drop its marker.
"""
