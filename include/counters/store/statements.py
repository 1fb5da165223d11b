"""The statements core of a family's store: every statement prepared once (by name, from CQL
text over the family's quoted table and column names), run with bounded concurrency, batched
(unlogged within a token range, logged for a reshard's moves) and counted per phase. The tables
(``raw``, ``touched``, ``ledger``, ...) hold one and say what to run; ``keys`` holds the key,
shard and epoch arithmetic over it."""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    OperationTimedOut,
    WriteTimeout,
)
from cassandra.concurrent import execute_concurrent
from cassandra.cqltypes import DateType, ListType, MapType, SetType, TupleType, UserType
from cassandra.marshal import int64_pack
from cassandra.policies import WriteType
from cassandra.protocol import ErrorMessage
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
)

from .. import schema
from ..config import Family
from ..connection import BULK_PROFILE, Connection
from ..core import Key, shard_bounds, spread
from ..rowkeys import Encoded
from ..schema import RawLayout, q

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
REQUEST_BYTES = 4 * 2**20
"""Most estimated bytes of values one request carries where the engine can split it (the items
of an ``IN`` list, the rows of a one-partition batch, a cleanup's ``IN`` delete): a quarter of
the node's 16 MiB limits on a request (``native_transport_max_message_size``) and on a mutation
(``max_mutation_size``, half of ``commitlog_segment_size``), so neither is reached whatever the
length of the keys, and a request a busy node writes within its write timeout."""
NODE_REQUEST_BYTES = 16 * 2**20
"""The node's default limits on one request and on one mutation (16 MiB each). A request that
cannot be split (a commit's record of the keys it counts) is refused before it is sent when its
values are within ``REQUEST_MARGIN`` of it."""
REQUEST_MARGIN = 64 * 1024
"""Bytes a request takes beyond its values (its frame, its statement, the mutation's own
overhead), with room to spare."""
ROW_BYTES = 16
"""Estimated bytes a row adds to a batch beyond its bound values (its deletion or liveness
info; the node counts no length prefixes, which the estimate does)."""
RUN_LOG_FETCH = 16
"""Run log records per page: each is up to a few MiB of counted keys (~0.1 MiB for 1,000
counters of short keys), so a page of a shard's records stays small."""
COMMIT_CHUNK = 1000
"""Counters per conditional batch: one Paxos round, one mutation of the ledger partition."""
SCAN_FETCH = 5000
CAS_WRITE_UNKNOWN = 0x1700
"""Protocol v5's error for a compare-and-set whose outcome the coordinator cannot tell; driver
3.30 has no class for it and raises the bare ``ErrorMessage``."""


class _Partial(dict[str, str]):
    """``str.format_map`` values that leave every other brace as it is (``{raw}``), for
    ``Statements.names`` to fill."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


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


def _bound_bytes(bound: BoundStatement) -> int:
    """The bytes of a bound statement's values: what its rows weigh in a batch, give or take
    the length prefixes (``ROW_BYTES`` adds the rest)."""
    return sum(len(v) for v in bound.values if isinstance(v, bytes))  # not None, not unset


def value_bytes(value: Any) -> int:
    """About the bytes a value takes bound in a request, with its 4-byte length: text as UTF-8,
    bytes as they are, a tuple, list or set as its elements, any other value as at most 16."""
    if type(value) is str:
        return 4 + (len(value) if value.isascii() else len(value.encode()))
    if isinstance(value, bytes | bytearray):
        return 4 + len(value)
    if isinstance(value, tuple | list | set | frozenset):
        return 4 + sum(map(value_bytes, value))
    return 20


def bounded(
    items: Iterable[Any],
    most: int,
    weigh: Callable[[Any], int] = value_bytes,
    most_bytes: int = REQUEST_BYTES,
) -> list[list[Any]]:
    """``items`` in consecutive groups of at most ``most`` items and ``most_bytes`` estimated
    bytes (``weigh``; an item over it alone is a group of its own): how every request the
    engine splits (an ``IN`` list, a one-partition batch) stays under the node's limits however
    long the keys and members are."""
    return [group for _size, group in spread(((1, weigh(i), i) for i in items), most, most_bytes)]


def fits_one_request(values_bytes: int) -> bool:
    """Whether a request whose values take ``values_bytes`` is under the node's limits."""
    return values_bytes + REQUEST_MARGIN <= NODE_REQUEST_BYTES


def request_too_large(exc: BaseException) -> bool:
    """The node refused a request over ``native_transport_max_message_size``, a mutation over
    ``max_mutation_size`` or a batch over ``batch_size_fail_threshold`` (nothing of it
    applied)."""
    if not isinstance(exc, InvalidRequest):
        return False
    text = str(exc)
    return any(
        sign in text
        for sign in ("exceeds allowed maximum", "oversized mutation", "Batch too large")
    )


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


@dataclass(frozen=True)
class Cql:
    """A statement as its table declares it: CQL text whose braces name the family's quoted
    tables and columns (``Statements.names``) or the parts its table fills (its
    ``statement_parts``, or those given to ``Statements.prepared``), and whether it is
    conditional (prepared with the serial consistency too). ``by_partition``: a one-partition
    ``SELECT ... WHERE {key_where}`` that ``declare`` also declares over many partitions, as
    ``<name>_in`` (``Statements.rows_by_partition``)."""

    text: str
    serial: bool = False
    by_partition: bool = False

    def over_partitions(self, name: str) -> Cql:
        """The same statement over the partitions an ``IN ?`` names (``{key_in}``), its rows
        led by their key, an aggregate grouped by partition (one row each)."""
        head, _, rest = self.text.partition("SELECT ")
        if head or not rest or self.text.count("{key_where}") != 1:
            raise ValueError(
                f"statement {name!r}: by_partition needs a SELECT of one partition "
                f"('WHERE {{key_where}}' once), got {self.text!r}"
            )
        text = "SELECT {key}, " + rest.replace("{key_where}", "{key_in}")
        if _AGGREGATE.search(rest):
            text += " GROUP BY {key}"
        return Cql(text, self.serial)


_AGGREGATE = re.compile(r"\b(count|sum|min|max|avg)\(", re.IGNORECASE)


def declare(**statements: Cql) -> Mapping[str, Cql]:
    """A table's statements by name, for its class's ``STATEMENTS``: each written once (a name
    given twice does not compile), a ``by_partition`` one followed by its ``<name>_in``,
    prepared by ``Statements.prepared``, listed in docs/data-model.md
    (``counters.store.catalog``)."""
    out: dict[str, Cql] = {}
    for name, cql in statements.items():
        out[name] = cql
        if cql.by_partition:
            if f"{name}_in" in statements:
                raise ValueError(f"statement {name!r}: {name}_in is declared by by_partition")
            out[f"{name}_in"] = cql.over_partitions(name)
    return MappingProxyType(out)


class Statements:
    """A family's statements over one connection: prepared once by name, run with at most
    ``concurrency`` in flight, batched, and counted in ``requests`` by ``phase``. Cheap to
    create; statements are prepared on first use. ``Store`` makes one as ``store.statements``
    and gives it to every table."""

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
        """Per thread, the phase its requests are counted in."""

    @property
    def current_phase(self) -> str:
        """The step this thread is in (its requests are counted under it): "other" outside
        every ``phase`` block."""
        return getattr(self._local, "phase", "other")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count this thread's requests under ``name`` inside the block, and under the step
        it was in before once it ends (a step of a step does not leak into its caller's)."""
        before = self.current_phase
        self._local.phase = name
        try:
            yield
        finally:
            self._local.phase = before

    def _count(self, requests: int) -> None:
        self.requests[self.current_phase] += requests

    def execute(self, statement: Any, params: Any = None, profile: str | None = None) -> Any:
        """Send one request (a statement, a bound statement or a batch) and count it: the
        driver's ``session.execute``, with the execution profile ``profile`` if given."""
        self._count(1)
        if profile is None:
            return self.session.execute(statement, params)
        return self.session.execute(statement, params, execution_profile=profile)

    def next_page(self, result: Any) -> None:
        """Fetch a result's next page (one more request, counted)."""
        self._count(1)
        result.fetch_next_page()

    # --- plumbing -------------------------------------------------------------------------

    @property
    def session(self):
        """The connection's session: its metadata (schema reads); requests go through
        ``execute``, ``run`` and the batches, which count them."""
        return self.conn.session

    @property
    def layout_if_read(self) -> RawLayout | None:
        """The layout when given or read already, else None (nothing is read for it): what a
        store for the same family at another shard count starts from."""
        return self._layout

    @property
    def layout(self) -> RawLayout:
        """The raw table's key, clustering, time and increment columns: read from the schema
        on first use unless the store was given them."""
        if self._layout is None:
            self._layout = schema.read_raw_layout(self.session, self.family)
        return self._layout

    @cached_property
    def names(self) -> dict[str, str]:
        """The quoted table and column names a statement's CQL text names in braces
        (``{ledger}``, ``{key_where}``, ``{increment}``: empty for a rows family)."""
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
            "key_in": f"{q(lay.key[0].name)} IN ?"
            + "".join(f" AND {q(c.name)} = ?" for c in lay.key[1:]),
            "clustering": ", ".join(q(c.name) for c in lay.clustering),
            "row_where": " AND ".join(f"{q(c.name)} = ?" for c in lay.key + lay.clustering),
            "value": q(f.compact_columns.value),
            "epoch": q(f.compact_columns.epoch),
            "time": q(lay.time.name),
            "increment": q(lay.increment.name) if lay.increment else "",
            "token": f"token({', '.join(q(c.name) for c in lay.key)})",
        }

    def prepared(self, table: object, name: str, **parts: str) -> PreparedStatement:
        """The statement ``name`` of ``table``'s class's ``STATEMENTS``, prepared once; the
        braces of its text that ``names`` does not fill are filled from the table's
        ``statement_parts`` (a select list, a relation: the family's, computed once), so a call
        costs a dict lookup. ``parts`` fill those that vary (a row's columns), each set of them
        its own statement."""
        if not parts and (statement := self._prepared.get(name)) is not None:
            return statement  # prepared already (``Keys.token`` asks for one per counter)
        declared = type(table).STATEMENTS[name]  # type: ignore[attr-defined]
        fixed: Mapping[str, str] = getattr(table, "statement_parts", {})
        text = declared.text.format_map(_Partial(fixed)) if fixed else declared.text
        if parts:
            name = f"{name}:{':'.join(parts.values())}"
            text = text.format_map(_Partial(parts))
        return self.prepare(name, text, declared.serial)

    def prepare(self, name: str, cql: str, serial: bool = False) -> PreparedStatement:
        """The statement ``name``, prepared from ``cql`` (its braces filled from ``names``) the
        first time it is asked for, at the family's consistency (and its serial one for a
        conditional statement)."""
        statement = self._prepared.get(name)
        if statement is None:
            consistency = (
                consistency_of(self.family),
                serial_consistency_of(self.family) if serial else None,
            )

            def setup(new: PreparedStatement) -> None:
                new.column_metadata = [
                    c._replace(type=millis_timestamps(c.type)) for c in new.column_metadata
                ]
                new.consistency_level, serial_level = consistency
                if serial_level is not None:
                    new.serial_consistency_level = serial_level

            statement = self.conn.prepare(cql.format(**self.names), consistency, setup)
            self._prepared[name] = statement
        return statement

    def run(
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
        self._count(len(statements))
        results = execute_concurrent(
            session or self.session,
            statements,
            concurrency=self.concurrency,
            raise_on_first_error=raise_first,
            execution_profile=profile,
        )
        return [result for _ok, result in results]

    def concurrent(
        self, statement: PreparedStatement, params: Sequence[Sequence[Any]], bulk: bool = True
    ) -> list[Any]:
        """One prepared statement for many parameter sets."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT

        return self.run(
            [(statement, p) for p in params], BULK_PROFILE if bulk else EXEC_PROFILE_DEFAULT
        )

    # --- keys and shards ------------------------------------------------------------------

    def batch(self, statement: PreparedStatement, params: Sequence[Sequence[Any]]) -> Any:
        """One unlogged batch of ``statement`` for each parameter set (one partition's rows)."""
        return self.batch_of([bind(statement, values) for values in params])

    def batches(
        self, statement: PreparedStatement, partitions: Iterable[Sequence[Sequence[Any]]]
    ) -> None:
        """Write each partition's parameter sets in unlogged one-partition batches of at most
        ``ROWS_PER_BATCH`` rows and ``REQUEST_BYTES`` (``bounded``), concurrently."""
        self.run(
            [
                (self.batch(statement, group), None)
                for params in partitions
                for group in bounded(params, ROWS_PER_BATCH)
            ]
        )

    def scan_distinct(self, statement: PreparedStatement, shard: int) -> list[Key]:
        """The partition keys a ``SELECT DISTINCT`` over a token range finds in ``shard``, read
        in ``SCAN_SPLITS`` sub-ranges (a query counts tombstones per range)."""
        fine = shard_bounds(self.family.shards * SCAN_SPLITS)
        ranges = fine[shard * SCAN_SPLITS : (shard + 1) * SCAN_SPLITS]
        results = self.concurrent(statement, ranges)
        return [tuple(r) for result in results for r in result]

    def rows_by_partition(
        self,
        table: object,
        name: str,
        counters: Sequence[Key],
        *,
        params: Sequence[Any] = (),
        **parts: str,
    ) -> dict[Key, list[tuple]]:
        """Rows of many partitions, grouped by partition: ``IN ?`` over the first key column,
        ``IN_CHUNK`` partitions per request (one request instead of one each, which is what
        bounds a Python client). A composite key is grouped by its other columns first (seed
        003's orders of one day: ``location_id IN ? AND calculation_date = ?``), so the ``IN``
        names exactly the wanted partitions. A first key column whose values the driver does
        not read back as it was given them (dates, times, decimals) is read a partition a
        request: ``table``'s statement ``name`` (``WHERE {key_where}``), else ``name_in``
        (``WHERE {key_in}``, its rows led by the key). ``params`` bind what they add after
        the key (a clustering restriction); ``parts`` fill their texts (``prepared``)."""
        out: dict[Key, list[tuple]] = {c: [] for c in counters}
        lay = self.layout
        width = len(lay.key)
        if lay.key[0].cql_type not in IN_KEY_TYPES:
            statement = self.prepared(table, name, **parts)
            results = self.concurrent(statement, [(*c, *params) for c in counters])
            for counter, result in zip(counters, results, strict=True):
                out[counter].extend(tuple(r) for r in result)
            return out
        statement = self.prepared(table, f"{name}_in", **parts)
        by_rest: dict[Key, list[Key]] = defaultdict(list)
        for counter in counters:
            by_rest[tuple(counter[1:])].append(counter)
        requests: list[tuple[Any, Any]] = []
        owners: list[dict[Any, Key]] = []
        for others, group_ in by_rest.items():
            for chunk in bounded(group_, IN_CHUNK, lambda c: value_bytes(c[0])):
                requests.append((statement, ([c[0] for c in chunk], *others, *params)))
                owners.append({c[0]: c for c in chunk})
        for owner, result in zip(owners, self.run(requests), strict=True):
            for row in result:
                out[owner[row[0]]].append(tuple(row[width:]))
        return out

    def write_spread(
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
            results = self.run(
                [(self.batch_of(group), None) for _size, group in groups], raise_first=False
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

    def batch_of(self, bound: Sequence[BoundStatement]) -> Any:
        """Bound statements as one unlogged batch at the family's consistency."""
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED, consistency_level=consistency_of(self.family)
        )
        for one in bound:
            batch.add(one)
        return batch

    def move(
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
        self.execute(batch)
