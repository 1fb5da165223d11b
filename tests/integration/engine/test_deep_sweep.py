"""A sweep's walk of a hot counter's whole past in slices (``read_hot_counter(deep=True)``),
attacked by a fresh-context reader (2026-11-30). A hot counter: 110,000 folded rows, so more
tombstones than the node's tombstone_failure_threshold (100,000), and a whole-partition read is
refused. The attack found a late backlog over what one commit carries lowering such a counter's
epoch below its tombstones (every read and run of it refused until they were purged): a hot
counter read by parts, walked or windowed, never has its epoch lowered; the rest of the backlog
waits for the next sweep."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from cassandra import ReadFailure
from counters import engine
from counters.core import to_millis

from .helpers import plain_insert
from .test_engine import inc, same_bucket

pytestmark = pytest.mark.integration

HOT_ROWS = 110_000


def run(store, epoch, **kw):
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=2), **kw)


def make_hot(store, client, hot, t0, e1):
    client.record(
        [inc(hot, 1, t0 + timedelta(microseconds=1000 * i), "w", i) for i in range(HOT_ROWS)]
    )
    first = run(store, e1)
    assert first.outcome == "success", first.message
    with pytest.raises(ReadFailure):
        store.raw.read_rows([(hot,)])


def many_plain(store, hot, rows):
    """rows: (time, actor, amount); plain INSERTs, no marks."""
    stamp = int(time.time() * 1e6)
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda ia: plain_insert(store, hot, ia[1][0], ia[1][1], ia[1][2], stamp + ia[0]),
                enumerate(rows),
            )
        )


def test_a_late_backlog_over_the_commit_cap_never_lowers_a_hot_counters_epoch(make_family, t0):
    """2,500 plain-CQL late rows with 4 KB keys (over ``FOLD_KEY_BYTES``, 8 MiB, in one
    commit), an hour below a hot counter's tombstones: the sweep folds what one commit carries
    and keeps the epoch; the counter stays readable, the next run succeeds, and the next sweep
    folds the rest, once."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    hot, other = same_bucket(store, 2)
    e1 = t0 + timedelta(minutes=25)
    make_hot(store, client, hot, t0, e1)
    late = [
        (t0 - timedelta(hours=1) + timedelta(milliseconds=i), "x" * 4000 + str(i), 1)
        for i in range(2500)
    ]
    many_plain(store, hot, late)
    client.record([inc(other, 5, e1 + timedelta(minutes=1), "w", 1)])
    assert client.read(hot) == HOT_ROWS  # the late rows wait for the sweep
    e2 = t0 + timedelta(minutes=31)
    second = run(store, e2)
    assert second.plan.sweep and second.outcome == "success", second.message
    folded = second.tally.late_rows
    assert 0 < folded < 2500 and second.tally.capped_counters == 1
    assert to_millis(store.reader.read_epochs([(hot,)])[(hot,)]) >= to_millis(e1)
    assert client.read(hot) == HOT_ROWS + folded  # readable: no read crosses the tombstones
    third = run(store, e2 + timedelta(minutes=1))
    assert third.outcome == "success", third.message
    swept = run(store, t0 + timedelta(minutes=91))  # the next sweep: the rest of the backlog
    assert swept.outcome == "success" and swept.tally.late_rows == 2500 - folded, swept.message
    assert client.read(hot) == HOT_ROWS + 2500 and client.read(other) == 5


class Crash(Exception):
    pass


@pytest.mark.parametrize("point", ["verify", "cleanup_delete"])
def test_deep_sweep_crash_then_runs_count_late_rows_on_slice_edges_once(make_family, t0, point):
    """Late plain-CQL rows of a hot counter below, among and above its 110,000 tombstones, on
    the deep walk's slice edges (whole minutes below the epoch: FIRST_SLICE_MS = 60 s and its
    doublings), one at exactly the epoch and one 1 ms below; the sweep that folds them crashes
    after its commit (``point``), then the next runs (retry, a minute's run, the next sweep).
    Every reader value in between is between 110,000 and the total, the end is exact."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    hot, _other = same_bucket(store, 2)
    e1 = t0 + timedelta(minutes=25)
    make_hot(store, client, hot, t0, e1)
    late = [(e1 - timedelta(minutes=k), f"edge{k}", k) for k in range(1, 26)]
    late += [(e1 - timedelta(minutes=k, milliseconds=1), f"edge-{k}", 100 * k) for k in (1, 3, 7)]
    late += [
        (e1, "at-epoch", 1000),
        (e1 - timedelta(milliseconds=1), "below-epoch", 2000),
        (t0 + timedelta(milliseconds=55_000), "among", 3000),  # same ms as a folded row
        (t0 + timedelta(microseconds=55_500_500), "among2", 4000),
        (t0 - timedelta(days=2), "far", 5000),
        (t0 - timedelta(milliseconds=1), "just-below", 6000),
    ]
    many_plain(store, hot, late)
    total = HOT_ROWS + sum(a for _t, _k, a in late)
    seen = []

    def crash(p):
        if p == point:
            raise Crash(p)

    e2 = t0 + timedelta(minutes=31)
    with pytest.raises(Crash):
        run(store, e2, run_id="crashed", fault=crash)
    seen.append(client.read(hot))
    retry = run(store, e2, run_id="crashed")
    assert retry.outcome in ("success", "noop"), retry.message
    seen.append(client.read(hot))
    minute = run(store, e2 + timedelta(minutes=1))
    assert minute.outcome in ("success", "noop"), minute.message
    seen.append(client.read(hot))
    sweep = run(store, t0 + timedelta(minutes=91))
    assert sweep.outcome in ("success", "noop"), sweep.message
    seen.append(client.read(hot))
    assert all(HOT_ROWS <= v <= total for v in seen), (seen, total)
    assert seen[-1] == total, (seen, total)
    assert store.raw.read_rows_upto((hot,), to_millis(t0 + timedelta(minutes=91))) == []


def test_a_late_backlog_over_max_fold_rows_never_lowers_a_hot_counters_epoch(make_family, t0):
    """As above with ordinary keys: 200,500 late rows (over ``MAX_FOLD_ROWS``, 200,000) written
    through the API a day below the hot counter's epoch: the sweep keeps the epoch and the
    counter readable; the next sweep folds the rest."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    hot, _other = same_bucket(store, 2)
    e1 = t0 + timedelta(minutes=25)
    make_hot(store, client, hot, t0, e1)
    far = t0 - timedelta(days=1)
    n = engine.MAX_FOLD_ROWS + 500
    client.record([inc(hot, 1, far + timedelta(microseconds=1000 * i), "l", i) for i in range(n)])
    second = run(store, t0 + timedelta(minutes=31))
    assert second.plan.sweep and second.outcome == "success", second.message
    assert to_millis(store.reader.read_epochs([(hot,)])[(hot,)]) >= to_millis(e1)
    assert client.read(hot) == HOT_ROWS + second.tally.late_rows < HOT_ROWS + n
    swept = run(store, t0 + timedelta(minutes=91))
    assert swept.outcome == "success", swept.message
    assert client.read(hot) == HOT_ROWS + n
