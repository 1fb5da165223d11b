"""``RunOutcome``: one value per finished run, the one source of its audit row (the table's
columns), its metrics, ``counterctl compact --json`` and the DAG's XCom summary, and the asset
event's ``extra``; the keys people and scripts see are those the previous release wrote."""

from __future__ import annotations

from datetime import datetime

import pytest
from counters.compaction.outcome import RunOutcome
from counters.compaction.plan import RunPlan
from counters.core import CheckOutcome, Tally
from counters.metrics import run_metrics

pytestmark = pytest.mark.unit

EPOCH = datetime(2026, 11, 22, 9, 58)
BEFORE = datetime(2026, 11, 22, 9, 57)
STARTED = datetime(2026, 11, 22, 10, 0)


def ended(outcome: str = "success", *, dry_run: bool = False) -> RunOutcome:
    plan = RunPlan("trades", "r1", EPOCH, BEFORE, (0, 1), sweep=True, dry_run=dry_run)
    tally = Tally(counters_committed=2, rows_folded=5, sum_folded=42, rows_deleted=5, rows_gone=1)
    return RunOutcome(
        plan,
        outcome,
        STARTED,
        "increments",
        tally,
        {"plan": 0.12345},
        (CheckOutcome("family_total_conserved", outcome == "success", True, "ok"),),
        "why",
        "fp",
        "file:///r",
        {"compact": 3},
        12.345,
    )


AUDIT_COLUMNS = [  # the audit row's columns as the engine writes them (no CQL change)
    "family", "started_at", "run_id", "kind", "outcome", "dry_run", "sweep", "gx_suite",
    "gx_result", "epoch_before", "epoch_after", "counters", "rows_folded", "sum_folded",
    "late_rows", "late_sum", "max_lateness_ms", "conflicts", "rows_deleted", "checks",
    "durations", "message",
]  # fmt: skip
SUMMARY_KEYS = [  # counterctl compact --json, as the previous release printed it, and one more
    "peak_rss_mib", "family", "run_id", "outcome", "epoch_before", "epoch", "sweep", "message",
    "rows_read", "counters_seen", "counters_committed", "counters_refused",
    "counters_quarantined", "conflicts", "rows_folded", "sum_folded", "late_rows", "late_sum",
    "max_lateness_ms", "rows_deleted", "windowed_reads", "capped_counters",
    "buckets_by_counter",  # new in this release
    "rows_left",
    "counted_present", "rows_gone", "quarantined", "windowed_counters", "checks",
    "durations_s", "requests", "gx_result",
]  # fmt: skip


def test_the_audit_row_has_the_tables_columns_and_the_epoch_it_left():
    row = ended().audit_row()
    assert list(row) == AUDIT_COLUMNS
    assert row["epoch_after"] == EPOCH and row["counters"] == 2 and row["started_at"] == STARTED
    assert row["checks"] == {"family_total_conserved": "pass"}
    assert row["durations"] == {"plan": 0.123}
    assert row["message"].startswith("why; 1 counted business row(s) found deleted")
    failed = ended("failed").audit_row()
    assert failed["epoch_after"] == BEFORE and failed["checks"] == {
        "family_total_conserved": "FAIL: ok"
    }
    assert ended(dry_run=True).audit_row()["epoch_after"] == BEFORE


def test_the_summary_keeps_the_keys_people_see_and_the_one_time_format():
    summary = ended().summary()
    assert list(summary) == SUMMARY_KEYS
    assert summary["epoch"] == "2026-11-22T09:58:00.000Z" and summary["peak_rss_mib"] == 12.3
    assert summary["checks"] == {"family_total_conserved": True}
    assert summary["durations_s"] == {"plan": 0.123} and summary["message"] == "why"


def test_the_asset_extra_and_the_metrics_come_from_the_same_outcome():
    run = ended()
    assert run.committed and not ended().plan.dry_run
    assert run.asset_extra() == {
        "family": "trades",
        "run_id": "r1",
        "epoch_before": "2026-11-22T09:57:00.000Z",
        "epoch": "2026-11-22T09:58:00.000Z",
        "counters": 2,
        "rows_folded": 5,
        "sum_folded": 42,
        "rows_deleted": 5,
    }
    sent = {m.name: m.value for m in run_metrics(run.audit_row(), STARTED)}
    assert sent["counters.rows_folded"] == 5 and sent["counters.rows_deleted"] == 5
