"""Reading a bucket whole: when the touched counters are a large share of a bucket's
population (kept in the ledger's static ``population`` by every commit), a run reads the bucket's
ledger partition, compact rows and recount by token range instead of by name, and keeps what it
read to the touched counters. What a run counts must not depend on which way it read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.core import utc_aware
from counters.schema import ledger_table
from counters.store import Store

from tests.copies import after_write, change_copy

from .helpers import forget_marks, rows_at_or_below
from .test_engine import same_bucket

pytestmark = pytest.mark.integration


def _population(store: Store, shard: int, bucket: int) -> int | None:
    f = store.family
    row = store.statements.session.execute(
        f'SELECT population FROM {f.keyspace}."{ledger_table(f)}" WHERE shard = %s AND bucket = %s '
        "LIMIT 1",
        (shard, bucket),
    ).one()
    return row.population


def _record(client, names, amount, at) -> None:
    client.record([Increment((n,), amount, utc_aware(at), ("w", amount)) for n in names])


def _reads_of_copies(store: Store) -> list[str]:
    """Record how each read of compact rows went: ``whole`` (token range) or ``by name``."""
    seen: list[str] = []
    read_copies = store.ledger.read_copies

    def spy(shard, bucket, counters):
        seen.append("whole" if counters is None else "by name")
        return read_copies(shard, bucket, counters)

    store.ledger.read_copies = spy
    return seen


def _run(store, t0, minute, names):
    """A run, then its bucket's marks forgotten, as runs minutes apart find them (a run keeps a
    mark younger than ``engine.FORGET_MARGIN``: back to back, each run would find the last
    one's counters touched too)."""
    summary = engine.run_family(
        store, t0 + timedelta(minutes=minute), now=t0 + timedelta(minutes=minute + 2)
    )
    assert summary.outcome == "success", summary.message
    forget_marks(store, store.keys.shard((names[0],)))
    return summary


def test_the_population_follows_the_commits_and_chooses_how_a_bucket_is_read(make_family, t0):
    _family, store, client = make_family(shards=1, sweep_interval="1d")
    names = same_bucket(store, 240)
    shard, bucket = store.keys.bucket((names[0],))
    _record(client, names[:40], 1, t0 + timedelta(minutes=1))
    _run(store, t0, 2, names)  # a sweep, the family's first run
    assert _population(store, shard, bucket) == 40

    # 100 touched (40 known, 60 new) against 40 known: read whole, then 100 known
    seen = _reads_of_copies(store)
    _record(client, names[:100], 2, t0 + timedelta(minutes=3))
    summary = _run(store, t0, 4, names)
    assert summary.tally.counters_committed == 100
    assert seen == ["whole", "whole"]  # before the fold, and the verify's read-back
    assert _population(store, shard, bucket) == 100
    assert [v.value for v in client.read_many([(n,) for n in names[:100]])] == [3] * 40 + [2] * 60

    # 40 touched (16 new) against 100 known: 40 x 4 >= 100, whole again
    seen.clear()
    _record(client, names[:24], 4, t0 + timedelta(minutes=5))
    _record(client, names[100:116], 4, t0 + timedelta(minutes=5))
    _run(store, t0, 6, names)
    assert seen == ["whole", "whole"]
    assert _population(store, shard, bucket) == 116

    seen.clear()
    _record(client, names[:33], 8, t0 + timedelta(minutes=7))
    _record(client, names[116:], 8, t0 + timedelta(minutes=7))
    _run(store, t0, 8, names)
    assert seen == ["whole", "whole"]
    assert _population(store, shard, bucket) == 240

    seen.clear()
    _record(client, names[:32], 16, t0 + timedelta(minutes=9))  # 32 x 4 < 240
    _run(store, t0, 10, names)
    assert seen == ["by name", "by name"]
    assert _population(store, shard, bucket) == 240
    expected = {n: 0 for n in names}
    for group, amount in (
        (names[:40], 1),
        (names[:100], 2),
        (names[:24] + names[100:116], 4),
        (names[:33] + names[116:], 8),
        (names[:32], 16),
    ):
        for n in group:
            expected[n] += amount
    values = client.read_many([(n,) for n in names])
    assert [(v.value, v.compact_value) for v in values] == [(expected[n],) * 2 for n in names]
    assert all(rows_at_or_below(store, (n,), t0 + timedelta(minutes=10)) == 0 for n in names)


def test_a_whole_read_touches_only_the_touched_counters(make_family, t0):
    """A whole bucket's read also returns its idle counters. Kept to the touched ones, an idle
    counter whose compact row was changed outside the engine is not this run's business (a sweep
    finds it): without that, the run quarantines it (checked)."""
    family, store, client = make_family(shards=1, sweep_interval="1d")
    names = same_bucket(store, 40)
    _record(client, names, 1, t0 + timedelta(minutes=1))
    _run(store, t0, 2, names)
    change_copy(
        store.statements.session, f"{family.keyspace}.{family.compact_table}", names[-1], 999
    )
    seen = _reads_of_copies(store)
    _record(client, names[:-1], 2, t0 + timedelta(minutes=3))
    summary = _run(store, t0, 4, names)
    assert seen == ["whole", "whole"]
    assert summary.tally.counters_quarantined == 0, summary.tally
    assert summary.tally.counters_committed == len(names) - 1
    assert all(v.value == 3 for v in client.read_many([(n,) for n in names[:-1]]))


def test_a_ledger_from_before_the_population_is_read_by_name_and_stays_exact(make_family, t0):
    """A ledger written before the count (its static ``population`` null, as ``counterctl
    init`` leaves it when it adds the column) is read by name until a sweep counts it."""
    family, store, client = make_family(shards=1, sweep_interval="1d")
    names = same_bucket(store, 40)
    shard, bucket = store.keys.bucket((names[0],))
    _record(client, names, 1, t0 + timedelta(minutes=1))
    _run(store, t0, 2, names)
    ledger = f'{family.keyspace}."{ledger_table(family)}"'
    where = "shard = %s AND bucket = %s"
    stamp = after_write(store.statements.session, ledger, "population", where, (shard, bucket))
    store.statements.session.execute(
        f"DELETE population FROM {ledger} USING TIMESTAMP {stamp} WHERE {where}",
        (shard, bucket),
    )
    seen = _reads_of_copies(store)
    _record(client, names, 2, t0 + timedelta(minutes=3))
    _run(store, t0, 4, names)
    assert seen == ["by name", "by name"]
    assert _population(store, shard, bucket) is None
    assert all(
        v.value == 3 and v.compact_value == 3 for v in client.read_many([(n,) for n in names])
    )


def test_a_sweep_counts_compact_rows_from_before_the_ledger(make_family, t0):
    """Counters compacted before the ledger existed have a compact row and no ledger row; a
    sweep counts them with the rest, so a minute's run does not read a bucket whole that is
    mostly such idle counters."""
    family, store, client = make_family(shards=1, sweep_interval="1d")
    names = same_bucket(store, 200)
    shard, bucket = store.keys.bucket((names[0],))
    cc = family.compact_columns
    for name in names[40:]:
        store.statements.session.execute(
            f'INSERT INTO {family.keyspace}.{family.compact_table} (type, "{cc.value}", '
            f'"{cc.epoch}") VALUES (%s, 5, %s)',
            (name, t0),
        )
    _record(client, names[:40], 1, t0 + timedelta(minutes=1))
    _run(store, t0, 2, names)  # the first run sweeps
    assert _population(store, shard, bucket) == 200
    seen = _reads_of_copies(store)
    _record(client, names[:40], 2, t0 + timedelta(minutes=3))  # 40 x 4 < 200 (not < 40)
    _run(store, t0, 4, names)
    assert seen == ["by name", "by name"]
    values = client.read_many([(n,) for n in names])
    assert [v.value for v in values] == [3] * 40 + [5] * 160
