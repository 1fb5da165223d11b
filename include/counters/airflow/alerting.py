"""Alert streaks: one alert when a family starts failing, a reminder at an interval while it
keeps failing, a notice when it recovers; the same for a family that falls behind (stale).

A family scheduled every minute that keeps failing used to alert every minute, and people switch
such alerts off. Each family has two streaks, ``failing`` (its compaction runs) and ``stale``
(the ``counters_freshness`` checks), kept as an Airflow Variable each
(``counters_alert_state__<family>__<kind>``, JSON) so every task of every worker sees them, also
when Cassandra is what fails. The decisions are pure (:func:`after_failure`,
:func:`after_success`); :class:`VariableStreaks` reads and writes the state.

* The first failure opens the streak and alerts (``started``).
* Later failures count; the first one at least ``remind_every`` after the last alert sends a
  ``reminder`` naming how long and how many (``remind_every: 0``: no reminders). A second task
  failing in the same run neither counts nor alerts again.
* A run that ends without failing (success, idle, no-op), or a freshness check that finds the
  family fresh, closes an open streak with a ``recovered`` notice.

Delete a Variable to forget a streak (the next failure alerts again).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from ..config import Alerts, Family, parse_duration
from ..core import from_text, to_text, utc_naive

log = logging.getLogger(__name__)

StreakKind = Literal["failing", "stale"]
FAILING: Final = "failing"
STALE: Final = "stale"

REMIND_ENV = "COUNTERS_ALERT_REMIND_EVERY"
DEFAULT_REMIND_EVERY = timedelta(hours=1)
STATE_PREFIX = "counters_alert_state"

Notice = Literal["started", "reminder", "recovered"]


def remind_every(family: Family, env: Mapping[str, str] | None = None) -> timedelta:
    """The family's ``alerts.remind_every``, else ``$COUNTERS_ALERT_REMIND_EVERY``, else 1h."""
    return remind_every_of(family.alerts, env)


def remind_every_of(alerts: Alerts, env: Mapping[str, str] | None = None) -> timedelta:
    """``alerts.remind_every``, else ``$COUNTERS_ALERT_REMIND_EVERY``, else 1h."""
    if alerts.remind_every is not None:
        return alerts.remind_every
    env = os.environ if env is None else env
    text = env.get(REMIND_ENV)
    if not text:
        return DEFAULT_REMIND_EVERY
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{REMIND_ENV}: {exc}") from None


@dataclass(frozen=True)
class Streak:
    """An open streak: since when it fails, when it last alerted, how many failures, the run
    that failed last (a second failure of the same run is not another one) and the first
    failure's summary."""

    since: datetime
    last_sent: datetime
    failures: int
    last_run: str
    first: str

    def to_json(self) -> str:
        data = asdict(self)
        data["since"] = to_text(self.since)
        data["last_sent"] = to_text(self.last_sent)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Streak | None:
        """The stored streak; None when there is none or it cannot be read (then the next
        failure opens a new one: an extra alert, never a lost one)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(
                since=from_text(data["since"]),  # earlier versions': isoformat(), read too
                last_sent=from_text(data["last_sent"]),
                failures=int(data["failures"]),
                last_run=str(data["last_run"]),
                first=str(data.get("first") or ""),
            )
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable alert streak %r; starting a new one", text)
            return None


@dataclass(frozen=True)
class Decision:
    notice: Notice | None
    """What to send: nothing, the opening alert, a reminder, or the recovery notice."""
    streak: Streak | None
    """The state to keep (None: no open streak)."""


def after_failure(
    streak: Streak | None, *, run_id: str, now: datetime, remind_every: timedelta, what: str
) -> Decision:
    """A task of ``run_id`` failed for good (or a freshness check found the family stale)."""
    now = utc_naive(now)
    if streak is None:
        return Decision("started", Streak(now, now, 1, run_id, what))
    if streak.last_run == run_id:
        return Decision(None, streak)
    counted = replace(streak, failures=streak.failures + 1, last_run=run_id)
    if remind_every > timedelta(0) and now - streak.last_sent >= remind_every:
        return Decision("reminder", replace(counted, last_sent=now))
    return Decision(None, counted)


def after_success(streak: Streak | None) -> Decision:
    """A run ended without failing (or a freshness check found the family fresh)."""
    return Decision(None if streak is None else "recovered", None)


def state_key(family: str, kind: StreakKind) -> str:
    return f"{STATE_PREFIX}__{family}__{kind}"


class VariableStreaks:
    """Streaks kept as Airflow Variables (read and written through the Task SDK, so from any
    task process or failure callback)."""

    def load(self, key: str) -> Streak | None:
        from airflow.sdk import Variable

        return Streak.from_json(Variable.get(key, default=None))

    def save(self, key: str, streak: Streak | None) -> None:
        from airflow.sdk import Variable

        if streak is None:
            Variable.delete(key)
        else:
            Variable.set(
                key,
                streak.to_json(),
                description="counters-compaction alert streak (delete it to forget the streak)",
            )
