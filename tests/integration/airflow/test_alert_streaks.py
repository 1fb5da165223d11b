"""Alerts a person keeps switched on: one when a family starts failing, a reminder once the
interval has passed, a recovery notice, and the same for a family falling behind.

Real DAG runs (``dag.test()``) against the real node, delivered to a real HTTP receiver. The
streak state lives in Airflow Variables; a test moves a streak's last alert back in time
instead of waiting for the interval.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from counters import engine
from counters.airflow import tasks
from counters.airflow.alerting import Streak, state_key
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def variable(key: str) -> Streak | None:
    """A streak as the metadata DB holds it (read as a server process reads it)."""
    from airflow.models.variable import Variable

    return Streak.from_json(Variable.get(key, default_var=None))


def move_last_alert_back(key: str, by: timedelta) -> None:
    """As if ``by`` had passed since the streak's last alert."""
    from airflow.models.variable import Variable

    streak = variable(key)
    assert streak is not None
    moved = Streak(
        streak.since - by, streak.last_sent - by, streak.failures, streak.last_run, streak.first
    )
    Variable.set(key, moved.to_json())


def run(dag: Any, when: datetime, epoch: str | None = None) -> Any:
    """A run at ``when``; ``epoch`` its param (``dag.test`` keeps a conf for the next runs of
    the same DAG object, so every run names it)."""
    return dag.test(logical_date=when.replace(tzinfo=UTC), run_conf={"epoch": epoch})


def kinds(posts: list[dict[str, Any]]) -> list[str]:
    return [p["kind"] for p in posts]


def test_a_failing_family_alerts_once_reminds_after_the_interval_and_recovers(
    conn, make_families, dagbag, receivers, t0
):
    hook = f"http://127.0.0.1:{receivers.http_port}/hook"
    families = make_families(
        {"alerts": {"webhook_url": hook, "remind_every": "1h"}}, shape="mapped"
    )
    family = families.family(families.entries[0]["name"])
    key = state_key(family.name, "failing")
    dag = dagbag().dags[family.dag_id]
    client = CounterClient(conn, family, Store(conn, family))

    # three runs refused at once (a malformed epoch param): one alert, then silence
    for minute in range(3):
        failed = run(dag, t0 + timedelta(minutes=minute), epoch="yesterday")
        assert failed.state == "failed"
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["failing"], posts
    assert posts[0]["checks"] == ["epoch_param"] and posts[0]["failures"] == 1
    streak = variable(key)
    assert streak is not None and streak.failures == 3 and "epoch_param" in streak.first

    # the interval has passed since that alert: the next failure reminds, with the count
    move_last_alert_back(key, timedelta(hours=1, minutes=1))
    assert run(dag, t0 + timedelta(minutes=3), epoch="yesterday").state == "failed"
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["failing", "still_failing"], posts
    reminder = posts[1]
    assert reminder["failures"] == 4 and reminder["checks"] == ["epoch_param"]
    assert "still failing since" in reminder["subject"] and "4 failed runs" in reminder["subject"]
    assert run(dag, t0 + timedelta(minutes=4), epoch="yesterday").state == "failed"
    assert kinds(receivers.json_posts("/hook")) == ["failing", "still_failing"]

    # a run that folds rows succeeds: the recovery notice, and the streak is closed
    client.record([Increment(("IBM",), 7, utc_aware(t0 + timedelta(minutes=1)), ("w", 1))])
    ok = run(dag, t0 + timedelta(minutes=5) + family.lag)
    assert ok.state == "success"
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["failing", "still_failing", "recovered"], posts
    recovered = posts[2]
    assert recovered["failures"] == 5 and recovered["checks"] == []
    assert "recovered after 5 failed runs" in recovered["subject"]
    assert "the first: run: epoch_param" in recovered["message"]
    assert variable(key) is None
    assert client.read_many(["IBM"])[0].compact_value == 7

    # an idle run after that sends nothing; a new failure opens a new streak
    assert run(dag, t0 + timedelta(minutes=6) + family.lag).state == "success"
    assert run(dag, t0 + timedelta(minutes=7), epoch="yesterday").state == "failed"
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["failing", "still_failing", "recovered", "failing"], posts
    assert posts[3]["failures"] == 1
    json.dumps(posts)


def test_two_failing_tasks_of_one_run_alert_once(conn, make_families, dagbag, receivers, t0):
    """A first run sweeps: ``compact`` is mapped over the shards, and here both fail (a
    failure the retry policy does not retry). One run, one alert, one failure counted."""
    hook = f"http://127.0.0.1:{receivers.http_port}/hook"
    families = make_families({"shards": 2, "alerts": {"webhook_url": hook}}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    client = CounterClient(conn, family, Store(conn, family))
    client.record([Increment((f"C{i}",), 1, utc_aware(t0), ("w", i)) for i in range(40)])
    dag = dagbag().dags[family.dag_id]

    def blow_up(point: str) -> None:
        if point == "lease":
            raise engine.ChecksFailed("shard blew up before reading anything", [])

    with tasks.fault_hook(blow_up):
        failed = run(dag, t0 + timedelta(minutes=1) + family.lag)
    assert failed.state == "failed"
    states = {(ti.task_id, ti.map_index): ti.state for ti in failed.get_task_instances()}
    assert sorted(k for k, v in states.items() if v == "failed") == [("compact", 0), ("compact", 1)]
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["failing"], posts
    assert posts[0]["task"] in ("compact[0]", "compact[1]")
    assert variable(state_key(family.name, "failing")).failures == 1


def test_a_stale_family_alerts_once_and_says_when_it_is_fresh_again(
    conn, make_families, dagbag, receivers
):
    hook = f"http://127.0.0.1:{receivers.http_port}/hook"
    families = make_families({"freshness": "10m", "alerts": {"webhook_url": hook}}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    store.state.advance_family_epoch(now - timedelta(minutes=30), "old-run")
    freshness = dagbag().dags["counters_freshness"]

    assert freshness.test().state == "failed"
    assert freshness.test().state == "failed"
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["stale"], posts
    assert posts[0]["checks"] == ["freshness"]
    assert variable(state_key(family.name, "stale")).failures == 2

    store.state.advance_family_epoch(now - timedelta(minutes=2), "new-run")
    assert freshness.test().state == "success"
    posts = receivers.json_posts("/hook")
    assert kinds(posts) == ["stale", "fresh_again"], posts
    assert "fresh again after 2 stale checks" in posts[1]["subject"]
    assert variable(state_key(family.name, "stale")) is None
    assert freshness.test().state == "success"
    assert kinds(receivers.json_posts("/hook")) == ["stale", "fresh_again"]
