"""What every part of a family's store shares: the statements, prepared once and executed
with bounded concurrency and batching; keys, shards and packing. The types the parts return
are in ``records``."""

from __future__ import annotations

import logging
import secrets
import struct
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    OperationTimedOut,
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
from cassandra.util import max_uuid_from_time

from .. import schema
from ..config import Family
from ..connection import BULK_PROFILE, Connection
from ..core import (
    Key,
    Packed,
    Row,
    bucket_of,
    chunks,
    from_millis,
    shard_bounds,
    shard_of,
    spread,
    to_millis,
)
from ..rowkeys import Encoded, KeyCodec
from ..schema import RawLayout, q
from .records import epoch_ms_of

if TYPE_CHECKING:
    from ..audit import Provenance

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


def consistency_of(family: Family) -> int:
    return getattr(ConsistencyLevel, family.consistency.value)


def serial_consistency_of(family: Family) -> int:
    """The Paxos consistency that matches the family's: a local quorum's commits are serial
    within the data center; any other level's across the cluster (two data centers must not
    both win a compare-and-set)."""
    local = family.consistency.value.startswith("LOCAL_")
    return ConsistencyLevel.LOCAL_SERIAL if local else ConsistencyLevel.SERIAL


READ_ATTEMPTS = 8
"""Rounds a read takes at most while runs keep moving its counters' copies (a run moves a
counter's copy once; a read round takes milliseconds)."""
READ_HINT_S = 60.0
"""How long the epoch a counter was read at serves as the next read's first bound: the raw read
after a stale bound also reads the rows (or tombstones) of the folds since."""
READ_HINTS = 100_000
"""Counters whose last read epoch a store keeps."""


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


def pending_flags_of(
    archive: tuple[bytes | None, str | None] | None, counter: list[Any], keys: Sequence[Packed]
) -> tuple[dict[Packed, int], bool]:
    """The ``ROW_*`` flags of a counter's pending keys from its commit's archive record, each
    ``ROW_ARCHIVED`` when a cleanup archived the commit (and did not leave the counter out: a
    quarantined one), and whether no archive holds the commit and it was built on zero. A
    commit recorded before the family had an archive: every key counted, none archived."""
    from ..archive import archived_skipped, unpack_record
    from ..core import ROW_ARCHIVED, ROW_COUNTED

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


def normal_key(key: Sequence[Any]) -> tuple[Any, ...]:
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


class StoreBase:
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
        """Per counter, when it was last read and the epoch it was read at (``read_values``)."""
        self.provenance: Provenance | None = None
        """Who started the changes this store makes (written into its audit rows)."""
        self.checked_run: tuple[str, bool] | None = None
        """The run whose family checks passed on this store, and whether they cover a step
        that may record the identity (``identity.check_family(once_per_run=True)``)."""

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
        # before the first statement is prepared: token-aware routing needs the keyspace's
        # replication, which a connection without the full schema model reads only on demand
        schema.keyspace_metadata(self.session, f.keyspace)
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
            consistency = (
                consistency_of(self.family),
                serial_consistency_of(self.family) if serial else None,
            )
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
        return murmur3(bind(statement, counter).routing_key)

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
        the epoch's first 100 ns tick (``max_uuid_from_time``), so ``time <= bound`` and
        ``time > bound`` split there; every split of a rows family uses this same value."""
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
        return epoch_ms_of(stored)

    def epoch_time(self, stored: Any) -> datetime | None:
        ms = self.epoch_ms_of(stored)
        return None if ms is None else from_millis(ms)

    def _batch(self, statement: PreparedStatement, params: Sequence[Sequence[Any]]) -> Any:
        return self._batch_of([bind(statement, values) for values in params])

    def _scan_distinct(self, statement: PreparedStatement, shard: int) -> list[Key]:
        fine = shard_bounds(self.family.shards * SCAN_SPLITS)
        ranges = fine[shard * SCAN_SPLITS : (shard + 1) * SCAN_SPLITS]
        results = self._concurrent(statement, ranges)
        return [tuple(r) for result in results for r in result]

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

    def _batch_of(self, bound: Sequence[BoundStatement]) -> Any:
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED, consistency_level=consistency_of(self.family)
        )
        for one in bound:
            batch.add(one)
        return batch

    def _move(
        self, insert: PreparedStatement, at_new: Sequence[Any], delete: PreparedStatement,
        at_old: Sequence[Any],
    ) -> None:  # fmt: skip
        """A row written at its new place and deleted at its old one, in one logged batch
        (both or neither, eventually): a reshard that dies between two moves leaves each row
        at one place or the other, never at none."""
        batch = BatchStatement(
            batch_type=BatchType.LOGGED, consistency_level=consistency_of(self.family)
        )
        batch.add(insert, at_new)
        batch.add(delete, at_old)
        self.session.execute(batch)
