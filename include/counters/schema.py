"""Tables of a family: DDL with options chosen for this access pattern, and checks of existing ones.

Table options (explained in docs/data-model.md, "Table options"):

* raw table: LeveledCompactionStrategy (a counter's rows stay in few SSTables, so the
  reader's slice and the fold read touch few files); ``tombstone_threshold`` and
  ``unchecked_tombstone_compaction`` so the point deletes of folded rows are purged soon after
  ``gc_grace_seconds``; ``gc_grace_seconds`` = 3 h, the default hint window (shorter risks
  resurrecting deleted rows on a replica that missed the delete; longer keeps more tombstones
  in the fold read).
* compact table: LCS and key cache; it is small and read on every counter read.
* bookkeeping tables: the touched index (a queue-like table: short gc_grace), the run log (TTL).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the driver is not imported for the DAG files' retry policy (SchemaError)
    from cassandra.cluster import Session

from .config import Family

log = logging.getLogger(__name__)

INTEGER_TYPES = {"tinyint", "smallint", "int", "bigint", "varint"}
TIME_TYPES = {"timestamp", "timeuuid"}

RAW_OPTIONS = (
    "compaction = {'class': 'LeveledCompactionStrategy', 'tombstone_threshold': '0.1', "
    "'unchecked_tombstone_compaction': 'true'} "
    "AND gc_grace_seconds = 10800 "
    "AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}"
)
COMPACT_OPTIONS = (
    "compaction = {'class': 'LeveledCompactionStrategy'} "
    "AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}"
)
INDEX_OPTIONS = (  # a resurrected mark only adds a candidate: short gc_grace is harmless
    "compaction = {'class': 'LeveledCompactionStrategy', 'tombstone_threshold': '0.05', "
    "'unchecked_tombstone_compaction': 'true'} AND gc_grace_seconds = 600"
)
RUNLOG_TTL_S = 1_209_600
"""How long the run log keeps a commit's record (14 days): a counter whose counted rows are still
present after that (no run and no sweep read it meanwhile) is quarantined, not guessed at."""
RUNLOG_OPTIONS = f"default_time_to_live = {RUNLOG_TTL_S} AND gc_grace_seconds = 10800"
LEDGER_OPTIONS = (
    "compaction = {'class': 'LeveledCompactionStrategy'} "
    "AND caching = {'keys': 'ALL', 'rows_per_partition': 'NONE'}"
)

AUDIT_TABLE = "counters_audit_by_month"
"""One partition per family and month (``audit.month_of``): a row a minute is ~44,640 rows a
month, a bounded partition however long the family runs."""
AUDIT_MONTHS_TABLE = "counters_audit_months"
"""Per family, the months that have audit rows: reads walk these partitions, newest first."""
LEGACY_AUDIT_TABLE = "counters_audit"
"""Versions before the month partitions kept a family's whole trail in one partition here;
``counterctl init`` moves its rows (``store.auditlog.AuditLog.upgrade``)."""
AUDIT_UPGRADE_TABLE = "counters_audit_upgrade"
"""Per family, how far the move from ``counters_audit`` got (a resumable cursor)."""
LEASE_TABLE = "counters_lease"
STATE_TABLE = "counters_family_state"
TABLES_TABLE = "counters_tables"
"""Which family owns each raw and compact table of the keyspace, and the family's identity
(tables, kind, shards, buckets, columns) as recorded at its first commit."""


class SchemaError(ValueError):
    """A table the family names is missing or does not have what the YAML says."""


@dataclass(frozen=True)
class Column:
    name: str
    cql_type: str


@dataclass(frozen=True)
class RawLayout:
    """The raw table as it is in Cassandra: partition key, clustering key, time and increment."""

    key: tuple[Column, ...]
    clustering: tuple[Column, ...]
    time: Column
    increment: Column | None
    written: tuple[str, ...] = ()
    """The row's own columns whose write time CQL reads (``WRITETIME``): not key, static or
    non-frozen collection columns; a row outlives its delete while any of them is newer."""

    @property
    def clustering_tuple_type(self) -> str:
        return f"frozen<tuple<{', '.join(c.cql_type for c in self.clustering)}>>"


def index_table(family: Family) -> str:
    return f"{family.raw_table}_touched"


def ledger_table(family: Family) -> str:
    return f"{family.compact_table}_ledger"


def runs_table(family: Family) -> str:
    return f"{family.compact_table}_runs"


def quarantine_table(family: Family) -> str:
    return f"{family.compact_table}_quarantine"


def q(name: str) -> str:
    """Quote an identifier (names are validated at load; quoting keeps case as written)."""
    return '"' + name.replace('"', '""') + '"'


def default_raw_ddl(family: Family) -> str:
    """The seed's raw table, with the family's column names."""
    cols = family.columns
    key_defs = ", ".join(f"{q(k)} text" for k in cols.key)
    key_list = ", ".join(q(k) for k in cols.key)
    return (
        f"CREATE TABLE IF NOT EXISTS {q(family.keyspace)}.{q(family.raw_table)} ("
        f"{key_defs}, {q(cols.time)} timestamp, actor text, version bigint, "
        f"{q(cols.increment)} bigint, "
        f"PRIMARY KEY (({key_list}), {q(cols.time)}, actor, version)) "
        f"WITH CLUSTERING ORDER BY ({q(cols.time)} DESC, actor ASC, version ASC) "
        f"AND {RAW_OPTIONS}"
    )


def epoch_type(family: Family, layout: RawLayout) -> str:
    """A slice-folded family's checkpoint has the type of the time column (seed 003 keeps a
    timeuuid); a pending-folded one is a timestamp."""
    return layout.time.cql_type if family.folds_by_slice else "timestamp"


def compact_ddl(family: Family, layout: RawLayout) -> str:
    key_defs = ", ".join(f"{q(c.name)} {c.cql_type}" for c in layout.key)
    key_list = ", ".join(q(c.name) for c in layout.key)
    cc = family.compact_columns
    return (
        f"CREATE TABLE IF NOT EXISTS {q(family.keyspace)}.{q(family.compact_table)} ("
        f"{key_defs}, {q(cc.epoch)} {epoch_type(family, layout)}, {q(cc.value)} bigint, "
        f"{_bookkeeping_defs(family, layout)}, PRIMARY KEY (({key_list}))) WITH {COMPACT_OPTIONS}"
    )


def _bookkeeping(family: Family, layout: RawLayout) -> list[Column]:
    columns = [Column("commit_id", "timeuuid"), Column("run_id", "text")]
    if not family.folds_by_slice:
        columns.append(Column("pending", f"frozen<list<{layout.clustering_tuple_type}>>"))
    return [*columns, Column("updated_at", "timestamp")]


def _bookkeeping_defs(family: Family, layout: RawLayout) -> str:
    return ", ".join(f"{c.name} {c.cql_type}" for c in _bookkeeping(family, layout))


def bookkeeping_ddl(family: Family, layout: RawLayout) -> list[str]:
    """The engine's own tables of a family: touched index, ledger, run chunks, quarantine."""
    ks = q(family.keyspace)
    key_defs = ", ".join(f"{q(c.name)} {c.cql_type}" for c in layout.key)
    key_list = ", ".join(q(c.name) for c in layout.key)
    return [
        f"CREATE TABLE IF NOT EXISTS {ks}.{q(index_table(family))} (shard int, {key_defs}, "
        f"slot int, touched boolean, minutes set<bigint>, PRIMARY KEY ((shard, slot), {key_list})) "
        f"WITH {INDEX_OPTIONS}",
        # one partition per token-range bucket: a conditional batch on its static head commits
        # many counters in one Paxos round
        f"CREATE TABLE IF NOT EXISTS {ks}.{q(ledger_table(family))} (shard int, bucket int, "
        f"head timeuuid static, population int static, shards int static, "
        f"scan_refused_ms bigint static, {key_defs}, "
        "value bigint, "
        "epoch_ms bigint, commit_id timeuuid, "
        "run_id text, pending text, pending_sum bigint, pending_rows int, pending_low_ms bigint, "
        "base_value bigint, "
        "folded_sum bigint, version bigint, updated_at timestamp, state blob, origin_ms bigint, "
        f"PRIMARY KEY ((shard, bucket), {key_list})) WITH {LEDGER_OPTIONS}",
        # per commit, the keys of the rows each of its counters counted (written before the
        # commit; cleanup deletes exactly these, a later fold reads them if any is left)
        f"CREATE TABLE IF NOT EXISTS {ks}.{q(runs_table(family))} (run_id text, shard int, "
        "bucket int, commit_id timeuuid, counters text, keys blob, applied boolean, "
        "verified_by text, archive_rows blob, archived text, figures text, deleted int, "
        f"PRIMARY KEY ((run_id, shard), bucket, commit_id)) WITH {RUNLOG_OPTIONS}",
        f"CREATE TABLE IF NOT EXISTS {ks}.{q(quarantine_table(family))} (shard int, "
        f"{key_defs}, reason text, detail text, run_id text, at timestamp, "
        f"PRIMARY KEY ((shard), {key_list}))",
    ]


COMPACTOR_ROLE = "compactor"


def compactor_tables(family: Family) -> list[tuple[str, tuple[str, ...]]]:
    """(table, permissions) the compaction of a family needs, and no more: it reads and writes
    its own bookkeeping tables, reads the raw rows and deletes them unless they are kept
    (a rows family's business data: read only); a unique family's set table gets its members
    marked ``counted``."""
    rw = ("SELECT", "MODIFY")
    folded = ("SELECT",) if family.folds_by_slice else rw
    tables: list[tuple[str, tuple[str, ...]]] = [(family.fold_table, folded)]
    if family.rules.members:
        tables.append((family.raw_table, rw))
    tables += [
        (family.compact_table, rw),
        (index_table(family), rw),
        (ledger_table(family), rw),
        (runs_table(family), rw),
        (quarantine_table(family), rw),
        (AUDIT_TABLE, rw),
        (AUDIT_MONTHS_TABLE, rw),
        (LEASE_TABLE, rw),
        (STATE_TABLE, rw),
        (TABLES_TABLE, rw),
    ]
    return tables


def compactor_grants(families: Sequence[Family], role: str = COMPACTOR_ROLE) -> list[str]:
    """GRANT statements for a least-privilege compaction role: table by table, no keyspace-
    wide permission, no CREATE/ALTER/DROP/AUTHORIZE (`counterctl init` runs as an admin)."""
    statements: list[str] = []
    for family in families:
        for table, permissions in compactor_tables(family):
            for permission in permissions:
                statement = (
                    f"GRANT {permission} ON TABLE {q(family.keyspace)}.{q(table)} TO {q(role)}"
                )
                if statement not in statements:  # the keyspace's shared tables, once
                    statements.append(statement)
    return statements


def keyspace_ddl(keyspace: str, replication: str) -> list[str]:
    ks = q(keyspace)
    return [
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {replication}",
        f"CREATE TABLE IF NOT EXISTS {ks}.{AUDIT_TABLE} (family text, month text, "
        "started_at timestamp, run_id text, action text, kind text, outcome text, "
        "dry_run boolean, sweep boolean, epoch_before timestamp, epoch_after timestamp, "
        "counters int, rows_folded bigint, sum_folded bigint, late_rows bigint, "
        "late_sum bigint, max_lateness_ms bigint, conflicts int, rows_deleted bigint, "
        "checks text, durations text, message text, triggered_by text, airflow_user text, "
        "os_user text, host text, cassandra_role text, parameters text, code_version text, "
        "config_hash text, gx_suite text, gx_result text, archive map<text, text>, "
        "PRIMARY KEY ((family, month), started_at, run_id)) "
        "WITH CLUSTERING ORDER BY (started_at DESC, run_id ASC)",
        f"CREATE TABLE IF NOT EXISTS {ks}.{AUDIT_MONTHS_TABLE} (family text, month text, "
        "PRIMARY KEY ((family), month)) WITH CLUSTERING ORDER BY (month DESC)",
        f"CREATE TABLE IF NOT EXISTS {ks}.{AUDIT_UPGRADE_TABLE} (family text PRIMARY KEY, "
        "cut_micros bigint, cursor timestamp, copied bigint, started_at timestamp, "
        "finished_at timestamp)",
        f"CREATE TABLE IF NOT EXISTS {ks}.{LEASE_TABLE} (family text, shard int, owner text, "
        "acquired_at timestamp, PRIMARY KEY ((family, shard)))",
        f"CREATE TABLE IF NOT EXISTS {ks}.{STATE_TABLE} (family text PRIMARY KEY, "
        "epoch timestamp, run_id text, updated_at timestamp, last_sweep timestamp, shards int, "
        "last_sweep_size int, retired_at timestamp, retired_by text)",
        f"CREATE TABLE IF NOT EXISTS {ks}.{TABLES_TABLE} (table_name text PRIMARY KEY, "
        "family text, identity text, recorded_at timestamp, recorded_by text)",
    ]


MIN_GC_GRACE_S = 10_800
"""The least ``gc_grace_seconds`` of a raw table whose rows the engine deletes: its tombstones
must outlive the hint window (3 h by default) and the repairs, or a replica that missed a delete
brings the row back and the next run counts it again; and they are what keep a write API retry
of a deleted row deleted."""


def option_problems(family: Family, options: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with the options of the tables a family's totals depend on, each naming the
    table, the option, its value and the fix. Pure: ``options`` is each table's options as the
    driver's schema metadata holds them (tables it does not name are not checked)."""
    ks = family.keyspace
    problems: list[str] = []

    def ttl(table: str, what: str) -> None:
        value = (options.get(table) or {}).get("default_time_to_live") or 0
        if value:
            problems.append(
                f"table {ks}.{table} has default_time_to_live = {value}: {what}; run "
                f"ALTER TABLE {ks}.{table} WITH default_time_to_live = 0"
            )

    deletes = not family.folds_by_slice
    ttl(family.fold_table, "rows expire whether counted or not (a quarantined counter's too)")
    if family.raw_table != family.fold_table:
        ttl(family.raw_table, "members expire and would count again when written again")
    ttl(family.compact_table, "the readers' totals expire (read as 0 plus the newer rows)")
    ttl(ledger_table(family), "the checkpoints expire and every counted row would count again")
    grace = (options.get(family.fold_table) or {}).get("gc_grace_seconds")
    if deletes and grace is not None and grace < MIN_GC_GRACE_S:
        problems.append(
            f"table {ks}.{family.fold_table} has gc_grace_seconds = {grace}, under "
            f"{MIN_GC_GRACE_S} (3 h): a replica that missed a delete brings the row back after "
            "its tombstone is purged, and the next run counts it again; run ALTER TABLE "
            f"{ks}.{family.fold_table} WITH gc_grace_seconds = {MIN_GC_GRACE_S}"
        )
    return problems


def table_options(session: Session, family: Family) -> dict[str, dict[str, Any]]:
    """The options ``option_problems`` checks, of the family's tables that exist, read from
    ``system_schema.tables`` (one request): not through the driver's schema metadata, whose
    refresh needs the control connection, which a node's restart can leave reconnecting while
    requests already succeed (a run must not fail on that)."""
    from cassandra.query import ValueSequence

    tables = sorted(
        {family.fold_table, family.raw_table, family.compact_table, ledger_table(family)}
    )
    rows = session.execute(
        "SELECT table_name, default_time_to_live, gc_grace_seconds FROM system_schema.tables "
        "WHERE keyspace_name = %s AND table_name IN %s",
        (family.keyspace, ValueSequence(tables)),
    )
    return {
        row.table_name: {
            "default_time_to_live": row.default_time_to_live,
            "gc_grace_seconds": row.gc_grace_seconds,
        }
        for row in rows
    }


def check_table_options(session: Session, family: Family) -> None:
    """Refuse (``SchemaError``) a family whose tables' options break its totals."""
    problems = option_problems(family, table_options(session, family))
    if problems:
        raise SchemaError(
            f"family {family.name!r}: " + "; ".join(problems) + ". Nothing was read or changed."
        )


METADATA_ATTEMPTS = 4
"""Tries of a schema metadata refresh (1, 2, 3 s apart) before a step gives up."""


def _retrying_refresh(refresh: Any) -> None:
    from cassandra import DriverException

    for attempt in range(METADATA_ATTEMPTS):
        try:
            refresh()
            return
        except DriverException:
            # "metadata was not refreshed": the control connection is reconnecting (a node
            # restarted) while requests already succeed; it is back within seconds
            if attempt == METADATA_ATTEMPTS - 1:
                raise
            time.sleep(1.0 + attempt)


def keyspace_metadata(session: Session, keyspace: str) -> Any:
    """The driver's metadata of a keyspace (its replication), read from the cluster when the
    driver does not hold it: a connection without the full schema model
    (``ConnectionSettings.schema_metadata``) knows only the keyspaces it asked for, and routes
    a statement to its replicas (token aware) only once it knows the keyspace's replication.
    None when the keyspace does not exist, or when it cannot be read now (the control
    connection is reconnecting after a node restart while requests already succeed: a run must
    not fail on that; its statements then go to any node, and the next call reads it)."""
    from cassandra import DriverException

    cluster = session.cluster
    if keyspace not in cluster.metadata.keyspaces:
        try:
            cluster.refresh_keyspace_metadata(keyspace)
        except DriverException as exc:
            log.warning("keyspace %s: its metadata could not be read now (%s)", keyspace, exc)
    return cluster.metadata.keyspaces.get(keyspace)


def table_metadata(session: Session, keyspace: str, table: str) -> Any:
    """The driver's metadata of a table, refreshed from the cluster (None if it does not
    exist)."""
    return _table_meta(session, keyspace, table)


def _table_meta(session: Session, keyspace: str, table: str):
    if not has_table(session, keyspace, table):
        return None
    cluster = session.cluster

    def refresh() -> None:
        if keyspace not in cluster.metadata.keyspaces:
            # a keyspace another client created a moment ago, whose schema event this
            # session has not processed yet (or a session without the full schema model):
            # the driver drops a table refresh for a keyspace it does not know
            cluster.refresh_keyspace_metadata(keyspace)
        cluster.refresh_table_metadata(keyspace, table)

    _retrying_refresh(refresh)
    ks = cluster.metadata.keyspaces.get(keyspace)
    return ks.tables.get(table) if ks else None


def has_table(session: Session, keyspace: str, table: str) -> bool:
    """Whether ``keyspace.table`` exists, read from ``system_schema`` (not the driver's model,
    which a connection without the full schema model does not keep)."""
    row = session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name=%s AND table_name=%s",
        (keyspace, table),
    ).one()
    return row is not None


def read_raw_layout(session: Session, family: Family) -> RawLayout:
    """Read the folded table's layout from the cluster and check it against the family."""
    meta = _table_meta(session, family.keyspace, family.fold_table)
    where = f"family {family.name!r}: raw table {family.keyspace}.{family.fold_table}"
    if meta is None:
        raise SchemaError(f"{where} does not exist (run `counterctl init --family {family.name}`)")
    columns = {c.name: c for c in meta.columns.values()}
    cols = family.fold_columns
    summed = family.rules.summed
    for name, field in [(k, "columns.key") for k in cols.key] + [
        (cols.time, "columns.time"),
        (cols.increment, "columns.increment"),
    ]:
        if (summed or field != "columns.increment") and (name not in columns):
            raise SchemaError(f"{where} has no column {name!r} (named by {field})")
    partition = tuple(Column(c.name, c.cql_type) for c in meta.partition_key)
    if tuple(c.name for c in partition) != cols.key:
        raise SchemaError(
            f"{where}: partition key is {[c.name for c in partition]}, but columns.key "
            f"says {list(cols.key)}"
        )
    clustering = tuple(Column(c.name, c.cql_type) for c in meta.clustering_key)
    if not clustering or clustering[0].name != cols.time:
        raise SchemaError(
            f"{where}: columns.time {cols.time!r} must be the first clustering column "
            f"(clustering key is {[c.name for c in clustering]})"
        )
    time = clustering[0]
    if time.cql_type not in TIME_TYPES:
        raise SchemaError(
            f"{where}: columns.time {cols.time!r} has type {time.cql_type}; "
            "it must be timestamp or timeuuid"
        )
    if time.cql_type == "timeuuid" and not family.folds_by_slice:
        raise SchemaError(
            f"{where}: columns.time {cols.time!r} is a timeuuid, which only a rows family "
            f"(rows kept, counted by the server) may count by; family {family.name!r} is of kind "
            f"{family.kind.value}: its folds compare each row's time to the epoch in "
            "milliseconds while the server orders timeuuids within one, and its readers bind a "
            "timestamp epoch. Use a timestamp time column. Nothing was read or changed."
        )
    keyed = {c.name for c in (*meta.partition_key, *meta.clustering_key)}
    written = tuple(
        c.name
        for c in meta.columns.values()
        if c.name not in keyed
        and not c.is_static
        and not c.cql_type.startswith(("list<", "set<", "map<"))
    )
    if not summed:
        return RawLayout(partition, clustering, time, None, written)
    increment = Column(cols.increment, columns[cols.increment].cql_type)
    if increment.cql_type not in INTEGER_TYPES:
        raise SchemaError(
            f"{where}: columns.increment {cols.increment!r} has type {increment.cql_type}; "
            f"it must be an integer type ({', '.join(sorted(INTEGER_TYPES))})"
        )
    return RawLayout(partition, clustering, time, increment, written)


def check_compact_table(session: Session, family: Family, layout: RawLayout) -> list[str]:
    """Check an existing compact table; return ALTERs that add missing bookkeeping columns."""
    meta = _table_meta(session, family.keyspace, family.compact_table)
    where = f"family {family.name!r}: compact table {family.keyspace}.{family.compact_table}"
    if meta is None:
        raise SchemaError(f"{where} does not exist")
    key = tuple(c.name for c in meta.partition_key)
    if key != tuple(c.name for c in layout.key):
        raise SchemaError(
            f"{where}: primary key is {list(key)}, expected {list(family.columns.key)}"
        )
    columns = {c.name: c.cql_type for c in meta.columns.values()}
    cc = family.compact_columns
    for name, field, allowed in (
        (cc.value, "compact_columns.value", INTEGER_TYPES),
        (cc.epoch, "compact_columns.epoch", {epoch_type(family, layout)}),
    ):
        if name not in columns:
            raise SchemaError(f"{where} has no column {name!r} (named by {field})")
        if columns[name] not in allowed:
            raise SchemaError(f"{where}: column {name!r} has type {columns[name]}")
    alters = []
    table = f"{q(family.keyspace)}.{q(family.compact_table)}"
    for column in _bookkeeping(family, layout):
        if column.name not in columns:
            alters.append(f"ALTER TABLE {table} ADD {column.name} {column.cql_type}")
        elif columns[column.name].replace(" ", "") != column.cql_type.replace(" ", ""):
            raise SchemaError(
                f"{where}: bookkeeping column {column.name!r} has type {columns[column.name]}, "
                f"expected {column.cql_type}"
            )
    return alters


def unique_set_ddl(family: Family) -> str:
    """Seed 000's set table: one row per (counter, member), written first-write-wins."""
    cols = family.columns
    key_defs = ", ".join(f"{q(k)} text" for k in cols.key)
    key_list = ", ".join(q(k) for k in cols.key)
    return (
        f"CREATE TABLE IF NOT EXISTS {q(family.keyspace)}.{q(family.raw_table)} ("
        f"{key_defs}, {q(cols.member or 'member')} text, first_seen timestamp, counted boolean, "
        f"PRIMARY KEY (({key_list}), {q(cols.member or 'member')})) "
        "WITH compaction = {'class': 'LeveledCompactionStrategy'}"
    )


def ensure_unique_tables(session: Session, family: Family) -> None:
    """The set table (created if missing, checked and completed if present) and the derived
    table of first writes that the engine folds."""
    where = f"family {family.name!r}: set table {family.keyspace}.{family.raw_table}"
    session.execute(unique_set_ddl(family))
    meta = _table_meta(session, family.keyspace, family.raw_table)
    columns = {c.name: c.cql_type for c in meta.columns.values()}
    member = family.columns.member or "member"
    if member not in columns:
        raise SchemaError(f"{where} has no column {member!r} (named by columns.member)")
    keys = tuple(c.name for c in meta.partition_key)
    if keys != family.columns.key:
        raise SchemaError(
            f"{where}: partition key is {list(keys)}, columns.key says {list(family.columns.key)}"
        )
    if [c.name for c in meta.clustering_key] != [member]:
        raise SchemaError(f"{where}: the clustering key must be the member column {member!r}")
    table = f"{q(family.keyspace)}.{q(family.raw_table)}"
    for name, cql_type in (("first_seen", "timestamp"), ("counted", "boolean")):
        if name not in columns:
            session.execute(f"ALTER TABLE {table} ADD {name} {cql_type}")
    key_defs = ", ".join(f"{q(k)} {columns[k]}" for k in family.columns.key)
    key_list = ", ".join(q(k) for k in family.columns.key)
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {q(family.keyspace)}.{q(family.fold_table)} ("
        f"{key_defs}, first_time timestamp, {q(member)} {columns[member]}, increment int, "
        f"PRIMARY KEY (({key_list}), first_time, {q(member)})) "
        f"WITH CLUSTERING ORDER BY (first_time DESC, {q(member)} ASC) AND {RAW_OPTIONS}"
    )


def ensure_schema(
    session: Session,
    family: Family,
    replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}",
    create_raw: bool = True,
) -> RawLayout:
    """Create what is missing (IF NOT EXISTS), check what exists; return the raw layout."""
    for statement in keyspace_ddl(family.keyspace, replication):
        session.execute(statement)
    state = _table_meta(session, family.keyspace, STATE_TABLE)
    for column, cql_type in (
        ("last_sweep", "timestamp"),
        ("shards", "int"),
        ("last_sweep_size", "int"),
        ("retired_at", "timestamp"),
        ("retired_by", "text"),
    ):
        if state is not None and column not in state.columns:  # from an older version
            table = f"{q(family.keyspace)}.{STATE_TABLE}"
            session.execute(f"ALTER TABLE {table} ADD {column} {cql_type}")
    if create_raw and family.rules.creates_raw_table:
        session.execute(default_raw_ddl(family))
    if family.rules.members:
        ensure_unique_tables(session, family)
    layout = read_raw_layout(session, family)
    if has_table(session, family.keyspace, family.compact_table):
        for statement in check_compact_table(session, family, layout):
            session.execute(statement)
    else:
        session.execute(compact_ddl(family, layout))
    for statement in bookkeeping_ddl(family, layout):
        session.execute(statement)
    runs = _table_meta(session, family.keyspace, runs_table(family))
    for column, cql_type in (
        ("keys", "blob"),
        ("applied", "boolean"),
        ("verified_by", "text"),
        ("archive_rows", "blob"),
        ("archived", "text"),
        ("figures", "text"),
        ("deleted", "int"),
    ):
        if runs is not None and column not in runs.columns:  # a run log from before keys moved
            session.execute(
                f"ALTER TABLE {q(family.keyspace)}.{q(runs_table(family))} ADD {column} {cql_type}"
            )
    ledger = _table_meta(session, family.keyspace, ledger_table(family))
    for column, cql_type in (
        ("population", "int static"),
        ("pending_low_ms", "bigint"),
        ("state", "blob"),
        ("origin_ms", "bigint"),
        ("shards", "int static"),
        ("scan_refused_ms", "bigint static"),
    ):
        if ledger is not None and column not in ledger.columns:  # a ledger from before it
            session.execute(
                f"ALTER TABLE {q(family.keyspace)}.{q(ledger_table(family))} "
                f"ADD {column} {cql_type}"
            )
    index = _table_meta(session, family.keyspace, index_table(family))
    if index is not None and "minutes" not in index.columns:  # marks from before they had times
        session.execute(
            f"ALTER TABLE {q(family.keyspace)}.{q(index_table(family))} ADD minutes set<bigint>"
        )
    if index is not None and [c.name for c in index.partition_key] != ["shard", "slot"]:
        raise SchemaError(
            f"family {family.name!r}: index table {family.keyspace}.{index_table(family)} has an "
            "older layout (partition key (shard)); drop it, run `counterctl init`, and let one "
            "compaction with `discovery: scan` find the counters it marked"
        )
    if session.cluster.schema_metadata_enabled:
        session.cluster.refresh_schema_metadata()
    else:  # the keyspace's replication may have been created here; its tables are read as needed
        _retrying_refresh(lambda: session.cluster.refresh_keyspace_metadata(family.keyspace))
    check_table_options(session, family)
    return layout
