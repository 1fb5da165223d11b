"""The store's pure encodings (no services): the run log's record of counted keys."""

import zlib

import pytest
from counters.store import pack_commit_keys, unpack_commit_keys

pytestmark = pytest.mark.unit


def _codec():
    from counters.rowkeys import KeyCodec

    return KeyCodec(("timestamp", "text", "bigint"))


def _drivers_in_value(keys: list[tuple]) -> bytes:
    """What the driver itself binds to ``(modify_time, actor, version) IN ?`` for these keys
    (a CQL list of tuples: the count, then each tuple behind its length): the reference the
    codec's bytes are checked against, not the codec."""
    from cassandra.cqltypes import DateType, ListType, LongType, TupleType, UTF8Type

    key = TupleType.apply_parameters([DateType, UTF8Type, LongType])
    return ListType.apply_parameters([key]).serialize(keys, 5)


# two keys (ms, "w", n) as the IN value the cleanup binds, pinned: the count, then per key its
# length (29) and fields, each behind its own length: 8-byte ms, 1-byte text, 8-byte bigint
TWO_KEYS_IN_VALUE = bytes.fromhex(
    "00000002"
    "0000001d" "00000008" "0000018bcfe56800" "00000001" "77" "00000008" "0000000000000001"
    "0000001d" "00000008" "0000018bcfe56801" "00000001" "77" "00000008" "0000000000000002"
)  # fmt: skip


def test_commit_keys_round_trip():
    entries = [
        (["IBM"], 1_700_000_060_000, ((1_700_000_000_000, "w", 1), (1_700_000_060_000, "w", 2))),
        (["AAPL", 3], 1_700_000_060_000, ()),  # a commit with nothing left to delete
        (["ü-ß"], 5, ((1, "a\u00e9", -5),)),
    ]
    found = unpack_commit_keys(pack_commit_keys(entries, _codec()), _codec())
    assert [(c, e, k.keys, len(k)) for c, e, k in found] == [
        (["IBM"], 1_700_000_060_000, [(1_700_000_000_000, "w", 1), (1_700_000_060_000, "w", 2)], 2),
        (["AAPL", 3], 1_700_000_060_000, [], 0),
        (["ü-ß"], 5, [(1, "a\u00e9", -5)], 1),
    ]
    for _counter, _epoch, keys in found:  # the bytes the driver would bind, count first
        assert len(keys).to_bytes(4, "big") + keys.body == _drivers_in_value(keys.keys)


def test_a_record_from_before_the_key_bytes_is_still_read():
    import json

    legacy = [[["IBM"], 7, [[1_700_000_000_000, "w", 1], [1_700_000_000_001, "w", 2]]]]
    blob = zlib.compress(json.dumps(legacy).encode(), 1)
    ((counter, epoch, keys),) = unpack_commit_keys(blob, _codec())
    assert (counter, epoch, keys.keys) == (
        ["IBM"],
        7,
        [(1_700_000_000_000, "w", 1), (1_700_000_000_001, "w", 2)],
    )
    # bound as a new record's keys are: the driver's bytes for those keys, pinned
    assert keys.in_values(500) == [(2, TWO_KEYS_IN_VALUE)]
    assert _drivers_in_value(keys.keys) == TWO_KEYS_IN_VALUE


def test_commit_keys_are_compressed():
    entries = [
        ([f"c{i}"], 1, tuple((1_700_000_000_000 + j, "writer", j) for j in range(10)))
        for i in range(1000)
    ]
    blob = pack_commit_keys(entries, _codec())
    assert len(blob) * 4 < len(zlib.decompress(blob[1:]))


def test_timestamps_bound_from_millis_are_the_drivers_bytes():
    from datetime import datetime

    from cassandra.cqltypes import DateType, ListType, LongType, TupleType, UTF8Type
    from counters.store import MillisTimestampType, millis_timestamps

    keys = ListType.apply_parameters([TupleType.apply_parameters([DateType, UTF8Type, LongType])])
    fast = millis_timestamps(keys)
    assert fast.subtypes[0].subtypes[0] is MillisTimestampType
    assert fast.cql_parameterized_type() == keys.cql_parameterized_type()
    for value in ([(1_795_349_400_000, "w", 3)], [(datetime(2026, 1, 1, 1, 2, 3, 4000), "w", -1)]):
        assert fast.serialize(value, 5) == keys.serialize(value, 5)
    assert millis_timestamps(UTF8Type) is UTF8Type


def _prepared(*columns: tuple[str, object], routing: list[int] | None = None):
    """A prepared statement as the driver builds one from a node's answer (no node needed)."""
    from cassandra.protocol import ColumnMetadata
    from cassandra.query import PreparedStatement
    from counters.store import millis_timestamps

    meta = [ColumnMetadata("ks", "t", name, millis_timestamps(t)) for name, t in columns]
    return PreparedStatement(meta, b"id", routing, "UPDATE ks.t ...", "ks", 5, None, None)


def test_bind_gives_the_drivers_bytes():
    import uuid

    from cassandra.cqltypes import (
        DateType,
        Int32Type,
        ListType,
        LongType,
        TimeUUIDType,
        TupleType,
        UTF8Type,
    )
    from counters.store import bind

    keys = ListType.apply_parameters([TupleType.apply_parameters([DateType, UTF8Type, LongType])])
    statement = _prepared(
        ("type", UTF8Type),
        ("value", LongType),
        ("epoch_ms", DateType),
        ("commit_id", TimeUUIDType),
        ("rows", Int32Type),
        ("keys", keys),
        routing=[0],
    )
    commit = uuid.uuid1()
    for values in (
        ("IBM", -5, 1_795_349_400_000, commit, 3, [(1_795_349_400_000, "w", 2)]),
        ("ü-ß", 2**62, 0, commit, None, []),  # None: a null cell
    ):
        ours, drivers = bind(statement, values), statement.bind(values)
        assert ours.values == drivers.values
        assert ours.routing_key == drivers.routing_key
        assert ours.raw_values == values


def test_bind_sends_encoded_keys_as_they_are():
    from cassandra.cqltypes import DateType, ListType, LongType, TupleType, UTF8Type
    from counters.rowkeys import CountedKeys
    from counters.store import bind

    keys = ListType.apply_parameters([TupleType.apply_parameters([DateType, UTF8Type, LongType])])
    statement = _prepared(("ts", LongType), ("type", UTF8Type), ("keys", keys), routing=[1])
    rows = [(1_795_349_400_000, "w", 2), (1_795_349_400_001, "v", 3)]
    ((n, value),) = CountedKeys.of(_codec(), rows).in_values(500)
    ours, drivers = bind(statement, (9, "IBM", value)), statement.bind((9, "IBM", rows))
    assert n == 2
    assert ours.values == drivers.values
    assert ours.routing_key == drivers.routing_key


def test_bind_leaves_every_other_case_to_the_driver():
    from cassandra.cqltypes import LongType, UTF8Type
    from cassandra.query import UNSET_VALUE
    from counters.store import bind

    statement = _prepared(("type", UTF8Type), ("value", LongType), routing=[0])
    assert bind(statement, ("IBM", UNSET_VALUE)).values == [b"IBM", UNSET_VALUE]
    assert bind(statement, ("IBM",)).values == [b"IBM", UNSET_VALUE]  # padded
    with pytest.raises(ValueError, match="routing key 'type'"):
        bind(statement, (UNSET_VALUE, 1))
    with pytest.raises(TypeError, match='column "value"'):
        bind(statement, ("IBM", "not a number"))


def test_a_commits_record_may_have_expired_only_once_its_commit_is_near_the_run_logs_ttl():
    """``commit_verified`` counts a missing record as verified only when the run log may have
    let it expire; a younger commit's record is elsewhere (a reshard moved its checkpoint)."""
    import uuid

    from cassandra.util import uuid_from_time
    from counters.schema import RUNLOG_TTL_S
    from counters.store.runlog import RECORD_AGE_MARGIN_S, record_may_have_expired

    made = 1_780_000_000.0
    commit = uuid_from_time(made)
    assert not record_may_have_expired(commit, made + 60)
    assert not record_may_have_expired(commit, made + RUNLOG_TTL_S - RECORD_AGE_MARGIN_S - 1)
    assert record_may_have_expired(commit, made + RUNLOG_TTL_S - RECORD_AGE_MARGIN_S + 1)
    assert record_may_have_expired(commit, made + RUNLOG_TTL_S + 1)
    assert record_may_have_expired(uuid.uuid4(), made)  # tells no time: it may have
