"""Table sets for throw-away test families, reused within a test session.

Creating a family's six tables is the costliest thing most engine and DAG tests do (a schema
change each, and every client's schema refresh grows with the keyspace). A test still gets a
family of its own: a new name, and tables that are empty and owned by nobody. When its test
ends, a family's tables are emptied (TRUNCATE: rows and tombstones, whatever their write
timestamps) and every row of it in the keyspace's shared tables is deleted (the tables' owners,
the family's state, leases, audit trail); the next family of the same shape gets the set.

A shape is everything ``ensure_schema`` builds the tables from besides their names
(``shape_of``). A test that changes its tables (ALTER, DROP, table options) asks for tables of
its own (``fresh``): a set whose schema changed during its test is not reused, and its test
fails at teardown saying so. A set whose test failed is kept as it was (not emptied, not
reused), for a look at what it holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from cassandra.cluster import Session
from cassandra.query import ValueSequence
from counters.config import Family
from counters.schema import (
    AUDIT_MONTHS_TABLE,
    AUDIT_TABLE,
    AUDIT_UPGRADE_TABLE,
    LEASE_TABLE,
    LEGACY_AUDIT_TABLE,
    STATE_TABLE,
    TABLES_TABLE,
    RawLayout,
    ensure_schema,
    has_table,
    index_table,
    ledger_table,
    q,
    quarantine_table,
    runs_table,
)

SHAPE_FIELDS = frozenset({"keyspace", "kind", "columns", "compact_columns"})
"""The fields of a family that its tables' DDL depends on besides the tables' names, with its
effective retention (whether it folds by slice)."""


def shape_of(family: Family) -> str:
    """The key of a family's table set in the pool: its DDL's inputs but the names."""
    shape: dict[str, Any] = family.model_dump(mode="json", include=set(SHAPE_FIELDS))
    shape["retention"] = family.effective_retention.value
    return json.dumps(shape, sort_keys=True)


def family_tables(family: Family) -> tuple[str, ...]:
    """Every table of a family's own: raw (and a unique family's table of first writes),
    compact, touched index, ledger, run log, quarantine."""
    return tuple(
        dict.fromkeys(
            (
                *family.tables,
                index_table(family),
                ledger_table(family),
                runs_table(family),
                quarantine_table(family),
            )
        )
    )


SCHEMA_TABLES = ("tables", "columns", "dropped_columns", "indexes", "triggers")
"""What ``schema_of`` reads from ``system_schema``: a set whose rows there changed is not the
set that was created."""


def schema_of(session: Session, keyspace: str, tables: Iterable[str]) -> str:
    """The tables' rows in ``system_schema`` (options, table id, columns, dropped columns,
    indexes, triggers), as one comparable text."""
    names = ValueSequence(sorted(tables))
    rows: list[str] = []
    for what in SCHEMA_TABLES:
        result = session.execute(
            f"SELECT * FROM system_schema.{what} WHERE keyspace_name = %s AND table_name IN %s",
            (keyspace, names),
        )
        rows += sorted(f"{what}: {sorted(row._asdict().items())!r}" for row in result)
    return "\n".join(rows)


@dataclass(frozen=True)
class TableSet:
    """A family's tables as the pool keeps them: the names, the raw layout ``ensure_schema``
    returned, and their schema when they were created."""

    shape: str
    raw_table: str
    compact_table: str
    layout: RawLayout
    schema: str


@dataclass
class TablePool:
    """The pool of one session's connection: free sets by shape, and the counts the closing
    report shows."""

    session: Session
    free: dict[str, list[TableSet]] = field(default_factory=dict)
    created: int = 0
    reused: int = 0
    changed: int = 0
    """Sets whose schema their test changed: not reused."""
    kept: int = 0
    """Sets of failed tests: kept as they were, not reused."""

    def family(
        self, fields: dict[str, Any], fresh: bool = False
    ) -> tuple[Family, RawLayout, TableSet | None]:
        """The family of ``fields``, its raw layout and its pooled tables: a free set of its
        shape (its table names put in the family), else new ones (``ensure_schema``).
        ``fresh``: the tables ``fields`` names (created if missing), never pooled (None)."""
        family = Family.model_validate(fields)
        if fresh:
            return family, ensure_schema(self.session, family), None
        shape = shape_of(family)
        free = self.free.get(shape)
        if free:
            tables = free.pop()
            family = Family.model_validate(
                {**fields, "raw_table": tables.raw_table, "compact_table": tables.compact_table}
            )
            self.check_empty(family)
            self.reused += 1
            return family, tables.layout, tables
        layout = ensure_schema(self.session, family)
        self.created += 1
        schema = schema_of(self.session, family.keyspace, family_tables(family))
        tables = TableSet(shape, family.raw_table, family.compact_table, layout, schema)
        return family, layout, tables

    def check_empty(self, family: Family) -> None:
        """A set handed out holds no row of an earlier family: its tables are empty and nobody
        owns them (a test that would see another's leftovers fails here, naming them)."""
        ks = q(family.keyspace)
        left = [
            table
            for table in family_tables(family)
            if self.session.execute(f"SELECT * FROM {ks}.{q(table)} LIMIT 1").one() is not None
        ]
        owners = self.session.execute(
            f"SELECT table_name, family FROM {ks}.{TABLES_TABLE} WHERE table_name IN %s",
            (ValueSequence(family_tables(family)),),
        ).all()
        assert not left and not owners, (
            f"the pooled tables of family {family.name!r} hold an earlier family's rows: "
            f"rows in {left}, owners {[tuple(o) for o in owners]}"
        )

    def release(self, family: Family, tables: TableSet) -> str | None:
        """Empty the set and give it back; or, when its schema changed during the test, keep
        it out of the pool and say why (the caller fails the test with it)."""
        now = schema_of(self.session, family.keyspace, family_tables(family))
        if now != tables.schema:
            self.changed += 1
            return (
                f"family {family.name!r}: its pooled tables' schema changed during the test "
                f"(an ALTER, a DROP or a table option): ask make_family(fresh=True) for tables "
                f"of its own. Changed:\n{_diff(tables.schema, now)}"
            )
        ks = q(family.keyspace)
        for table in family_tables(family):
            self.session.execute(f"TRUNCATE {ks}.{q(table)}", timeout=120)
        self.session.execute(
            f"DELETE FROM {ks}.{TABLES_TABLE} WHERE table_name IN %s",
            (ValueSequence(family_tables(family)),),
        )
        self.free.setdefault(tables.shape, []).append(tables)
        return None

    def forget(self, family: Family) -> None:
        """Delete the family's rows in the keyspace's shared tables: its state, leases, audit
        trail (its months' partitions) and the upgrade cursor of its trail."""
        session, ks = self.session, q(family.keyspace)
        session.execute(f"DELETE FROM {ks}.{STATE_TABLE} WHERE family = %s", (family.name,))
        leases = session.execute(
            f"SELECT shard FROM {ks}.{LEASE_TABLE} WHERE family = %s ALLOW FILTERING",
            (family.name,),
        )
        for (shard,) in leases:
            session.execute(
                f"DELETE FROM {ks}.{LEASE_TABLE} WHERE family = %s AND shard = %s",
                (family.name, shard),
            )
        months = session.execute(
            f"SELECT month FROM {ks}.{AUDIT_MONTHS_TABLE} WHERE family = %s", (family.name,)
        )
        for (month,) in months:
            session.execute(
                f"DELETE FROM {ks}.{AUDIT_TABLE} WHERE family = %s AND month = %s",
                (family.name, month),
            )
        session.execute(f"DELETE FROM {ks}.{AUDIT_MONTHS_TABLE} WHERE family = %s", (family.name,))
        session.execute(f"DELETE FROM {ks}.{AUDIT_UPGRADE_TABLE} WHERE family = %s", (family.name,))
        if has_table(session, family.keyspace, LEGACY_AUDIT_TABLE):
            session.execute(
                f"DELETE FROM {ks}.{LEGACY_AUDIT_TABLE} WHERE family = %s", (family.name,)
            )

    def summary(self) -> str:
        return (
            f"table sets: {self.created} created, {self.reused} reused, {self.changed} changed "
            f"by their test and {self.kept} of failed tests kept (neither reused)"
        )


TEST_FAILED = pytest.StashKey[bool]()
"""Set on a test's item when a phase of it failed (tests/conftest.py)."""


def release_families(
    pool: TablePool, made: list[tuple[Family, TableSet | None]], failed: bool
) -> None:
    """At a test's end: its families' rows in the shared tables deleted, its pooled sets
    emptied and given back; all kept as they are when the test failed. Fails the test when a
    set's schema changed (it needed ``fresh``)."""
    if failed:
        pool.kept += len({t for _, t in made if t is not None})
        return
    problems = []
    released: set[TableSet] = set()
    for family, tables in made:
        pool.forget(family)
        if tables is not None and tables not in released:
            released.add(tables)
            problem = pool.release(family, tables)
            if problem:
                problems.append(problem)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _diff(before: str, after: str) -> str:
    old, new = set(before.splitlines()), set(after.splitlines())
    lines = [f"- {line}" for line in sorted(old - new)]
    lines += [f"+ {line}" for line in sorted(new - old)]
    return "\n".join(lines[:20])
