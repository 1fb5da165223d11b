"""Every CQL statement of a family, prepared once, executed with bounded concurrency.

The engine and the client library call these; nothing else in the project writes CQL for a
family's tables. Identifiers come from the validated config and are quoted; values are bound.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent
from cassandra.murmur3 import murmur3
from cassandra.query import BatchStatement, BatchType, PreparedStatement
from cassandra.util import datetime_from_uuid1, max_uuid_from_time, uuid_from_time

from . import schema
from .config import Family, Kind
from .connection import BULK_PROFILE, Connection
from .core import Checkpoint, FoldPlan, Key, RawRow, shard_bounds, shard_of, write_timestamp
from .schema import RawLayout, q

DEFAULT_CONCURRENCY = 64
IN_CHUNK = 50
IN_KEY_TYPES = frozenset(
    {
        "text",
        "varchar",
        "ascii",
        "int",
        "bigint",
        "smallint",
        "tinyint",
        "varint",
        "uuid",
        "timeuuid",
        "boolean",
    }
)
"""Key column types read back as the same Python values they were bound with (``IN`` results
are matched to the counters asked for by their first key column)."""
BATCH_PARTITIONS = 10
INDEX_SLOTS = 16
SCAN_SPLITS = 64
"""Token sub-ranges per shard for scans (tombstones of folded rows are counted per query)."""
"""Index partitions per shard (see ``Store.index_partition``)."""
"""Partitions per ``IN`` read: fewer requests, still a modest fan-out for the coordinator."""
FIRST_WRITE_WINS = 2**63 - 1
"""Seed 000: writes ``USING TIMESTAMP Long.MAX - now``, so the earliest write has the largest
timestamp and wins."""
DELETE_BATCH_ROWS = 100


@dataclass(frozen=True)
class Touched:
    """An entry of the touched-counter index and the server write time of its latest mark."""

    counter: Key
    writetime: int


@dataclass(frozen=True)
class LogEntry:
    """One counter in a run's log: what the run saw and what it committed."""

    counter: Key
    commit_id: Any
    action: str
    base_value: int
    base_epoch: datetime | None
    folded_rows: int
    folded_sum: int
    late_rows: int
    late_sum: int
    max_lateness_ms: int
    new_value: int
    new_epoch: datetime
    touched_writetime: int | None
    newer_rows: int


def _consistency(family: Family) -> int:
    return getattr(ConsistencyLevel, family.consistency.value)


class Store:
    """I/O for one family. Cheap to create; statements are prepared on first use."""

    def __init__(
        self,
        conn: Connection,
        family: Family,
        layout: RawLayout | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
    ):
        if concurrency <= 0:
            raise ValueError(f"concurrency must be greater than 0, got {concurrency}")
        self.conn = conn
        self.family = family
        self.concurrency = concurrency
        self._layout = layout
        self._prepared: dict[str, PreparedStatement] = {}

    # --- plumbing -------------------------------------------------------------------------

    @property
    def session(self):
        return self.conn.session

    @property
    def layout(self) -> RawLayout:
        if self._layout is None:
            self._layout = schema.read_raw_layout(self.session, self.family)
        return self._layout

    @cached_property
    def _names(self) -> dict[str, str]:
        f = self.family
        lay = self.layout
        ks = q(f.keyspace)
        return {
            "raw": f"{ks}.{q(f.fold_table)}",
            "set": f"{ks}.{q(f.raw_table)}",
            "member": q(f.columns.member or "member"),
            "compact": f"{ks}.{q(f.compact_table)}",
            "index": f"{ks}.{q(schema.index_table(f))}",
            "runlog": f"{ks}.{q(schema.runlog_table(f))}",
            "audit": f"{ks}.{schema.AUDIT_TABLE}",
            "lease": f"{ks}.{schema.LEASE_TABLE}",
            "state": f"{ks}.{schema.STATE_TABLE}",
            "key": ", ".join(q(c.name) for c in lay.key),
            "key_where": " AND ".join(f"{q(c.name)} = ?" for c in lay.key),
            "key_marks": ", ".join("?" for _ in lay.key),
            "clustering": ", ".join(q(c.name) for c in lay.clustering),
            "row_where": " AND ".join(f"{q(c.name)} = ?" for c in lay.key + lay.clustering),
            "value": q(f.compact_columns.value),
            "epoch": q(f.compact_columns.epoch),
            "time": q(lay.time.name),
            "increment": q(lay.increment.name) if lay.increment else "",
            "token": f"token({', '.join(q(c.name) for c in lay.key)})",
        }

    def prepare(self, name: str, cql: str, serial: bool = False) -> PreparedStatement:
        statement = self._prepared.get(name)
        if statement is None:
            statement = self.session.prepare(cql.format(**self._names))
            statement.consistency_level = _consistency(self.family)
            if serial:
                statement.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
            self._prepared[name] = statement
        return statement

    def _run(
        self,
        statements: Sequence[tuple[Any, Any]],
        profile: str = BULK_PROFILE,
        session: Any = None,
    ) -> list[Any]:
        """Run (statement, params) pairs with at most ``concurrency`` in flight; results in
        input order; the first error raises."""
        if not statements:
            return []
        results = execute_concurrent(
            session or self.session,
            statements,
            concurrency=self.concurrency,
            raise_on_first_error=True,
            execution_profile=profile,
        )
        return [result for _ok, result in results]

    def _concurrent(
        self, statement: PreparedStatement, params: Sequence[Sequence[Any]], bulk: bool = True
    ) -> list[Any]:
        """One prepared statement for many parameter sets."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT

        return self._run(
            [(statement, p) for p in params], BULK_PROFILE if bulk else EXEC_PROFILE_DEFAULT
        )

    # --- keys and shards ------------------------------------------------------------------

    def token(self, counter: Key) -> int:
        statement = self.prepare(
            "compact_value", "SELECT {value}, {epoch} FROM {compact} WHERE {key_where}"
        )
        return murmur3(statement.bind(list(counter)).routing_key)

    def parse_key(self, parts: Sequence[str]) -> Key:
        """Typed key values from text (the CLI), by the partition key's column types."""
        if len(parts) != len(self.layout.key):
            raise ValueError(
                f"family {self.family.name!r}: key {[c.name for c in self.layout.key]} needs "
                f"{len(self.layout.key)} part(s), got {list(parts)}"
            )
        return tuple(
            _parse_value(c.cql_type, c.name, p) for c, p in zip(self.layout.key, parts, strict=True)
        )

    def shard(self, counter: Key) -> int:
        return shard_of(self.token(counter), self.family.shards)

    def index_partition(self, counter: Key) -> tuple[int, int]:
        """(shard, slot) of a counter's mark: the shard split again into ``INDEX_SLOTS`` finer
        token ranges, so no index partition collects the tombstones of a whole shard."""
        fine = shard_of(self.token(counter), self.family.shards * INDEX_SLOTS)
        return fine // INDEX_SLOTS, fine % INDEX_SLOTS

    # --- write API ------------------------------------------------------------------------

    def mark_touched(self, counters: Iterable[Key]) -> None:
        """Mark counters as having rows to fold (server timestamps; before the raw write)."""
        statement = self.prepare(
            "index_mark",
            "UPDATE {index} SET touched = true WHERE shard = ? AND slot = ? AND {key_where}",
        )
        params = [(*self.index_partition(c), *c) for c in set(counters)]
        self._run([(statement, p) for p in params], session=self.conn.server_timestamp_session)

    def insert_raw(self, rows: Sequence[tuple[Key, Key, int, int]]) -> None:
        """Insert raw rows ``(counter, clustering, increment, write_ts_micros)``, batched per
        counter (one mutation per partition)."""
        cols = ", ".join([self._names["key"], self._names["clustering"], self._names["increment"]])
        marks = ", ".join(
            "?" for _ in range(len(self.layout.key) + len(self.layout.clustering) + 1)
        )
        statement = self.prepare(
            "raw_insert", f"INSERT INTO {{raw}} ({cols}) VALUES ({marks}) USING TIMESTAMP ?"
        )
        by_counter: dict[Key, list[tuple]] = defaultdict(list)
        for counter, clustering, increment, ts in rows:
            by_counter[counter].append((*counter, *clustering, increment, ts))
        self._run(
            [
                (self._batch(statement, group), None)
                for values in by_counter.values()
                for group in _groups(values, DELETE_BATCH_ROWS)
            ]
        )

    def add_member(self, counter: Key, member: Any, now: datetime) -> tuple[bool, datetime]:
        """One pair of :meth:`add_members` (what a writer that crashes before its derived row
        leaves behind)."""
        return self.add_members([(counter, member)], now)[0]

    def add_members(
        self, items: Sequence[tuple[Key, Any]], now: datetime
    ) -> list[tuple[bool, datetime]]:
        """Seed 000's first-write-wins insert, then its WRITETIME check, for many
        ``(counter, member)`` pairs at once; returns per pair (whether this write was the first,
        the winning first-write time). Every insert lands before any check is read."""
        ts = FIRST_WRITE_WINS - write_timestamp(now)
        insert = self.prepare(
            "set_insert",
            "INSERT INTO {set} ({key}, {member}, first_seen) VALUES ({key_marks}, ?, ?) "
            "USING TIMESTAMP ?",
        )
        check = self.prepare(
            "set_check",
            "SELECT first_seen, writetime(first_seen) FROM {set} WHERE {key_where} "
            "AND {member} = ?",
        )
        self._concurrent(insert, [(*counter, member, now, ts) for counter, member in items])
        checks = self._concurrent(check, [(*counter, member) for counter, member in items])
        return [(winner == ts, first_seen) for first_seen, winner in (r.one() for r in checks)]

    def counted_members(self, counter: Key, members: Sequence[Any]) -> set[Any]:
        """Members of a unique family already marked counted by an earlier cleanup."""
        if not members:
            return set()
        statement = self.prepare(
            "set_counted",
            "SELECT {member}, counted FROM {set} WHERE {key_where} AND {member} IN ?",
        )
        rows = self.session.execute(statement, (*counter, list(set(members))))
        return {member for member, counted in rows if counted}

    def mark_counted(self, items: Sequence[tuple[Key, Sequence[Any]]]) -> None:
        statement = self.prepare(
            "set_mark",
            "UPDATE {set} SET counted = true WHERE {key_where} AND {member} = ?",
        )
        self._run(
            [
                (self._batch(statement, [(*counter, m) for m in group]), None)
                for counter, members in items
                for group in _groups(members, DELETE_BATCH_ROWS)
            ]
        )

    def members(self, counter: Key) -> list[tuple[Any, datetime | None, bool]]:
        """Every member of a unique counter with its first-write time and counted mark."""
        statement = self.prepare(
            "set_members",
            "SELECT {member}, first_seen, counted FROM {set} WHERE {key_where}",
        )
        rows = self.session.execute(statement, counter, execution_profile=BULK_PROFILE)
        return [(m, first_seen, bool(counted)) for m, first_seen, counted in rows]

    def scan_set_counters(self, shard: int) -> list[Key]:
        """Every counter of a unique family's set table in the shard's token range."""
        statement = self.prepare(
            "set_distinct", "SELECT DISTINCT {key} FROM {set} WHERE {token} > ? AND {token} <= ?"
        )
        return self._scan_distinct(statement, shard)

    def recount_slices(
        self, counters: Sequence[Key], checkpoints: dict[Key, Checkpoint]
    ) -> dict[Key, int]:
        """A rows family's full recount up to each counter's checkpoint (reconciliation)."""
        statement = self.prepare(
            "raw_recount", "SELECT count(*) FROM {raw} WHERE {key_where} AND {time} <= ?"
        )
        params = [(*c, self.epoch_value(checkpoints[c].epoch)) for c in counters]
        return {
            c: r.one()[0]
            for c, r in zip(counters, self._concurrent(statement, params), strict=True)
        }

    def count_members(self, counters: Sequence[Key]) -> dict[Key, int]:
        """Recount a unique family's set (reconciliation)."""
        statement = self.prepare("set_count", "SELECT count(*) FROM {set} WHERE {key_where}")
        results = self._concurrent(statement, counters)
        return {c: r.one()[0] for c, r in zip(counters, results, strict=True)}

    # --- discovery ------------------------------------------------------------------------

    def touched(self, shard: int) -> list[Touched]:
        statement = self.prepare(
            "index_scan",
            "SELECT {key}, writetime(touched) FROM {index} WHERE shard = ? AND slot = ?",
        )
        width = len(self.layout.key)
        results = self._concurrent(statement, [(shard, slot) for slot in range(INDEX_SLOTS)])
        return [Touched(tuple(r[:width]), r[width]) for result in results for r in result]

    def scan_counters(self, shard: int) -> list[Key]:
        """Every counter with live raw rows in the shard's token range (the sweep), read as
        ``SCAN_SPLITS`` finer ranges so no single query walks a whole shard's tombstones."""
        statement = self.prepare(
            "raw_distinct",
            "SELECT DISTINCT {key} FROM {raw} WHERE {token} > ? AND {token} <= ?",
        )
        return self._scan_distinct(statement, shard)

    def _scan_distinct(self, statement: PreparedStatement, shard: int) -> list[Key]:
        fine = shard_bounds(self.family.shards * SCAN_SPLITS)
        ranges = fine[shard * SCAN_SPLITS : (shard + 1) * SCAN_SPLITS]
        results = self._concurrent(statement, ranges)
        return [tuple(r) for result in results for r in result]

    def forget_touched(self, shard: int, entries: Sequence[Touched]) -> None:
        """Delete index entries, each at the write time it was read with: a mark written after
        the read has a later server timestamp and survives. Deletes go in single-partition
        batches (one per index partition)."""
        statement = self.prepare(
            "index_forget",
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ? AND {key_where}",
        )
        by_partition: dict[tuple[int, int], list[tuple]] = defaultdict(list)
        for entry in entries:
            where = self.index_partition(entry.counter)
            by_partition[where].append((entry.writetime, *where, *entry.counter))
        del shard  # implied by the counters; kept in the signature for the engine's symmetry
        self._run(
            [
                (self._batch(statement, group), None)
                for params in by_partition.values()
                for group in _groups(params, DELETE_BATCH_ROWS)
            ]
        )

    def _batch(self, statement: PreparedStatement, params: Sequence[Sequence[Any]]) -> Any:
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED, consistency_level=_consistency(self.family)
        )
        for values in params:
            batch.add(statement, values)
        return batch

    # --- fold reads and the commit --------------------------------------------------------

    def epoch_value(self, epoch: datetime | None) -> Any:
        """The stored form of an epoch: a timeuuid checkpoint is the largest timeuuid of the
        epoch's millisecond, so ``time <= until`` and ``time > until`` split at the epoch."""
        if epoch is None:
            return None
        if self.family.folds_by_slice and self.layout.time.cql_type == "timeuuid":
            return max_uuid_from_time(epoch)
        return epoch

    def epoch_time(self, stored: Any) -> datetime | None:
        if stored is None:
            return None
        if isinstance(stored, datetime):
            return stored
        return datetime_from_uuid1(stored)

    def _rows_by_partition(
        self, name: str, columns: str, table: str, counters: Sequence[Key]
    ) -> dict[Key, list[tuple]]:
        """Rows of many partitions, grouped by partition: ``IN ?`` over the first key column,
        ``IN_CHUNK`` partitions per request (one request instead of one each, which is what
        bounds a Python client). A composite key is grouped by its other columns first (seed
        003's orders of one day: ``location_id IN ? AND calculation_date = ?``), so the ``IN``
        names exactly the wanted partitions. A first key column whose values the driver does
        not read back as it was given them (dates, times, decimals) is read a partition a
        request."""
        out: dict[Key, list[tuple]] = {c: [] for c in counters}
        lay = self.layout
        width = len(lay.key)
        if lay.key[0].cql_type not in IN_KEY_TYPES:
            statement = self.prepare(name, f"SELECT {columns} FROM {table} WHERE {{key_where}}")
            results = self._concurrent(statement, counters)
            for counter, result in zip(counters, results, strict=True):
                out[counter].extend(tuple(r) for r in result)
            return out
        rest = "".join(f" AND {q(c.name)} = ?" for c in lay.key[1:])
        statement = self.prepare(
            f"{name}_in",
            f"SELECT {{key}}, {columns} FROM {table} WHERE {q(lay.key[0].name)} IN ?{rest}",
        )
        by_rest: dict[Key, list[Key]] = defaultdict(list)
        for counter in counters:
            by_rest[tuple(counter[1:])].append(counter)
        requests: list[tuple[Any, Any]] = []
        owners: list[dict[Any, Key]] = []
        for others, group in by_rest.items():
            for chunk in _groups(group, IN_CHUNK):
                requests.append((statement, ([c[0] for c in chunk], *others)))
                owners.append({c[0]: c for c in chunk})
        for owner, result in zip(owners, self._run(requests), strict=True):
            for row in result:
                out[owner[row[0]]].append(tuple(row[width:]))
        return out

    def read_checkpoints(self, counters: Sequence[Key]) -> dict[Key, Checkpoint]:
        columns = "{value}, {epoch}, commit_id"
        if not self.family.folds_by_slice:
            columns += ", pending"
        rows = self._rows_by_partition("compact_read", columns, "{compact}", counters)
        out: dict[Key, Checkpoint] = {}
        for counter in counters:
            if not rows[counter]:
                out[counter] = Checkpoint(value=0, epoch=None)
                continue
            row = rows[counter][0]
            pending = row[3] if len(row) > 3 else None
            out[counter] = Checkpoint(
                value=row[0] or 0,
                epoch=self.epoch_time(row[1]),
                commit_id=row[2],
                pending=frozenset(tuple(p) for p in (pending or ())),
            )
        return out

    def read_slices(
        self, counters: Sequence[Key], checkpoints: dict[Key, Checkpoint], epoch: datetime
    ) -> dict[Key, tuple[int, int]]:
        """Server-side aggregate of each counter's slice (checkpoint, epoch]: (rows, total).
        The total is the row count for a rows family, the sum of increments otherwise."""
        measure = "count(*)" if self.layout.increment is None else "sum({increment})"
        bounded = self.prepare(
            "raw_slice",
            f"SELECT count(*), {measure} FROM {{raw}} WHERE {{key_where}} "
            "AND {time} > ? AND {time} <= ?",
        )
        unbounded = self.prepare(
            "raw_slice_all",
            f"SELECT count(*), {measure} FROM {{raw}} WHERE {{key_where}} AND {{time}} <= ?",
        )
        upper = self.epoch_value(epoch)
        statements = []
        for counter in counters:
            base = checkpoints[counter].epoch
            if base is None:
                statements.append((unbounded, (*counter, upper)))
            else:
                statements.append((bounded, (*counter, self.epoch_value(base), upper)))
        out: dict[Key, tuple[int, int]] = {}
        for counter, result in zip(counters, self._run(statements), strict=True):
            rows, total = result.one()
            out[counter] = (rows or 0, total or 0)
        return out

    def read_rows(self, counters: Sequence[Key]) -> dict[Key, list[RawRow]]:
        rows = self._rows_by_partition("raw_read", "{clustering}, {increment}", "{raw}", counters)
        return {c: self._raw_rows(rows[c]) for c in counters}

    def _raw_rows(self, rows: Iterable[Sequence[Any]]) -> list[RawRow]:
        """``(clustering..., increment)`` rows as RawRows (the time is the first clustering)."""
        width = len(self.layout.clustering)
        return [RawRow(tuple(r[:width]), r[0], r[width]) for r in rows]

    def read_rows_after(self, counter: Key, lower: datetime) -> list[RawRow]:
        """A counter's rows after ``lower`` only. Past a hot counter's epoch this read meets no
        tombstone of ours (every folded row is at or before the epoch it was folded at), where
        a whole-partition read can exceed the node's ``tombstone_failure_threshold``."""
        statement = self.prepare(
            "raw_read_after",
            "SELECT {clustering}, {increment} FROM {raw} WHERE {key_where} AND {time} > ?",
        )
        return self._raw_rows(
            self.session.execute(statement, (*counter, lower), execution_profile=BULK_PROFILE)
        )

    def read_rows_at(self, counter: Key, clusterings: Sequence[Key]) -> list[RawRow]:
        """Those of the given rows of a counter that are present: point reads (the clustering
        keys ``IN``, ``DELETE_BATCH_ROWS`` per request), no range scanned."""
        relation, bind = self._rows_in()
        statement = self.prepare(
            "raw_read_at",
            f"SELECT {{clustering}}, {{increment}} FROM {{raw}} WHERE {{key_where}} AND {relation}",
        )
        params = [(*counter, bind(g)) for g in _groups(clusterings, DELETE_BATCH_ROWS)]
        return self._raw_rows(r for result in self._concurrent(statement, params) for r in result)

    def read_rows_between(self, counter: Key, lower: datetime, upper: datetime) -> list[RawRow]:
        """A counter's rows in ``[lower, upper]`` (a hot counter's recent past, for late rows)."""
        statement = self.prepare(
            "raw_read_between",
            "SELECT {clustering}, {increment} FROM {raw} WHERE {key_where} "
            "AND {time} >= ? AND {time} <= ?",
        )
        bounds = (*counter, lower, upper)
        return self._raw_rows(
            self.session.execute(statement, bounds, execution_profile=BULK_PROFILE)
        )

    def commit(
        self, plans: Sequence[FoldPlan], commit_ids: Sequence[Any], run_id: str
    ) -> list[bool]:
        """Compare-and-set each counter's compact row on the state its plan was based on: the
        commit id (pending-folded families) or the checkpoint itself (slice-folded ones, as in
        seed 003's ``IF last_timestamp = <old>``)."""
        now = datetime.utcnow()
        if self.family.folds_by_slice:
            statement = self.prepare(
                "compact_cas_slice",
                "UPDATE {compact} SET {value} = ?, {epoch} = ?, commit_id = ?, run_id = ?, "
                "updated_at = ? WHERE {key_where} IF {epoch} = ?",
                serial=True,
            )
            params = [
                (
                    p.value,
                    self.epoch_value(p.epoch),
                    cid,
                    run_id,
                    now,
                    *p.counter,
                    self.epoch_value(p.base.epoch),
                )
                for p, cid in zip(plans, commit_ids, strict=True)
            ]
        else:
            statement = self.prepare(
                "compact_cas",
                "UPDATE {compact} SET {value} = ?, {epoch} = ?, commit_id = ?, run_id = ?, "
                "pending = ?, updated_at = ? WHERE {key_where} IF commit_id = ?",
                serial=True,
            )
            params = [
                (p.value, p.epoch, cid, run_id, list(p.pending), now, *p.counter, p.base.commit_id)
                for p, cid in zip(plans, commit_ids, strict=True)
            ]
        return [r.was_applied for r in self._concurrent(statement, params, bulk=False)]

    def committed_by(self, counter: Key) -> str | None:
        """The run (or reset) id of the counter's latest commit."""
        statement = self.prepare("compact_run", "SELECT run_id FROM {compact} WHERE {key_where}")
        row = self.session.execute(statement, counter).one()
        return row.run_id if row else None

    @staticmethod
    def new_commit_id() -> Any:
        return uuid_from_time(time.time())

    def delete_rows(self, deletions: Sequence[tuple[Key, Sequence[Key]]], ts: int) -> int:
        """Delete exactly these rows (never a range: a late row next to them must survive),
        with a tombstone timestamp that also shadows later retries of the same rows.

        One multi-column ``IN`` delete per counter (a statement per row cost twice the client
        CPU: bench variant ``delete_in``), in unlogged batches of up to ``DELETE_BATCH_ROWS``
        rows from at most ``BATCH_PARTITIONS`` counters (Cassandra warns above 10 partitions
        per batch)."""
        relation, bind = self._rows_in()
        statement = self.prepare(
            "raw_delete_in",
            f"DELETE FROM {{raw}} USING TIMESTAMP ? WHERE {{key_where}} AND {relation}",
        )
        batches: list[tuple[Any, None]] = []
        current: list[tuple] = []
        rows = 0
        for counter, clusterings in deletions:
            for group in _groups(clusterings, DELETE_BATCH_ROWS):
                if current and (
                    rows + len(group) > DELETE_BATCH_ROWS or len(current) >= BATCH_PARTITIONS
                ):
                    batches.append((self._batch(statement, current), None))
                    current, rows = [], 0
                current.append((ts, *counter, bind(group)))
                rows += len(group)
        if current:
            batches.append((self._batch(statement, current), None))
        self._run(batches)
        return sum(len(c) for _counter, c in deletions)

    def _rows_in(self) -> tuple[str, Callable[[Sequence[Key]], list[Any]]]:
        """The relation naming many rows of one partition by their clustering keys, and how to
        bind the keys to it (a one-column clustering key is not a tuple)."""
        if len(self.layout.clustering) == 1:
            return "{time} IN ?", lambda keys: [k[0] for k in keys]
        return "({clustering}) IN ?", lambda keys: [tuple(k) for k in keys]

    # --- run log --------------------------------------------------------------------------

    def write_log(self, run_id: str, shard: int, entries: Sequence[LogEntry]) -> None:
        statement = self.prepare(
            "log_write",
            "INSERT INTO {runlog} (run_id, shard, {key}, commit_id, action, base_value, "
            "base_epoch, folded_rows, folded_sum, late_rows, late_sum, max_lateness_ms, "
            "new_value, new_epoch, touched_writetime, newer_rows) VALUES (?, ?, {key_marks}, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        rows = [
            (
                run_id,
                shard,
                *e.counter,
                e.commit_id,
                e.action,
                e.base_value,
                e.base_epoch,
                e.folded_rows,
                e.folded_sum,
                e.late_rows,
                e.late_sum,
                e.max_lateness_ms,
                e.new_value,
                e.new_epoch,
                e.touched_writetime,
                e.newer_rows,
            )
            for e in entries
        ]  # one partition (run, shard): single-partition batches
        self._run(
            [(self._batch(statement, group), None) for group in _groups(rows, DELETE_BATCH_ROWS)]
        )

    def read_log(self, run_id: str, shard: int) -> list[LogEntry]:
        statement = self.prepare(
            "log_read",
            "SELECT {key}, commit_id, action, base_value, base_epoch, folded_rows, folded_sum, "
            "late_rows, late_sum, max_lateness_ms, new_value, new_epoch, touched_writetime, "
            "newer_rows FROM {runlog} WHERE run_id = ? AND shard = ?",
        )
        width = len(self.layout.key)
        rows = self.session.execute(statement, (run_id, shard), execution_profile=BULK_PROFILE)
        return [LogEntry(tuple(r[:width]), *r[width:]) for r in rows]

    # --- lease ----------------------------------------------------------------------------

    def acquire_lease(self, shard: int, owner: str, ttl_s: int) -> str | None:
        """Take the shard's lease (or keep it, for a retry of the same run).

        Returns None on success, else the current holder."""
        take = self.prepare(
            "lease_take",
            "UPDATE {lease} USING TTL ? SET owner = ?, acquired_at = toTimestamp(now()) "
            "WHERE family = ? AND shard = ? IF owner = null",
            serial=True,
        )
        keep = self.prepare(
            "lease_keep",
            "UPDATE {lease} USING TTL ? SET owner = ? WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        )
        result = self.session.execute(take, (ttl_s, owner, self.family.name, shard))
        if result.was_applied:
            return None
        holder = result.one().owner
        if holder == owner:
            again = self.session.execute(keep, (ttl_s, owner, self.family.name, shard, owner))
            if again.was_applied:
                return None
            holder = again.one().owner
        return holder or "(unknown)"

    def renew_lease(self, shard: int, owner: str, ttl_s: int) -> bool:
        keep = self.prepare(
            "lease_keep",
            "UPDATE {lease} USING TTL ? SET owner = ? WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        )
        return self.session.execute(
            keep, (ttl_s, owner, self.family.name, shard, owner)
        ).was_applied

    def release_lease(self, shard: int, owner: str) -> None:
        statement = self.prepare(
            "lease_release",
            "DELETE FROM {lease} WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        )
        self.session.execute(statement, (self.family.name, shard, owner))

    # --- family state and audit -----------------------------------------------------------

    def family_epoch(self) -> datetime | None:
        statement = self.prepare("state_read", "SELECT epoch FROM {state} WHERE family = ?")
        row = self.session.execute(statement, (self.family.name,)).one()
        return row.epoch if row else None

    def advance_family_epoch(self, epoch: datetime, run_id: str) -> None:
        """Record the family's compacted epoch; the write timestamp is the epoch itself, so the
        newest epoch wins whatever order overlapping runs finish in."""
        from .core import write_timestamp

        statement = self.prepare(
            "state_write",
            "UPDATE {state} USING TIMESTAMP ? SET epoch = ?, run_id = ?, "
            "updated_at = toTimestamp(now()) WHERE family = ?",
        )
        self.session.execute(statement, (write_timestamp(epoch), epoch, run_id, self.family.name))

    def write_audit(self, record: dict[str, Any]) -> None:
        columns = list(record)
        statement = self.session.prepare(
            f"INSERT INTO {self._names['audit']} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})"
        )
        statement.consistency_level = _consistency(self.family)
        values = [
            json.dumps(v, default=str) if isinstance(v, dict | list) else v for v in record.values()
        ]
        self.session.execute(statement, values)

    def read_audit(self, limit: int) -> list[dict[str, Any]]:
        statement = self.prepare("audit_read", "SELECT * FROM {audit} WHERE family = ? LIMIT ?")
        return [row._asdict() for row in self.session.execute(statement, (self.family.name, limit))]

    # --- read API -------------------------------------------------------------------------

    def read_values(self, counters: Sequence[Key]) -> dict[Key, tuple[int, datetime | None, int]]:
        """The seed's read rule for many counters: (compact value, epoch, newer rows' sum; their
        count for a rows family; their distinct members for a unique family)."""
        unique = self.family.kind is Kind.UNIQUE
        compact = (
            self.prepare(
                "compact_value_pending",
                "SELECT {value}, {epoch}, pending FROM {compact} WHERE {key_where}",
            )
            if unique
            else self.prepare(
                "compact_value", "SELECT {value}, {epoch} FROM {compact} WHERE {key_where}"
            )
        )
        if unique:  # members, counted distinct below: a clock-behind winner leaves two rows
            measure = "{member}"
        elif self.layout.increment is None:
            measure = "count(*)"
        else:
            measure = "sum({increment})"
        newer = self.prepare(
            "raw_newer", f"SELECT {measure} FROM {{raw}} WHERE {{key_where}} AND {{time}} > ?"
        )
        everything = self.prepare("raw_all", f"SELECT {measure} FROM {{raw}} WHERE {{key_where}}")

        bases = self._concurrent(compact, counters)
        checkpoints = []
        counted: dict[Key, set[Any]] = {}
        for counter, result in zip(counters, bases, strict=True):
            row = result.one()
            checkpoints.append((row[0] or 0, row[1]) if row else (0, None))  # stored form
            if unique and row is not None:
                counted[counter] = {key[1] for key in (row[2] or ())}  # (first_time, member)

        def measured(counter: Key, result: Any) -> int:
            if not unique:
                return result.one()[0] or 0
            # a member counts once: not if the compact row already counts it (pending) or an
            # earlier cleanup marked it (its first row is gone, a clock-behind duplicate is not)
            members = {row[0] for row in result} - counted.get(counter, set())
            return len(members - self.counted_members(counter, sorted(members, key=repr)))

        with_epoch = [(c, cp) for c, cp in zip(counters, checkpoints, strict=True) if cp[1]]
        without = [c for c, cp in zip(counters, checkpoints, strict=True) if not cp[1]]
        sums: dict[Key, int] = {}
        for (counter, _cp), result in zip(
            with_epoch,
            self._concurrent(newer, [(*c, cp[1]) for c, cp in with_epoch]),
            strict=True,
        ):
            sums[counter] = measured(counter, result)
        for counter, result in zip(without, self._concurrent(everything, without), strict=True):
            sums[counter] = measured(counter, result)
        return {
            c: (cp[0], self.epoch_time(cp[1]), sums[c])
            for c, cp in zip(counters, checkpoints, strict=True)
        }


def _parse_value(cql_type: str, column: str, text: str) -> Any:
    import datetime as dt
    import decimal
    import uuid

    try:
        if cql_type in ("tinyint", "smallint", "int", "bigint", "varint", "counter"):
            return int(text)
        if cql_type in ("float", "double"):
            return float(text)
        if cql_type == "decimal":
            return decimal.Decimal(text)
        if cql_type == "boolean":
            return text.lower() in ("true", "1", "yes")
        if cql_type == "date":
            return dt.date.fromisoformat(text)
        if cql_type == "timestamp":
            return dt.datetime.fromisoformat(text)
        if cql_type in ("uuid", "timeuuid"):
            return uuid.UUID(text)
    except ValueError as exc:
        raise ValueError(f"key column {column!r} ({cql_type}): cannot parse {text!r}") from exc
    return text


def _groups(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
