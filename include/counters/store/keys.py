"""A family's keys: tokens, shards and buckets of counters, key values from text and as JSON,
counted keys as bytes, raw rows packed into plain values and back, and epochs as stored. Pure
arithmetic over the raw table's layout, but for the token (the driver's routing key of a
prepared statement), so it holds the family's statements."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

from cassandra.murmur3 import murmur3
from cassandra.util import Date as CassandraDate
from cassandra.util import max_uuid_from_time

from .. import schema
from ..core import Key, Packed, Row, bucket_of, from_millis, parse_epoch, shard_of, to_millis
from ..rowkeys import KeyCodec
from ..schema import q
from .records import epoch_ms_of
from .statements import IN_KEY_TYPES, Cql, Statements, bind, declare

PACKED_TYPES = IN_KEY_TYPES | {"timestamp"}
"""Clustering column types the engine can pack (and ``rowkeys.KeyCodec`` encode)."""
PLAIN_KEY_TYPES = frozenset(
    {"text", "varchar", "ascii", "int", "bigint", "smallint", "tinyint", "varint", "boolean"}
)
"""Key column types whose values are their own JSON encoding (``_encode_value``)."""


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
        if cql_type == "timestamp":  # as the table holds it: naive UTC to the ms, offset read
            return parse_epoch(text)
        if cql_type in ("uuid", "timeuuid"):
            return uuid.UUID(text)
    except ValueError as exc:
        raise ValueError(
            f"key column {column!r} ({cql_type}): cannot parse {text!r}: {exc}"
        ) from exc
    return text


def _identity(value: Any) -> Any:
    return value


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


BUCKETS_KEPT = 1 << 16
"""Counters whose bucket a store keeps (a few MiB): past it the store starts again."""


class Keys:
    """The key, shard and epoch arithmetic of one family over its statements (the layout they
    read, the token's routing key). ``Store`` makes one as ``store.keys``."""

    STATEMENTS = declare(
        compact_value=Cql("SELECT {value}, {epoch} FROM {compact} WHERE {key_where}"),
    )

    def __init__(self, statements: Statements):
        self.statements = statements
        self.family = statements.family
        self._buckets: dict[Key, tuple[int, int]] = {}

    def token(self, counter: Key) -> int:
        """The counter's partition token, from the routing key the driver binds for it."""
        statement = self.statements.prepared(self, "compact_value")
        return murmur3(bind(statement, counter).routing_key)

    def parse_key(self, parts: Sequence[str]) -> Key:
        """Typed key values from text (the CLI), by the partition key's column types."""
        key = self.statements.layout.key
        if len(parts) != len(key):
            raise ValueError(
                f"family {self.family.name!r}: key {[c.name for c in key]} needs "
                f"{len(key)} part(s), got {list(parts)}"
            )
        return tuple(_parse_value(c.cql_type, c.name, p) for c, p in zip(key, parts, strict=True))

    def shard(self, counter: Key) -> int:
        """The shard (token range) a counter is in at the family's shard count."""
        return shard_of(self.token(counter), self.family.shards)

    def fresh_identity(self) -> tuple[Any, ...]:
        """Random values for the clustering columns after the time (the seed's actor and
        version): an increment that names no identity of its own is a row of its own."""
        values: list[Any] = []
        for column in self.statements.layout.clustering[1:]:
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
        """(shard, bucket) of a counter: its ledger partition and its touched-index partition.
        Kept per counter: a shard asks it of every mark it places and again of every fold
        without a copy (each a bind and a murmur3 hash), and the shard count is fixed for the
        store's life."""
        found = self._buckets.get(counter)
        if found is None:
            if len(self._buckets) >= BUCKETS_KEPT:  # a long-lived store (the warm pool) stays
                self._buckets.clear()  # bounded; a run's bucket is far smaller than this
            found = self._buckets[counter] = bucket_of(self.token(counter), self.family.shards)
        return found

    # --- packing: raw rows and keys as plain, hashable, JSON-able values ------------------

    @cached_property
    def packing(self) -> tuple[list[str], list[Callable[[Any], Any]], bool, int | None]:
        """How raw rows are selected and packed: the clustering select expressions, a decoder
        per clustering column (packed value -> bindable value), whether no column needs
        converting, and the position of the time in epoch ms when it is not the packed time."""
        exprs: list[str] = []
        decoders: list[Callable[[Any], Any]] = []
        plain = True
        for column in self.statements.layout.clustering:
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
        if self.statements.layout.time.cql_type != "timestamp":
            exprs.append(f"toUnixTimestamp({q(self.statements.layout.time.name)})")
            time_at = len(self.statements.layout.clustering)
        return exprs, decoders, plain, time_at

    def row_columns(self) -> str:
        """The select list of raw rows; a rows family has no increment column (its rows are
        counted by the server), so the time is repeated in its place."""
        exprs = self.packing[0]
        return ", ".join([*exprs, self.statements.names["increment"] or exprs[0]])

    def parse_rows(self, rows: Iterable[tuple[Any, ...]], width: int) -> dict[Key, list[Row]]:
        """``(key..., clustering..., [time ms], increment)`` rows grouped by counter as
        ``(time ms, packed clustering, increment)``. ``width``: key columns in the row (0 when
        the caller knows the counter)."""
        _exprs, _decoders, plain, time_at = self.packing
        cw = len(self.statements.layout.clustering)
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

    def unpack(self, packed: Packed) -> tuple[Any, ...]:
        """A packed clustering key as values to bind."""
        decoders = self.packing[1]
        return tuple(d(v) for d, v in zip(decoders, packed, strict=True))

    def pack_clustering(self, values: Sequence[Any]) -> Packed:
        """Clustering values as read by the driver (datetimes, uuids) in packed form."""
        return tuple(
            to_millis(v) if isinstance(v, datetime) else str(v) if isinstance(v, uuid.UUID) else v
            for v in values
        )

    def time_bound(self, epoch_ms: int) -> Any:
        """An epoch as a bound on the time column: a timeuuid bound is the largest timeuuid of
        the epoch's first 100 ns tick (``max_uuid_from_time``), so ``time <= bound`` and
        ``time > bound`` split there; every split of a rows family uses this same value."""
        if self.statements.layout.time.cql_type == "timeuuid":
            return max_uuid_from_time(epoch_ms / 1000)
        return epoch_ms

    def epoch_value(self, epoch_ms: int | None) -> Any:
        """The stored form of an epoch in the compact table (timestamp, or a rows family's
        timeuuid ``counted_until``)."""
        if epoch_ms is None:
            return None
        if self.statements.layout.time.cql_type == "timeuuid" and self.family.folds_by_slice:
            return max_uuid_from_time(epoch_ms / 1000)
        return epoch_ms

    @staticmethod
    def epoch_ms_of(stored: Any) -> int | None:
        """An epoch as stored (timestamp or timeuuid) in epoch ms (``records.epoch_ms_of``)."""
        return epoch_ms_of(stored)

    def epoch_time(self, stored: Any) -> datetime | None:
        """An epoch as stored as a datetime (None for none)."""
        ms = self.epoch_ms_of(stored)
        return None if ms is None else from_millis(ms)

    @cached_property
    def key_codec(self) -> KeyCodec:
        """Counted keys <-> the bytes of the raw table's ``(clustering) IN ?`` value."""
        return KeyCodec(tuple(c.cql_type for c in self.statements.layout.clustering))

    def json_codec(self) -> tuple[Callable[[Key], list[Any]], Callable[[list[Any]], Key]]:
        """Counter keys -> JSON values and back, by the key columns' types (the run log's
        records and a run's chunks list counters)."""
        types = [c.cql_type for c in self.statements.layout.key]

        def encode(key: Key) -> list[Any]:
            return [_encode_value(t, v) for t, v in zip(types, key, strict=True)]

        def decode(values: list[Any]) -> Key:
            return tuple(_decode_value(t, v) for t, v in zip(types, values, strict=True))

        return encode, decode
