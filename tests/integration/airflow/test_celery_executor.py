"""The project's unchanged DAGs under a second executor: CeleryExecutor with a Celery worker.

A private Airflow (fresh ``AIRFLOW_HOME`` in the test's tmp dir, a copy of a DB fresh from
``airflow db migrate``, free ports): ``airflow api-server``, ``scheduler``, ``dag-processor`` and
``celery worker --concurrency 2``, each in its own session, stopped by pid at the end. No broker
server: kombu's file-system transport and celery's ``file://`` result backend in the tmp dir
(``counters.airflow.celery_local``). A family's first run sweeps, so ``compact`` and ``cleanup``
are mapped over its 4 shards and spread over the worker's two processes; a second run is small (the
``run`` task does it whole). Every task instance that ran was executed by the Celery worker (its
Celery task id is in the worker's log and in the result backend, with SUCCESS).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

from .conftest import DAGS, PROJECT, answers, api_request, fernet_key, free_port
from .test_backfill_scheduler import AIRFLOW, Service

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180
COUNTERS = 300
SHARDS = 4


class CeleryAirflow:
    """A private Airflow whose executor is Celery: home, settings, services, DB reads."""

    def __init__(self, home: Path):
        self.home = home
        self.port = free_port()
        self.celery_dir = home / "celery"
        self.services: list[Service] = []
        self.settings = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": (
                "counters.airflow.celery_local.CELERY_CONFIG"
            ),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
            "COUNTERS_CELERY_DIR": str(self.celery_dir),
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{self.port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": fernet_key(),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # the API without a token
            "PYTHONWARNINGS": "ignore",
        }

    def env(self) -> dict[str, str]:
        """The test's environment now (its families YAML, its Cassandra connection)."""
        return {**os.environ, **self.settings}

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [AIRFLOW, *args], env=self.env(), capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"airflow {args[:3]}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, name: str, *args: str) -> None:
        self.services.append(Service(name, list(args), self.env(), self.home))

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def check_alive(self) -> None:
        for service in self.services:
            assert service.alive(), service.tail()

    def wait_for(self, what: str, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.check_alive()
            assert time.monotonic() < deadline, f"{what} not after {timeout} s\n{self.logs()}"
            time.sleep(0.2)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True) as db:
            return db.execute(sql, params).fetchall()

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query(
            "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id
        )
        return rows[0][0] if rows else None

    def trigger_and_wait(self, dag_id: str, run_id: str, epoch: datetime) -> float:
        """A manual run with its epoch, as the UI's Trigger sends it (the REST API), until it
        ends; returns the seconds it took."""
        started = time.monotonic()
        body = {"dag_run_id": run_id, "logical_date": None, "conf": {"epoch": epoch.isoformat()}}
        api_request(self.port, "POST", f"dags/{dag_id}/dagRuns", body)
        deadline = started + RUN_TIMEOUT_S
        while (state := self.run_state(dag_id, run_id)) not in ("success", "failed"):
            self.check_alive()
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert state == "success", (
            f"{run_id}: {state}\n{self.task_instances(dag_id, run_id)}\n"
            f"{self.task_errors(dag_id, run_id)}\n{self.logs()}"
        )
        return time.monotonic() - started

    def task_errors(self, dag_id: str, run_id: str) -> str:
        """The error lines of the run's task logs (e.g. of a task waiting for its retry)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        return "\n".join(
            f"{path.relative_to(folder)}: {line[:2000]}"
            for path in sorted(folder.rglob("attempt=*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if '"level":"error"' in line
        )

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT task_id, map_index, state, queue, executor, hostname, external_executor_id "
            "FROM task_instance WHERE dag_id = ? AND run_id = ? ORDER BY task_id, map_index",
            dag_id,
            run_id,
        )
        keys = ("task_id", "map_index", "state", "queue", "executor", "hostname", "celery_id")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def logs(self) -> str:
        return "\n".join(service.tail() for service in self.services)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


@pytest.fixture
def celery_airflow(tmp_path: Path) -> Iterator[CeleryAirflow]:
    home = tmp_path / "airflow"
    home.mkdir()
    airflow = CeleryAirflow(home)
    try:
        yield airflow
    finally:
        airflow.stop()


def celery_result(airflow: CeleryAirflow, celery_id: str | None) -> str | None:
    """The Celery state the worker stored for a task id, or None (not yet, or no id)."""
    path = airflow.celery_dir / "results" / f"celery-task-meta-{celery_id}"
    return json.loads(path.read_text())["status"] if celery_id and path.exists() else None


def not_run_on_celery(airflow: CeleryAirflow, tis: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task instances whose Celery task id is not in the worker's log with the workload,
    or has no SUCCESS in the result backend. The worker stores STARTED, then the outcome once
    the task process has exited, which can be after the run is marked done: wait a little."""
    from celery.states import READY_STATES

    airflow.wait_for(
        "every task's Celery outcome",
        lambda: all(celery_result(airflow, ti["celery_id"]) in READY_STATES for ti in tis),
        30,
    )
    worker_log = airflow.service("celery-worker").log.read_text(errors="replace")
    return [
        ti
        for ti in tis
        if f"[{ti['celery_id']}] Executing workload in Celery" not in worker_log
        or celery_result(airflow, ti["celery_id"]) != "SUCCESS"
    ]


def test_dags_run_unchanged_under_the_celery_executor(
    conn, make_families, celery_airflow, migrated_airflow_db
):
    """The family's DAG under the Celery executor, as a deployment runs it. Over 30 s, and
    why: an Airflow of its own (migrate, api-server, scheduler, a Celery worker) starts, and
    real scheduled runs go through the executor; nothing cheaper proves it."""
    from counters.airflow.factory import pool

    test_started = time.monotonic()
    airflow = celery_airflow
    families = make_families(
        {"shards": SHARDS, "schedule": "0 0 29 2 *", "tags": ["celery"]}, shape="mapped"
    )
    family = families.family(families.entries[0]["name"])
    shutil.copy(migrated_airflow_db, airflow.home / "airflow.db")
    airflow.cli("pools", "set", pool(), "4", "Concurrent compaction tasks")
    airflow.start("api-server", "api-server", "--port", str(airflow.port))
    airflow.start("dag-processor", "dag-processor")
    airflow.start("celery-worker", "celery", "worker", "--concurrency", "2")
    # together: no run starts before the first trigger, which waits for the API server
    airflow.start("scheduler", "scheduler")

    # increments while the services start: a minute apart, an hour back
    base = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0) - timedelta(hours=1)
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    keys = [f"C{i:04d}" for i in range(COUNTERS)]
    first = [
        Increment((key,), i % 7 + m + 1, utc_aware(base + timedelta(minutes=m)), ("w", i * 10 + m))
        for i, key in enumerate(keys)
        for m in range(3)
    ]
    client.record(first)

    airflow.wait_for(
        "the API server", lambda: answers(f"http://localhost:{airflow.port}/api/v2/version"), 120
    )
    airflow.wait_for(
        f"{family.dag_id} parsed",
        lambda: airflow.query("SELECT 1 FROM dag WHERE dag_id = ?", family.dag_id),
        START_TIMEOUT_S,
    )
    api_request(airflow.port, "PATCH", f"dags/{family.dag_id}", {"is_paused": False})
    ready_s = time.monotonic() - test_started

    # 1. the first run sweeps: compact and cleanup mapped over the shards
    epoch1 = base + timedelta(minutes=5)
    run1_s = airflow.trigger_and_wait(family.dag_id, "celery-sweep", epoch1)
    tis = airflow.task_instances(family.dag_id, "celery-sweep")
    ran = [ti for ti in tis if ti["state"] == "success"]
    assert sorted((ti["task_id"], ti["map_index"]) for ti in ran) == sorted(
        [("run", -1), ("verify", -1), ("record_audit", -1)]
        + [(task, s) for task in ("compact", "cleanup") for s in range(SHARDS)]
    ), tis
    assert (missing := not_run_on_celery(airflow, ran)) == [], f"{missing}\n{airflow.logs()}"
    assert {ti["queue"] for ti in ran} == {"default"}
    # the preload (counters.airflow.celery_local at import) ran in the worker's main process, which
    # forks the pool processes: the driver's and pandas' C extensions are mapped in it
    worker_maps = Path(f"/proc/{airflow.service('celery-worker').proc.pid}/maps").read_text()
    assert "cassandra/cluster.cpython" in worker_maps and "pandas/_libs" in worker_maps

    written = {key: 0 for key in keys}
    for event in first:
        written[event.counter[0]] += event.increment
    values = client.read_many(keys)
    assert {v.counter[0]: v.value for v in values} == written
    assert {v.counter[0]: v.compact_value for v in values} == written
    assert {v.epoch for v in values} == {epoch1}
    f = family
    left = store.statements.session.execute(
        f"SELECT count(*) FROM {f.keyspace}.{f.raw_table}"
    ).one()[0]
    assert left == 0
    audit = store.audit.page(5)
    assert [(a["run_id"], a["outcome"]) for a in audit] == [("celery-sweep", "success")]
    assert (audit[0]["rows_folded"], audit[0]["rows_deleted"]) == (len(first), len(first))

    # 2. a small run: the run task does it whole, the rest is skipped
    second = [
        Increment((key,), 1000 + i, utc_aware(base + timedelta(minutes=7)), ("w2", i))
        for i, key in enumerate(keys[:5])
    ]
    late = Increment(
        (keys[0],), 5, utc_aware(base + timedelta(minutes=30)), ("w2", 99)
    )  # after epoch2
    client.record([*second, late])
    epoch2 = base + timedelta(minutes=10)
    run2_s = airflow.trigger_and_wait(family.dag_id, "celery-small", epoch2)
    tis = airflow.task_instances(family.dag_id, "celery-small")
    ran = [ti for ti in tis if ti["state"] == "success"]
    assert [ti["task_id"] for ti in ran] == ["run"], tis
    assert (missing := not_run_on_celery(airflow, ran)) == [], f"{missing}\n{airflow.logs()}"

    for event in (*second, late):
        written[event.counter[0]] += event.increment
    values = {v.counter[0]: v for v in client.read_many(keys)}
    assert {key: v.value for key, v in values.items()} == written
    assert values[keys[0]].compact_value == written[keys[0]] - late.increment
    left = store.statements.session.execute(
        f"SELECT count(*) FROM {f.keyspace}.{f.raw_table}"
    ).one()[0]
    assert left == 1  # only the row newer than the epoch
    audit = store.audit.page(5)
    assert [(a["run_id"], a["outcome"]) for a in audit] == [
        ("celery-small", "success"),
        ("celery-sweep", "success"),
    ]
    assert (audit[0]["rows_folded"], audit[0]["rows_deleted"]) == (len(second), len(second))
    print(
        f"services ready {ready_s:.1f} s; sweep run ({2 * SHARDS} mapped tasks) {run1_s:.1f} s; "
        f"small run {run2_s:.1f} s; test {time.monotonic() - test_started:.1f} s"
    )
