"""A hot counter: more folded rows in its partition than Cassandra reads past.

Every folded row leaves a tombstone for ``gc_grace_seconds`` (3 h); past the node's
``tombstone_failure_threshold`` (100,000, the default on the test node) a read of the whole
partition is refused. The family must keep compacting, exactly, and say which counter it read
by parts.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from cassandra import ReadFailure
from counters import engine
from counters.client import Increment
from counters.core import utc_aware

pytestmark = pytest.mark.integration

HOT_ROWS = 110_000


def test_hot_counter_keeps_compacting_and_stays_exact(make_family, t0):
    _family, store, client = make_family()
    hot, cold = ("hot",), ("cold",)
    client.record(
        [
            Increment(hot, 1, utc_aware(t0 + timedelta(milliseconds=i)), ("w", i))
            for i in range(HOT_ROWS)
        ]
        + [Increment(cold, 2, utc_aware(t0 + timedelta(seconds=i)), ("w", i)) for i in range(10)]
    )
    epoch1 = t0 + timedelta(minutes=30)  # the tombstones will lie outside the late window
    first = engine.run_family(store, epoch1, now=epoch1 + timedelta(minutes=2))
    assert first.outcome == "success", first.message
    assert first.tally.rows_deleted == HOT_ROWS + 10
    after_cleanup = {c.name: c for c in first.checks}["no_counted_rows_remain_after_cleanup"]
    assert after_cleanup.success  # by the server's count, or by parts if that is refused
    with pytest.raises(ReadFailure):  # the partition is past the threshold now
        store.raw.read_rows([hot])

    late_recent = Increment(hot, 100, utc_aware(epoch1 - timedelta(minutes=3)), ("late", 1))
    late_deep = Increment(hot, 1000, utc_aware(t0 - timedelta(minutes=5)), ("late", 2))
    newer = Increment(hot, 7, utc_aware(epoch1 + timedelta(minutes=2)), ("w", -1))
    client.record([late_recent, late_deep, newer, Increment(cold, 5, utc_aware(epoch1), ("w", -1))])
    epoch2 = epoch1 + timedelta(minutes=5)
    second = engine.run_family(store, epoch2, now=epoch2 + timedelta(minutes=2))
    assert second.outcome == "success", second.message
    assert (second.tally.windowed_reads, second.tally.windowed_counters) == (1, ("hot",))
    warning = {c.name: c for c in second.checks}["hot_counters_read_whole"]
    assert not warning.success and not warning.critical and warning.counters == ("hot",)
    # folded: the recent late row, the newer row and the cold counter's; not the deep late row
    assert (second.tally.rows_folded, second.tally.sum_folded) == (3, 112)
    assert client.read("hot") == HOT_ROWS + 100 + 7
    assert client.read("cold") == 25
    # the deep late row is kept (uncounted, not lost) for the next sweep
    deep_key = store.keys.pack_clustering((late_deep.time, *late_deep.identity))
    assert [r[2] for r in store.raw.read_rows_at(hot, [deep_key])] == [1000]

    # a sweep (the fixture's sweeps fall half an interval after t0: this run is the first after
    # t0 + 37.5 min): the bucket's scan is refused, its counters are found around the hot one,
    # and the hot one's whole past is walked in slices: the deep late row is folded, once
    third = engine.run_family(
        store, epoch2 + timedelta(minutes=1), now=epoch2 + timedelta(minutes=3)
    )
    assert third.plan.sweep and not second.plan.sweep
    assert third.outcome == "success", third.message
    assert (third.tally.late_rows, third.tally.late_sum) == (1, 1000)
    assert third.tally.windowed_reads == 0
    assert client.read("hot") == HOT_ROWS + 100 + 7 + 1000  # pending rows not counted again
    recent_key = store.keys.pack_clustering((late_recent.time, *late_recent.identity))
    assert store.raw.read_rows_at(hot, [recent_key, deep_key]) == []


def test_raw_table_with_only_a_time_clustering_column(conn, engine_keyspace, make_family, t0):
    """An existing raw table keyed ``((type), modify_time)`` (no identity columns): deletes and
    point reads bind plain times instead of clustering tuples."""
    table = f"raw_time_only_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (type text, modify_time timestamp, "
        "increment bigint, PRIMARY KEY ((type), modify_time))"
    )
    _family, store, client = make_family(raw_table=table)
    client.record(
        [Increment(("a",), i + 1, utc_aware(t0 + timedelta(seconds=i)), ()) for i in range(5)]
    )
    summary = engine.run_family(store, t0 + timedelta(minutes=1), now=t0 + timedelta(minutes=3))
    assert summary.outcome == "success", summary.message
    assert (summary.tally.rows_folded, summary.tally.rows_deleted) == (5, 5)
    assert client.read("a") == 15
    kept = t0 + timedelta(minutes=5)
    client.record([Increment(("a",), 100, utc_aware(kept), ())])
    keys = [store.keys.pack_clustering((kept,)), store.keys.pack_clustering((t0,))]
    assert [r[2] for r in store.raw.read_rows_at(("a",), keys)] == [100]
