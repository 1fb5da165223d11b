"""Adversarial review for exactness (issue #43 item 10): each test reproduces a finding on the
real node and asserts the correct behaviour, so it fails until the engine is fixed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.core import utc_aware
from counters.store import Store

from .helpers import aware, rows_at_or_below

pytestmark = pytest.mark.integration


def test_a_rival_commit_between_the_ledger_and_the_copies_read_quarantines_nothing(
    conn, make_family, t0
):
    """Run A reads X's ledger row (commit C1); run B commits C2 and writes its copy; A reads
    the copies: C2's. ``fold_bases`` reads the ledger again and clears the suspicion, but the fold
    keeps C1 as its base, and ``against_readers`` (``core.readers_base``) refuses it: copy
    of C2, fold on C1, copy not behind. X is quarantined as ``check_failed`` (a false alarm:
    the fold would have lost its compare-and-set and been folded again on C2)."""
    family, store, client = make_family(shards=1)
    x = ("X",)
    client.record([Increment(x, 1, utc_aware(t0 + timedelta(minutes=1)), ("w", 1))])
    first = engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert first.outcome == "success"
    client.record([Increment(x, 2, utc_aware(t0 + timedelta(minutes=3)), ("w", 3))])
    client.record([Increment(x, 4, utc_aware(t0 + timedelta(minutes=5)), ("w", 5))])

    racing = Store(conn, family, store.layout, concurrency=8)
    store_a = Store(conn, family, store.layout, concurrency=8)
    read_copies, read_ledger = store_a.ledger.read_copies, store_a.ledger.read_ledger
    raced: list[engine.RunOutcome] = []
    started: list[bool] = []
    ledger_read: list[bool] = []

    here = store.keys.bucket(x)

    def ledger_then_flag(shard, bucket, *args, **kwargs):
        found = read_ledger(shard, bucket, *args, **kwargs)
        if (shard, bucket) == here:
            ledger_read.append(True)
        return found

    def copies_after_a_rival_commit(shard, bucket, *args, **kwargs):
        # once, between A's ledger read of X's bucket and its copies read
        if (shard, bucket) == here and ledger_read and not started:
            started.append(True)
            raced.append(
                engine.run_family(
                    racing, t0 + timedelta(minutes=4), "B", use_lease=False,
                    now=t0 + timedelta(minutes=6),
                )
            )  # fmt: skip
        return read_copies(shard, bucket, *args, **kwargs)

    store_a.ledger.read_copies = copies_after_a_rival_commit
    store_a.ledger.read_ledger = ledger_then_flag
    try:
        a = engine.run_family(
            store_a, t0 + timedelta(minutes=6), "A", use_lease=False, now=t0 + timedelta(minutes=8)
        )
    except engine.ChecksFailed as failed:
        pytest.fail(f"a false alarm: {failed}")
    assert raced and raced[0].outcome == "success"
    assert a.outcome == "success" and a.tally.counters_quarantined == 0, a.tally
    assert engine.quarantined(store) == []
    assert client.read("X") == 7 and rows_at_or_below(store, x, t0 + timedelta(minutes=6)) == 0


class Crash(BaseException):
    """Stands for the process dying: no handler in the engine runs."""


def test_a_dry_run_after_a_crash_before_the_first_copy_reports_no_quarantine(make_family, t0):
    """X's first commit applies, then the run dies before its copy (``commit`` point): readers
    read X from its raw rows, exact. A dry run then folds X's new row: the copy is missing,
    but only a real run marks it ``restore`` (``_compact_bucket``: ``missing and not
    ctx.dry_run``), so ``core.readers_base`` sees no copy and a base with a commit, and the
    dry run reports X quarantined (``check_failed``), which the real run never does."""
    _family, store, client = make_family(shards=1)
    x = ("X",)
    client.record([Increment(x, 1, utc_aware(t0 + timedelta(minutes=1)), ("w", 1))])

    def crash(point):
        if point == "commit":
            raise Crash(point)

    epoch = t0 + timedelta(minutes=2)
    with pytest.raises(Crash):
        engine.run_family(store, epoch, fault=crash, now=epoch + timedelta(minutes=2))
    client.record([Increment(x, 2, utc_aware(t0 + timedelta(minutes=3)), ("w", 3))])
    assert client.read("X") == 3
    later = t0 + timedelta(minutes=4)
    dry = engine.run_family(store, later, dry_run=True, now=later + timedelta(minutes=2))
    assert dry.tally.counters_quarantined == 0, dry.message
    real = engine.run_family(store, later, now=later + timedelta(minutes=2))
    assert real.outcome == "success" and real.tally.counters_quarantined == 0, real.message
    assert client.read("X") == 3 and engine.quarantined(store) == []


def test_a_reset_between_a_runs_ledger_and_copies_read_quarantines_nothing(conn, make_family, t0):
    """The same interleaving with an operator's ``counterctl reset`` as the rival: the reset
    commits (0, its point) and writes its copy after run A read X's ledger row and before A
    reads the copies. ``core.readers_base`` refuses A's fold on the pre-reset commit and X is
    quarantined, though the fold would lose its compare-and-set and be refolded on the reset."""
    family, store, client = make_family(shards=1)
    x = ("X",)
    client.record([Increment(x, 1, utc_aware(t0 + timedelta(minutes=1)), ("w", 1))])
    first = engine.run_family(store, t0 + timedelta(minutes=2), now=t0 + timedelta(minutes=4))
    assert first.outcome == "success"
    client.record([Increment(x, 2, utc_aware(t0 + timedelta(minutes=3)), ("w", 3))])
    client.record([Increment(x, 4, utc_aware(t0 + timedelta(minutes=5)), ("w", 5))])

    operator = Store(conn, family, store.layout, concurrency=8)
    store_a = Store(conn, family, store.layout, concurrency=8)
    read_copies, read_ledger = store_a.ledger.read_copies, store_a.ledger.read_ledger
    here = store.keys.bucket(x)
    ledger_read: list[bool] = []
    reset: list[object] = []

    def ledger_then_flag(shard, bucket, *args, **kwargs):
        found = read_ledger(shard, bucket, *args, **kwargs)
        if (shard, bucket) == here:
            ledger_read.append(True)
        return found

    def copies_after_a_reset(shard, bucket, *args, **kwargs):
        if (shard, bucket) == here and ledger_read and not reset:
            point = t0 + timedelta(minutes=3, seconds=30)
            reset.append(
                engine.reset_counter(operator, x, aware(point), now=t0 + timedelta(minutes=7))
            )  # fmt: skip
        return read_copies(shard, bucket, *args, **kwargs)

    store_a.ledger.read_copies = copies_after_a_reset
    store_a.ledger.read_ledger = ledger_then_flag
    try:
        a = engine.run_family(
            store_a, t0 + timedelta(minutes=6), "A", use_lease=False, now=t0 + timedelta(minutes=8)
        )
    except engine.ChecksFailed as failed:
        pytest.fail(f"a false alarm: {failed}")
    assert reset and a.outcome == "success" and a.tally.counters_quarantined == 0, a.tally
    assert engine.quarantined(store) == []
    assert client.read("X") == 4
