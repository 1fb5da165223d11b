"""``counters_freshness``: one task checks every family; a family whose compacted epoch fell
behind alerts its own channels, and says so again only when it is fresh again."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from counters.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def test_one_task_alerts_each_stale_family_through_its_own_channel_until_fresh_again(
    conn, make_families, dagbag, receivers, task_log
):
    port = receivers.http_port
    families = make_families(
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/a"}},  # stale
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/b"}},  # stale
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/c"}},  # fresh
        {"alerts": {"webhook_url": f"http://127.0.0.1:{port}/c"}},  # never compacted
    )
    a, b, fresh, new = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    Store(conn, a).control.advance_family_epoch(now - timedelta(minutes=30), "old-run")
    Store(conn, b).control.advance_family_epoch(now - timedelta(minutes=40), "old-run")
    Store(conn, fresh).control.advance_family_epoch(now - timedelta(minutes=2), "recent-run")
    dag = dagbag().dags["counters_freshness"]
    assert [t.task_id for t in dag.tasks] == ["check_freshness"]

    run = dag.test()

    assert run.state == "failed"
    (ti,) = run.get_task_instances()
    assert ti.state == "failed"
    state = ti.xcom_pull(task_ids="check_freshness", key="freshness")
    assert sorted(state["stale"]) == sorted([a.name, b.name])
    assert state["fresh"] == [fresh.name] and state["never_compacted"] == [new.name]
    assert 39 * 60 <= state["families"][b.name]["behind_s"] < 44 * 60  # 40m - lag, + test time
    log = task_log.text  # the task's log lines
    assert "clock: this worker is " in log and "the cluster's (coordinator" in log
    for family, state in ((a, "stale"), (b, "stale"), (fresh, "fresh"), (new, "never")):
        assert f"freshness {family.name}\t{state}\t" in log
    for family, path in ((a, "/a"), (b, "/b")):
        (alert,) = receivers.json_posts(path)
        assert alert["family"] == family.name and alert["kind"] == "stale"
        assert alert["checks"] == ["freshness"] and alert["dag_id"] == "counters_freshness"
        assert f"family {family.name!r} is stale" in alert["message"]
        assert "more than its freshness 0:10:00" in alert["message"]
        assert "/dags/counters_freshness/runs/" in alert["log_url"]
        json.dumps(alert)
    assert receivers.json_posts("/c") == []

    # a recovers: its notice only; b, still stale, is not alerted again (no reminder yet)
    Store(conn, a).control.advance_family_epoch(now - timedelta(minutes=1), "new-run")
    assert dag.test().state == "failed"
    assert [p["kind"] for p in receivers.json_posts("/a")] == ["stale", "fresh_again"]
    assert [p["kind"] for p in receivers.json_posts("/b")] == ["stale"]

    Store(conn, b).control.advance_family_epoch(now - timedelta(minutes=1), "new-run")
    done = dag.test()
    assert done.state == "success"
    summary = done.get_task_instances()[0].xcom_pull(task_ids="check_freshness")
    assert summary["stale"] == [] and sorted(summary["fresh"]) == sorted(
        [a.name, b.name, fresh.name]
    )
    assert abs(summary["clock_offset_s"]) < 2 and summary["clock_refused"] == []
    assert [p["kind"] for p in receivers.json_posts("/b")] == ["stale", "fresh_again"]
    assert [p["kind"] for p in receivers.json_posts("/a")] == ["stale", "fresh_again"]
    assert receivers.json_posts("/c") == []


def test_a_family_whose_alert_cannot_be_sent_does_not_silence_the_others(
    conn, make_families, dagbag, receivers, monkeypatch
):
    from counters.airflow import tasks

    port = receivers.http_port
    families = make_families(
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/a"}},
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/b"}},
    )
    a, b = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    for family in (a, b):
        Store(conn, family).control.advance_family_epoch(now - timedelta(minutes=30), "old-run")
    sent = tasks.notify_failure

    def broken_for_a(name, *args, **kwargs):
        if name == a.name:  # e.g. a provider that cannot be imported, a template that fails
            raise RuntimeError("the alert could not be built")
        return sent(name, *args, **kwargs)

    monkeypatch.setattr(tasks, "notify_failure", broken_for_a)
    run = dagbag().dags["counters_freshness"].test()

    assert run.state == "failed"
    (ti,) = run.get_task_instances()
    state = ti.xcom_pull(task_ids="check_freshness", key="freshness")
    assert state["unalerted"] == [a.name]
    assert [p["kind"] for p in receivers.json_posts("/b")] == ["stale"]  # b alerted all the same
    assert receivers.json_posts("/a") == []


def test_a_worker_whose_clock_is_an_hour_ahead_measures_lag_by_the_clusters_time(
    conn, make_families, dagbag, receivers
):
    """The check runs on a worker whose clock is really an hour ahead (``time_machine``: the
    whole process): a family compacted two minutes ago is fresh by the cluster's time (by the
    worker's it was stale, and alerted), and the worker's offset is in the result, with the
    families a compaction on it would be refused for."""
    import time_machine

    port = receivers.http_port
    families = make_families(
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/a"}}
    )
    (fresh,) = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    Store(conn, fresh).control.advance_family_epoch(now - timedelta(minutes=2), "recent-run")
    dag = dagbag().dags["counters_freshness"]
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=1), tick=True):
        done = dag.test()
    assert done.state == "success"
    summary = done.get_task_instances()[0].xcom_pull(task_ids="check_freshness")
    assert summary["fresh"] == [fresh.name] and summary["stale"] == []
    assert 3590 < summary["clock_offset_s"] < 3610
    assert summary["clock_refused"] == [fresh.name]
    assert receivers.json_posts("/a") == []
