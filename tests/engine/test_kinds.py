"""Family kinds other than increments: rows (business data, counted, never deleted)."""

from __future__ import annotations

import secrets
from datetime import date, timedelta

import pytest
from cassandra.util import uuid_from_time
from counters import engine
from counters.schema import SchemaError
from counters.store import Store

from .conftest import Crash

pytestmark = pytest.mark.integration

DAY = date(2026, 3, 29)


@pytest.fixture
def orders(conn, engine_keyspace, make_family):
    """Seed 003's location_orders2 (composite partition key, timeuuid clustering)."""
    table = f"orders_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (location_id int, calculation_date date, "
        "timestamp timeuuid, order_id int, PRIMARY KEY ((location_id, calculation_date), "
        "timestamp, order_id)) WITH CLUSTERING ORDER BY (timestamp ASC, order_id ASC)"
    )
    family, store, client = make_family(
        kind="rows",
        raw_table=table,
        columns={"key": ["location_id", "calculation_date"], "time": "timestamp"},
    )
    insert = conn.session.prepare(
        f"INSERT INTO {engine_keyspace}.{table} (location_id, calculation_date, timestamp, "
        "order_id) VALUES (?, ?, ?, ?)"
    )

    def add(location, at, order_id):
        conn.session.execute(insert, (location, DAY, uuid_from_time(at), order_id))

    return family, store, client, add


def business_rows(store: Store) -> int:
    f = store.family
    return store.session.execute(f"SELECT count(*) FROM {f.keyspace}.{f.raw_table}").one()[0]


def test_rows_family_counts_without_deleting(orders, t0):
    family, store, client, add = orders
    assert family.compact_columns.value == "count" and family.discovery.value == "scan"
    for i in range(10):
        add(1, t0 + timedelta(minutes=i), i)
        add(2, t0 + timedelta(minutes=i, seconds=30), 100 + i)
    epoch = t0 + timedelta(minutes=5)
    summary = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert summary.outcome == "success"
    assert summary.tally.rows_folded == 6 + 5 and summary.tally.rows_deleted == 0
    values = {v.counter[0]: v for v in client.read_many([(1, DAY), (2, DAY)])}
    assert (values[1].compact_value, values[1].value) == (6, 10)
    assert (values[2].compact_value, values[2].value) == (5, 10)
    assert values[1].epoch == epoch
    assert business_rows(store) == 20
    row = store.session.execute(
        f"SELECT count, counted_until FROM {family.keyspace}.{family.compact_table} "
        "WHERE location_id = 1 AND calculation_date = %s",
        (DAY,),
    ).one()
    assert row.count == 6 and row.counted_until.version == 1  # a timeuuid checkpoint
    engine.run_family(store, t0 + timedelta(minutes=20), now=t0 + timedelta(minutes=30))
    assert [v.compact_value for v in client.read_many([(1, DAY), (2, DAY)])] == [10, 10]
    assert business_rows(store) == 20


@pytest.mark.parametrize("point", ["read_compact", "read_raw", "commit", "log", "verify", "finish"])
def test_rows_family_crash_then_rerun_is_exact(orders, t0, point):
    _family, store, client, add = orders
    for i in range(8):
        add(i % 3, t0 + timedelta(minutes=i), i)
    epoch = t0 + timedelta(minutes=10)

    def crash(p):
        if p == point:
            raise Crash(p)

    with pytest.raises(Crash):
        engine.run_family(
            store, epoch, now=epoch + timedelta(minutes=2), fault=crash, run_id="r1", chunk_size=1
        )
    engine.run_family(store, epoch, now=epoch + timedelta(minutes=2), run_id="r1")
    values = client.read_many([(i, DAY) for i in range(3)])
    assert [v.value for v in values] == [3, 3, 2]
    assert [v.compact_value for v in values] == [3, 3, 2]
    assert business_rows(store) == 8


def test_rows_family_overlapping_commits_never_double_count(orders, t0):
    """Two runs fold the same slice; the second commit is refused by the checkpoint's CAS."""
    _family, store, client, add = orders
    for i in range(5):
        add(1, t0 + timedelta(minutes=i), i)
    key = (1, DAY)
    epoch = t0 + timedelta(minutes=10)
    base = store.read_checkpoints([key])
    slice_ = store.read_slices([key], base, epoch)
    from counters.core import plan_slice

    plan = plan_slice(key, base[key], *slice_[key], epoch)
    first = store.commit([plan], [store.new_commit_id()], "A")
    second = store.commit([plan], [store.new_commit_id()], "B")
    assert (first, second) == ([True], [False])
    assert client.read_many([key])[0].value == 5


def test_rows_family_needs_a_time_clustering_column(conn, engine_keyspace, make_family):
    table = f"bad_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.{table} (k int, seq int, v int, PRIMARY KEY (k, seq))"
    )
    with pytest.raises(
        SchemaError, match=r"family '.*': raw table .*columns.time 'seq' has type int"
    ):
        make_family(kind="rows", raw_table=table, columns={"key": "k", "time": "seq"})


def test_rows_family_missing_raw_table_is_not_created(make_family):
    with pytest.raises(SchemaError, match="does not exist"):
        make_family(kind="rows", raw_table="no_such_table", columns={"key": "k", "time": "t"})
