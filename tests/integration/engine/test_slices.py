"""A minute's run reads a busy bucket above its counters' counted rows (a clustering slice):
the tombstones of earlier folds behind it are never read, and nothing it must see lies there."""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine
from counters.core import to_millis

from .conftest import Crash
from .helpers import forget_marks, ledger_as_older_versions_wrote_it, rows_at_or_below
from .test_engine import inc, same_bucket
from .test_engine import run as run_once

pytestmark = pytest.mark.integration

N = 40  # at least SCAN_THRESHOLD touched counters: the bucket is scanned, not read by name


def _round(client, counters, start, base, rows=3):
    """``rows`` increments per counter, 10 s apart from ``start``, through the write API."""
    client.record(
        [
            inc(c, base + j, start + timedelta(seconds=10 * (j + 1)), "w", base + j)
            for c in counters
            for j in range(rows)
        ]
    )
    return sum(base + j for j in range(rows))


def run(store, epoch, **kw):
    """A run, then the marks it read forgotten, as a run minutes later finds them (a run keeps
    a mark younger than ``engine.FORGET_MARGIN``). One shard: every mark is in shard 0."""
    summary = run_once(store, epoch, **kw)
    forget_marks(store)
    return summary


def _family(make_family, t0, n=N, fresh=False):
    _family, store, client = make_family(shards=1, fresh=fresh)
    counters = same_bucket(store, n)
    # no sweep falls in these runs: every run after the first reads only marked counters
    store.state.advance_family_epoch(
        t0 - timedelta(days=1), "setup", swept_at=t0 + timedelta(days=2)
    )
    return store, client, counters


def _scans(store):
    calls = []
    scan = store.raw.scan_rows

    def recording(shard, bucket, after_ms=None):
        calls.append(after_ms)
        return scan(shard, bucket, after_ms)

    store.raw.scan_rows = recording
    return calls


def test_a_steady_bucket_is_scanned_above_the_rows_its_last_commit_counted(make_family, t0):
    store, client, counters = _family(make_family, t0)
    total = 0
    epochs = [t0 + timedelta(minutes=m) for m in (1, 2, 3)]
    calls = _scans(store)
    for i, epoch in enumerate(epochs):
        total += _round(client, counters, epoch - timedelta(minutes=1), 10 * i)
        run(store, epoch)
    # run 1: never folded, read whole; run 2 down to run 1's rows (its counted rows may still be
    # there); run 3 down to run 2's only: run 1's tombstones lie behind the slice
    assert calls == [
        None,
        to_millis(t0 + timedelta(seconds=10)) - 1,
        to_millis(epochs[0] + timedelta(seconds=10)) - 1,
    ]
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(
        counters, total
    )
    assert all(rows_at_or_below(store, (c,), epochs[-1]) == 0 for c in counters)


def test_counted_rows_a_crash_left_are_read_by_the_slice_and_deleted_once(make_family, t0):
    """The run commits, forgets its marks, and dies before its cleanup: the next run has no mark
    that reaches back to the rows that commit counted; its ledger row's ``low_ms`` does."""
    store, client, counters = _family(make_family, t0)
    e1, e2, e3 = (t0 + timedelta(minutes=m) for m in (1, 2, 3))
    total = _round(client, counters, t0, 0)
    run(store, e1)
    total += _round(client, counters, e1, 10)

    def crash(point):
        if point == "cleanup_read_log":  # committed, marks forgotten, nothing deleted
            forget_marks(store)
            raise Crash(point)

    with pytest.raises(Crash):
        run(store, e2, fault=crash, run_id="crashed")
    assert rows_at_or_below(store, (counters[0],), e2) == 3
    total += _round(client, counters, e2, 20)
    calls = _scans(store)
    after = run(store, e3)
    assert after.tally.counted_present == 3 * N  # seen in the slice, not counted again
    assert all(rows_at_or_below(store, (c,), e3) == 0 for c in counters)  # and deleted
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(
        counters, total
    )
    assert calls == [to_millis(e1 + timedelta(seconds=10)) - 1]  # down to the counted rows


def test_a_write_api_row_an_hour_behind_is_folded_by_the_next_run(make_family, t0):
    store, client, counters = _family(make_family, t0)
    e1, e2, e3 = (t0 + timedelta(minutes=m) for m in (1, 2, 3))
    total = _round(client, counters, t0, 0)
    run(store, e1)
    total += _round(client, counters, e1, 10)
    run(store, e2)
    total += _round(client, counters, e2, 20)
    late = counters[5]
    client.record([inc(late, 1000, t0 - timedelta(hours=1), "late", 1)])  # its mark says so
    calls = _scans(store)
    summary = run(store, e3)
    # the others' slice (down to run 2's counted rows); the late counter is read whole
    assert calls == [to_millis(e1 + timedelta(seconds=10)) - 1]
    assert (summary.tally.late_rows, summary.tally.late_sum) == (1, 1000)
    values = {v.counter[0]: v.value for v in client.read_many(counters)}
    assert values == {c: total + (1000 if c == late else 0) for c in counters}
    assert engine.quarantined(store) == []


def test_commits_and_marks_from_before_the_floors_are_read_whole(make_family, t0):
    """A family from an older version: `counterctl init` adds the ledger's ``pending_low_ms``
    and ``state`` and the index's ``minutes``; its commits (in columns, no ``state``) and marks
    have neither, so its next run reads the bucket whole, and the run after that (on commits
    that have them) above their floor."""
    from counters.schema import ensure_schema, index_table, ledger_table

    store, client, counters = _family(make_family, t0, fresh=True)  # it drops columns
    family = store.family
    e1, e2, e3 = (t0 + timedelta(minutes=m) for m in (1, 2, 3))
    total = _round(client, counters, t0, 0)
    run(store, e1)
    total += _round(client, counters, e1, 10)
    assert ledger_as_older_versions_wrote_it(store, with_low=False) == len(counters)
    for table, column in (
        (ledger_table(family), "pending_low_ms"),
        (ledger_table(family), "state"),
        (index_table(family), "minutes"),
    ):
        store.statements.session.execute(f"ALTER TABLE {family.keyspace}.{table} DROP {column}")
    ensure_schema(store.statements.session, family)  # what `counterctl init` does after an upgrade
    calls = _scans(store)
    run(store, e2)
    total += _round(client, counters, e2, 20)
    run(store, e3)
    assert calls == [None, to_millis(e1 + timedelta(seconds=10)) - 1]
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(
        counters, total
    )


def test_a_few_marked_counters_are_read_by_name_above_their_floor(make_family, t0):
    store, client, counters = _family(make_family, t0, n=4)  # too few to scan the bucket
    calls = []
    read_rows = store.raw.read_rows

    def recording(names, after_ms=None):
        if store.statements.current_phase == "read_raw":
            calls.append((len(names), after_ms))
        return read_rows(names, after_ms)

    store.raw.read_rows = recording
    total = 0
    epochs = [t0 + timedelta(minutes=m) for m in (1, 2, 3)]
    for i, epoch in enumerate(epochs):
        total += _round(client, counters, epoch - timedelta(minutes=1), 10 * i)
        run(store, epoch)
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(
        counters, total
    )
    assert calls == [
        (4, None),
        (4, to_millis(t0 + timedelta(seconds=10)) - 1),
        (4, to_millis(epochs[0] + timedelta(seconds=10)) - 1),
    ]
