"""Time as text (one format, read back exactly), and a run's epoch (one rule for the DAG, the CLI
and the bench)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pendulum
import pytest
import pytz
from counters.airflow.alerting import Streak
from counters.core import (
    EARLIEST,
    ClockOffset,
    aware_millis,
    aware_utc,
    clock_refusal,
    clock_tolerance,
    day_text,
    from_micros,
    from_text,
    parse_moment,
    run_epoch,
    stamp,
    table_time,
    to_micros,
    to_millis,
    to_text,
    utc_aware,
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


def test_a_naive_time_is_refused_at_the_write_api_saying_what_to_pass():
    with pytest.raises(ValueError, match=r"family 'trades': at=: .* naive .* pass a tz-aware"):
        aware_utc(datetime(2026, 11, 22, 10, 0), "family 'trades': at=")
    paris = datetime(2026, 11, 22, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    utc = aware_utc(paris, "at=")
    assert isinstance(utc, pendulum.DateTime) and utc == paris and utc.utcoffset() == timedelta(0)
    assert aware_utc(pendulum.datetime(2026, 11, 22, 10, tz="Europe/Paris"), "at=").hour == 9


@pytest.mark.parametrize(
    "local",
    [
        pytz.timezone("Europe/Paris").localize(datetime(2026, 10, 25, 2, 30), is_dst=False),
        datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Paris"), fold=1),
        datetime(2026, 3, 29, 2, 30, tzinfo=ZoneInfo("Europe/Paris")),  # the spring gap
        datetime(2026, 11, 22, 11, 0, tzinfo=pytz.FixedOffset(60)),
    ],
    ids=["pytz_autumn_standard_hour", "zoneinfo_fold", "zoneinfo_spring_gap", "pytz_fixed"],
)
def test_the_write_api_takes_the_instant_a_times_own_offset_says(local):
    """What ``utcoffset()`` says, as ``utc_naive`` (a reset's point) reads it: re-reading the
    wall time in the zone's name moved these by an hour (a retry in UTC: a second row)."""
    assert aware_utc(local, "at=") == local.astimezone(UTC)
    assert table_time(aware_utc(local, "at=")) == table_time(local)


@pytest.mark.parametrize(
    "local",
    [
        pytz.timezone("Europe/Paris").localize(datetime(2026, 10, 25, 2, 30), is_dst=False),
        datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Paris"), fold=1),
        datetime(2026, 3, 29, 2, 30, 0, 999_999, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(2026, 11, 22, 11, 0, 0, 123_999, tzinfo=pytz.FixedOffset(60)),
        pendulum.datetime(2026, 11, 22, 10, 0, 59, 1_500, tz="America/New_York"),
        datetime(1969, 12, 31, 23, 59, 59, 999_500, tzinfo=UTC),
    ],
    ids=[
        "pytz_autumn",
        "zoneinfo_fold",
        "zoneinfo_gap_us",
        "pytz_fixed_us",
        "pendulum",
        "pre_1970",
    ],
)
def test_an_aware_time_is_stored_at_the_ms_its_naive_utc_form_was(local):
    """``record()`` takes an event's time to the table's ms with ``aware_millis`` (one
    subtraction, no pendulum): the very ms ``table_time`` gives its naive UTC form (what a naive
    ``Increment.time`` was stored at), floored, the instant its own ``utcoffset()`` says."""
    naive_utc = local.astimezone(UTC).replace(tzinfo=None)
    assert aware_millis(local) == to_millis(naive_utc) == to_millis(local)
    assert EARLIEST + timedelta(milliseconds=aware_millis(local)) == table_time(naive_utc)
    assert utc_aware(naive_utc) == local.astimezone(UTC) and utc_aware(local) == utc_aware(
        naive_utc
    )


def test_a_persons_time_is_tz_aware_utc_to_the_millisecond():
    at = parse_moment("2026-11-22T11:00:00.123456+01:00")
    assert at == datetime(2026, 11, 22, 10, 0, 0, 123_000, tzinfo=UTC)
    assert at.utcoffset() == timedelta(0)
    assert parse_moment("2026-11-22T10:00") == datetime(2026, 11, 22, 10, tzinfo=UTC)  # UTC


def test_micros_of_a_naive_time_are_utc_not_the_hosts_local_time(monkeypatch):
    """A naive time is the tables' UTC, whatever the host's zone (``datetime.timestamp()``
    reads a naive time as local time)."""
    monkeypatch.setenv("TZ", "America/New_York")
    import time

    time.tzset()
    try:
        moment = datetime(2026, 11, 22, 10, 0, 0, 123_457)
        assert to_micros(moment) == 1_795_341_600_123_457
        assert to_micros(moment.replace(tzinfo=UTC)) == to_micros(moment)
        assert from_micros(to_micros(moment)) == moment
        assert to_micros(EARLIEST) == 0
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_stamps_and_days_are_utc_and_read_back():
    moment = datetime(2026, 11, 22, 23, 30, 0, 123_456)
    assert stamp(moment) == "20261122T233000Z"
    assert stamp(moment, micros=True) == "20261122T233000.123456Z"
    assert from_text(stamp(moment, micros=True)) == moment
    assert from_text(stamp(moment)) == moment.replace(microsecond=0)
    tokyo = moment.replace(tzinfo=UTC).astimezone(timezone(timedelta(hours=9)))
    assert stamp(tokyo) == "20261122T233000Z" and day_text(tokyo) == "2026-11-22"


@pytest.mark.parametrize(
    "stored",
    [
        "2026-11-22T10:00:00.123456",  # isoformat() of a naive time (earlier versions)
        "2026-11-22T10:00:00.123456+00:00",  # isoformat() of an aware one
        "2026-11-22 10:00:00.123456",
    ],
)
def test_times_stored_in_an_earlier_form_still_read(stored):
    """An alert streak an earlier version kept in an Airflow Variable (its times written by
    ``isoformat()``) reads back as the same streak; written again, it takes ``to_text``."""
    old = (
        f'{{"failures": 3, "first": "f", "last_run": "r", "last_sent": "{stored}", '
        f'"since": "{stored}"}}'
    )
    streak = Streak.from_json(old)
    assert streak is not None and streak.failures == 3
    assert streak.since == streak.last_sent == datetime(2026, 11, 22, 10, 0, 0, 123_456)
    assert '"since": "2026-11-22T10:00:00.123Z"' in streak.to_json()


def test_airflows_pendulum_times_convert_like_any_other():
    """Airflow's times are pendulum's: made naive, they subtract into pendulum intervals that
    ``// timedelta`` refuses; ``utc_naive`` makes them plain datetimes first."""
    paris = pendulum.datetime(2026, 11, 22, 11, 0, 0, 123_000, tz="Europe/Paris")
    assert to_millis(paris) == to_millis(datetime(2026, 11, 22, 10, 0, 0, 123_000))
    assert table_time(aware_utc(paris, "at=")) == datetime(2026, 11, 22, 10, 0, 0, 123_000)
    assert run_epoch(paris, timedelta(minutes=1)) == datetime(2026, 11, 22, 9, 59)
    assert to_text(paris) == "2026-11-22T10:00:00.123Z"
