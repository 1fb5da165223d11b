"""``counters_freshness``: a family whose compacted epoch fell behind alerts its channels."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from counters.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def test_stale_family_fails_its_task_and_alerts_fresh_and_new_ones_pass(
    conn, make_families, dagbag, receivers
):
    hook = f"http://127.0.0.1:{receivers.http_port}/hook"
    families = make_families(
        {"freshness": "10m", "alerts": {"webhook_url": hook}},  # stale
        {"freshness": "10m", "alerts": {"webhook_url": hook}},  # fresh
        {"alerts": {"webhook_url": hook}},  # never compacted
    )
    stale, fresh, new = (families.family(e["name"]) for e in families.entries)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    Store(conn, stale).advance_family_epoch(now - timedelta(minutes=30), "old-run")
    Store(conn, fresh).advance_family_epoch(now - timedelta(minutes=2), "recent-run")

    run = dagbag().dags["counters_freshness"].test()

    assert run.state == "failed"
    got = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert got == {stale.name: "failed", fresh.name: "success", new.name: "skipped"}
    posts = receivers.json_posts("/hook")
    assert len(posts) == 1, posts
    alert = posts[0]
    assert alert["family"] == stale.name and alert["checks"] == ["freshness"]
    assert alert["dag_id"] == "counters_freshness"
    assert f"family {stale.name!r} is stale" in alert["message"]
    assert "more than its freshness 0:10:00" in alert["message"]
    assert "/dags/counters_freshness/runs/" in alert["log_url"]
    json.dumps(alert)
