"""The pure parts of ``counters.status``: freshness, typed audit rows, totals, CSV, keys."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta

import pytest
from counters.config import Family
from counters.status import (
    AUDIT_COLUMNS,
    AuditRow,
    Freshness,
    audit_csv,
    check_names,
    freshness,
    split_counter,
    totals,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 12, 0, 0)


def family(**fields: object) -> Family:
    base: dict[str, object] = {
        "name": "trades",
        "keyspace": "ks",
        "raw_table": "raw",
        "compact_table": "compact",
        "lag": "1m",
        "freshness": "10m",
    }
    base.update(fields)
    return Family.model_validate(base)


def record(**fields: object) -> dict[str, object]:
    row: dict[str, object] = {
        "family": "trades",
        "started_at": NOW,
        "run_id": "scheduled__1",
        "kind": "increments",
        "outcome": "success",
        "dry_run": False,
        "epoch_before": NOW - timedelta(minutes=2),
        "epoch_after": NOW - timedelta(minutes=1),
        "counters": 3,
        "rows_folded": 10,
        "sum_folded": 55,
        "late_rows": 0,
        "late_sum": 0,
        "max_lateness_ms": 0,
        "conflicts": 0,
        "rows_deleted": 10,
        "checks": json.dumps({"family_total_conserved": "pass"}),
        "durations": json.dumps({"compact": 0.25, "verify": 0.5}),
        "message": "",
    }
    row.update(fields)
    return row


@pytest.mark.parametrize(
    ("behind", "state"),
    [
        (timedelta(seconds=30), Freshness.FRESH),
        (timedelta(minutes=5), Freshness.FRESH),
        (timedelta(minutes=5, seconds=1), Freshness.LATE),
        (timedelta(minutes=10), Freshness.LATE),
        (timedelta(minutes=10, seconds=1), Freshness.STALE),
    ],
)
def test_expect_the_lag_colour_to_follow_half_and_all_of_the_freshness_limit(
    behind: timedelta, state: Freshness
) -> None:
    f = family()
    epoch = NOW - f.lag - behind
    lag = freshness(epoch, NOW, f)
    assert (lag.state, lag.behind, lag.limit) == (state, behind, timedelta(minutes=10))


def test_expect_a_family_never_compacted_to_say_so() -> None:
    lag = freshness(None, NOW, family())
    assert (lag.state, lag.behind) == (Freshness.NEVER, None)


def test_expect_an_audit_row_to_parse_its_json_columns_and_sum_its_phases() -> None:
    row = AuditRow.from_record(record())
    assert row.checks == {"family_total_conserved": "pass"}
    assert row.durations == {"compact": 0.25, "verify": 0.5}
    assert row.duration_s == 0.75
    assert row.lag_s == 60.0
    assert row.failed_checks == {}


def test_expect_an_unreadable_json_column_to_be_kept_not_dropped() -> None:
    row = AuditRow.from_record(record(checks="not json", durations=None, counters=None))
    assert row.checks == {"(unparsed)": "not json"}
    assert row.failed_checks == {"(unparsed)": "not json"}
    assert (row.durations, row.duration_s, row.counters) == ({}, 0.0, 0)


def test_expect_a_run_without_an_epoch_to_have_no_lag() -> None:
    assert AuditRow.from_record(record(epoch_after=None)).lag_s is None


def test_expect_the_csv_to_have_every_column_and_to_read_back() -> None:
    rows = [
        AuditRow.from_record(record()),
        AuditRow.from_record(
            record(
                run_id='r,2 "quoted"',
                outcome="failed",
                message="line one\nline two",
                checks=json.dumps({"recount_equals_counted_rows": "FAIL: 1 bucket(s)"}),
            )
        ),
    ]
    parsed = list(csv.DictReader(io.StringIO(audit_csv(rows))))
    assert list(parsed[0]) == list(AUDIT_COLUMNS)
    assert parsed[0]["started_at"] == "2026-11-22T12:00:00.000Z"
    assert parsed[0]["duration_s"] == "0.75"
    assert parsed[1]["run_id"] == 'r,2 "quoted"'
    assert parsed[1]["message"] == "line one\nline two"
    assert json.loads(parsed[1]["checks"]) == {"recount_equals_counted_rows": "FAIL: 1 bucket(s)"}


def test_expect_totals_to_add_up_the_runs_and_count_failures() -> None:
    rows = [
        AuditRow.from_record(record(rows_folded=10, rows_deleted=10, late_rows=2)),
        AuditRow.from_record(record(outcome="idle", counters=0, rows_folded=0, rows_deleted=0)),
        AuditRow.from_record(record(outcome="partial", rows_folded=5, conflicts=1)),
    ]
    result = totals(rows, truncated=True)
    assert (result.runs, result.worked, result.failed) == (3, 2, 1)
    assert (result.rows_folded, result.rows_deleted, result.late_rows, result.conflicts) == (
        15,
        20,
        2,
        1,
    )
    assert result.truncated


def test_expect_check_names_in_first_seen_order() -> None:
    rows = [
        AuditRow.from_record(record(checks=json.dumps({"b": "pass", "a": "pass"}))),
        AuditRow.from_record(record(checks=json.dumps({"c": "pass", "a": "FAIL: x"}))),
    ]
    assert check_names(rows) == ["b", "a", "c"]


def test_expect_a_composite_key_to_split_on_slashes_and_a_bad_one_to_name_the_columns() -> None:
    orders = family(kind="rows", columns={"key": ["location_id", "calculation_date"]})
    assert split_counter(orders, " 7/2026-11-22 ") == ["7", "2026-11-22"]
    assert split_counter(family(), "a/b") == ["a/b"]  # one key column: the slash is data
    with pytest.raises(ValueError, match=r"\['location_id', 'calculation_date'\]"):
        split_counter(orders, "7")
    with pytest.raises(ValueError, match="give a counter key"):
        split_counter(family(), "  ")
