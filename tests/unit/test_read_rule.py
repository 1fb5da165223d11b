"""The read rule's pure parts (no services): what a settled read adds, and when it settles."""

import uuid
from datetime import datetime

import pytest
from cassandra.util import max_uuid_from_time, min_uuid_from_time
from counters.store import ReadBase

pytestmark = pytest.mark.unit


def test_a_unique_read_adds_the_newer_members_neither_pending_nor_marked():
    base = ReadBase(5, datetime(2026, 1, 1), frozenset({"a"}))
    assert base.measure({"a", "b", "c", "d"}, frozenset({"c"})) == 2  # b and d
    assert base.measure({"a", "b"}) == 1
    assert base.measure(7) == 7  # a sum or a count, as read


def test_a_copy_settles_a_read_only_at_the_epoch_it_was_bounded_by():
    at = datetime(2026, 1, 1, 12, 0)
    assert ReadBase(5, at).has_epoch(at)
    assert not ReadBase(5, at).has_epoch(datetime(2026, 1, 1, 12, 1))
    assert ReadBase(0, None).has_epoch(None)
    assert not ReadBase(5, at).has_epoch(None)


def test_timeuuid_epochs_within_one_millisecond_are_told_apart():
    low, high = min_uuid_from_time(1_767_268_800.0), max_uuid_from_time(1_767_268_800.0)
    assert ReadBase(5, low).has_epoch(uuid.UUID(str(low)))
    assert not ReadBase(5, high).has_epoch(low)
