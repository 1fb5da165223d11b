"""Alert streaks, decided by pure functions: when to alert, when to stay quiet, when to remind."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from counters.airflow.alerting import (
    DEFAULT_REMIND_EVERY,
    Streak,
    after_failure,
    after_success,
    remind_every,
    state_key,
)
from counters.config import Family

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 22, 10, 0)
HOUR = timedelta(hours=1)


def fail(streak: Streak | None, run: str, minutes: float, every: timedelta = HOUR):
    return after_failure(
        streak, run_id=run, now=T0 + timedelta(minutes=minutes), remind_every=every, what="x"
    )


def test_expect_one_alert_when_a_family_starts_failing_then_silence() -> None:
    first = fail(None, "r1", 0)
    assert first.notice == "started"
    assert first.streak == Streak(T0, T0, 1, "r1", "x")
    streak = first.streak
    for minute in range(1, 60):  # a run every minute for an hour: counted, not alerted
        decision = fail(streak, f"r{minute + 1}", minute)
        assert decision.notice is None, minute
        streak = decision.streak
    assert streak.failures == 60 and streak.last_sent == T0


def test_expect_a_reminder_once_the_interval_has_passed_since_the_last_alert() -> None:
    streak = fail(None, "r1", 0).streak
    assert fail(streak, "r2", 59.9).notice is None
    reminder = fail(streak, "r2", 60)
    assert reminder.notice == "reminder"
    assert reminder.streak == Streak(T0, T0 + HOUR, 2, "r2", "x")
    assert fail(reminder.streak, "r3", 119).notice is None  # counted from the reminder
    assert fail(reminder.streak, "r3", 120).notice == "reminder"


def test_expect_no_reminders_when_the_interval_is_zero() -> None:
    streak = fail(None, "r1", 0, timedelta(0)).streak
    assert fail(streak, "r2", 60 * 24 * 7, timedelta(0)).notice is None


def test_expect_a_second_failing_task_of_the_same_run_neither_counted_nor_alerted() -> None:
    streak = fail(None, "r1", 0).streak
    again = fail(streak, "r1", 90)
    assert again == type(again)(None, streak)


def test_expect_a_recovery_notice_only_for_an_open_streak() -> None:
    streak = fail(None, "r1", 0).streak
    assert after_success(streak).notice == "recovered" and after_success(streak).streak is None
    assert after_success(None).notice is None


def test_expect_the_streak_survives_its_json_and_garbage_reads_as_none() -> None:
    streak = Streak(T0, T0 + HOUR, 7, "scheduled__2026", "verify: value_change")
    assert Streak.from_json(streak.to_json()) == streak
    assert Streak.from_json(None) is None
    assert Streak.from_json("{not json") is None
    assert Streak.from_json('{"since": "yesterday"}') is None


def test_expect_remind_every_from_the_family_then_the_environment_then_an_hour() -> None:
    base = {"name": "trades", "keyspace": "ks", "raw_table": "r", "compact_table": "c"}
    plain = Family.model_validate({**base, "lag": "1m"})
    own = Family.model_validate({**base, "lag": "1m", "alerts": {"remind_every": "30m"}})
    off = Family.model_validate({**base, "lag": "1m", "alerts": {"remind_every": 0}})
    env = {"COUNTERS_ALERT_REMIND_EVERY": "4h"}
    assert remind_every(plain, {}) == DEFAULT_REMIND_EVERY == HOUR
    assert remind_every(plain, env) == timedelta(hours=4)
    assert remind_every(own, env) == timedelta(minutes=30)
    assert remind_every(off, env) == timedelta(0)
    with pytest.raises(ValueError, match="COUNTERS_ALERT_REMIND_EVERY: expected a duration"):
        remind_every(plain, {"COUNTERS_ALERT_REMIND_EVERY": "often"})
    assert state_key("trades", "stale") == "counters_alert_state__trades__stale"
