"""Time as text (one format, read back exactly), and a run's epoch (one rule for the DAG, the CLI
and the bench)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from counters.core import (
    ClockOffset,
    clock_refusal,
    clock_tolerance,
    from_text,
    run_epoch,
    to_text,
)

pytestmark = pytest.mark.unit


def test_a_time_is_written_in_one_format_utc_to_the_millisecond():
    naive = datetime(2026, 11, 22, 10, 0, 0, 123_456)
    assert to_text(naive) == "2026-11-22T10:00:00.123Z"
    aware = datetime(2026, 11, 22, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    assert to_text(aware) == "2026-11-22T10:00:00.000Z"
    assert to_text(None) is None


def test_text_reads_back_as_the_naive_utc_time_it_was_written_from():
    moment = datetime(2026, 11, 22, 10, 0, 0, 123_000)
    assert from_text(to_text(moment)) == moment
    assert from_text(to_text(moment)).tzinfo is None
    assert from_text("2026-11-22T11:00:00+01:00") == datetime(2026, 11, 22, 10, 0)
    assert from_text("2026-11-22T10:00:00") == datetime(2026, 11, 22, 10, 0)
    assert from_text(None) is None
    with pytest.raises(ValueError, match="'yesterday'"):
        from_text("yesterday")


def test_a_runs_epoch_is_its_scheduled_minute_minus_the_lag_unless_overridden():
    scheduled = datetime(2026, 11, 22, 10, 0, 42, tzinfo=UTC)
    lag = timedelta(minutes=1, seconds=30)
    assert run_epoch(scheduled, lag) == datetime(2026, 11, 22, 9, 58, 30)
    assert run_epoch(scheduled, lag, "") == datetime(2026, 11, 22, 9, 58, 30)
    assert run_epoch(scheduled, lag, "2026-11-22T09:00:00+01:00") == datetime(2026, 11, 22, 8)
    with pytest.raises(ValueError, match="'soon'"):
        run_epoch(scheduled, lag, "soon")


def test_a_host_off_the_clusters_clock_by_more_than_a_quarter_of_the_lag_is_refused():
    """``clock_refusal``: the tolerance is ``lag / 4``, beyond the measurement's uncertainty;
    the reason names the family, the offset with its direction, and the tolerance."""
    lag = timedelta(minutes=1)
    assert clock_tolerance(lag) == timedelta(seconds=15)
    ok = ClockOffset(offset_us=14_900_000, uncertainty_us=50_000, source="10.0.0.1:9042")
    assert clock_refusal("trades", lag, ok) is None
    unsure = ClockOffset(offset_us=-15_040_000, uncertainty_us=50_000, source="10.0.0.1:9042")
    assert clock_refusal("trades", lag, unsure) is None  # within the read's uncertainty
    ahead = ClockOffset(offset_us=3_600_012_000, uncertainty_us=2_000, source="10.0.0.1:9042")
    reason = clock_refusal("trades", lag, ahead)
    assert reason is not None
    assert "family 'trades'" in reason and "3600.012 s ahead of the cluster's" in reason
    assert "10.0.0.1:9042" in reason and "(15 s of 60 s)" in reason
    behind = ClockOffset(offset_us=-16_000_000, uncertainty_us=2_000, source="n1")
    assert "16.000 s behind the cluster's" in (clock_refusal("trades", lag, behind) or "")
    assert clock_refusal("slow", timedelta(hours=1), behind) is None  # 15 min allowed
