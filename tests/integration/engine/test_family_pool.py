"""The pool of table sets behind ``make_family`` (tests/family_pool.py) keeps tests apart: a
family handed a reused set sees nothing of the family before it, a set whose schema its test
changed is not handed out again, and a failed test's set is kept as it was."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

import pytest
from cassandra.query import ValueSequence
from counters import engine
from counters.client import CounterClient, Increment
from counters.connection import Connection
from counters.core import utc_aware
from counters.schema import AUDIT_MONTHS_TABLE, LEASE_TABLE, STATE_TABLE, TABLES_TABLE
from counters.store import Store

from tests.family_pool import TablePool, family_tables, release_families
from tests.sweeps import with_sweep_offset

pytestmark = pytest.mark.integration


def _fields(keyspace: str, t0: datetime, **more: object) -> dict[str, object]:
    suffix = secrets.token_hex(3)
    fields = {
        "name": f"pool_{suffix}",
        "keyspace": keyspace,
        "raw_table": f"raw_{suffix}",
        "compact_table": f"compact_{suffix}",
        "lag": "1m",
        "shards": 2,
        **more,
    }
    return with_sweep_offset(fields, t0)


def _rows_of(conn: Connection, keyspace: str, table: str, family: str) -> list[tuple]:
    return [
        tuple(r)
        for r in conn.session.execute(
            f"SELECT * FROM {keyspace}.{table} WHERE family = %s ALLOW FILTERING", (family,)
        )
    ]


def test_a_reused_set_holds_nothing_of_the_family_before(
    conn: Connection, engine_keyspace: str, t0: datetime
) -> None:
    """The first family fills every table it has (rows, marks, ledger, run log, copies,
    quarantine, owners, state, audit, a lease left by a crash); the next family of its shape
    gets the same tables, empty, and its run counts only its own rows."""
    pool = TablePool(conn.session)
    first, layout, tables = pool.family(_fields(engine_keyspace, t0))
    assert tables is not None and pool.created == 1
    store = Store(conn, first, layout)
    client = CounterClient(conn, first, store)
    client.record(
        [Increment(("IBM",), 5, utc_aware(t0 + timedelta(seconds=i)), ("w", i)) for i in range(4)]
    )
    epoch = t0 + timedelta(minutes=1)
    assert engine.run_family(store, epoch, now=epoch + timedelta(minutes=5)).outcome == "success"
    client.record(
        [Increment(("IBM",), 7, utc_aware(epoch + timedelta(seconds=1)), ("w", 9))]
    )  # left raw
    store.quarantine.add("r-test", [(("AAPL",), "test", "held by the first family")])
    assert store.lease.acquire_lease(0, "crashed-owner", ttl_s=600) is None
    assert store.owners.table_owners() and store.audit.page(5)

    release_families(pool, [(first, tables)], failed=False)
    assert pool.free[tables.shape] == [tables]

    second, layout2, again = pool.family(_fields(engine_keyspace, t0))
    assert again is tables and pool.reused == 1  # the same tables, under a new name
    assert (second.raw_table, second.compact_table) == (first.raw_table, first.compact_table)
    assert second.name != first.name
    ks = engine_keyspace
    for table in family_tables(second):
        assert conn.session.execute(f"SELECT * FROM {ks}.{table} LIMIT 1").one() is None, table
    owners = conn.session.execute(
        f"SELECT * FROM {ks}.{TABLES_TABLE} WHERE table_name IN %s",
        (ValueSequence(family_tables(second)),),
    ).all()
    assert owners == []
    for shared in (STATE_TABLE, LEASE_TABLE, AUDIT_MONTHS_TABLE):
        assert _rows_of(conn, ks, shared, first.name) == [], shared
    assert Store(conn, first, layout).audit.page(5) == []

    store2 = Store(conn, second, layout2)
    client2 = CounterClient(conn, second, store2)
    client2.record([Increment(("IBM",), 1, utc_aware(t0 + timedelta(seconds=1)), ("w", 1))])
    summary = engine.run_family(store2, epoch, now=epoch + timedelta(minutes=5))
    assert summary.outcome == "success", summary.message
    assert summary.plan.sweep and summary.tally.rows_folded == 1  # the family's first run
    assert client2.read("IBM") == 1
    assert engine.quarantined(store2) == []


def test_a_set_whose_schema_changed_is_not_reused(
    conn: Connection, engine_keyspace: str, t0: datetime
) -> None:
    pool = TablePool(conn.session)
    family, _layout, tables = pool.family(_fields(engine_keyspace, t0))
    assert tables is not None
    conn.session.execute(
        f"ALTER TABLE {engine_keyspace}.{family.compact_table} WITH default_time_to_live = 60"
    )
    problem = pool.release(family, tables)
    assert problem and "make_family(fresh=True)" in problem and "default_time_to_live" in problem
    assert not pool.free.get(tables.shape) and pool.changed == 1
    other, _layout, new = pool.family(_fields(engine_keyspace, t0))
    assert new is not None and new is not tables and pool.created == 2
    assert other.compact_table != family.compact_table


def test_a_failed_tests_set_is_kept_as_it_was(
    conn: Connection, engine_keyspace: str, t0: datetime
) -> None:
    pool = TablePool(conn.session)
    family, layout, tables = pool.family(_fields(engine_keyspace, t0))
    CounterClient(conn, family, Store(conn, family, layout)).record(
        [Increment(("IBM",), 3, utc_aware(t0), ("w", 0))]
    )
    release_families(pool, [(family, tables)], failed=True)
    assert not pool.free.get(tables.shape) and pool.kept == 1
    rows = conn.session.execute(f"SELECT * FROM {engine_keyspace}.{family.raw_table}").all()
    assert len(rows) == 1


def test_the_shape_keys_what_the_tables_are_built_from(engine_keyspace: str, t0: datetime) -> None:
    """Families that differ only in what their tables are not built from share a shape; a
    different kind, key, column name or keyspace does not."""
    from counters.config import Family

    from tests.family_pool import shape_of

    def shape(keyspace: str = engine_keyspace, **more: object) -> str:
        return shape_of(Family.model_validate(_fields(keyspace, t0, **more)))

    base = shape()
    assert shape(shards=7, lag="5m", sweep_interval="1d", archive="var/x") == base
    assert shape(columns={"key": ["a", "b"]}) != base
    assert shape(retention="delete") == base  # the default, said
    assert shape(kind="unique", columns={"key": "m", "member": "u"}) != base
    assert shape(compact_columns={"value": "total"}) != base
    assert shape(keyspace="other_ks") != base
