"""Counted keys as the bytes of a CQL ``IN ?`` value: the driver's bytes, for every type the
engine packs, and back (pure: no node)."""

import uuid

import pytest
from cassandra.cqltypes import (
    AsciiType,
    BooleanType,
    ByteType,
    DateType,
    Int32Type,
    IntegerType,
    ListType,
    LongType,
    ShortType,
    TimeUUIDType,
    TupleType,
    UTF8Type,
    UUIDType,
    VarcharType,
)
from counters.rowkeys import KEY_TYPES, CountedKeys, KeyCodec
from counters.store import PACKED_TYPES, millis_timestamps

pytestmark = pytest.mark.unit

DRIVER = {
    "timestamp": DateType,
    "bigint": LongType,
    "int": Int32Type,
    "smallint": ShortType,
    "tinyint": ByteType,
    "varint": IntegerType,
    "boolean": BooleanType,
    "text": UTF8Type,
    "varchar": VarcharType,
    "ascii": AsciiType,
    "uuid": UUIDType,
    "timeuuid": TimeUUIDType,
}
"""The driver's type of each CQL type name."""

SAMPLES = {  # packed values, extremes included
    "timestamp": [0, -1, 1_795_349_400_123, 2**62],
    "bigint": [0, -(2**63), 2**63 - 1],
    "int": [0, -(2**31), 2**31 - 1],
    "smallint": [0, -(2**15), 2**15 - 1],
    "tinyint": [0, -128, 127],
    "varint": [0, -1, 2**100, -(2**70) + 3],
    "boolean": [True, False],
    "text": ["", "w", "ü-ß \u2603"],
    "varchar": ["a", "\u00e9"],
    "ascii": ["", "writer-7"],
    "uuid": [str(uuid.uuid4()), str(uuid.UUID(int=0)), str(uuid.UUID(int=2**128 - 1))],
    "timeuuid": [str(uuid.uuid1()), str(uuid.uuid1()), "0a1b2c3d-0000-1000-8000-00000000000f"],
}


def _bindable(cql_type: str, value):
    """A packed value as the driver binds it (uuids are packed as text)."""
    return uuid.UUID(value) if cql_type in ("uuid", "timeuuid") else value


def _drivers_bytes(types: tuple[str, ...], keys: list[tuple]) -> bytes:
    if len(types) == 1:
        kind = millis_timestamps(ListType.apply_parameters([DRIVER[types[0]]]))
        return kind.serialize([_bindable(types[0], k[0]) for k in keys], 5)
    element = TupleType.apply_parameters([DRIVER[t] for t in types])
    kind = millis_timestamps(ListType.apply_parameters([element]))
    return kind.serialize(
        [tuple(_bindable(t, v) for t, v in zip(types, k, strict=True)) for k in keys], 5
    )


def test_every_packed_type_has_a_codec():
    assert KEY_TYPES == PACKED_TYPES


@pytest.mark.parametrize("cql_type", sorted(SAMPLES))
def test_one_column_keys_are_the_drivers_bytes_and_back(cql_type):
    codec = KeyCodec((cql_type,))
    keys = [(v,) for v in SAMPLES[cql_type]]
    found = CountedKeys.of(codec, keys)
    ((n, value),) = found.in_values(100)
    assert n == len(keys)
    assert bytes(value) == _drivers_bytes((cql_type,), keys)
    assert codec.decode(codec.encode(keys)) == keys


@pytest.mark.parametrize("cql_type", sorted(SAMPLES))
def test_tuple_keys_are_the_drivers_bytes_and_back(cql_type):
    types = ("timestamp", cql_type, "bigint")
    keys = [(1_795_349_400_000 + i, v, -i) for i, v in enumerate(SAMPLES[cql_type])]
    ((_n, value),) = CountedKeys.of(KeyCodec(types), keys).in_values(100)
    assert bytes(value) == _drivers_bytes(types, keys)
    assert KeyCodec(types).decode(KeyCodec(types).encode(keys)) == keys


@pytest.mark.parametrize("count,most", [(0, 3), (1, 3), (3, 3), (7, 3), (9, 3), (1001, 500)])
def test_many_keys_split_into_values_of_at_most_so_many(count, most):
    codec = KeyCodec(("timestamp", "text", "bigint"))
    keys = [(1_795_349_400_000 + i, f"w{i % 3}", i) for i in range(count)]
    stored = CountedKeys(codec, count, codec.encode(keys))  # as read from the run log
    values = stored.in_values(most)
    assert [n for n, _v in values] == [min(most, count - start) for start in range(0, count, most)]
    at = 0
    for n, value in values:
        assert bytes(value) == _drivers_bytes(codec.types, keys[at : at + n])
        at += n
    assert at == count
    assert stored.keys == keys


def test_an_unknown_clustering_type_is_refused():
    with pytest.raises(ValueError, match="duration"):
        KeyCodec(("timestamp", "duration"))


@pytest.mark.parametrize(
    "text", ["", "not-a-uuid", "0a1b2c3d-0000-1000-8000-00000000000", "0a" * 17]
)
def test_a_packed_uuid_that_is_not_one_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="uuid"):
        KeyCodec(("timestamp", "timeuuid")).encode([(1, text)])


def test_uuid_bytes_decode_to_the_texts_the_driver_gives():
    raw = [uuid.uuid1().bytes, uuid.uuid4().bytes, bytes(16), b"\xff" * 16]
    for kind in ("uuid", "timeuuid"):
        body = b"".join(len(r).to_bytes(4, "big") + r for r in raw)
        assert KeyCodec((kind,)).decode(body) == [(str(uuid.UUID(bytes=r)),) for r in raw]
