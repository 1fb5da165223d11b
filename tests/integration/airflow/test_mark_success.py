"""A compact task that failed after committing, marked successful by hand, under a real
scheduler: its commits were never copied nor verified, so no cleanup may delete their rows
(issue #37, item 8). The services are the backfill test's: a private ``AIRFLOW_HOME``, a real
scheduler (LocalExecutor) and API server on free ports."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

from . import test_backfill_scheduler as backfill
from .conftest import DAGS
from .test_backfill_scheduler import AIRFLOW, PREPARE, RUNS_TIMEOUT_S

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

private_airflow = backfill.private_airflow  # the fixture: a private home, real services


def _task_states(airflow, dag_id: str) -> dict[str, list[str]]:
    import sqlite3

    with sqlite3.connect(f"file:{airflow.home / 'airflow.db'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT task_id, state FROM task_instance WHERE dag_id = ? ORDER BY task_id, map_index",
            (dag_id,),
        ).fetchall()
        runs = db.execute("SELECT state FROM dag_run WHERE dag_id = ?", (dag_id,)).fetchall()
    states: dict[str, list[str]] = {"(run)": [state for (state,) in runs]}
    for task, state in rows:
        states.setdefault(task, []).append(state)
    return states


def _wait(airflow, dag_id: str, done, timeout_s: float = RUNS_TIMEOUT_S) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout_s
    states: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        states = _task_states(airflow, dag_id)
        if done(states):
            return states
        for service in airflow.services:
            assert service.alive(), service.tail()
        time.sleep(2)
    raise AssertionError(f"{states}\n{airflow.logs()}")


def _mark_success(airflow, dag_id: str, run_id: str, task: str, index: int) -> None:
    """What the UI's "Mark success" sends."""
    url = (
        f"http://localhost:{airflow.port}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/"
        f"{task}/{index}"
    )
    request = urllib.request.Request(
        url,
        data=json.dumps({"new_state": "success"}).encode(),
        headers={"Content-Type": "application/json"},
        method="PATCH",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, response.read()


def test_a_failed_compact_task_marked_successful_deletes_nothing_unverified(
    conn, make_families, private_airflow, monkeypatch
):
    """Mark success in the UI on a failed compact task deletes nothing unverified. Over 30 s,
    and why: a private Airflow's api-server and scheduler run the DAG, and the action goes
    through the API the UI calls."""
    from counters.airflow.factory import pool

    day = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=2)
    base = day.replace(hour=12, minute=0, second=0, microsecond=0)
    families = make_families(  # its compact table loses a column for a while: tables of its own
        {"shards": 2, "schedule": f"*/3 12 {base.day} {base.month} *"}, shape="mapped", fresh=True
    )
    family = families.family(families.entries[0]["name"])
    monkeypatch.setenv("COUNTERS_TASK_RETRIES", "0")  # the copy's failure is for good
    private_airflow.settings["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "True"
    private_airflow.run(sys.executable, "-c", PREPARE, str(DAGS), family.dag_id, pool())
    private_airflow.start_api_server()
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    counters = [f"m{i}" for i in range(40)]
    client.record(
        [Increment((c,), 9, utc_aware(base + timedelta(seconds=20)), ("w", 1)) for c in counters]
    )
    table = f"{family.keyspace}.{family.compact_table}"
    conn.session.execute(f"ALTER TABLE {table} DROP run_id")  # every copy fails: after commits
    private_airflow.run(
        AIRFLOW, "backfill", "create", "--dag-id", family.dag_id,
        "--from-date", (base + timedelta(minutes=3)).isoformat(),
        "--to-date", (base + timedelta(minutes=3)).isoformat(),
    )  # fmt: skip
    private_airflow.start_scheduler()
    states = _wait(  # every compact task failed and the run is over, its state committed
        private_airflow,  # (SQLite: a change before that commit would be overwritten by it)
        family.dag_id,
        lambda s: (
            s.get("compact") == ["failed", "failed"]
            and all(x in ("failed", "upstream_failed") for x in s.get("record_audit", ["-"]))
            and s["(run)"] == ["failed"]
        ),
    )
    assert states["compact"] == ["failed", "failed"], states
    committed = sum(
        len(store.ledger.read_ledger(s, b, None).checkpoints) for s in range(2) for b in range(16)
    )
    assert committed > 0  # committed, never copied (a shard stops at its first failed bucket)
    conn.session.execute(f"ALTER TABLE {table} ADD run_id text")
    [(run_id, _state, _logical)] = private_airflow.backfill_runs(family.dag_id)
    for index in (0, 1):  # the operator marks both failed compact tasks successful...
        _mark_success(private_airflow, family.dag_id, run_id, "compact", index)
    # ...and runs what follows them again. "Mark success" clears the failed tasks after it
    # and queues the run itself; a scheduler's write to the run at that moment can put it
    # back to failed (SQLite applies both), so the operator's clear is repeated until the
    # tasks after compact run, as an operator would
    for _attempt in range(3):
        private_airflow.run(
            AIRFLOW, "tasks", "clear", family.dag_id, "-y",
            "-t", "^(verify|cleanup|record_audit)$",
            "-s", base.isoformat(), "-e", (base + timedelta(minutes=10)).isoformat(),
        )  # fmt: skip
        try:
            states = _wait(
                private_airflow,
                family.dag_id,
                lambda s: (
                    s.get("cleanup")
                    and all(
                        x in ("success", "failed", "upstream_failed", "skipped")
                        for x in s["cleanup"]
                    )
                ),
                timeout_s=60,
            )
        except AssertionError:
            continue
        if states.get("verify") != ["upstream_failed"]:
            break  # else the clear met compact still failed (the same race): clear again
    else:
        raise AssertionError(
            f"the tasks after compact never ran: {_task_states(private_airflow, family.dag_id)}"
        )
    print(f"after mark success and clear: {states}")
    assert "success" in states["cleanup"], states  # the cleanups ran...
    epoch = base + timedelta(minutes=2)
    left = sum(
        1 for c in counters for _ in [0] if store.raw.read_rows([(c,)])[(c,)]
    )  # ...and deleted nothing: no execution whose report passed verify had verified them
    assert left == len(counters)
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(counters, 9)
    engine.run_family(store, epoch + timedelta(minutes=1), "cli-after")  # copies, then cleans
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(counters, 9)
    assert not any(store.raw.read_rows([(c,)])[(c,)] for c in counters)
