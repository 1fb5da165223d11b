"""A real triggerer: a family's one-task DAG runs from the trigger, in the warm pool, and hands
to a worker what the pool should not end.

One private Airflow (LocalExecutor; ``airflow api-server``, ``dag-processor``, ``scheduler`` and
``triggerer``, as ``test_scheduler_assets_metrics``: a copy of the session's migrated DB, runs
triggered through the REST API) and one family, its runs triggered one after the other with
their epochs; the pool's processes (one) run ``tests.pool_faults``, whose fault files the test
drops before a run:

1. the family's first run, a sweep, is large: the worker does it (the task went through the
   executor), the event through the alias, its metrics;
2. a small run in the pool: no executor, the XCom ``summary``, the same asset event (alias link,
   ``extra``, the task instance as its source) and metrics as a worker's run, the downstream DAG
   runs after it;
3. a counter's copy overwritten in the pool: audited ``partial`` there, the worker fails the
   task at once (one try) with its alert (the streak opens), no second audit row;
4. the triggerer is killed while the pool works: a new triggerer runs the trigger again, in
   its pool, totals exact; the streak being open, a worker ends that run and closes it.

A pool process that dies after a commit, a pool that does not answer in time and a task marked
failed while its run is in the pool are ``test_warm_pool``'s (the same trigger and pool, the
trigger run in line by ``dag.test()``).

Minutes, not seconds: four Airflow services start once (the test's one stack) and each run
waits for the scheduler and the triggerer's polls; every case above shares them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from counters import engine
from counters.airflow.alerting import state_key
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

from tests.pool_faults import FAULTS_ENV, SETUP

from .conftest import PROJECT, answers, api_request
from .test_scheduler_assets_metrics import (
    RUN_TIMEOUT_S,
    START_TIMEOUT_S,
    LocalAirflow,
    StatsdListener,
)

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


class TriggerAirflow(LocalAirflow):
    """``LocalAirflow`` with a triggerer whose warm pool runs the test's fault hooks."""

    def __init__(self, home: Path, statsd_port: int, family: str, faults: Path):
        super().__init__(home, statsd_port, family)
        self.faults = faults
        self.settings.update(
            {
                "PYTHONPATH": str(PROJECT),  # the pool processes import tests.pool_faults
                "COUNTERS_WARM_POOL_PROCESSES": "1",
                "COUNTERS_WARM_POOL_SETUP": SETUP,
                FAULTS_ENV: str(faults),
                "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",  # a loaded machine
            }
        )

    def fault(self, point: str, action: str) -> None:
        (self.faults / f"{point}.{action.split()[0]}").write_text(action)

    def start_triggerer(self, name: str = "triggerer") -> None:
        self.start(name, "triggerer")

    def kill(self, name: str) -> None:
        service = next(s for s in self.services if s.name == name)
        os.killpg(service.proc.pid, signal.SIGKILL)
        service.proc.wait(30)
        self.services.remove(service)

    def trigger(self, dag_id: str, run_id: str, epoch: datetime) -> None:
        """A manual run with its epoch, as the UI's Trigger sends it (no CLI process)."""
        api_request(
            self.port,
            "POST",
            f"dags/{dag_id}/dagRuns",
            {"dag_run_id": run_id, "logical_date": None, "conf": {"epoch": epoch.isoformat()}},
        )

    def ended(self, dag_id: str, run_id: str) -> str:
        self.wait_for(
            f"{dag_id} run {run_id} done",
            lambda: self.run_state(dag_id, run_id) in ("success", "failed"),
            RUN_TIMEOUT_S,
        )
        return str(self.run_state(dag_id, run_id))

    def run_task(self, dag_id: str, run_id: str) -> dict[str, Any]:
        rows = self.query(
            "SELECT state, try_number, queued_dttm, next_method FROM task_instance "
            "WHERE dag_id = ? AND run_id = ? AND task_id = 'run'",
            dag_id,
            run_id,
        )
        state, tries, queued, next_method = rows[0]
        return {
            "state": state,
            "tries": tries,
            "on_worker": queued is not None,
            "next": next_method,
        }

    def summary(self, dag_id: str, run_id: str) -> dict[str, Any] | None:
        rows = self.query(
            "SELECT key, value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'run'",
            dag_id,
            run_id,
        )
        found = dict(rows)
        assert set(found) <= {"summary"}, found  # one XCom, not the run's end marker
        return json.loads(found["summary"]) if "summary" in found else None

    def events(self, uri: str) -> list[dict[str, Any]]:
        """The table's asset events: extra, source task and run, aliases."""
        rows = self.query(
            "SELECT e.id, e.extra, e.source_task_id, e.source_run_id FROM asset_event e "
            "JOIN asset a ON a.id = e.asset_id WHERE a.uri = ? ORDER BY e.id",
            uri,
        )
        out = []
        for event_id, extra, task, run in rows:
            aliases = self.query(
                "SELECT al.name FROM asset_alias_asset_event l JOIN asset_alias al "
                "ON al.id = l.alias_id WHERE l.event_id = ?",
                event_id,
            )
            out.append(
                {
                    "extra": json.loads(extra) if extra else {},
                    "source": (task, run),
                    "aliases": [a for (a,) in aliases],
                }
            )
        return out

    def success_callbacks(self) -> int:
        """How many success callbacks the DAG processor parsed the DAG file for (Airflow's own
        end-from-trigger queues one per task; ours none)."""
        needle = "Task callback requested but is not a failure callback"
        return sum(
            path.read_text(errors="replace").count(needle)
            for path in (self.home / "logs").rglob("*")
            if path.is_file()
        )

    def variable(self, key: str) -> str | None:
        """A Variable's stored value (encrypted when Fernet is on), None when there is none."""
        rows = self.query("SELECT val FROM variable WHERE key = ?", key)
        return rows[0][0] if rows else None


def test_runs_from_the_trigger_in_the_warm_pool_and_back_to_a_worker(
    conn, make_families, statsd, tmp_path, migrated_airflow_db
):
    """The four cases of the module, in order, on one private Airflow. Minutes: four Airflow
    services start once, two triggerers' pool processes warm up, and each of the five runs
    waits for the scheduler's and the triggerer's polls; the cheap fault cases are in
    ``test_warm_pool``, this one proves them against a real scheduler and triggerer."""
    families = make_families({"schedule": "0 0 29 2 *", "sweep_interval": "1h"}, shape="one-task")
    family = families.family(families.entries[0]["name"])
    home, faults = tmp_path / "airflow", tmp_path / "faults"
    home.mkdir()
    faults.mkdir()
    airflow = TriggerAirflow(home, statsd.port, family.name, faults)
    dag_id, downstream = family.dag_id, f"counters_example_after_{family.name}"
    compact = f"{family.keyspace}.{family.compact_table}"
    uri = f"cassandra://cassandra-test:9042/{family.keyspace}/{family.compact_table}"
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    base = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0) - timedelta(hours=1)
    written: dict[str, int] = {}

    def write(minute: int, amounts: dict[str, int]) -> None:
        at = base + timedelta(minutes=minute, seconds=1)
        client.record(
            [
                Increment((c,), n, utc_aware(at), ("w", minute * 100 + i))
                for i, (c, n) in enumerate(sorted(amounts.items()))
            ]
        )
        for c, n in amounts.items():
            written[c] = written.get(c, 0) + n

    def run(run_id: str, minute: int) -> str:
        airflow.trigger(dag_id, run_id, base + timedelta(minutes=minute))
        return airflow.ended(dag_id, run_id)

    def exact() -> None:
        names = sorted(written)
        values = dict(zip(names, (v.value for v in client.read_many(names)), strict=True))
        assert values == written, (values, written)

    try:
        shutil.copy(migrated_airflow_db, home / "airflow.db")
        airflow.start("api-server", "api-server", "--port", str(airflow.port))
        airflow.start("dag-processor", "dag-processor")
        # together: no run starts before the first trigger, which waits for the API server
        airflow.start("scheduler", "scheduler")
        airflow.start_triggerer()
        write(0, {"IBM": 1, "AAPL": 2})
        airflow.wait_for(
            "the API server",
            lambda: answers(f"http://localhost:{airflow.port}/api/v2/version"),
            START_TIMEOUT_S,
        )
        for dag in (dag_id, downstream):
            airflow.wait_for(
                f"{dag} parsed",
                lambda d=dag: airflow.query("SELECT 1 FROM dag WHERE dag_id = ?", d),
                START_TIMEOUT_S,
            )
            airflow.unpause(dag)

        # 1. the first run sweeps: large, back to a worker, which does it
        assert run("sweep-1", 5) == "success"
        task = airflow.run_task(dag_id, "sweep-1")
        assert (task["state"], task["on_worker"], task["next"]) == ("success", True, None), task
        exact()

        # 2. a small run in the pool: ended by the trigger, the same outputs
        write(6, {"IBM": 10})
        assert run("small-2", 10) == "success"
        assert airflow.run_task(dag_id, "small-2")["on_worker"] is False
        assert airflow.success_callbacks() == 0
        (user,) = airflow.query(
            "SELECT triggering_user_name FROM dag_run WHERE dag_id = ? AND run_id = ?",
            dag_id,
            "small-2",
        )[0]
        audited = [a for a in store.audit.page(10) if a["run_id"] == "small-2"]
        assert user and [a["airflow_user"] for a in audited] == [user], (user, audited)
        summary = airflow.summary(dag_id, "small-2")
        assert summary is not None and summary["rows_folded"] == 1, summary
        events = airflow.events(uri)
        assert [e["extra"]["run_id"] for e in events] == ["sweep-1", "small-2"], events
        alias = f"counters_compacted_{family.name}"
        assert [e["aliases"] for e in events] == [[alias], [alias]]
        assert events[1]["source"] == ("run", "small-2")
        assert events[1]["extra"] == {
            "family": family.name, "run_id": "small-2", "epoch_before": summary["epoch_before"],
            "epoch": summary["epoch"], "counters": 1, "rows_folded": 1, "sum_folded": 10,
            "rows_deleted": 1,
        }  # fmt: skip
        airflow.wait_for(
            "the downstream run after small-2",
            lambda: len([s for _, s in airflow.runs(downstream) if s == "success"]) == 2,
            RUN_TIMEOUT_S,
        )
        exact()

        # 3. a check fails in the pool: audited there, failed at once on the worker, alerted
        write(11, {"IBM": 100})
        airflow.fault("copy", f"tamper {compact} IBM 111 999")
        assert run("tampered-3", 15) == "failed"
        task = airflow.run_task(dag_id, "tampered-3")
        assert (task["state"], task["tries"], task["on_worker"]) == ("failed", 1, True), task
        audit = [a for a in store.audit.page(10) if a["run_id"] == "tampered-3"]
        assert [a["outcome"] for a in audit] == ["partial"], audit
        assert airflow.variable(state_key(family.name, "failing")) is not None  # (encrypted)
        assert not list(faults.iterdir())
        engine.release(store, ("IBM",))  # the operator's fix: the copy from the ledger

        # 4. the triggerer is killed while the pool works: another triggerer runs it again in
        #    its pool; the streak open, a worker ends the run and closes the streak
        write(21, {"IBM": 10000})
        airflow.fault("commit", "sleep 30")
        airflow.trigger(dag_id, "orphaned-4", base + timedelta(minutes=25))
        airflow.wait_for("the pool at work", lambda: not list(faults.iterdir()), RUN_TIMEOUT_S)
        airflow.kill("triggerer")
        airflow.start_triggerer("triggerer-2")
        assert airflow.ended(dag_id, "orphaned-4") == "success"
        # the streak was open: the triggerer's handler found it and a worker ended the run the
        # pool did (no second audit row), its XCom, and closed the streak with its notice
        assert airflow.run_task(dag_id, "orphaned-4")["on_worker"] is True
        assert [a["run_id"] for a in store.audit.page(20)].count("orphaned-4") == 1
        assert airflow.variable(state_key(family.name, "failing")) is None
        exact()

        outcomes = {a["run_id"]: a["outcome"] for a in store.audit.page(20)}
        assert outcomes["orphaned-4"] in ("success", "noop"), outcomes
        if outcomes["orphaned-4"] == "success":  # the worker pushed the pool's summary
            assert (airflow.summary(dag_id, "orphaned-4") or {}).get("run_id") == "orphaned-4"

        # every run's metrics, from the worker and from the pool processes alike
        tag = {"family": family.name}
        successes = list(outcomes.values()).count("success")
        airflow.wait_for(
            "the runs' metrics",
            lambda: (
                len(statsd.values("airflow.counters.runs", **tag, outcome="success")) >= successes
            ),
            60,
        )
        folded = statsd.values("airflow.counters.rows_folded", **tag)
        audited = sum(int(a["rows_folded"] or 0) for a in store.audit.page(20))
        assert sum(v for v, _ in folded) == audited
        assert len(statsd.values("airflow.counters.runs", **tag, outcome="partial")) == 1
    finally:
        airflow.stop()
