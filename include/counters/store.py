"""Every CQL statement of a family, prepared once, executed with bounded concurrency.

The engine and the client library call these; nothing else in the project writes CQL for a
family's tables. Identifiers come from the validated config and are quoted; values are bound.
"""

from __future__ import annotations

import json
import logging
import secrets
import struct
import threading
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    OperationTimedOut,
    ReadFailure,
    ReadTimeout,
    WriteTimeout,
)
from cassandra.concurrent import execute_concurrent
from cassandra.cqltypes import DateType, ListType, MapType, SetType, TupleType, UserType
from cassandra.marshal import int64_pack
from cassandra.murmur3 import murmur3
from cassandra.policies import WriteType
from cassandra.protocol import ErrorMessage
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
)
from cassandra.util import Date as CassandraDate
from cassandra.util import datetime_from_uuid1, max_uuid_from_time, uuid_from_time

from . import schema
from .config import Family, Kind
from .connection import BULK_PROFILE, Connection
from .core import (
    BUCKETS,
    Checkpoint,
    Fold,
    Key,
    Packed,
    Row,
    bucket_bounds,
    bucket_of,
    chunks,
    from_millis,
    pack_state,
    shard_bounds,
    shard_of,
    split_refused_range,
    spread,
    state_commit,
    to_millis,
    unpack_state,
    write_timestamp,
)
from .errors import EngineError
from .rowkeys import CountedKeys, Encoded, KeyCodec
from .schema import RawLayout, q

if TYPE_CHECKING:
    from .audit import Provenance
    from .auditlog import AuditLog

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 64
IN_CHUNK = 50
"""Partitions per ``IN`` read: fewer requests, still a modest fan-out for the coordinator."""
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
SCAN_SPLITS = 64
"""Token sub-ranges per shard for ``SELECT DISTINCT`` scans (tombstones count per query)."""
FIRST_WRITE_WINS = 2**63 - 1
"""Seed 000: writes ``USING TIMESTAMP Long.MAX - now``, so the earliest write has the largest
timestamp and wins."""
ROWS_PER_BATCH = 100
"""Rows per single-partition unlogged batch (inserts, index forgets, ``counted`` marks)."""
DELETE_BATCH_ROWS = 500
"""Raw rows per multi-partition delete batch: few requests per million rows, and well under the
default 50 KiB batch failure threshold for short keys (a row tombstone is ~40 bytes);
``BATCH_BYTES`` bounds the batches of long ones."""
COPY_BATCH_PARTITIONS = 50
"""Compact copies per multi-partition unlogged batch (one small row each)."""
BATCH_BYTES = 40 * 1024
"""Most estimated bytes per multi-partition unlogged batch (deletes, copies): under Cassandra's
default ``batch_size_fail_threshold`` of 50 KiB whatever the length of the keys or of a unique
copy's ``pending``. A batch over it is refused whole ("Batch too large"), so the row and
partition counts alone would let long keys stop every cleanup."""
ROW_BYTES = 16
"""Estimated bytes a row adds to a batch beyond its bound values (its deletion or liveness
info; the node counts no length prefixes, which the estimate does)."""
RUN_LOG_FETCH = 16
"""Run log records per page: each is up to a few MiB of counted keys (~0.1 MiB for 1,000
counters of short keys), so a page of a shard's records stays small."""
COMMIT_CHUNK = 1000
"""Counters per conditional batch: one Paxos round, one mutation of the ledger partition."""
SCAN_FETCH = 5000
PACKED_TYPES = IN_KEY_TYPES | {"timestamp"}
PLAIN_KEY_TYPES = frozenset(
    {"text", "varchar", "ascii", "int", "bigint", "smallint", "tinyint", "varint", "boolean"}
)
"""Key column types whose values are their own JSON encoding (``_encode_value``)."""
"""Clustering column types the engine can pack (and ``rowkeys.KeyCodec`` encode)."""


@dataclass(frozen=True)
class Touched:
    """An entry of the touched-counter index and the server write time of its latest mark."""

    counter: Key
    writetime: int
    earliest_ms: int | None = None
    """The earliest minute (ms) of the rows its writers announced, None if a mark did not say
    (the counter's past must then be read whole)."""


_NO_KEYS: frozenset[Packed] = frozenset()


class Copy(NamedTuple):
    """A counter's row in the compact table (the readers' copy of the ledger). A tuple: verify
    reads one per committed counter, and a tuple is built 5x faster than a frozen dataclass."""

    value: int
    epoch_ms: int | None
    commit_id: Any
    writetime: int | None
    legacy_pending: frozenset[Packed] = frozenset()


@dataclass(frozen=True)
class Ledger:
    """One ledger partition as read: its head (the compare-and-set token of the whole bucket),
    the checkpoints of the counters read, and the bucket's population: how many counters it holds
    (a checkpoint or a compact row), counted where a run read the bucket whole and carried on by
    each commit; None until a run has counted it. It only chooses how a bucket is read, never
    what a run counts."""

    head: Any
    checkpoints: dict[Key, Checkpoint]
    population: int | None = None
    shards: int | None = None
    """The shard count the partition was committed under (None: before it was recorded;
    ``MOVING``: a reshard is moving it). Every commit is conditioned on it."""


MOVING = -1
"""A ledger partition's ``shards`` while a reshard moves its checkpoints: no commit applies."""


class TableOwner(NamedTuple):
    """The family recorded as a table's owner, with its identity (JSON) when it was recorded."""

    family: str
    identity: str
    recorded_at: datetime | None
    recorded_by: str | None


class FamilyState(NamedTuple):
    epoch: datetime | None
    last_sweep: datetime | None
    shards: int | None  # what the ledger was written with (None before it was recorded)
    last_sweep_size: int | None = None
    """Raw rows and counters the last sweep read (None: not recorded): a small one sweeps
    every run (``Family.sweep_every_run_below``)."""


@dataclass(frozen=True)
class CommitRecord:
    """One applied commit of a run, as the run log holds it: per counter, its new epoch (ms)
    and the keys of the rows it counted (packed, as JSON lists). Kept compressed until a bucket
    of the cleanup reads ``entries``: decoded for the whole shard at once, the keys made a
    cleanup's memory grow with the shard, not with the buckets in flight."""

    commit_id: Any
    blob: bytes
    decode: Callable[[list[Any]], Key]
    codec: KeyCodec
    archive_rows: bytes | None = None
    """A family with an archive: the commit's archive record (``archive.pack_record``), None
    for a commit recorded before the family had one."""
    archived: str | None = None
    """The archive file that holds the commit's rows, once a cleanup wrote it."""

    @property
    def entries(self) -> list[tuple[Key, int, CountedKeys]]:
        return [
            (self.decode(c), epoch, keys)
            for c, epoch, keys in unpack_commit_keys(self.blob, self.codec)
        ]


@dataclass(frozen=True)
class Quarantined:
    counter: Key
    reason: str
    run_id: str
    detail: str


CAS_WRITE_UNKNOWN = 0x1700
"""Protocol v5's error for a compare-and-set whose outcome the coordinator cannot tell; driver
3.30 has no class for it and raises the bare ``ErrorMessage``."""


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a conditional write's error leaves its outcome open: a Paxos timeout (the
    proposal may have been accepted by some replicas, and the next round completes it), a
    client-side timeout, or v5's explicit "unknown". Any other error: not applied."""
    if isinstance(exc, WriteTimeout):
        return exc.write_type == WriteType.CAS
    if isinstance(exc, ErrorMessage):
        return getattr(exc, "code", None) == CAS_WRITE_UNKNOWN
    return isinstance(exc, OperationTimedOut)


def _consistency(family: Family) -> int:
    return getattr(ConsistencyLevel, family.consistency.value)


def _serial(family: Family) -> int:
    """The Paxos consistency that matches the family's: a local quorum's commits are serial
    within the data center; any other level's across the cluster (two data centers must not
    both win a compare-and-set)."""
    local = family.consistency.value.startswith("LOCAL_")
    return ConsistencyLevel.LOCAL_SERIAL if local else ConsistencyLevel.SERIAL


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
        self.requests: dict[str, int] = defaultdict(int)
        """Requests sent, by the phase named in ``phase`` (the benchmark reports them)."""
        self.batch_bytes = BATCH_BYTES
        """Most estimated bytes per multi-partition batch; lowered when the node refuses one."""
        self._local = threading.local()
        self._read_hints: dict[Key, tuple[float, Any]] = {}
        """Per counter, when it was last read and the epoch it was read at (``read_values``)."""
        self.provenance: Provenance | None = None
        """Who started the changes this store makes (written into its audit rows)."""

    @property
    def phase(self) -> str:
        """The step this thread is in (requests are counted per step)."""
        return getattr(self._local, "phase", "other")

    @phase.setter
    def phase(self, name: str) -> None:
        self._local.phase = name

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
            "ledger": f"{ks}.{q(schema.ledger_table(f))}",
            "runs": f"{ks}.{q(schema.runs_table(f))}",
            "quarantine": f"{ks}.{q(schema.quarantine_table(f))}",
            "audit": f"{ks}.{schema.AUDIT_TABLE}",
            "audit_months": f"{ks}.{schema.AUDIT_MONTHS_TABLE}",
            "audit_legacy": f"{ks}.{schema.LEGACY_AUDIT_TABLE}",
            "audit_upgrade": f"{ks}.{schema.AUDIT_UPGRADE_TABLE}",
            "lease": f"{ks}.{schema.LEASE_TABLE}",
            "state": f"{ks}.{schema.STATE_TABLE}",
            "tables": f"{ks}.{schema.TABLES_TABLE}",
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
            consistency = _consistency(self.family), _serial(self.family) if serial else None
            statement, new = self.conn.prepare(cql.format(**self._names), consistency)
            if new:
                statement.column_metadata = [
                    c._replace(type=millis_timestamps(c.type)) for c in statement.column_metadata
                ]
                statement.consistency_level, serial_level = consistency
                if serial_level is not None:
                    statement.serial_consistency_level = serial_level
            self._prepared[name] = statement
        return statement

    def _run(
        self,
        statements: Sequence[tuple[Any, Any]],
        profile: str = BULK_PROFILE,
        session: Any = None,
        raise_first: bool = True,
    ) -> list[Any]:
        """Run (statement, params) pairs with at most ``concurrency`` in flight; results in
        input order; the first error raises (``raise_first=False``: a failed request's result
        is its exception)."""
        if not statements:
            return []
        self.requests[self.phase] += len(statements)
        results = execute_concurrent(
            session or self.session,
            statements,
            concurrency=self.concurrency,
            raise_on_first_error=raise_first,
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

    def fresh_identity(self) -> tuple[Any, ...]:
        """Random values for the clustering columns after the time (the seed's actor and
        version): an increment that names no identity of its own is a row of its own."""
        values: list[Any] = []
        for column in self.layout.clustering[1:]:
            if column.cql_type in ("text", "varchar", "ascii"):
                values.append(uuid.uuid4().hex)
            elif column.cql_type in ("bigint", "varint"):
                values.append(secrets.randbits(63))
            elif column.cql_type == "int":
                values.append(secrets.randbits(31))
            elif column.cql_type in ("uuid", "timeuuid"):
                values.append(uuid.uuid1())
            else:
                raise TypeError(
                    f"family {self.family.name!r}: pass an identity for clustering column "
                    f"{column.name!r} ({column.cql_type}); it cannot be made up"
                )
        return tuple(values)

    def bucket(self, counter: Key) -> tuple[int, int]:
        """(shard, bucket) of a counter: its ledger partition and its touched-index partition."""
        return bucket_of(self.token(counter), self.family.shards)

    # --- write API ------------------------------------------------------------------------

    def mark_touched(
        self, counters: Iterable[Key], minutes: dict[Key, set[int]] | None = None
    ) -> None:
        """Mark counters as having rows to fold (server timestamps; before the raw write), with
        the minutes (ms) of the rows to come where known: a run reads a marked counter's past
        only down to them. A mark without minutes makes the run read the counter whole."""
        plain = self.prepare(
            "index_mark",
            "UPDATE {index} SET touched = true WHERE shard = ? AND slot = ? AND {key_where}",
        )
        timed = self.prepare(
            "index_mark_minutes",
            "UPDATE {index} SET touched = true, minutes = minutes + ? "
            "WHERE shard = ? AND slot = ? AND {key_where}",
        )
        minutes = minutes or {}
        requests: list[tuple[Any, tuple[Any, ...]]] = [
            (timed, (minutes[c], *self.bucket(c), *c))
            if minutes.get(c)
            else (plain, (*self.bucket(c), *c))
            for c in set(counters)
        ]
        self._run(requests, session=self.conn.server_timestamp_session)

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
                for group in chunks(values, ROWS_PER_BATCH)
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
                for group in chunks(members, ROWS_PER_BATCH)
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

    def count_members(self, counters: Sequence[Key]) -> dict[Key, int]:
        """Recount a unique family's set (reconciliation)."""
        statement = self.prepare("set_count", "SELECT count(*) FROM {set} WHERE {key_where}")
        results = self._concurrent(statement, counters)
        return {c: r.one()[0] for c, r in zip(counters, results, strict=True)}

    # --- discovery ------------------------------------------------------------------------

    def touched(self, shard: int) -> dict[int, list[Touched]]:
        """The shard's index marks, by bucket (one index partition each)."""
        statement = self.prepare(
            "index_scan",
            "SELECT {key}, writetime(touched), minutes FROM {index} WHERE shard = ? AND slot = ?",
        )
        width = len(self.layout.key)
        results = self._concurrent(statement, [(shard, bucket) for bucket in range(BUCKETS)])
        return {
            bucket: [
                Touched(tuple(r[:width]), r[width], min(r[width + 1]) if r[width + 1] else None)
                for r in result
            ]
            for bucket, result in enumerate(results)
        }

    def scan_counters(self, shard: int) -> list[Key]:
        """Every counter with live raw rows in the shard's token range (the sweep), read as
        ``SCAN_SPLITS`` finer ranges so no single query walks a whole shard's tombstones."""
        statement = self.prepare(
            "raw_distinct",
            "SELECT DISTINCT {key} FROM {raw} WHERE {token} > ? AND {token} <= ?",
        )
        return self._scan_distinct(statement, shard)

    def touched_count(self, limit: int) -> int:
        """How many counters are marked touched, counted up to ``limit`` per index partition
        (one small read per partition: a scan of the whole index would walk every tombstone
        of the marks forgotten within its ``gc_grace_seconds``)."""
        statement = self.prepare(
            "index_count", "SELECT {key} FROM {index} WHERE shard = ? AND slot = ? LIMIT ?"
        )
        results = self._concurrent(
            statement,
            [
                (shard, bucket, limit)
                for shard in range(self.family.shards)
                for bucket in range(BUCKETS)
            ],
        )
        return sum(len(result.current_rows) for result in results)

    def anything_quarantined(self) -> bool:
        """Whether any counter is quarantined (a quarantined one keeps every run alerting)."""
        statement = self.prepare("quarantine_any", "SELECT shard FROM {quarantine} LIMIT 1")
        self.requests[self.phase] += 1
        return self.session.execute(statement).one() is not None

    def distinct_counters(
        self, shard: int, bucket: int, splits: int = 8, around: Sequence[Key] = ()
    ) -> list[Key]:
        """Every counter with live raw rows in one bucket's token range, read in ``splits``
        finer ranges (the fallback when a bucket's row scan meets too many tombstones; one
        range for a rows family, whose rows are never deleted). A range the server refuses
        (a hot counter's partition of tombstones) is read again around the partitions of
        ``around`` (known counters, which the caller reads by parts), else in halves."""
        statement = self.prepare(
            "raw_distinct",
            "SELECT DISTINCT {key} FROM {raw} WHERE {token} > ? AND {token} <= ?",
        )
        low, high = bucket_bounds(self.family.shards, shard, bucket)
        step = (high - low) // splits or 1
        edges = [low + i * step for i in range(splits)] + [high]
        ranges = [(edges[i], edges[i + 1]) for i in range(splits) if edges[i] < edges[i + 1]]
        known = [self.token(c) for c in around]
        found: dict[Key, None] = {}
        while ranges:
            refused: list[tuple[int, int]] = []
            results = self._run([(statement, r) for r in ranges], raise_first=False)
            for (start, end), result in zip(ranges, results, strict=True):
                try:
                    if isinstance(result, Exception):
                        raise result
                    found.update((tuple(r), None) for r in result)  # later pages may fail too
                except (ReadFailure, ReadTimeout) as error:
                    try:
                        refused += split_refused_range(start, end, known)
                    except ValueError as unsplittable:
                        raise EngineError(
                            f"family {self.family.name!r}: {unsplittable}: it holds too many "
                            f"tombstones ({type(error).__name__}) and is no counter the family "
                            "knows (no ledger row, compact row or mark); wait for its "
                            "tombstones to be purged (gc_grace_seconds) or raise the node's "
                            "tombstone_failure_threshold. Nothing was deleted."
                        ) from error
            ranges = refused
        return list(found)

    def _scan_distinct(self, statement: PreparedStatement, shard: int) -> list[Key]:
        fine = shard_bounds(self.family.shards * SCAN_SPLITS)
        ranges = fine[shard * SCAN_SPLITS : (shard + 1) * SCAN_SPLITS]
        results = self._concurrent(statement, ranges)
        return [tuple(r) for result in results for r in result]

    def forget_bucket(self, shard: int, bucket: int, before_micros: int) -> None:
        """Delete every mark of one index partition written at or before ``before_micros``: a
        partition tombstone at that time (marks written later, with later server timestamps,
        survive it)."""
        statement = self.prepare(
            "index_forget_bucket",
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ?",
        )
        self.requests[self.phase] += 1
        self.session.execute(statement, (before_micros, shard, bucket))

    def forget_touched(self, entries: Sequence[Touched]) -> None:
        """Delete index entries, each at the write time it was read with: a mark written after
        the read has a later server timestamp and survives. Single-partition batches."""
        statement = self.prepare(
            "index_forget",
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ? AND {key_where}",
        )
        by_partition: dict[tuple[int, int], list[tuple]] = defaultdict(list)
        for entry in entries:
            where = self.bucket(entry.counter)
            by_partition[where].append((entry.writetime, *where, *entry.counter))
        self._run(
            [
                (self._batch(statement, group), None)
                for params in by_partition.values()
                for group in chunks(params, ROWS_PER_BATCH)
            ]
        )

    def _batch(self, statement: PreparedStatement, params: Sequence[Sequence[Any]]) -> Any:
        return self._batch_of([bind(statement, values) for values in params])

    def _batch_of(self, bound: Sequence[BoundStatement]) -> Any:
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED, consistency_level=_consistency(self.family)
        )
        for one in bound:
            batch.add(one)
        return batch

    def _write_spread(
        self, statement: PreparedStatement, entries: Iterable[tuple[int, Sequence[Any]]], most: int
    ) -> None:
        """Write ``(rows, values)`` entries of many partitions of one token range in unlogged
        batches of at most ``most`` rows and ``batch_bytes`` estimated bytes (a batch of one
        partition is never too large). A batch the node still refuses as too large (a cluster
        with a lower ``batch_size_fail_threshold``) applied nothing: it is split in halves and
        sent again, and the store's budget drops below it for later batches. Only for writes
        that are the same when repeated (fixed write timestamps)."""
        bound = ((n, bind(statement, values)) for n, values in entries)
        groups = spread(
            ((n, _bound_bytes(b) + ROW_BYTES * n, b) for n, b in bound), most, self.batch_bytes
        )
        while groups:
            results = self._run(
                [(self._batch_of(group), None) for _size, group in groups], raise_first=False
            )
            again: list[tuple[int, list[BoundStatement]]] = []
            for (size, group), result in zip(groups, results, strict=True):
                if not isinstance(result, Exception):
                    continue
                if len(group) < 2 or not batch_too_large(result):
                    raise result
                self.batch_bytes = max(ROW_BYTES, min(self.batch_bytes, size // 2))
                half = len(group) // 2
                again += [(size // 2, group[:half]), (size - size // 2, group[half:])]
            if again:
                log.warning(
                    "family %s: the node refused %d batch(es) as too large; sending them in "
                    "halves and at most ~%d bytes a batch from now on (raise the node's "
                    "batch_size_fail_threshold to send fewer requests)",
                    self.family.name,
                    len(again) // 2,
                    self.batch_bytes,
                )
            groups = again

    def _rows_by_partition(
        self,
        name: str,
        columns: str,
        table: str,
        counters: Sequence[Key],
        *,
        where: str = "",
        params: Sequence[Any] = (),
        group: bool = False,
    ) -> dict[Key, list[tuple]]:
        """Rows of many partitions, grouped by partition: ``IN ?`` over the first key column,
        ``IN_CHUNK`` partitions per request (one request instead of one each, which is what
        bounds a Python client). A composite key is grouped by its other columns first (seed
        003's orders of one day: ``location_id IN ? AND calculation_date = ?``), so the ``IN``
        names exactly the wanted partitions. A first key column whose values the driver does
        not read back as it was given them (dates, times, decimals) is read a partition a
        request. ``where``/``params`` add a clustering restriction; ``group`` aggregates per
        partition (``GROUP BY`` the key)."""
        out: dict[Key, list[tuple]] = {c: [] for c in counters}
        lay = self.layout
        width = len(lay.key)
        grouping = " GROUP BY {key}" if group else ""
        if lay.key[0].cql_type not in IN_KEY_TYPES:
            statement = self.prepare(
                name, f"SELECT {columns} FROM {table} WHERE {{key_where}} {where}"
            )
            results = self._concurrent(statement, [(*c, *params) for c in counters])
            for counter, result in zip(counters, results, strict=True):
                out[counter].extend(tuple(r) for r in result)
            return out
        rest = "".join(f" AND {q(c.name)} = ?" for c in lay.key[1:])
        statement = self.prepare(
            f"{name}_in",
            f"SELECT {{key}}, {columns} FROM {table} WHERE {q(lay.key[0].name)} IN ?{rest} "
            f"{where}{grouping}",
        )
        by_rest: dict[Key, list[Key]] = defaultdict(list)
        for counter in counters:
            by_rest[tuple(counter[1:])].append(counter)
        requests: list[tuple[Any, Any]] = []
        owners: list[dict[Any, Key]] = []
        for others, group_ in by_rest.items():
            for chunk in chunks(group_, IN_CHUNK):
                requests.append((statement, ([c[0] for c in chunk], *others, *params)))
                owners.append({c[0]: c for c in chunk})
        for owner, result in zip(owners, self._run(requests), strict=True):
            for row in result:
                out[owner[row[0]]].append(tuple(row[width:]))
        return out

    def read_slices(
        self, counters: Sequence[Key], checkpoints: dict[Key, Checkpoint], epoch_ms: int
    ) -> dict[Key, tuple[int, int]]:
        """Server-side aggregate of each counter's slice (checkpoint, epoch]: (rows, total).
        The total is the row count for a rows family, the sum of increments otherwise;
        counters sharing a checkpoint are aggregated together (``IN`` + ``GROUP BY``)."""
        measure = (
            "count(*)"
            if self.layout.increment is None
            else f"sum(CAST({self._names['increment']} AS varint))"
        )
        upper = self._time_bound(epoch_ms)
        by_base: dict[int | None, list[Key]] = defaultdict(list)
        for counter in counters:
            by_base[checkpoints[counter].epoch_ms].append(counter)
        out: dict[Key, tuple[int, int]] = {}
        for base, group in by_base.items():
            if base is None:
                found = self._rows_by_partition(
                    "raw_slice_all",
                    f"count(*), {measure}",
                    "{raw}",
                    group,
                    where="AND {time} <= ?",
                    params=(upper,),
                    group=True,
                )
            else:
                found = self._rows_by_partition(
                    "raw_slice",
                    f"count(*), {measure}",
                    "{raw}",
                    group,
                    where="AND {time} > ? AND {time} <= ?",
                    params=(self._time_bound(base), upper),
                    group=True,
                )
            for counter, rows in found.items():
                out[counter] = (rows[0][0] or 0, rows[0][1] or 0) if rows else (0, 0)
        return out

    # --- packing: raw rows and keys as plain, hashable, JSON-able values ------------------

    @cached_property
    def _packing(self) -> tuple[list[str], list[Callable[[Any], Any]], bool, int | None]:
        """How raw rows are selected and packed: the clustering select expressions, a decoder
        per clustering column (packed value -> bindable value), whether no column needs
        converting, and the position of the time in epoch ms when it is not the packed time."""
        exprs: list[str] = []
        decoders: list[Callable[[Any], Any]] = []
        plain = True
        for column in self.layout.clustering:
            if column.cql_type not in PACKED_TYPES:
                raise schema.SchemaError(
                    f"family {self.family.name!r}: clustering column {column.name!r} has type "
                    f"{column.cql_type}; the engine packs only {', '.join(sorted(PACKED_TYPES))}"
                )
            if column.cql_type == "timestamp":
                exprs.append(f"toUnixTimestamp({q(column.name)})")
                decoders.append(_identity)
            elif column.cql_type in ("uuid", "timeuuid"):
                exprs.append(q(column.name))
                decoders.append(uuid.UUID)
                plain = False
            else:
                exprs.append(q(column.name))
                decoders.append(_identity)
        time_at = None
        if self.layout.time.cql_type != "timestamp":
            exprs.append(f"toUnixTimestamp({q(self.layout.time.name)})")
            time_at = len(self.layout.clustering)
        return exprs, decoders, plain, time_at

    def _row_columns(self) -> str:
        """The select list of raw rows; a rows family has no increment column (its rows are
        counted by the server), so the time is repeated in its place."""
        exprs = self._packing[0]
        return ", ".join([*exprs, self._names["increment"] or exprs[0]])

    def _parse_rows(self, rows: Iterable[tuple[Any, ...]], width: int) -> dict[Key, list[Row]]:
        """``(key..., clustering..., [time ms], increment)`` rows grouped by counter as
        ``(time ms, packed clustering, increment)``. ``width``: key columns in the row (0 when
        the caller knows the counter)."""
        _exprs, _decoders, plain, time_at = self._packing
        cw = len(self.layout.clustering)
        out: dict[Key, list[Row]] = {}
        last_key: Any = None
        bucket: list[Row] = []
        for r in rows:
            key = r[:width]
            if key != last_key:
                bucket = out.setdefault(key, [])
                last_key = key
            packed = r[width : width + cw]
            if not plain:
                packed = tuple(str(v) if isinstance(v, uuid.UUID) else v for v in packed)
            time_ms = packed[0] if time_at is None else r[width + time_at]
            bucket.append((time_ms, packed, r[-1]))
        return out

    def _unpack(self, packed: Packed) -> tuple[Any, ...]:
        """A packed clustering key as values to bind."""
        decoders = self._packing[1]
        return tuple(d(v) for d, v in zip(decoders, packed, strict=True))

    def pack_clustering(self, values: Sequence[Any]) -> Packed:
        """Clustering values as read by the driver (datetimes, uuids) in packed form."""
        return tuple(
            to_millis(v) if isinstance(v, datetime) else str(v) if isinstance(v, uuid.UUID) else v
            for v in values
        )

    def _time_bound(self, epoch_ms: int) -> Any:
        """An epoch as a bound on the time column: a timeuuid bound is the largest timeuuid of
        the epoch's millisecond, so ``time <= bound`` and ``time > bound`` split at the epoch."""
        if self.layout.time.cql_type == "timeuuid":
            return max_uuid_from_time(epoch_ms / 1000)
        return epoch_ms

    def epoch_value(self, epoch_ms: int | None) -> Any:
        """The stored form of an epoch in the compact table (timestamp, or a rows family's
        timeuuid ``counted_until``)."""
        if epoch_ms is None:
            return None
        if self.family.folds_by_slice and self.layout.time.cql_type == "timeuuid":
            return max_uuid_from_time(epoch_ms / 1000)
        return epoch_ms

    @staticmethod
    def epoch_ms_of(stored: Any) -> int | None:
        if stored is None:
            return None
        if isinstance(stored, datetime):
            return to_millis(stored)
        if isinstance(stored, int):
            return stored
        return to_millis(datetime_from_uuid1(stored))

    def epoch_time(self, stored: Any) -> datetime | None:
        ms = self.epoch_ms_of(stored)
        return None if ms is None else from_millis(ms)

    # --- reading raw rows -----------------------------------------------------------------

    def scan_rows(
        self, shard: int, bucket: int, after_ms: int | None = None
    ) -> dict[Key, list[Row]]:
        """Every raw row of one bucket's token range, grouped by counter (one paged query); only
        those after ``after_ms`` if given (a clustering slice: the node never reaches the
        tombstones of earlier folds behind it)."""
        select = f"SELECT {{key}}, {self._row_columns()} FROM {{raw}} "
        params: tuple[Any, ...] = bucket_bounds(self.family.shards, shard, bucket)
        if after_ms is None:
            statement = self.prepare("raw_scan", select + "WHERE {token} > ? AND {token} <= ?")
        else:
            statement = self.prepare(
                "raw_scan_after",
                select + "WHERE {token} > ? AND {token} <= ? AND {time} > ? ALLOW FILTERING",
            )
            params = (*params, self._time_bound(after_ms))
        self.requests[self.phase] += 1
        result = self.session.execute(statement, params, execution_profile=BULK_PROFILE)
        return self._parse_rows(result, len(self.layout.key))

    def read_rows(
        self, counters: Sequence[Key], after_ms: int | None = None
    ) -> dict[Key, list[Row]]:
        """Every raw row of the given counters (``IN`` reads); only those after ``after_ms`` if
        given (a clustering slice, as ``scan_rows``: past a hot counter's epoch it meets no
        tombstone of ours, every folded row being at or before the epoch it was folded at)."""
        if after_ms is None:
            found = self._rows_by_partition("raw_read", self._row_columns(), "{raw}", counters)
        else:
            found = self._rows_by_partition(
                "raw_read_after_all",
                self._row_columns(),
                "{raw}",
                counters,
                where="AND {time} > ?",
                params=(self._time_bound(after_ms),),
            )
        out: dict[Key, list[Row]] = {}
        for counter in counters:
            out[counter] = self._parse_rows(found[counter], 0).get((), [])
        return out

    def _read_counter_rows(self, name: str, where: str, params: Sequence[Any]) -> list[Row]:
        statement = self.prepare(
            name, f"SELECT {self._row_columns()} FROM {{raw}} WHERE {{key_where}} {where}"
        )
        self.requests[self.phase] += 1
        rows = self.session.execute(statement, params, execution_profile=BULK_PROFILE)
        return self._parse_rows(rows, 0).get((), [])

    def read_rows_between(self, counter: Key, low_ms: int, high_ms: int) -> list[Row]:
        """A counter's rows in ``[low_ms, high_ms]`` (a hot counter's recent past)."""
        low = self._time_bound(low_ms - 1)
        return self._read_counter_rows(
            "raw_read_between",
            "AND {time} > ? AND {time} <= ?",
            (*counter, low, self._time_bound(high_ms)),
        )

    def read_rows_at(self, counter: Key, keys: Sequence[Packed]) -> list[Row]:
        """Those of the given rows of a counter that are present: point reads, no range."""
        relation, bind = self._rows_in()
        statement = self.prepare(
            "raw_read_at",
            f"SELECT {self._row_columns()} FROM {{raw}} WHERE {{key_where}} AND {relation}",
        )
        params = [(*counter, bind(group)) for group in chunks(list(keys), ROWS_PER_BATCH)]
        results = self._concurrent(statement, params)
        return self._parse_rows((r for result in results for r in result), 0).get((), [])

    def _rows_in(self) -> tuple[str, Callable[[Sequence[Packed]], list[Any]]]:
        """The relation naming many rows of one partition by their clustering keys, and how to
        bind packed keys to it (a one-column clustering key is not a tuple)."""
        if len(self.layout.clustering) == 1:
            decode = self._packing[1][0]
            return "{time} IN ?", lambda keys: [decode(k[0]) for k in keys]
        if self._packing[2]:  # packed keys bind as they are (times as epoch ms)
            return "({clustering}) IN ?", list
        return "({clustering}) IN ?", lambda keys: [self._unpack(k) for k in keys]

    def recount(
        self,
        shard: int,
        bucket: int,
        counters: Sequence[Key] | None,
        epoch_ms: int,
        after_ms: int | None = None,
    ) -> dict[Key, tuple[int, int]]:
        """An independent recount by the server: per counter, the number and the sum of its
        present raw rows at or below ``epoch_ms`` and after ``after_ms`` if given (``GROUP BY``
        over the bucket's token range, or over the given counters). The lower bound is a
        clustering slice: the node never reaches the tombstones behind it. Summed as varint: an
        int column cannot wrap."""
        measure = f"count(*), sum(CAST({self._names['increment']} AS varint))"
        bound = self._time_bound(epoch_ms)
        params: tuple[Any, ...]
        where, params, name = "AND {time} <= ?", (bound,), "raw_recount_below"
        if after_ms is not None:
            where = "AND {time} > ? AND {time} <= ?"
            params, name = (self._time_bound(after_ms), bound), "raw_recount_between"
        if counters is None:
            statement = self.prepare(
                f"{name}_range",
                f"SELECT {{key}}, {measure} FROM {{raw}} WHERE {{token}} > ? AND {{token}} <= ? "
                f"{where} GROUP BY {{key}} ALLOW FILTERING",
            )
            self.requests[self.phase] += 1
            rows = self.session.execute(
                statement,
                (*bucket_bounds(self.family.shards, shard, bucket), *params),
                execution_profile=BULK_PROFILE,
            )
            width = len(self.layout.key)
            return {tuple(r[:width]): (r[width], r[width + 1] or 0) for r in rows}
        found = self._rows_by_partition(
            name, measure, "{raw}", counters, where=where, params=params, group=True
        )
        return {c: (rows[0][0], rows[0][1] or 0) if rows else (0, 0) for c, rows in found.items()}

    # --- the ledger: checkpoints committed a bucket at a time -----------------------------

    _LEDGER_COLUMNS = (
        "commit_id, state, value, epoch_ms, run_id, pending, pending_sum, version, pending_rows, "
        "pending_low_ms, origin_ms"
    )
    _LEDGER_VALUES = (
        "commit_id, state, value, epoch_ms, run_id, (text)null, pending_sum, version, "
        "pending_rows, pending_low_ms, origin_ms"
    )
    """The read-back of committed values, without a legacy ``pending`` list."""

    def _checkpoint(self, row: Sequence[Any], with_pending: bool = True) -> Checkpoint:
        """A ledger row as a checkpoint: its ``state`` cell (``core.pack_state``) when that
        was written by the row's last commit, else the separate columns older versions wrote.
        Its pending keys are in the run log (``keys`` of the commit's record), loaded only when
        needed (``load_pending``); a row written before that (``pending`` as a JSON list in the
        ledger itself) carries them inline."""
        commit_id, state, origin_ms = row[0], row[1], row[-1]
        if commit_id is not None and state_commit(state) == commit_id.bytes:
            checkpoint = unpack_state(state, commit_id)
            return checkpoint if origin_ms is None else replace(checkpoint, origin_ms=origin_ms)
        (value, epoch_ms, run_id, pending, pending_sum, version, pending_rows, low_ms) = row[2:-1]
        inline = bool(pending) and with_pending
        keys: frozenset[Packed] = (
            frozenset(map(tuple, json.loads(pending))) if inline else frozenset()
        )
        count = pending_rows if pending_rows is not None else len(keys)
        return Checkpoint(
            value=value or 0,
            epoch_ms=epoch_ms,
            commit_id=commit_id,
            pending=keys,
            pending_sum=pending_sum or 0,
            version=version,
            run_id=run_id,
            pending_rows=count or 0,
            low_ms=low_ms,
            pending_loaded=inline or not count,
            origin_ms=origin_ms,
        )

    def read_ledger(
        self,
        shard: int,
        bucket: int,
        counters: Sequence[Key] | None,
        with_pending: bool = True,
    ) -> Ledger:
        """A bucket's head and the checkpoints of ``counters`` (all counters when None);
        ``with_pending=False`` leaves the pending lists unparsed (a read-back of values)."""
        width = len(self.layout.key)
        columns = self._LEDGER_COLUMNS if with_pending else self._LEDGER_VALUES
        suffix = "" if with_pending else "_values"
        if counters is None:
            statement = self.prepare(
                "ledger_scan" + suffix,
                f"SELECT head, shards, {{key}}, {columns} FROM {{ledger}} "
                "WHERE shard = ? AND bucket = ?",
            )
            self.requests[self.phase] += 1
            rows = list(
                self.session.execute(statement, (shard, bucket), execution_profile=BULK_PROFILE)
            )
            head, shards = (rows[0][0], rows[0][1]) if rows else (None, None)
            checkpoints = {
                tuple(r[2 : 2 + width]): self._checkpoint(r[2 + width :], with_pending)
                for r in rows
                if r[2] is not None
            }
            # its population is counted by the caller, who reads the compact rows too
            return Ledger(head, checkpoints, None, shards)
        head_statement = self._head_statement()
        statement = self.prepare(
            "ledger_read" + suffix,
            f"SELECT {{key}}, {columns} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ? AND ({key}) IN ?",
        )
        requests: list[tuple[Any, Any]] = [(head_statement, (shard, bucket))]
        requests += [
            (statement, (shard, bucket, [tuple(c) for c in group]))
            for group in chunks(list(counters), ROWS_PER_BATCH)
        ]
        results = self._run(requests)
        head, population, shards = self._head_of(results[0].one())
        asked = {_normal(c): c for c in counters}  # the caller's key values (a date, not a Date)
        checkpoints = {
            asked.get(_normal(r[:width]), tuple(r[:width])): self._checkpoint(
                r[width:], with_pending
            )
            for result in results[1:]
            for r in result
        }
        return Ledger(head, checkpoints, population, shards)

    def population(self, shard: int, bucket: int) -> int | None:
        """A bucket's population alone: enough to choose how to read it."""
        self.requests[self.phase] += 1
        return self._head_of(self.session.execute(self._head_statement(), (shard, bucket)).one())[1]

    def bucket_head(self, shard: int, bucket: int) -> Any:
        """A bucket's head alone (the id of its last commit, None if never set)."""
        self.requests[self.phase] += 1
        return self._head_of(self.session.execute(self._head_statement(), (shard, bucket)).one())[0]

    def _head_statement(self) -> PreparedStatement:
        return self.prepare(
            "ledger_head",
            "SELECT head, population, shards FROM {ledger} WHERE shard = ? AND bucket = ? LIMIT 1",
        )

    @staticmethod
    def _head_of(row: Sequence[Any] | None) -> tuple[Any, int | None, int | None]:
        """(head, population, shards) of a head read; None where never set."""
        return (row[0], row[1], row[2]) if row is not None else (None, None, None)

    def commit_bucket(
        self,
        shard: int,
        bucket: int,
        head: Any,
        folds: Sequence[Fold],
        commit_id: Any,
        run_id: str,
        now_micros: int,
        population: int | None = None,
    ) -> bool:
        """Commit many counters of one bucket in one conditional batch: one Paxos round,
        applied only if the bucket's head is still the one the folds were planned on (every
        commit to the bucket changes the head, so two runs can never both build on one state)
        and every counter's ledger row still holds the commit its fold was built on. The head
        and the rows are read in separate requests at a quorum, not serially: a read can meet
        a commit that is still landing on the replicas and see its head but not yet its rows,
        and only the rows' own conditions keep a fold on such a stale base out (it would set
        the counter back one commit). And only if the partition belongs to the family's shard
        count (its ``shards`` static, written by every commit): a worker whose YAML says another
        count, or a run that started before a reshard fenced the partition, commits nothing
        (``MOVING`` matches no count). All or nothing. ``population`` is the bucket's count
        once this commit applies (``core.grown_population``); None leaves it as it is."""
        from .core import next_version

        head_cas = self.prepare(
            "ledger_head_cas",
            "UPDATE {ledger} SET head = ?, population = ?, shards = ? "
            "WHERE shard = ? AND bucket = ? IF head = ? AND shards IN (?, null)",
            serial=True,
        )
        # the checkpoint as one cell (``core.pack_state``); the keys are in the run log
        # (``write_commit_keys``), not in this Paxos mutation. The columns older versions
        # wrote are left as they are: ``state`` names the commit it belongs to
        row = self.prepare(
            "ledger_state_write",
            "UPDATE {ledger} SET state = ?, commit_id = ? "
            "WHERE shard = ? AND bucket = ? AND {key_where} IF commit_id = ?",
            serial=True,
        )
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED,
            consistency_level=_consistency(self.family),
            serial_consistency_level=_serial(self.family),
        )
        reset_row = self.prepare(
            "ledger_state_write_origin",
            "UPDATE {ledger} SET state = ?, commit_id = ?, origin_ms = ? "
            "WHERE shard = ? AND bucket = ? AND {key_where} IF commit_id = ?",
            serial=True,
        )
        batch.add(
            bind(
                head_cas,
                (
                    commit_id,
                    UNSET_VALUE if population is None else population,
                    self.family.shards,
                    shard,
                    bucket,
                    head,
                    self.family.shards,
                ),
            )
        )
        now_ms = now_micros // 1000
        commit = commit_id.bytes
        for f in folds:
            state = pack_state(
                commit,
                f.value,
                f.epoch_ms,
                f.pending_sum,
                len(f.pending),
                f.low_ms,
                f.base.value,
                f.folded_sum,
                next_version(now_micros, f.base.version),
                now_ms,
                run_id,
            )
            if f.origin_ms is None:
                params = (state, commit_id, shard, bucket, *f.counter, f.base.commit_id)
                batch.add(bind(row, params))
            else:  # a reset: the point its value counts from
                params = (
                    state,
                    commit_id,
                    f.origin_ms,
                    shard,
                    bucket,
                    *f.counter,
                    f.base.commit_id,
                )
                batch.add(bind(reset_row, params))
        self.requests[self.phase] += 1
        return self.session.execute(batch).was_applied

    def head_serial(self, shard: int, bucket: int) -> Any:
        """A bucket's head read at the serial level. The read is itself a Paxos round: a
        commit still in flight (accepted by some replicas when its coordinator timed out) is
        completed or superseded before it answers, and cannot apply afterwards."""
        bound = self._head_statement().bind((shard, bucket))
        bound.consistency_level = _serial(self.family)
        self.requests[self.phase] += 1
        return self._head_of(self.session.execute(bound).one())[0]

    def copy_compact(
        self, commits: Sequence[tuple[Key, Checkpoint]], run_id: str, now_micros: int
    ) -> None:
        """Write the readers' copies of committed checkpoints, each with the write timestamp
        of its commit (``version``): a late copy of an older commit never overwrites a newer
        one. Unlogged batches of many partitions (one bucket's, so one token range)."""
        unique = self.family.kind is Kind.UNIQUE
        pending = ", pending = ?" if unique else ""
        statement = self.prepare(
            "compact_copy",
            "UPDATE {compact} USING TIMESTAMP ? SET {value} = ?, {epoch} = ?, commit_id = ?, "
            f"run_id = ?, updated_at = ?{pending} WHERE {{key_where}}",
        )
        now_ms = now_micros // 1000
        params = []
        for counter, cp in commits:
            values = [
                cp.version,
                cp.value,
                self.epoch_value(cp.epoch_ms),
                cp.commit_id,
                run_id,
                now_ms,
            ]
            if unique:
                values.append(sorted((self._unpack(p) for p in cp.pending), key=repr))
            params.append((1, (*values, *counter)))
        self._write_spread(statement, params, COPY_BATCH_PARTITIONS)

    def read_copies(
        self, shard: int, bucket: int, counters: Sequence[Key] | None
    ) -> dict[Key, Copy]:
        """The compact rows of ``counters`` (all of the bucket's token range when None)."""
        pending = ", pending" if not self.family.folds_by_slice else ""
        epoch = (  # a timestamp as epoch ms from the server: no datetime built and taken apart
            "toUnixTimestamp({epoch})"
            if schema.epoch_type(self.family, self.layout) == "timestamp"
            else "{epoch}"
        )
        columns = f"{{value}}, {epoch}, commit_id, writetime({{value}}){pending}"
        if counters is None:
            statement = self.prepare(
                "compact_scan",
                f"SELECT {{key}}, {columns} FROM {{compact}} "
                "WHERE {token} > ? AND {token} <= ?",
            )
            self.requests[self.phase] += 1
            width = len(self.layout.key)
            rows = self.session.execute(
                statement,
                bucket_bounds(self.family.shards, shard, bucket),
                execution_profile=BULK_PROFILE,
            )
            return {tuple(r[:width]): self._copy(r[width:]) for r in rows}
        found = self._rows_by_partition("compact_read", columns, "{compact}", counters)
        return {c: self._copy(rows[0]) for c, rows in found.items() if rows}

    def _copy(self, row: Sequence[Any]) -> Copy:
        legacy = (
            frozenset(self.pack_clustering(p) for p in row[4])
            if len(row) > 4 and row[4]
            else _NO_KEYS
        )
        epoch = row[1]
        epoch_ms = epoch if type(epoch) is int else self.epoch_ms_of(epoch)
        return Copy(row[0] or 0, epoch_ms, row[2], row[3], legacy)

    def committed_by(self, counter: Key) -> str | None:
        """The run (or reset) id of the counter's latest commit."""
        shard, bucket = self.bucket(counter)
        checkpoint = self.read_ledger(shard, bucket, [counter]).checkpoints.get(counter)
        return checkpoint.run_id if checkpoint else None

    @staticmethod
    def new_commit_id() -> Any:
        return uuid_from_time(time.time())

    # --- the run log: which rows each commit counted (what cleanup deletes) ---------------

    @cached_property
    def key_codec(self) -> KeyCodec:
        """Counted keys <-> the bytes of the raw table's ``(clustering) IN ?`` value."""
        return KeyCodec(tuple(c.cql_type for c in self.layout.clustering))

    def _key_codec(self) -> tuple[Callable[[Key], list[Any]], Callable[[list[Any]], Key]]:
        types = [c.cql_type for c in self.layout.key]

        def encode(key: Key) -> list[Any]:
            return [_encode_value(t, v) for t, v in zip(types, key, strict=True)]

        def decode(values: list[Any]) -> Key:
            return tuple(_decode_value(t, v) for t, v in zip(types, values, strict=True))

        return encode, decode

    def commit_keys(self, folds: Sequence[Fold]) -> bytes:
        """The record of the rows ``folds`` count, as ``write_commit_keys`` stores it."""
        encode, _decode = self._key_codec()
        return pack_commit_keys(
            [(encode(f.counter), f.epoch_ms, f.pending) for f in folds], self.key_codec
        )

    def write_commit_keys(
        self,
        run_id: str,
        shard: int,
        bucket: int,
        commit_id: Any,
        folds: Sequence[Fold],
        keys: bytes | None = None,
        archive_rows: bytes | None = None,
    ) -> None:
        """Record, before a commit, the keys of the rows each of its counters counts (one
        compressed cell: the Paxos batch then carries only values and sums). Cleanup deletes
        exactly these rows once an execution verified the commit (``mark_verified``), and a later
        fold reads them if any is still present. A record of a commit that did not apply is
        never used: it is never verified, and no ledger row names its commit id. A kept family's
        records name only the counters (its rows are not deleted): the look-up's history.
        ``archive_rows``: the rows' archive record, for a family with an archive (in the same
        write: a commit's keys are never recorded without it)."""
        blob = self.commit_keys(folds) if keys is None else keys
        if archive_rows is None and self.family.archive is not None:
            archive_rows = self.archive_rows(folds)
        self.requests[self.phase] += 1
        if archive_rows is None:
            statement = self.prepare(
                "runs_keys",
                "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys) "
                "VALUES (?, ?, ?, ?, ?)",
            )
            self.session.execute(statement, (run_id, shard, bucket, commit_id, blob))
            return
        statement = self.prepare(
            "runs_keys_archive",
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys, archive_rows) "
            "VALUES (?, ?, ?, ?, ?, ?)",
        )
        self.session.execute(statement, (run_id, shard, bucket, commit_id, blob, archive_rows))

    def archive_rows(self, folds: Sequence[Fold]) -> bytes | None:
        """The archive record of the rows ``folds`` count (``archive.pack_record``), None for
        a family without an archive."""
        if self.family.archive is None:
            return None
        from .archive import pack_record

        encode, _decode = self._key_codec()
        if all(c.cql_type in PLAIN_KEY_TYPES for c in self.layout.key):
            encode = list  # JSON as they are: the encoder's call per counter is not needed
        return pack_record(folds, encode, [c.cql_type for c in self.layout.clustering])

    def archive_layout(self) -> Any:
        """The family's columns as its archive files name them (``archive.Layout``)."""
        from .archive import Layout

        lay = self.layout
        return Layout(
            tuple((c.name, c.cql_type) for c in lay.key),
            tuple((c.name, c.cql_type) for c in lay.clustering),
            lay.increment.name if lay.increment else "increment",
        )

    def mark_archived(
        self, run_id: str, shard: int, commits: Sequence[tuple[int, Any]], url: str
    ) -> None:
        """Mark commits ``(bucket, commit id)`` of a run's shard as held by the archive file
        ``url``, before any of their rows is deleted: a retry of the cleanup does not archive
        them again, and a later fold that finds one of their rows still present carries it as
        archived. One single-partition batch."""
        if not commits:
            return
        statement = self.prepare(
            "runs_archived",
            "UPDATE {runs} SET archived = ? WHERE run_id = ? AND shard = ? AND bucket = ? "
            "AND commit_id = ?",
        )
        params = [(url, run_id, shard, bucket, commit_id) for bucket, commit_id in commits]
        for group in chunks(params, ROWS_PER_BATCH):
            self._run([(self._batch(statement, group), None)])

    def mark_verified(
        self, run_id: str, shard: int, bucket: int, commit_ids: Sequence[Any], execution: str
    ) -> None:
        """Mark a bucket's commits as verified by ``execution`` (one attempt of the shard's
        compact step), after their copies were read back and their rows recounted: what that
        execution's cleanup may delete, and a copy found missing later was removed by someone
        (not a crash between commit and copy). One single-partition batch."""
        if not commit_ids:
            return
        statement = self.prepare(
            "runs_verified",
            "UPDATE {runs} SET verified_by = ? WHERE run_id = ? AND shard = ? AND bucket = ? "
            "AND commit_id = ?",
        )
        params = [(execution, run_id, shard, bucket, c) for c in commit_ids]
        self._run([(self._batch(statement, params), None)])

    def read_run_commits(
        self, run_id: str, shard: int, executions: Sequence[str]
    ) -> dict[int, list[CommitRecord]]:
        """The records of the run's commits in a shard that one of ``executions`` verified, by
        bucket. A commit no such execution verified is left out, whoever made it (a zombie
        attempt, a run that reused the run id, a task marked successful by hand): its rows,
        if counted, stay counted (its checkpoint's pending), and a later fold commits them
        again as present and deletes them then."""
        archived = self.family.archive is not None
        statement = self.prepare(
            "runs_read_archive" if archived else "runs_read",
            "SELECT bucket, commit_id, keys, verified_by"
            + (", archive_rows, archived" if archived else "")
            + " FROM {runs} WHERE run_id = ? AND shard = ?",
        )
        _encode, decode = self._key_codec()
        bound = statement.bind((run_id, shard))
        bound.fetch_size = RUN_LOG_FETCH
        self.requests[self.phase] += 1
        wanted = set(executions)
        out: dict[int, list[CommitRecord]] = defaultdict(list)
        for row in self.session.execute(bound, execution_profile=BULK_PROFILE):
            bucket, commit_id, blob, verified_by = row[:4]
            if blob is None or verified_by not in wanted:
                continue
            extra = (row[4], row[5]) if archived else (None, None)
            out[bucket].append(CommitRecord(commit_id, blob, decode, self.key_codec, *extra))
        return out

    def commit_record(
        self, run_id: str, shard: int, bucket: int, commit_id: Any
    ) -> tuple[list[tuple[list[Any], int, CountedKeys]], bytes | None, str | None] | None:
        """One commit's record: its entries (counter JSON-encoded, epoch, keys), its archive
        record and its ``archived`` mark; None when the run log no longer holds it."""
        statement = self.prepare(
            "runs_record_read",
            "SELECT keys, archive_rows, archived FROM {runs} WHERE run_id = ? AND shard = ? "
            "AND bucket = ? AND commit_id = ?",
        )
        self.requests[self.phase] += 1
        row = self.session.execute(statement, (run_id, shard, bucket, commit_id)).one()
        if row is None or row[0] is None:
            return None
        return unpack_commit_keys(row[0], self.key_codec), row[1], row[2]

    def commit_verified(self, run_id: str | None, shard: int, bucket: int, commit_id: Any) -> bool:
        """Whether an execution verified this commit (its copy was read back equal to it), as
        far as the run log remembers (``schema.RUNLOG_TTL_S``; a record gone counts as
        verified: any run that read the counter since would have copied it again)."""
        statement = self.prepare(
            "runs_verified_read",
            "SELECT verified_by FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ? "
            "AND commit_id = ?",
        )
        self.requests[self.phase] += 1
        row = self.session.execute(statement, (run_id or "", shard, bucket, commit_id)).one()
        return row is None or row[0] is not None

    def load_pending(
        self, shard: int, bucket: int, checkpoints: dict[Key, Checkpoint], counters: Iterable[Key]
    ) -> list[Key]:
        """Load, in place, the pending keys of the given counters' checkpoints from their
        commits' records (one read per commit). Returns the counters whose record is gone (the
        run log keeps records ``schema.RUNLOG_TTL_S``): their counted rows cannot be told from late
        ones."""
        wanted = [c for c in counters if not checkpoints[c].pending_loaded]
        if not wanted:
            return []
        archived = self.family.archive is not None
        statement = self.prepare(
            "runs_keys_read_archive" if archived else "runs_keys_read",
            "SELECT keys" + (", archive_rows, archived" if archived else "") + " FROM {runs} "
            "WHERE run_id = ? AND shard = ? AND bucket = ? AND commit_id = ?",
        )
        refs = sorted(
            {(checkpoints[c].run_id or "", checkpoints[c].commit_id) for c in wanted}, key=str
        )
        results = self._concurrent(statement, [(r, shard, bucket, cid) for r, cid in refs])
        encode, decode = self._key_codec()
        records: dict[tuple[str, Any], dict[Key, CountedKeys]] = {}
        archives: dict[tuple[str, Any], tuple[bytes | None, str | None]] = {}
        for ref, result in zip(refs, results, strict=True):
            row = result.one()
            if row is not None and row[0] is not None:
                records[ref] = {
                    _normal(decode(c)): keys
                    for c, _epoch, keys in unpack_commit_keys(row[0], self.key_codec)
                }
                if archived:
                    archives[ref] = (row[1], row[2])
        missing = []
        for counter in wanted:
            cp = checkpoints[counter]
            ref = (cp.run_id or "", cp.commit_id)
            keys = records.get(ref, {}).get(_normal(counter))
            if keys is None:
                missing.append(counter)
                continue
            flags, from_zero = (
                _pending_flags(archives.get(ref), encode(counter), keys.keys)
                if archived
                else (None, False)
            )
            checkpoints[counter] = replace(
                cp,
                pending=frozenset(keys.keys),
                pending_loaded=True,
                pending_flags=flags,
                unarchived_from_zero=from_zero,
            )
        return missing

    # --- deletes --------------------------------------------------------------------------

    def delete_rows(
        self, deletions: Sequence[tuple[Key, Sequence[Packed] | CountedKeys]], ts: int
    ) -> int:
        """Delete exactly these rows (never a range: a late row next to them must survive),
        with a tombstone timestamp that also shadows later retries of the same rows. One
        ``IN`` delete per counter, in unlogged batches of up to ``DELETE_BATCH_ROWS`` rows of
        many counters (the caller passes one bucket: one token range). Keys from the run log
        are bound as the bytes they are stored in."""
        relation = self._rows_in()[0]
        statement = self.prepare(
            "raw_delete_in",
            f"DELETE FROM {{raw}} USING TIMESTAMP ? WHERE {{key_where}} AND {relation}",
        )
        entries: list[tuple[int, tuple]] = []
        deleted = 0
        for counter, keys in deletions:
            if not isinstance(keys, CountedKeys):
                keys = CountedKeys.of(self.key_codec, keys)
            deleted += len(keys)
            entries += [
                (n, (ts, *counter, value)) for n, value in keys.in_values(DELETE_BATCH_ROWS)
            ]
        self._write_spread(statement, entries, DELETE_BATCH_ROWS)
        return deleted

    # --- quarantine -----------------------------------------------------------------------

    def quarantine(self, run_id: str, entries: Sequence[tuple[Key, str, str]]) -> None:
        """Keep counters out of every run (no fold, no delete) until an operator releases
        them: ``(counter, reason, detail)``."""
        statement = self.prepare(
            "quarantine_put",
            "INSERT INTO {quarantine} (shard, {key}, reason, detail, run_id, at) "
            "VALUES (?, {key_marks}, ?, ?, ?, toTimestamp(now()))",
        )
        self._concurrent(
            statement,
            [
                (self.bucket(c)[0], *c, reason, detail[:2000], run_id)
                for c, reason, detail in entries
            ],
        )

    def read_quarantine(self, shard: int) -> dict[Key, Quarantined]:
        statement = self.prepare(
            "quarantine_read",
            "SELECT {key}, reason, run_id, detail FROM {quarantine} WHERE shard = ?",
        )
        width = len(self.layout.key)
        self.requests[self.phase] += 1
        return {
            tuple(r[:width]): Quarantined(tuple(r[:width]), *r[width:])
            for r in self.session.execute(statement, (shard,), execution_profile=BULK_PROFILE)
        }

    def release(self, counter: Key) -> None:
        statement = self.prepare(
            "quarantine_release", "DELETE FROM {quarantine} WHERE shard = ? AND {key_where}"
        )
        self.session.execute(statement, (self.bucket(counter)[0], *counter))

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

    def family_state(self) -> FamilyState:
        """The family's compacted epoch, when its last sweep (a full scan) started, and the
        shard count its ledger was written with."""
        statement = self.prepare(
            "state_read",
            "SELECT epoch, last_sweep, shards, last_sweep_size FROM {state} WHERE family = ?",
        )
        row = self.session.execute(statement, (self.family.name,)).one()
        return FamilyState(*row) if row else FamilyState(None, None, None)

    def table_owners(self) -> dict[str, TableOwner]:
        """The recorded owner of each of the family's tables (``schema.TABLES_TABLE``)."""
        statement = self.prepare(
            "tables_read",
            "SELECT table_name, family, identity, recorded_at, recorded_by FROM {tables} "
            "WHERE table_name IN ?",
        )
        self.requests[self.phase] += 1
        rows = self.session.execute(statement, (list(self.family.tables),))
        return {r[0]: TableOwner(*r[1:]) for r in rows}

    def claim_table(self, table: str, identity: str, run_id: str) -> TableOwner | None:
        """Record the family as ``table``'s owner with its identity, unless an owner is recorded
        (a lightweight transaction: of two first commits, one records). None when this call
        recorded it, else the owner that is recorded."""
        statement = self.prepare(
            "tables_claim",
            "INSERT INTO {tables} (table_name, family, identity, recorded_at, recorded_by) "
            "VALUES (?, ?, ?, toTimestamp(now()), ?) IF NOT EXISTS",
            serial=True,
        )
        self.requests[self.phase] += 1
        result = self.session.execute(statement, (table, self.family.name, identity, run_id))
        if result.was_applied:
            return None
        row = result.one()
        return TableOwner(row.family, row.identity, row.recorded_at, row.recorded_by)

    def ledger_positions(self, limit: int) -> list[tuple[int, int, Key]]:
        """``(shard, bucket, counter)`` of up to ``limit`` ledger rows, the first in token order:
        where the ledger holds some counters, to check it against the shard count."""
        statement = self.prepare(
            "ledger_positions", "SELECT shard, bucket, {key} FROM {ledger} LIMIT ?"
        )
        self.requests[self.phase] += 1
        return [
            (r[0], r[1], tuple(r[2:]))
            for r in self.session.execute(statement, (limit,))
            if all(v is not None for v in r[2:])  # a partition holding only its head
        ]

    # --- reshard: moving the rows that depend on the shard count --------------------------

    def with_shards(self, shards: int) -> Store:
        """This store for the same family at another shard count (a reshard's old count)."""
        family = self.family.model_copy(update={"shards": shards})
        return Store(self.conn, family, self._layout, self.concurrency)

    def replace_identity(
        self, table: str, expected: dict[str, Any], identity: dict[str, Any]
    ) -> bool:
        """Replace ``table``'s recorded identity if it is still ``expected`` (a lightweight
        transaction); whether it was."""
        from .identity import encode

        statement = self.prepare(
            "tables_replace",
            "UPDATE {tables} SET identity = ? WHERE table_name = ? IF identity = ?",
            serial=True,
        )
        result = self.session.execute(statement, (encode(identity), table, encode(expected)))
        return result.was_applied or encode(identity) == result.one().identity

    def fence_bucket(self, shard: int, bucket: int) -> None:
        """Set a ledger partition's ``shards`` to ``MOVING`` under its head's compare-and-set:
        from then on no commit applies to it, whoever planned it."""
        statement = self.prepare(
            "ledger_fence",
            "UPDATE {ledger} SET shards = ? WHERE shard = ? AND bucket = ? IF head = ?",
            serial=True,
        )
        for _attempt in range(16):
            head = self.head_serial(shard, bucket)
            if self.session.execute(statement, (MOVING, shard, bucket, head)).was_applied:
                return
        raise EngineError(
            f"family {self.family.name!r}: ledger partition {shard}/{bucket} kept changing "
            "while a reshard fenced it; stop the family's runs (pause its DAG) and run it again"
        )

    def open_bucket(self, shard: int, bucket: int, shards: int) -> None:
        """A ledger partition of the new shard count: its ``shards`` set, a fresh head (a
        reader of the old one commits nothing), its population to be counted again."""
        statement = self.prepare(
            "ledger_open",
            "UPDATE {ledger} SET shards = ?, head = ?, population = null "
            "WHERE shard = ? AND bucket = ?",
        )
        self.session.execute(statement, (shards, self.new_commit_id(), shard, bucket))

    def drop_bucket(self, shard: int, bucket: int) -> None:
        """Delete a ledger partition a smaller shard count no longer has (its rows moved)."""
        statement = self.prepare(
            "ledger_drop", "DELETE FROM {ledger} WHERE shard = ? AND bucket = ?"
        )
        self.session.execute(statement, (shard, bucket))

    @cached_property
    def _ledger_row_columns(self) -> list[str]:
        """The ledger's columns a checkpoint's row holds (not its key, not the statics)."""
        table = self.session.cluster.metadata.keyspaces[self.family.keyspace].tables[
            schema.ledger_table(self.family)
        ]
        fixed = {c.name for c in (*table.partition_key, *table.clustering_key)}
        return [
            name
            for name, column in table.columns.items()
            if name not in fixed and not column.is_static
        ]

    def ledger_rows(self, shard: int, bucket: int) -> list[tuple[Key, dict[str, Any]]]:
        """Every checkpoint row of a ledger partition, its columns as stored."""
        columns = self._ledger_row_columns
        statement = self.prepare(
            "ledger_rows",
            f"SELECT {{key}}, {', '.join(q(c) for c in columns)} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ?",
        )
        width = len(self.layout.key)
        rows = self.session.execute(statement, (shard, bucket), execution_profile=BULK_PROFILE)
        return [
            (tuple(r[:width]), dict(zip(columns, r[width:], strict=True)))
            for r in rows
            if r[0] is not None
        ]

    def move_ledger_row(
        self, counter: Key, row: dict[str, Any], old: tuple[int, int], new: tuple[int, int]
    ) -> None:
        """A checkpoint row at its new place and its deletion at the old one, in one logged
        batch (both or neither, eventually)."""
        columns = list(row)
        insert = self.prepare(
            "ledger_row_insert",
            f"INSERT INTO {{ledger}} (shard, bucket, {{key}}, {', '.join(q(c) for c in columns)}) "
            f"VALUES (?, ?, {{key_marks}}, {', '.join('?' for _ in columns)})",
        )
        delete = self.prepare(
            "ledger_row_delete",
            "DELETE FROM {ledger} WHERE shard = ? AND bucket = ? AND {key_where}",
        )
        self._move(insert, (*new, *counter, *row.values()), delete, (*old, *counter))

    def _move(
        self, insert: PreparedStatement, at_new: Sequence[Any], delete: PreparedStatement,
        at_old: Sequence[Any],
    ) -> None:  # fmt: skip
        """A row written at its new place and deleted at its old one, in one logged batch
        (both or neither, eventually): a reshard that dies between two moves leaves each row
        at one place or the other, never at none."""
        batch = BatchStatement(
            batch_type=BatchType.LOGGED, consistency_level=_consistency(self.family)
        )
        batch.add(insert, at_new)
        batch.add(delete, at_old)
        self.session.execute(batch)

    def copy_commit_record(
        self, row: dict[str, Any], counter: Key, old: tuple[int, int], new: tuple[int, int]
    ) -> bool:
        """Copy the counter's entry of its last commit's record of counted keys to the
        record at its new place (merged with the entries already copied there): a later fold
        reads it there. False when there is none to copy (nothing counted is pending, or the
        record expired)."""
        cp = self._checkpoint([row.get(c) for c in self._LEDGER_COLUMNS.split(", ")])
        if cp.commit_id is None or not cp.pending_rows or cp.pending_loaded:
            return False
        archived = self.family.archive is not None
        read = self.prepare(
            "runs_record_read" if archived else "runs_keys_read",
            "SELECT keys"
            + (", archive_rows, archived" if archived else "")
            + " FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ? AND commit_id = ?",
        )
        run_id = cp.run_id or ""
        found = self.session.execute(read, (run_id, *old, cp.commit_id)).one()
        if found is None or found[0] is None:
            return False
        encode, _decode = self._key_codec()
        wanted = encode(counter)
        entry = [e for e in unpack_commit_keys(found[0], self.key_codec) if e[0] == wanted]
        if not entry:
            return False
        there = self.session.execute(read, (run_id, *new, cp.commit_id)).one()
        entries = [
            e
            for e in (unpack_commit_keys(there[0], self.key_codec) if there and there[0] else [])
            if e[0] != wanted
        ]
        blob = pack_commit_keys([*entries, *entry], self.key_codec)
        if not archived or found[1] is None:
            write = self.prepare(
                "runs_keys",
                "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys) "
                "VALUES (?, ?, ?, ?, ?)",
            )
            self.session.execute(write, (run_id, *new, cp.commit_id, blob))
            return True
        # the counter's part of the commit's archive record goes with its keys, in their order
        from .archive import join_records, record_part, unpack_record

        mine = tuple(wanted)
        parts = []
        if there is not None and there[1] is not None:
            parts.append(record_part(unpack_record(there[1]), lambda c: c != mine))
        parts.append(record_part(unpack_record(found[1]), lambda c: c == mine))
        write = self.prepare(
            "runs_keys_archive_moved",
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys, archive_rows, archived) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        self.session.execute(
            write, (run_id, *new, cp.commit_id, blob, join_records(parts), found[2])
        )
        return True

    def move_quarantine(self, before: int, shards: int) -> int:
        """Move quarantine entries to their shard under ``shards``; how many moved."""
        read = self.prepare(
            "quarantine_all",
            "SELECT {key}, reason, detail, run_id, at FROM {quarantine} WHERE shard = ?",
        )
        insert = self.prepare(
            "quarantine_move",
            "INSERT INTO {quarantine} (shard, {key}, reason, detail, run_id, at) "
            "VALUES (?, {key_marks}, ?, ?, ?, ?)",
        )
        delete = self.prepare(
            "quarantine_release", "DELETE FROM {quarantine} WHERE shard = ? AND {key_where}"
        )
        width = len(self.layout.key)
        moved = 0
        for shard in range(before):
            for r in list(self.session.execute(read, (shard,))):
                counter = tuple(r[:width])
                to = shard_of(self.token(counter), shards)
                if to == shard:
                    continue
                self._move(insert, (to, *counter, *r[width:]), delete, (shard, *counter))
                moved += 1
        return moved

    def move_marks(self, before: int, shards: int) -> int:
        """Move the touched index's marks to their partition under ``shards``, each with its
        server write time (the forget horizon compares it); how many moved."""
        read = self.prepare(
            "index_all",
            "SELECT {key}, minutes, writetime(touched) FROM {index} WHERE shard = ? AND slot = ?",
        )
        insert = self.prepare(
            "index_move",
            "UPDATE {index} USING TIMESTAMP ? SET touched = true, minutes = minutes + ? "
            "WHERE shard = ? AND slot = ? AND {key_where}",
        )
        delete = self.prepare(
            "index_delete", "DELETE FROM {index} WHERE shard = ? AND slot = ? AND {key_where}"
        )
        width = len(self.layout.key)
        moved = 0
        for shard in range(before):
            for slot in range(BUCKETS):
                for r in list(self.session.execute(read, (shard, slot))):
                    counter = tuple(r[:width])
                    to = bucket_of(self.token(counter), shards)
                    if to == (shard, slot):
                        continue
                    minutes, written = r[width] or set(), r[width + 1]
                    self._move(
                        insert, (written, minutes, *to, *counter), delete, (shard, slot, *counter)
                    )
                    moved += 1
        return moved

    def record_shards(self, shards: int) -> None:
        """The family state's shard count after a reshard."""
        statement = self.prepare("state_shards", "UPDATE {state} SET shards = ? WHERE family = ?")
        self.session.execute(statement, (shards, self.family.name))

    def family_epoch(self) -> datetime | None:
        return self.family_state().epoch

    def advance_family_epoch(
        self,
        epoch: datetime,
        run_id: str,
        swept_at: datetime | None = None,
        sweep_size: int | None = None,
    ) -> None:
        """Record the family's compacted epoch; the write timestamp is the epoch itself, so the
        newest epoch wins whatever order overlapping runs finish in. A sweep run also records
        when it started and how much it read."""
        statement = self.prepare(
            "state_write",
            "UPDATE {state} USING TIMESTAMP ? SET epoch = ?, run_id = ?, shards = ?, "
            "updated_at = toTimestamp(now()) WHERE family = ?",
        )
        self.session.execute(
            statement,
            (write_timestamp(epoch), epoch, run_id, self.family.shards, self.family.name),
        )
        if swept_at is not None:
            sweep = self.prepare(
                "state_sweep",
                "UPDATE {state} SET last_sweep = ?, last_sweep_size = ? WHERE family = ?",
            )
            self.session.execute(sweep, (swept_at, sweep_size, self.family.name))

    @cached_property
    def audit_log(self) -> AuditLog:
        """The family's audit trail (month partitions; ``auditlog``)."""
        from .auditlog import AuditLog

        return AuditLog(self)

    def write_audit(self, record: dict[str, Any]) -> None:
        """One audit row, stamped with ``provenance`` (who started the change)."""
        self.audit_log.write(record)

    def read_audit(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` audit rows, across month partitions."""
        return self.audit_log.page(limit)

    # --- bounded reads for the UI (nothing here writes) -----------------------------------

    def read_audit_range(
        self, limit: int, since: datetime | None = None, before: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Audit rows with ``since <= started_at < before`` (naive UTC; open ends when None),
        newest first, at most ``limit``: a slice of each month partition until ``limit`` is
        met. The next page is ``before`` = the last row's ``started_at``."""
        return self.audit_log.page(limit, since, before)

    def read_quarantine_sample(self, limit: int) -> list[Quarantined]:
        """Up to ``limit`` quarantined counters of the whole family in one bounded read (the
        table is small; a count beyond ``limit`` is not needed to see that something is)."""
        statement = self.prepare(
            "quarantine_sample", "SELECT {key}, reason, run_id, detail FROM {quarantine} LIMIT ?"
        )
        width = len(self.layout.key)
        self.requests[self.phase] += 1
        return [
            Quarantined(tuple(r[:width]), *r[width:])
            for r in self.session.execute(statement, (limit,), execution_profile=BULK_PROFILE)
        ]

    def quarantined_entry(self, counter: Key) -> Quarantined | None:
        """The counter's quarantine entry, if it is quarantined (one point read)."""
        statement = self.prepare(
            "quarantine_one",
            "SELECT reason, run_id, detail FROM {quarantine} WHERE shard = ? AND {key_where}",
        )
        self.requests[self.phase] += 1
        row = self.session.execute(
            statement, (self.bucket(counter)[0], *counter), execution_profile=BULK_PROFILE
        ).one()
        return Quarantined(counter, *row) if row else None

    def runs_with_counter(self, run_ids: Sequence[str], counter: Key) -> set[str]:
        """Which of these runs committed ``counter``: one read of each run's log for the
        counter's bucket (the run log is kept two weeks)."""
        statement = self.prepare(
            "runs_bucket",
            "SELECT keys FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ?",
        )
        shard, bucket = self.bucket(counter)
        encode, _decode = self._key_codec()
        wanted = encode(counter)
        results = self._concurrent(statement, [(run_id, shard, bucket) for run_id in run_ids])
        return {
            run_id
            for run_id, result in zip(run_ids, results, strict=True)
            if any(
                entry[0] == wanted
                for (blob,) in result
                if blob is not None
                for entry in unpack_commit_keys(blob, self.key_codec)
            )
        }

    # --- read API -------------------------------------------------------------------------

    def read_values(self, counters: Sequence[Key]) -> dict[Key, tuple[int, datetime | None, int]]:
        """The seed's read rule for many counters, exact while runs copy and delete: (compact
        value, epoch, newer rows' sum; their count for a rows family; their distinct members for
        a unique family).

        A run deletes a counter's rows only after the copy that counts them was written and
        read back. So the rows after an epoch, read before a read of the copy that finds that
        same epoch, are every row after it (none was deleted before the raw read), and the
        value is that copy's plus those rows. A copy that moved in between (a run committed
        meanwhile) is read against again, at its new epoch. The epoch a counter was last read
        at is kept a minute (``READ_HINT_S``) as the next read's first bound: epochs only move
        forward, so a repeated read takes the raw read and the copy's, as the rule itself does.
        A family that keeps its rows deletes nothing, and one pass is exact."""
        keys = list(dict.fromkeys(counters))
        if self.family.folds_by_slice:
            bases = self._read_bases(keys)
            newer = self._read_newer(keys, {c: b.epoch for c, b in bases.items()})
            return {c: self._read_value(c, b, newer[c]) for c, b in bases.items()}
        now = time.monotonic()
        bounds: dict[Key, Any] = {}
        cold: list[Key] = []
        for counter in keys:
            hint = self._read_hints.get(counter)
            if hint is not None and now - hint[0] < READ_HINT_S:
                bounds[counter] = hint[1]
            else:
                cold.append(counter)
        bounds.update((c, b.epoch) for c, b in self._read_bases(cold).items())
        out: dict[Key, tuple[int, datetime | None, int]] = {}
        todo = keys
        for _attempt in range(READ_ATTEMPTS):
            newer = self._read_newer(todo, bounds)
            for counter, base in self._read_bases(todo).items():
                if self.epoch_ms_of(base.epoch) == self.epoch_ms_of(bounds[counter]):
                    out[counter] = self._read_value(counter, base, newer[counter])
                    self._hint(counter, base.epoch)
                else:
                    bounds[counter] = base.epoch
            todo = [c for c in todo if c not in out]
            if not todo:
                return out
        raise EngineError(
            f"family {self.family.name!r}: the compact rows of {len(todo)} counter(s) moved at "
            f"each of {READ_ATTEMPTS} reads (e.g. {todo[0]}): too many runs at once; read again"
        )

    def _hint(self, counter: Key, epoch: Any) -> None:
        if len(self._read_hints) >= READ_HINTS:
            self._read_hints.clear()  # rare; a cleared hint costs one read of the copy
        self._read_hints[counter] = (time.monotonic(), epoch)

    def _read_value(
        self, counter: Key, base: ReadBase, newer: Any
    ) -> tuple[int, datetime | None, int]:
        return base.value, self.epoch_time(base.epoch), base.measure(newer, self, counter)

    def _read_bases(self, counters: Sequence[Key]) -> dict[Key, ReadBase]:
        """Each counter's compact row as a reader's base (value, stored epoch, and for a unique
        family the members it already counts); an empty base where there is none."""
        unique = self.family.kind is Kind.UNIQUE
        if unique:
            statement = self.prepare(
                "compact_value_pending",
                "SELECT {value}, {epoch}, pending FROM {compact} WHERE {key_where}",
            )
        else:
            statement = self.prepare(
                "compact_value", "SELECT {value}, {epoch} FROM {compact} WHERE {key_where}"
            )
        out: dict[Key, ReadBase] = {}
        for counter, result in zip(counters, self._concurrent(statement, counters), strict=True):
            row = result.one()
            if row is None:
                out[counter] = EMPTY_READ_BASE
                continue
            members = frozenset(key[1] for key in (row[2] or ())) if unique else frozenset()
            out[counter] = ReadBase(row[0] or 0, row[1], members)  # (first_time, member) keys
        return out

    def _read_newer(self, counters: Sequence[Key], bounds: dict[Key, Any]) -> dict[Key, Any]:
        """What each counter's rows after its base's epoch add: their sum (varint: an int column
        cannot wrap), their count for a rows family, their members for a unique family."""
        unique = self.family.kind is Kind.UNIQUE
        if unique:  # members, counted distinct: a clock-behind winner leaves two rows
            measure = "{member}"
        elif self.layout.increment is None:
            measure = "count(*)"
        else:
            measure = "sum(CAST({increment} AS varint))"
        newer = self.prepare(
            "raw_newer", f"SELECT {measure} FROM {{raw}} WHERE {{key_where}} AND {{time}} > ?"
        )
        everything = self.prepare("raw_all", f"SELECT {measure} FROM {{raw}} WHERE {{key_where}}")
        requests = [
            (newer, (*c, bounds[c])) if bounds[c] is not None else (everything, c) for c in counters
        ]
        out: dict[Key, Any] = {}
        for counter, result in zip(counters, self._run(requests), strict=True):
            out[counter] = {r[0] for r in result} if unique else result.one()[0] or 0
        return out


READ_ATTEMPTS = 8
"""Rounds a read takes at most while runs keep moving its counters' copies (a run moves a
counter's copy once; a read round takes milliseconds)."""
READ_HINT_S = 60.0
"""How long the epoch a counter was read at serves as the next read's first bound: the raw read
after a stale bound also reads the rows (or tombstones) of the folds since."""
READ_HINTS = 100_000
"""Counters whose last read epoch a store keeps."""


class ReadBase(NamedTuple):
    """A reader's base: a counter's compact row as read (its epoch as stored)."""

    value: int
    epoch: Any
    counted: frozenset[Any] = frozenset()
    """A unique family's members the copy counts already (its ``pending``)."""

    def measure(self, newer: Any, store: Store, counter: Key) -> int:
        """The rows after the epoch as the read rule adds them: a number as read, or for a
        unique family the members not counted yet (not in the copy's ``pending``, and not marked
        counted by an earlier cleanup: its first row is gone, a clock-behind duplicate not)."""
        if not isinstance(newer, set):
            return newer
        members = newer - self.counted
        return len(members - store.counted_members(counter, sorted(members, key=repr)))


EMPTY_READ_BASE = ReadBase(0, None)


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


def _identity(value: Any) -> Any:
    return value


def _pending_flags(
    archive: tuple[bytes | None, str | None] | None, counter: list[Any], keys: Sequence[Packed]
) -> tuple[dict[Packed, int], bool]:
    """The ``ROW_*`` flags of a counter's pending keys from its commit's archive record, each
    ``ROW_ARCHIVED`` when a cleanup archived the commit (and did not leave the counter out: a
    quarantined one), and whether no archive holds the commit and it was built on zero. A
    commit recorded before the family had an archive: every key counted, none archived."""
    from .archive import archived_skipped, unpack_record
    from .core import ROW_ARCHIVED, ROW_COUNTED

    blob, mark = archive or (None, None)
    flags: list[int] | None = None
    from_zero = False
    if blob is not None:
        record = unpack_record(blob)
        flags = record.flags_of(counter)
        segment = next((s for s in record.segments if s.counter == tuple(counter)), None)
        from_zero = bool(segment and segment.from_zero)
    if flags is None or len(flags) != len(keys):
        flags = [ROW_COUNTED] * len(keys)
    skipped = archived_skipped(mark)  # None: the commit is not archived
    archived = skipped is not None and tuple(counter) not in skipped
    extra = ROW_ARCHIVED if archived else 0
    kept = ROW_COUNTED | ROW_ARCHIVED
    flagged = {k: (f | extra) & kept for k, f in zip(keys, flags, strict=True)}
    return flagged, from_zero and not archived


def _normal(key: Sequence[Any]) -> tuple[Any, ...]:
    """A key with the driver's own value types made plain (``cassandra.util.Date`` -> date)."""
    return tuple(v.date() if isinstance(v, CassandraDate) else v for v in key)


def _encode_value(cql_type: str, value: Any) -> Any:
    """A key value as JSON (the run's chunks list counters)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return to_millis(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)  # uuid, date, decimal, inet


def _decode_value(cql_type: str, value: Any) -> Any:
    import datetime as dt
    import decimal

    if value is None:
        return None
    if cql_type in ("uuid", "timeuuid"):
        return uuid.UUID(value)
    if cql_type == "date":
        return dt.date.fromisoformat(value)
    if cql_type == "timestamp":
        return from_millis(value)
    if cql_type == "decimal":
        return decimal.Decimal(value)
    if cql_type == "blob":
        return bytes.fromhex(value)
    return value


COMMIT_KEYS_V2 = b"\x02"
"""First byte of a run-log record whose keys are CQL bytes (``rowkeys``); a record written
before them is a zlib stream of JSON (its first byte is 0x78) and is still read."""


def pack_commit_keys(
    entries: Sequence[tuple[list[Any], int, Sequence[Packed] | CountedKeys]], codec: KeyCodec
) -> bytes:
    """One commit's counted keys, ``(counter as JSON values, its new epoch in ms, keys)`` per
    counter, as one compressed cell (zlib level 1): a JSON header of the counters, then each
    counter's keys as the elements of the ``IN`` value the cleanup binds."""
    header: list[list[Any]] = []
    bodies: list[bytes] = []
    for counter, epoch_ms, keys in entries:
        body = keys.body if isinstance(keys, CountedKeys) else codec.encode(keys)
        header.append([counter, epoch_ms, len(keys), len(body)])
        bodies.append(body)
    head = json.dumps(header, separators=(",", ":")).encode()
    data = b"".join([struct.pack(">i", len(head)), head, *bodies])
    return COMMIT_KEYS_V2 + zlib.compress(data, 1)


def unpack_commit_keys(blob: bytes, codec: KeyCodec) -> list[tuple[list[Any], int, CountedKeys]]:
    """The entries of :func:`pack_commit_keys` (or of a record from before it), keys still as
    bytes: decoded only where they are compared (``CountedKeys.keys``)."""
    if blob[:1] != COMMIT_KEYS_V2:
        return [
            (counter, epoch, CountedKeys.of(codec, keys))
            for counter, epoch, keys in json.loads(zlib.decompress(blob))
        ]
    data = zlib.decompress(blob[1:])
    (size,) = struct.unpack_from(">i", data, 0)
    at = 4 + size
    out: list[tuple[list[Any], int, CountedKeys]] = []
    for counter, epoch, count, width in json.loads(data[4:at]):
        out.append((counter, epoch, CountedKeys(codec, count, data[at : at + width])))
        at += width
    return out


def _bound_bytes(bound: BoundStatement) -> int:
    """The bytes of a bound statement's values: what its rows weigh in a batch, give or take
    the length prefixes (``ROW_BYTES`` adds the rest)."""
    return sum(len(v) for v in bound.values if isinstance(v, bytes))  # not None, not unset


def batch_too_large(exc: BaseException) -> bool:
    """The node refused a batch over its ``batch_size_fail_threshold`` (nothing of it
    applied)."""
    return isinstance(exc, InvalidRequest) and "Batch too large" in str(exc)


def bind(statement: PreparedStatement, values: Sequence[Any]) -> BoundStatement:
    """``statement.bind(values)``, the same bytes, without the driver's detour for every value:
    it builds a column descriptor (a namedtuple) per value to ask a column-encryption policy,
    which the engine never sets (half of binding a commit's 14-value row: 8.0 -> 3.9 us). The
    driver's own ``bind`` does every case this one does not: a policy, fewer values than
    markers, an unset value (it may not bind a routing key), a value of the wrong type (its
    error names the column)."""
    columns = statement.column_metadata
    if statement.column_encryption_policy is not None or len(values) != len(columns):
        return statement.bind(values)
    protocol = statement.protocol_version
    out: list[Any] = []
    try:
        for value, column in zip(values, columns, strict=True):
            if value is UNSET_VALUE:
                return statement.bind(values)
            if type(value) is Encoded:  # already the protocol's bytes (``rowkeys``)
                out.append(value)
                continue
            out.append(None if value is None else column.type.serialize(value, protocol))
    except (TypeError, struct.error):
        return statement.bind(values)
    bound = BoundStatement(statement)
    bound.raw_values = values
    bound.values = out
    return bound


class MillisTimestampType(DateType):
    """The driver's ``timestamp`` type, bound from epoch milliseconds without its detour: its
    serializer tries a datetime's methods and catches two ``AttributeError`` for every int,
    which was half of the client's time binding a cleanup's million row keys."""

    @staticmethod
    def serialize(v: Any, protocol_version: int) -> bytes:
        if type(v) is int:
            return int64_pack(v)
        return DateType.serialize(v, protocol_version)


def millis_timestamps(cqltype: Any) -> Any:
    """``cqltype`` with every ``timestamp`` in it (also inside lists and tuples) bound by
    :class:`MillisTimestampType`; the same bytes for every value."""
    if cqltype is DateType:
        return MillisTimestampType
    if not issubclass(cqltype, ListType | SetType | MapType | TupleType) or issubclass(
        cqltype, UserType
    ):
        return cqltype
    subtypes = cqltype.subtypes
    fast = [millis_timestamps(t) for t in subtypes]
    if all(a is b for a, b in zip(fast, subtypes, strict=True)):
        return cqltype
    return cqltype.apply_parameters(fast)
