"""Every request the engine can split stays under the node's size limits: the one helper that
groups by items and bytes, the ``IN`` delete values split by bytes, the commit's refusal of a
record the node would refuse, and how a refusal is told apart (no services)."""

from __future__ import annotations

import pytest
from cassandra import InvalidRequest, ReadTimeout
from counters.compaction.shard import chunk_over_limits
from counters.core import Checkpoint, Fold
from counters.rowkeys import CountedKeys, KeyCodec
from counters.store import (
    NODE_REQUEST_BYTES,
    REQUEST_BYTES,
    bounded,
    fits_one_request,
    request_too_large,
    value_bytes,
)

pytestmark = pytest.mark.unit


def test_value_bytes_counts_text_as_utf8_and_containers_by_their_elements():
    assert value_bytes("abc") == 7 and value_bytes("é") == 6
    assert value_bytes(b"\x00" * 10) == 14 and value_bytes(12) == 20
    assert value_bytes((1, "ab", [b"x"])) == 4 + 20 + 6 + (4 + 5)


def test_bounded_groups_by_items_and_by_bytes_and_a_big_item_goes_alone():
    items = ["a" * 10, "b" * 10, "c" * 100, "d" * 10, "e"]
    assert bounded(items, most=2, most_bytes=40) == [
        ["a" * 10, "b" * 10],
        ["c" * 100],
        ["d" * 10, "e"],
    ]
    assert bounded(["x"] * 5, most=2) == [["x", "x"], ["x", "x"], ["x"]]
    members = ["m" * 65_000] * 300  # a unique counter's backlog of long members
    groups = bounded(members, most=100)
    assert sum(map(len, groups)) == 300
    assert all(sum(map(value_bytes, g)) <= REQUEST_BYTES for g in groups)


def test_in_delete_values_are_split_by_bytes_as_well_as_by_keys():
    codec = KeyCodec(("timestamp", "text", "bigint"))
    keys = CountedKeys.of(codec, [(i, "k" * 1_000, i) for i in range(50)])
    whole = keys.in_values(500)
    assert [n for n, _v in whole] == [50]
    parts = keys.in_values(500, 10_000)
    assert [n for n, _v in parts] == [9, 9, 9, 9, 9, 5]
    assert all(len(v) <= 10_000 + 4 for _n, v in parts)
    assert b"".join(v[4:] for _n, v in parts) == whole[0][1][4:]
    assert [n for n, _v in keys.in_values(20, 10_000)] == [9, 9, 9, 9, 9, 5]
    assert [n for n, _v in keys.in_values(4, 10**6)] == [4] * 12 + [2]
    one = CountedKeys.of(codec, [(1, "k" * 50_000, 1)])
    assert [n for n, _v in one.in_values(500, 10_000)] == [1]  # over it alone: a value alone


def test_a_commit_over_the_nodes_limits_is_halved_or_refused_before_it_is_sent():
    fold = Fold(("c",), Checkpoint(), 1, 1, ((1, "w", 1),), 1, 1, 1)
    assert chunk_over_limits([fold], b"x" * 1_000, None) is None
    assert chunk_over_limits([fold, fold], b"x" * (9 * 2**20), None) is not None  # halved
    assert chunk_over_limits([fold], b"x" * (9 * 2**20), None) is None  # one alone: up to the node
    refused = chunk_over_limits([fold], b"x" * (12 * 2**20), b"y" * (4 * 2**20))
    assert refused is not None and "native_transport_max_message_size" in refused
    assert fits_one_request(NODE_REQUEST_BYTES - 2**17)
    assert not fits_one_request(NODE_REQUEST_BYTES - 2**10)


def test_a_refusal_for_size_is_told_from_other_errors():
    assert request_too_large(
        InvalidRequest("CQL Message of size 17934460 bytes exceeds allowed maximum of 16777216")
    )
    assert request_too_large(InvalidRequest("Batch too large"))
    assert request_too_large(InvalidRequest("Rejected an oversized mutation (17000000/16777216)"))
    assert not request_too_large(InvalidRequest("unconfigured table x"))
    assert not request_too_large(ReadTimeout("exceeds allowed maximum"))
