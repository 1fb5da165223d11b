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
        shape="mapped",
    )
    a, b, fresh, new = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    Store(conn, a).state.advance_family_epoch(now - timedelta(minutes=30), "old-run")
    Store(conn, b).state.advance_family_epoch(now - timedelta(minutes=40), "old-run")
    Store(conn, fresh).state.advance_family_epoch(now - timedelta(minutes=2), "recent-run")
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
    Store(conn, a).state.advance_family_epoch(now - timedelta(minutes=1), "new-run")
    assert dag.test().state == "failed"
    assert [p["kind"] for p in receivers.json_posts("/a")] == ["stale", "fresh_again"]
    assert [p["kind"] for p in receivers.json_posts("/b")] == ["stale"]

    Store(conn, b).state.advance_family_epoch(now - timedelta(minutes=1), "new-run")
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
        shape="mapped",
    )
    a, b = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    for family in (a, b):
        Store(conn, family).state.advance_family_epoch(now - timedelta(minutes=30), "old-run")
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
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/a"}},
        shape="mapped",
    )
    (fresh,) = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    Store(conn, fresh).state.advance_family_epoch(now - timedelta(minutes=2), "recent-run")
    dag = dagbag().dags["counters_freshness"]
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=1), tick=True):
        done = dag.test()
    assert done.state == "success"
    summary = done.get_task_instances()[0].xcom_pull(task_ids="check_freshness")
    assert summary["fresh"] == [fresh.name] and summary["stale"] == []
    assert 3590 < summary["clock_offset_s"] < 3610
    assert summary["clock_refused"] == [fresh.name]
    assert receivers.json_posts("/a") == []


def test_a_family_whose_entry_breaks_or_goes_missing_still_alerts_until_retired(
    conn, make_families, receivers, monkeypatch
):
    """Issue #49 item 4: a one-field typo in B's entry removes B's DAG; C's entry is deleted
    (no DAG either). Both are known to the cluster (their state rows), so the freshness check
    reports them and alerts: B through its own channel (its ``alerts`` still validate), C
    through the default one. D, retired with ``counterctl retire`` before its entry was
    removed, is listed as retired and alerts nobody. B's entry fixed: its notice that it is
    watched again."""
    import yaml
    from airflow.dag_processing.dagbag import DagBag
    from click.testing import CliRunner
    from counters.cli import cli

    from .conftest import DAGS

    port = receivers.http_port
    families = make_families(
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/a"}},
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/b"}},
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/c"}},
        {"freshness": "10m", "alerts": {"webhook_url": f"http://127.0.0.1:{port}/d"}},
        shape="mapped",
    )
    a, b, c, d = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    for family in (a, b, c, d):
        Store(conn, family).state.advance_family_epoch(now - timedelta(minutes=2), "recent")
    retired = CliRunner().invoke(
        cli, ["--config", str(families.path), "retire", "--family", d.name]
    )
    assert retired.exit_code == 0, retired.output
    [row] = Store(conn, d).audit.page(5)
    assert (row["action"], row["outcome"]) == ("retire", "retired")
    entries = [dict(e) for e in families.entries]
    entries[1]["freshnes"] = "10m"  # the typo: one field
    good_entries = [entries[0], entries[1]]  # C and D removed
    families.path.write_text(yaml.safe_dump({"families": good_entries}, sort_keys=False))
    monkeypatch.setenv("COUNTERS_ALERT_WEBHOOK_URL", f"http://127.0.0.1:{port}/default")

    def freshness_dag():
        bag = DagBag(dag_folder=str(DAGS))
        assert set(bag.import_errors) <= {str(DAGS / "counters_config_check.py")}
        return bag.dags["counters_freshness"]

    dag = freshness_dag()
    assert b.dag_id not in {t for t in DagBag(dag_folder=str(DAGS)).dag_ids}
    assert f"`{b.name}` | entry does not load" in dag.doc_md
    run = dag.test()

    assert run.state == "failed"
    (ti,) = run.get_task_instances()
    state = ti.xcom_pull(task_ids="check_freshness", key="freshness")
    assert state["fresh"] == [a.name], state
    assert set(state["unconfigured"]) == {b.name, c.name}, state
    assert "field 'freshnes'" in state["unconfigured"][b.name]
    assert "not in" in state["unconfigured"][c.name]
    # D retired (and the families of earlier tests, which their fixture retired)
    assert "retired" in state["retired"][d.name] and not {a.name, b.name, c.name} & set(
        state["retired"]
    )
    (to_b,) = receivers.json_posts("/b")
    assert to_b["family"] == b.name and to_b["checks"] == ["family_unconfigured"]
    assert "field 'freshnes'" in to_b["message"] and to_b["kind"] == "stale"
    (to_default,) = receivers.json_posts("/default")
    assert to_default["family"] == c.name and "counterctl retire" in to_default["message"]
    assert receivers.json_posts("/a") == receivers.json_posts("/c") == []
    assert receivers.json_posts("/d") == []

    # B's typo fixed (C's entry back too): watched again, B's notice that it is fresh again
    entries[1].pop("freshnes")
    families.path.write_text(
        yaml.safe_dump({"families": [entries[0], entries[1], entries[2]]}, sort_keys=False)
    )
    done = freshness_dag().test()
    assert done.state == "success", done.get_task_instances()[0].state
    assert [p["kind"] for p in receivers.json_posts("/b")] == ["stale", "fresh_again"]
    assert [p["kind"] for p in receivers.json_posts("/c")] == ["fresh_again"]
    # counterctl health, from outside Airflow, says the same: D retired, C unconfigured
    health = CliRunner().invoke(cli, ["--config", str(families.path), "health", "--json"])
    assert health.exit_code == 0, health.output
    listed = {f["family"]: f for f in json.loads(health.output)}
    assert listed[d.name]["state"] == "retired" and listed[d.name]["healthy"]
    families.path.write_text(yaml.safe_dump({"families": entries[:2]}, sort_keys=False))
    gone = CliRunner().invoke(cli, ["--config", str(families.path), "health"])
    assert gone.exit_code == 8 and f"{c.name}\tunconfigured" in gone.output, gone.output
