"""A family that runs every minute for months: what its runs read must not grow with the runs
behind it. Each fold leaves a tombstone per row it deletes, kept ``gc_grace_seconds`` (3 h, 180
runs) and then until compaction purges it; a read that walked the tombstones of every earlier
run would be refused by the node past its ``tombstone_failure_threshold`` (100,000), however
few rows it returned. Running 14,400 runs is out of a test's reach; the node's own trace of
each read is not: a run's reads walk as many tombstones after 60 runs as after 10."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from cassandra import ReadFailure
from counters import engine

from .helpers import TombstoneTrace, plain_insert, rows_at_or_below
from .test_engine import inc, same_bucket

pytestmark = pytest.mark.integration

ROWS = 3  # per counter and minute


@pytest.mark.usefixtures("marks_forgotten_at_once")
@pytest.mark.parametrize("n", [4, 50], ids=["by-name", "by-scan"])
def test_a_runs_reads_walk_no_more_tombstones_after_sixty_runs_than_after_ten(make_family, t0, n):
    """``n`` counters of one bucket, each with ``ROWS`` rows every minute, a run every minute
    (no sweep falls in the hour): 4 are read by name (``IN``), 50 by a token-range scan. Every
    statement of run 61 walks no more tombstones than it did in run 11: every read starts
    above the rows the last commit counted, whatever lies behind."""
    _family, store, client = make_family(shards=1, sweep_interval="1d")
    counters = same_bucket(store, n)
    walked: dict[int, dict[str, int]] = {}
    with TombstoneTrace(store) as trace:
        for minute in range(61):
            client.record(
                [
                    inc(
                        c,
                        1,
                        t0 + timedelta(minutes=minute, seconds=10 * (j + 1)),
                        "w",
                        minute * 10 + j,
                    )
                    for c in counters
                    for j in range(ROWS)
                ]
            )
            trace.on = minute in (10, 60)
            epoch = t0 + timedelta(minutes=minute + 1)
            summary = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
            assert summary.outcome == "success", summary.message
            assert not summary.plan.sweep or minute == 0
            if trace.on:
                trace.on = False
                walked[minute] = trace.walked()
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(
        counters, 61 * ROWS
    )
    # the raw reads walk the tombstones of the last run's deletes (they read down to the rows
    # its commit counted, which may still be there), never those of the runs before it
    raw_table = f'."{store.family.raw_table}" '
    raw_reads = [text for text in walked[60] if text.startswith("SELECT") and raw_table in text]
    assert raw_reads and max(walked[60][t] for t in raw_reads) <= n * ROWS
    grew = {
        text: (walked[10].get(text, 0), count)
        for text, count in walked[60].items()
        if count > walked[10].get(text, 0)
    }
    assert not grew, f"reads that walk more tombstones after 60 runs than after 10: {grew}"


def test_a_sweep_of_a_bucket_past_the_tombstone_limit_folds_every_row_once(make_family, t0):
    """Fifty counters of one bucket, each well under the node's tombstone limit, the bucket
    past it together (110,000 deleted rows: a busy shard's ~3 h inside ``gc_grace_seconds``).
    The sweep's scan of the bucket is refused; it reads the bucket counter by counter instead
    and folds what only a sweep finds: a plain-CQL row below the last epoch (no mark) and a
    counter no one marked."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    names = same_bucket(store, 51)
    counters, stranger = names[:50], names[50]
    client.record(
        [inc(c, 1, t0 + timedelta(milliseconds=i), "w", i) for c in counters for i in range(2_200)]
    )
    e1 = t0 + timedelta(minutes=10)
    first = engine.run_family(store, e1, now=e1 + timedelta(minutes=2))
    assert (first.outcome, first.tally.rows_deleted) == ("success", 110_000), first.message
    shard, bucket = store.keys.bucket((stranger,))
    with pytest.raises(ReadFailure):  # the bucket is past the limit, no counter of it is
        store.raw.scan_rows(shard, bucket)
    assert store.raw.read_rows([(c,) for c in counters]) == {(c,): [] for c in counters}

    client.record([inc(c, 2, t0 + timedelta(minutes=12), "w", -1) for c in counters])
    stamp = int(time.time() * 1e6)
    plain_insert(store, counters[0], t0 + timedelta(minutes=5), "late", 100, stamp)
    plain_insert(store, stranger, t0 + timedelta(minutes=11), "new", 7, stamp)
    e2 = t0 + timedelta(minutes=31)  # the fixture's sweeps fall at t0 + 30 min, then hourly
    with TombstoneTrace(store) as trace:
        trace.on = True
        second = engine.run_family(store, e2, now=e2 + timedelta(minutes=2))
        trace.walked()
    assert second.plan.sweep and second.outcome == "success", second.message
    assert (second.tally.rows_folded, second.tally.rows_deleted) == (52, 52)
    values = {v.counter[0]: v.value for v in client.read_many(names)}
    assert values == {**dict.fromkeys(counters, 2_202), counters[0]: 2_302, stranger: 7}
    assert all(rows_at_or_below(store, (c,), e2) == 0 for c in names)
    # the node refused the bucket's scan once; the ledger keeps that for the next sweeps
    assert len(trace.refused) == 1 and "token(" in trace.refused[0]
    assert store.ledger.read_ledger(shard, bucket, None).scan_refused_ms is not None
    warning = {c.name: c for c in second.checks}["buckets_scanned_whole"]
    assert (warning.success, warning.critical, second.tally.buckets_by_counter) == (False, False, 1)
    assert "1 bucket(s) held more tombstones than the node reads past" in warning.detail
    assert "buckets_scanned_whole" not in {c.name for c in first.checks}

    client.record([inc(c, 3, e2 + timedelta(minutes=1), "w", -2) for c in names])
    plain_insert(store, counters[1], e2 - timedelta(minutes=1), "late", 1_000, stamp)
    e3 = t0 + timedelta(minutes=91)
    with TombstoneTrace(store) as trace:
        trace.on = True
        third = engine.run_family(store, e3, now=e3 + timedelta(minutes=2))
        trace.walked()
    assert third.plan.sweep and third.outcome == "success", third.message
    assert trace.refused == [] and third.tally.buckets_by_counter == 1  # by counter at once
    values = {v.counter[0]: v.value for v in client.read_many(names)}
    assert values == {
        **dict.fromkeys(counters, 2_205),
        counters[0]: 2_305,
        counters[1]: 3_205,
        stranger: 10,
    }
    assert all(rows_at_or_below(store, (c,), e3) == 0 for c in names)
