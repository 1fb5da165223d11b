"""A bucket whose whole scan the node refused is remembered (the ledger's ``scan_refused_ms``,
3 h TTL) and swept counter by counter without asking again: attacked by a fresh-context reader
(2026-11-30), who found every total exact on that path, and one wrong read that a refusal,
fresh or remembered, left: a hot counter's late row below the window its by-parts read looked
back (now walked in slices by the sweep, the last test).

Each test forces the remembered path the way the ledger would after an earlier refusal
(``store.ledger.remember_scan_refused``) - often with no tombstones at all, as after the
tombstones were purged within the 3 h, or after a reshard moved the bucket's token range - and
checks that every total stays exact and no raw row at or below the epoch survives a sweep that
was able to fold it. Where a test needs a real refusal it builds one (as test_long_life)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from cassandra import ReadFailure
from counters import engine
from counters.core import BUCKETS, to_millis
from counters.reshard import reshard
from counters.store import Store

from .helpers import TombstoneTrace, aware, forget_marks, plain_insert, raw_rows, rows_at_or_below
from .test_engine import inc, same_bucket

pytestmark = pytest.mark.integration


def remember_everywhere(store: Store, shards: int | None = None) -> None:
    """Every bucket of every shard as if its whole scan had been refused a moment ago."""
    now_ms = int(time.time() * 1000)
    for shard in range(shards or store.family.shards):
        for bucket in range(BUCKETS):
            store.ledger.remember_scan_refused(shard, bucket, now_ms)


class NoWholeScan:
    """Wraps ``store.raw.scan_rows``: records each whole (floorless) scan asked for."""

    def __init__(self, store: Store):
        self.whole = 0
        inner = store.raw.scan_rows

        def scan_rows(shard, bucket, after_ms=None):
            if after_ms is None:
                self.whole += 1
            return inner(shard, bucket, after_ms)

        store.raw.scan_rows = scan_rows


def values(client, names):
    return {v.counter[0]: v.value for v in client.read_many(names)}


def run(store, epoch, **kw):
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=2), **kw)


def test_remembered_sweep_finds_unmarked_late_and_stranger_rows(make_family, t0):
    """Remembered refusal, no tombstones: a sweep must still fold a plain-CQL row below a
    counter's checkpoint epoch (no mark), a counter no one marked, a counter whose rows were
    all deleted, and a counter whose mark was lost (its rows written by the API below the
    epoch, mark forgotten)."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    names = same_bucket(store, 5)
    a, b, c, lost, stranger = names
    client.record(
        [inc(n, 1, t0 + timedelta(minutes=i), "w", i) for n in (a, b, c) for i in range(5)]
    )
    e1 = t0 + timedelta(minutes=10)
    first = run(store, e1)
    assert first.outcome == "success", first.message
    remember_everywhere(store)
    guard = NoWholeScan(store)
    stamp = int(time.time() * 1e6)
    plain_insert(store, a, t0 + timedelta(minutes=3, seconds=30), "late", 100, stamp)
    plain_insert(store, stranger, t0 + timedelta(minutes=2), "new", 7, stamp)
    client.record([inc(lost, 11, t0 + timedelta(minutes=9), "w", 1)])
    forget_marks(store)  # the mark of `lost` is gone: only a sweep finds its row
    client.record([inc(c, 2, e1 + timedelta(minutes=1), "w", 99)])
    e2 = t0 + timedelta(minutes=31)
    second = run(store, e2)
    assert second.plan.sweep and second.outcome == "success", second.message
    assert guard.whole == 0
    assert values(client, names) == {a: 105, b: 5, c: 7, lost: 11, stranger: 7}
    assert {n: rows_at_or_below(store, (n,), e2) for n in names} == dict.fromkeys(names, 0)


def test_remembered_sweep_keeps_a_quarantined_counters_rows_until_released(make_family, t0):
    """A quarantined counter in a remembered bucket, with a late unmarked row: its rows are
    neither folded nor deleted; once released, the next sweep folds every row once."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    names = same_bucket(store, 3)
    q, other, stranger = names
    client.record(
        [inc(n, 1, t0 + timedelta(minutes=i), "w", i) for n in (q, other) for i in range(4)]
    )
    e1 = t0 + timedelta(minutes=10)
    assert run(store, e1).outcome == "success"
    remember_everywhere(store)
    store.quarantine.add("by-hand", [((q,), "bad_rows", f"{q}: held for the test")])
    stamp = int(time.time() * 1e6)
    plain_insert(store, q, t0 + timedelta(minutes=5), "late", 50, stamp)
    plain_insert(store, q, e1 + timedelta(minutes=1), "new", 5, stamp)
    plain_insert(store, stranger, t0 + timedelta(minutes=5), "s", 3, stamp)
    e2 = t0 + timedelta(minutes=31)
    with pytest.raises(engine.ChecksFailed, match="quarantined"):
        run(store, e2)
    assert sorted(raw_rows(store, (q,))) == sorted(
        [(t0 + timedelta(minutes=5), 50), (e1 + timedelta(minutes=1), 5)]
    )
    engine.release(store, (q,))
    e3 = t0 + timedelta(minutes=91)
    third = run(store, e3)
    assert third.outcome == "success", third.message
    assert values(client, names) == {q: 59, other: 4, stranger: 3}
    assert {n: rows_at_or_below(store, (n,), e3) for n in names} == dict.fromkeys(names, 0)


def test_remembered_flag_survives_a_reshard_and_the_sweeps_stay_exact(make_family, t0):
    """Every bucket remembered under 1 shard, then a reshard to 3 (each old partition's flag
    now names another token range) and back to 2: sweeps between stay exact, late unmarked rows
    and strangers included."""
    family, store, client = make_family(shards=1, sweep_interval="1h")
    names = [f"r{i}" for i in range(40)]
    client.record([inc(n, 2, t0 + timedelta(minutes=1), "w", 1) for n in names])
    e1 = t0 + timedelta(minutes=5)
    assert run(store, e1).outcome == "success"
    remember_everywhere(store, 1)
    reshard(store, 3)
    three = Store(store.conn, family.model_copy(update={"shards": 3}), store.layout)
    remember_everywhere(three, 3)
    stamp = int(time.time() * 1e6)
    for i, n in enumerate(names[:10]):
        plain_insert(three, n, t0 + timedelta(minutes=2), "late", 10, stamp + i)
    plain_insert(three, "stranger", t0 + timedelta(minutes=2), "s", 9, stamp)
    e2 = t0 + timedelta(minutes=31)
    second = run(three, e2)
    assert second.plan.sweep and second.outcome == "success", second.message
    expect = {**dict.fromkeys(names, 2), **dict.fromkeys(names[:10], 12), "stranger": 9}
    assert values(client, [*names, "stranger"]) == expect
    reshard(three, 2)
    two = Store(store.conn, family.model_copy(update={"shards": 2}), store.layout)
    for i, n in enumerate(names[10:20]):
        plain_insert(two, n, t0 + timedelta(minutes=3), "late2", 100, stamp + 100 + i)
    e3 = t0 + timedelta(minutes=91)
    third = run(two, e3)
    assert third.plan.sweep and third.outcome == "success", third.message
    expect.update(dict.fromkeys(names[10:20], 102))
    assert values(client, [*names, "stranger"]) == expect
    assert sum(rows_at_or_below(two, (n,), e3) for n in [*names, "stranger"]) == 0


def test_a_dry_run_of_a_remembered_bucket_changes_nothing_and_tells_the_real_run(make_family, t0):
    """A dry run over a remembered bucket: nothing written, nothing deleted, and what it says
    the run would fold is what the real run folds."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    names = same_bucket(store, 3)
    client.record([inc(n, 1, t0 + timedelta(minutes=i), "w", i) for n in names for i in range(3)])
    e1 = t0 + timedelta(minutes=10)
    assert run(store, e1).outcome == "success"
    remember_everywhere(store)
    stamp = int(time.time() * 1e6)
    plain_insert(store, names[0], t0 + timedelta(minutes=1, seconds=1), "late", 40, stamp)
    plain_insert(store, "zz-new", t0 + timedelta(minutes=1), "s", 6, stamp)
    e2 = t0 + timedelta(minutes=31)
    before = values(client, [*names, "zz-new"])
    dry = run(store, e2, dry_run=True)
    assert values(client, [*names, "zz-new"]) == before
    assert rows_at_or_below(store, (names[0],), e2) == 1
    real = run(store, e2)
    assert real.outcome == "success", real.message
    assert (dry.tally.rows_folded, dry.tally.sum_folded) == (
        real.tally.rows_folded,
        real.tally.sum_folded,
    )
    assert values(client, [*names, "zz-new"]) == {
        names[0]: 43,
        names[1]: 3,
        names[2]: 3,
        "zz-new": 6,
    }


def test_remembered_sweep_of_a_unique_family_counts_each_member_once(make_family, t0):
    """A unique family's bucket remembered: members added late (below the epoch) whose marks
    are lost, duplicates of counted members, and a meeting no one marked."""
    suffix = f"{int(time.time() * 1000) % 100000}"
    _family, store, client = make_family(
        kind="unique",
        raw_table=f"members_{suffix}",
        columns={"key": "meeting", "member": "user"},
        shards=1,
        sweep_interval="1h",
    )
    for i in range(5):
        assert client.add_member("m1", f"u{i}", at=aware(t0 + timedelta(minutes=i)))
    e1 = t0 + timedelta(minutes=10)
    assert run(store, e1).outcome == "success"
    remember_everywhere(store)
    assert client.add_member("m1", "late", at=aware(t0 + timedelta(minutes=2))) is True
    assert client.add_member("m1", "u1", at=aware(t0 + timedelta(minutes=3))) is False
    assert client.add_member("m2", "x", at=aware(t0 + timedelta(minutes=3))) is True
    forget_marks(store)
    e2 = t0 + timedelta(minutes=31)
    second = run(store, e2)
    assert second.plan.sweep and second.outcome == "success", second.message
    assert client.read("m1") == 6 and client.read("m2") == 1
    e3 = t0 + timedelta(minutes=91)
    assert run(store, e3).outcome == "success"
    assert client.read("m1") == 6 and client.read("m2") == 1
    assert engine.reconcile(store) == []


def test_remembered_non_sweep_scan_with_an_unmarked_hot_counter_in_the_bucket(make_family, t0):
    """Not a sweep: 40 counters of one bucket marked (a token-range read, no floor after the
    marks were forgotten), the bucket remembered, and beside them an unmarked counter with
    110,000 folded rows (tombstones). The per-counter path lists and reads every counter of the
    bucket, the hot one too, whose checkpoint this run did not read."""
    _family, store, client = make_family(shards=1, sweep_interval="1d")
    names = same_bucket(store, 41)
    hot, counters = names[0], names[1:]
    client.record(
        [inc(hot, 1, t0 + timedelta(microseconds=1000 * i), "w", i) for i in range(110_000)]
    )
    e1 = t0 + timedelta(minutes=5)
    first = run(store, e1)
    assert first.outcome == "success" and first.tally.rows_deleted == 110_000, first.message
    with pytest.raises(ReadFailure):
        store.raw.read_rows([(hot,)])
    remember_everywhere(store)
    client.record([inc(c, 3, e1 + timedelta(seconds=10), "w", 1) for c in counters])
    # a live row of the hot counter, no mark (a plain-CQL writer): it is listed by the bucket
    plain_insert(store, hot, e1 + timedelta(seconds=20), "p", 4, int(time.time() * 1e6))
    e2 = e1 + timedelta(minutes=2)
    guard = NoWholeScan(store)
    listed: list = []
    inner = store.raw.distinct_counters
    store.raw.distinct_counters = lambda *a, **k: listed.extend(inner(*a, **k)) or list(listed)
    second = run(store, e2)
    assert guard.whole == 0 and (hot,) in listed, (guard.whole, len(listed))
    assert not second.plan.sweep
    assert second.outcome == "success", second.message
    assert values(client, [hot, *counters]) == {hot: 110_004, **dict.fromkeys(counters, 3)}


@pytest.mark.parametrize("remembered", [True, False], ids=["remembered", "fresh-refusal"])
def test_a_sweep_folds_a_hot_counters_late_row_below_its_window(make_family, t0, remembered):
    """A hot counter (110,000 folded rows) and a plain-CQL late row 20 minutes below its epoch,
    outside ``HOT_LATE_WINDOW`` (10 min), which a minute's run reads of it: the sweep walks its
    whole past in slices and folds the row, once, the refusal remembered or fresh."""
    _family, store, client = make_family(shards=1, sweep_interval="1h")
    names = same_bucket(store, 2)
    hot, other = names
    client.record(
        [inc(hot, 1, t0 + timedelta(microseconds=1000 * i), "w", i) for i in range(110_000)]
    )
    e1 = t0 + timedelta(minutes=25)
    first = run(store, e1)
    assert first.outcome == "success", first.message
    if remembered:
        remember_everywhere(store)
    stamp = int(time.time() * 1e6)
    plain_insert(store, hot, e1 - timedelta(minutes=20), "late", 1000, stamp)
    plain_insert(store, other, e1 - timedelta(minutes=20), "late", 1, stamp)
    e2 = t0 + timedelta(minutes=31)
    with TombstoneTrace(store) as trace:
        trace.on = True
        second = run(store, e2)
        trace.walked()
    # refused: the bucket's scan (unless remembered), the IN reads that find the hot counter
    # and one slice of the walk; never its whole past again (the reads just refused it)
    whole_past = [t for t in trace.refused if t.endswith('"type" = ? AND "modify_time" <= ?')]
    assert len(trace.refused) == (3 if remembered else 4) and not whole_past, trace.refused
    assert second.plan.sweep and second.outcome == "success", second.message
    assert values(client, names) == {hot: 111_000, other: 1}
    tally = second.tally  # the other counter was never folded: its row is not late
    assert (tally.late_rows, tally.late_sum, tally.windowed_reads) == (1, 1000, 0)
    assert [store.raw.read_rows_upto((n,), to_millis(e2)) for n in names] == [[], []]  # by parts
    third = run(store, t0 + timedelta(minutes=91))  # the next sweep counts nothing again
    assert third.outcome == "success" and values(client, names) == {hot: 111_000, other: 1}
