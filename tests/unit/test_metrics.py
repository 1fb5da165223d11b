"""A run's metrics and a family's lag, built from the audit record (no backend here)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters.metrics import Metric, airflow_configured, lag_metrics, run_metrics

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 10, 0, 30)


def record(**overrides):
    return {
        "family": "trades",
        "outcome": "success",
        "started_at": NOW - timedelta(seconds=12),
        "epoch_after": datetime(2026, 11, 22, 9, 59),
        "rows_folded": 120,
        "rows_deleted": 118,
        "late_rows": 3,
        **overrides,
    }


def test_expect_every_count_the_outcome_the_duration_and_the_lag_of_a_run() -> None:
    tags = {"family": "trades"}
    assert run_metrics(record(), quarantined=2, now=NOW) == [
        Metric("incr", "counters.trades.rows_folded", 120, tags),
        Metric("incr", "counters.trades.rows_deleted", 118, tags),
        Metric("incr", "counters.trades.late_rows", 3, tags),
        Metric("incr", "counters.trades.quarantined", 2, tags),
        Metric("timing", "counters.trades.run_duration", 12_000.0, tags),
        Metric("incr", "counters.trades.runs.success", 1, {**tags, "outcome": "success"}),
        Metric("gauge", "counters.trades.lag_seconds", 90.0, tags),
    ]


def test_expect_a_failed_run_before_any_compaction_to_send_no_lag() -> None:
    sent = run_metrics(
        {"family": "likes", "outcome": "failed", "started_at": NOW, "epoch_after": None},
        quarantined=0,
        now=NOW,
    )
    names = [m.name for m in sent]
    assert "counters.likes.runs.failed" in names
    assert not any(name.endswith("lag_seconds") for name in names)
    assert {m.name: m.value for m in sent}["counters.likes.rows_folded"] == 0


def test_expect_the_dry_run_outcome_as_a_metric_name() -> None:
    names = [m.name for m in run_metrics(record(outcome="dry-run"), 0, NOW)]
    assert "counters.trades.runs.dry_run" in names


def test_expect_the_lag_from_the_compacted_epoch_and_none_before_the_first_run() -> None:
    assert lag_metrics("trades", datetime(2026, 11, 22, 9, 0, 30), NOW) == [
        Metric("gauge", "counters.trades.lag_seconds", 3600.0, {"family": "trades"})
    ]
    assert lag_metrics("trades", None, NOW) == []


def test_expect_metrics_only_where_airflow_is_configured(tmp_path) -> None:
    assert not airflow_configured({"AIRFLOW_HOME": str(tmp_path)})
    assert airflow_configured({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__METRICS__STATSD_ON": "1"})
    (tmp_path / "airflow.cfg").write_text("[core]\n")
    assert airflow_configured({"AIRFLOW_HOME": str(tmp_path)})
