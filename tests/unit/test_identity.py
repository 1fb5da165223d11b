"""A family's identity and why a run is refused by the one its tables recorded."""

from datetime import datetime

import pytest
from counters.config import Family
from counters.identity import differences, encode, family_identity, refusal, written_shards
from counters.store import TableOwner

pytestmark = pytest.mark.unit


def family(**changes: object) -> Family:
    fields = {"name": "orders", "keyspace": "ks", "raw_table": "raw", "compact_table": "c"}
    return Family.model_validate({**fields, "lag": "1m", **changes})


def owner(recorded: Family, name: str | None = None) -> TableOwner:
    identity = encode(family_identity(recorded))
    return TableOwner(name or recorded.name, identity, datetime(2026, 11, 1, 12, 0), "run-1")


def test_settings_that_do_not_touch_the_checkpoints_may_change():
    before = family(kind="rows")
    after = family(kind="rows", lag="5m", schedule="*/5 * * * *", consistency="QUORUM")
    assert refusal(after, "c", owner(before), family_identity(after)) == ""


def test_a_kind_change_is_refused_naming_the_field_and_the_fix():
    rows = family(kind="rows")
    increments = family()
    reason = refusal(increments, "c", owner(rows), family_identity(increments))
    assert 'field \'kind\' is "increments" in the YAML but "rows" since the first commit' in reason
    assert "field 'retention' is \"delete\"" in reason  # a rows family keeps its rows
    assert (
        "set 'kind: rows' back" in reason
        and "(recorded 2026-11-01T12:00:00.000Z by run-1)" in reason
    )


def test_a_shard_change_points_at_reshard():
    reason = refusal(
        family(shards=8), "c", owner(family(shards=2)), family_identity(family(shards=8))
    )
    assert "field 'shards' is 8 in the YAML but 2" in reason
    assert "`counterctl reshard --family orders --shards 8`" in reason


def test_another_familys_table_is_refused():
    reason = refusal(family(), "c", owner(family(), "trades"), family_identity(family()))
    assert reason.startswith("family 'orders': table ks.c belongs to family 'trades'")


def test_a_record_of_an_older_version_is_compared_on_its_own_fields():
    recorded = {"kind": "increments", "shards": 4}  # no columns recorded then
    assert differences(recorded, family_identity(family())) == []
    assert differences(recorded, family_identity(family(shards=2))) == ["shards"]


def test_the_shard_count_a_ledger_was_written_with_is_found_from_positions():
    from counters.core import bucket_of

    tokens = [-(2**63) + 7, -5, 3 * 2**60, 2**63 - 11]
    positions = [(*bucket_of(t, 6), t) for t in tokens]
    assert written_shards(positions) == 6
    assert written_shards([(0, 0, 2**62)]) is None  # no count puts it there


def test_local_serial_across_data_centers_needs_the_one_that_compacts():
    from counters.identity import serial_problem

    local = family(consistency="LOCAL_QUORUM")
    assert serial_problem(local, {"dc1"}, "dc1") is None
    assert "set 'compaction_dc'" in serial_problem(local, {"dc1", "dc2"}, "dc1")
    named = family(consistency="LOCAL_QUORUM", compaction_dc="dc1")
    assert serial_problem(named, {"dc1", "dc2"}, "dc1") is None
    assert "this process's local data center is 'dc2'" in serial_problem(
        named, {"dc1", "dc2"}, "dc2"
    )
    assert "not replicated to" in serial_problem(
        family(consistency="LOCAL_QUORUM", compaction_dc="dc9"), {"dc1", "dc2"}, "dc9"
    )
    assert serial_problem(family(consistency="QUORUM"), {"dc1", "dc2"}, "dc2") is None


def test_table_options_that_break_totals_are_named_with_their_fix():
    from counters.schema import option_problems

    fam = family()
    assert (
        option_problems(fam, {"raw": {"gc_grace_seconds": 10800, "default_time_to_live": 0}}) == []
    )
    problems = option_problems(
        fam,
        {
            "raw": {"gc_grace_seconds": 60, "default_time_to_live": 0},
            "c": {"gc_grace_seconds": 864000, "default_time_to_live": 3600},
            "c_ledger": {"default_time_to_live": 60},
        },
    )
    assert len(problems) == 3
    assert "ks.c has default_time_to_live = 3600" in problems[0]
    assert "ks.c_ledger has default_time_to_live = 60" in problems[1]
    assert "ks.raw has gc_grace_seconds = 60, under 10800" in problems[2]
    kept = family(kind="rows")  # deletes nothing: its tombstones do not matter
    assert option_problems(kept, {"raw": {"gc_grace_seconds": 60}}) == []


def test_the_data_centers_of_a_replication_map() -> None:
    from counters.identity import dcs_of

    every = {"dc1", "dc2", "dc3"}
    nts = "org.apache.cassandra.locator.NetworkTopologyStrategy"
    assert dcs_of({"class": nts, "dc1": "3", "dc2": "0"}, every) == {"dc1"}
    assert dcs_of({"class": nts, "dc1": "3", "dc2": "2"}, every) == {"dc1", "dc2"}
    assert (
        dcs_of(
            {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "3"},
            every,
        )
        == every
    )
    assert dcs_of({}, every) == every  # a keyspace not found: every data center
