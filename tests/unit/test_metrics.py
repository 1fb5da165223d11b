"""A run's metrics and a family's gauges, built from the audit record (no backend here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from counters.metrics import (
    Metric,
    airflow_configured,
    family_metrics,
    for_backend,
    legacy_names_on,
    run_metrics,
    tags_reach_backend,
    unix_seconds,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 10, 0, 30)
EPOCH = datetime(2026, 11, 22, 9, 59)


def record(**overrides):
    return {
        "family": "trades",
        "outcome": "success",
        "started_at": NOW - timedelta(seconds=12),
        "epoch_after": EPOCH,
        "rows_folded": 120,
        "rows_deleted": 118,
        "late_rows": 3,
        **overrides,
    }


def test_expect_names_without_data_and_the_family_and_outcome_as_tags() -> None:
    run = {"family": "trades", "outcome": "success"}
    family = {"family": "trades"}
    sent = run_metrics(record(), NOW, quarantined=2, stale_after=timedelta(minutes=11))
    assert sent == [
        Metric("incr", "counters.rows_folded", 120, run),
        Metric("incr", "counters.rows_deleted", 118, run),
        Metric("incr", "counters.late_rows", 3, run),
        Metric("timing", "counters.run_duration", 12_000.0, run),
        Metric("incr", "counters.runs", 1, run),
        Metric("gauge", "counters.compacted_epoch_seconds", unix_seconds(EPOCH), family),
        Metric("gauge", "counters.lag_seconds", 90.0, family),
        Metric("gauge", "counters.stale_after_seconds", 660.0, family),
        Metric("gauge", "counters.quarantined", 2, family),
    ]
    assert not any("trades" in m.name for m in sent)


def test_expect_the_compacted_epoch_as_unix_seconds_whatever_its_timezone() -> None:
    assert unix_seconds(datetime(1970, 1, 1, 0, 1)) == 60.0
    aware = datetime(2026, 11, 22, 11, 59, tzinfo=UTC).astimezone()
    assert unix_seconds(aware) == unix_seconds(datetime(2026, 11, 22, 11, 59))


def test_expect_a_failed_run_before_any_compaction_to_send_no_epoch_and_no_lag() -> None:
    sent = run_metrics(
        {"family": "likes", "outcome": "failed", "started_at": NOW, "epoch_after": None}, NOW
    )
    names = {m.name: m for m in sent}
    assert names["counters.runs"].tags == {"family": "likes", "outcome": "failed"}
    assert "counters.lag_seconds" not in names
    assert "counters.compacted_epoch_seconds" not in names
    assert "counters.quarantined" not in names  # not read: no gauge, rather than a wrong 0
    assert names["counters.rows_folded"].value == 0


def test_expect_the_dry_run_outcome_as_a_tag() -> None:
    sent = run_metrics(record(outcome="dry-run"), NOW)
    assert {m.tags.get("outcome") for m in sent if m.kind == "incr"} == {"dry_run"}


def test_expect_quarantined_as_a_gauge_of_the_counters_quarantined_now() -> None:
    """A counter that stays quarantined through two runs is one counter, not two: the metric
    is a gauge (last value wins), the same value after each run, not a per-run count."""
    first = run_metrics(record(), NOW, quarantined=1)
    second = run_metrics(record(), NOW + timedelta(minutes=1), quarantined=1)
    for sent in (first, second):
        (gauge,) = [m for m in sent if m.name == "counters.quarantined"]
        assert gauge == Metric("gauge", "counters.quarantined", 1, {"family": "trades"})


def test_expect_the_family_gauges_and_none_before_the_first_run() -> None:
    tags = {"family": "trades"}
    assert family_metrics("trades", datetime(2026, 11, 22, 9, 0, 30), NOW) == [
        Metric("gauge", "counters.compacted_epoch_seconds", 1795338030.0, tags),
        Metric("gauge", "counters.lag_seconds", 3600.0, tags),
    ]
    assert family_metrics("trades", None, NOW) == []
    assert family_metrics("trades", None, NOW, stale_after=timedelta(minutes=2)) == [
        Metric("gauge", "counters.stale_after_seconds", 120.0, tags)
    ]


def test_expect_the_clock_offset_as_a_gauge_when_measured() -> None:
    """The sending host's clock minus the cluster's, in seconds: sent with a run's gauges and
    the family's (health, freshness) when measured, never as a made-up 0."""
    tags = {"family": "trades"}
    sent = run_metrics(record(), NOW, clock_offset=-3600.5)
    assert Metric("gauge", "counters.clock_offset_seconds", -3600.5, tags) in sent
    assert "counters.clock_offset_seconds" not in {m.name for m in run_metrics(record(), NOW)}
    assert family_metrics("trades", None, NOW, clock_offset=0.002) == [
        Metric("gauge", "counters.clock_offset_seconds", 0.002, tags)
    ]


def test_expect_per_family_names_where_tags_cannot_reach_the_backend() -> None:
    """Airflow's default StatsD (``statsd_on`` alone) drops tags: two families' epochs would be
    one gauge, and the stale alert could not tell them apart. There every metric goes under
    its per-family name, every tag in it."""
    plain = {"statsd_on": "True"}
    assert not tags_reach_backend(plain)
    assert not tags_reach_backend({**plain, "statsd_influxdb_enabled": "False"})
    for tagged in ("statsd_influxdb_enabled", "statsd_datadog_enabled", "otel_on"):
        assert tags_reach_backend({**plain, tagged: "True"}), tagged
    assert tags_reach_backend({"otel_on": "True"})
    assert tags_reach_backend({})  # no backend: nothing is sent anyway

    sent = run_metrics(record(), NOW, quarantined=0) + run_metrics(
        record(family="likes", outcome="failed"), NOW, quarantined=1
    )
    assert for_backend(sent, tags_reach=True, legacy=False) == sent
    named = for_backend(sent, tags_reach=False, legacy=False)
    assert [m.name for m in named] == [
        "counters.trades.rows_folded.success",
        "counters.trades.rows_deleted.success",
        "counters.trades.late_rows.success",
        "counters.trades.run_duration.success",
        "counters.trades.runs.success",
        "counters.trades.compacted_epoch_seconds",
        "counters.trades.lag_seconds",
        "counters.trades.quarantined",
        "counters.likes.rows_folded.failed",
        "counters.likes.rows_deleted.failed",
        "counters.likes.late_rows.failed",
        "counters.likes.run_duration.failed",
        "counters.likes.runs.failed",
        "counters.likes.compacted_epoch_seconds",
        "counters.likes.lag_seconds",
        "counters.likes.quarantined",
    ]
    assert [(m.kind, m.value, m.tags) for m in named] == [(m.kind, m.value, {}) for m in sent]
    assert for_backend(sent, tags_reach=True, legacy=True) == named  # asked for
    assert legacy_names_on({"COUNTERS_LEGACY_METRIC_NAMES": "1"})
    assert not legacy_names_on({"COUNTERS_LEGACY_METRIC_NAMES": "0"})
    assert not legacy_names_on({})


def test_expect_metrics_only_where_airflow_is_configured(tmp_path) -> None:
    assert not airflow_configured({"AIRFLOW_HOME": str(tmp_path)})
    assert airflow_configured({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__METRICS__STATSD_ON": "1"})
    (tmp_path / "airflow.cfg").write_text("[core]\n")
    assert airflow_configured({"AIRFLOW_HOME": str(tmp_path)})
