"""``airflow backfill create`` executed by a real scheduler (LocalExecutor) and API server.

The family's schedule only ticks at minutes of one past hour, so the scheduler creates no
regular run of it while the test runs: every run is the backfill's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.store import Store

from .conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
RUNS_TIMEOUT_S = 240
API_START_TIMEOUT_S = 120


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def sync_to_db(bag: Any) -> None:
    """What the DAG processor (and ``dag.test()``) does: serialize the bag's DAGs into the DB."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)


def only_backfill_runs(dag_id: str) -> None:
    """Let the scheduler run nothing but this DAG's backfill: pause the other DAGs of this test
    DB, and clear the DAG's next scheduled run (with catchup off, Airflow 3 would still create
    a run for the latest tick of its schedule, in the past)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).values(is_paused=DagModel.dag_id != dag_id))
        session.execute(
            update(DagModel)
            .where(DagModel.dag_id == dag_id)
            .values(next_dagrun=None, next_dagrun_create_after=None)
        )


def ensure_pool() -> None:
    """The compaction tasks' pool, as ``make run`` creates it from airflow_settings.yaml."""
    from airflow.models.pool import Pool
    from counters.airflow.factory import pool

    Pool.create_or_update_pool(pool(), 4, "Concurrent compaction tasks", include_deferred=False)


def backfill_runs(dag_id: str) -> list[Any]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    with create_session() as session:
        runs = DagRun.find(dag_id=dag_id, run_type=DagRunType.BACKFILL_JOB, session=session)
        for run in runs:
            session.expunge(run)
        return sorted(runs, key=lambda r: r.logical_date)


class Service:
    """An airflow command in its own process group, logging to a file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path):
        self.name = name
        self.log = logs / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [AIRFLOW, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(text[-lines:])

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def airflow_services(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``start()``: an API server (the execution API the task workers talk to) and a
    scheduler; stopped (process groups) after the test."""
    port = free_port()
    services: list[Service] = []

    def env() -> dict[str, str]:
        """The test's environment now (its families YAML, its connections)."""
        return {
            **os.environ,
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "PYTHONWARNINGS": "ignore",
        }

    def start_api_server() -> None:
        services.append(Service("api-server", ["api-server", "--port", str(port)], env(), tmp_path))

    def start_scheduler() -> None:
        """Once the API server answers: a task started before would fail its first try."""
        api = services[0]
        deadline = time.monotonic() + API_START_TIMEOUT_S
        while not _answers(f"http://localhost:{port}/api/v2/version"):
            assert api.alive() and time.monotonic() < deadline, api.tail()
            time.sleep(0.5)
        services.append(Service("scheduler", ["scheduler"], env(), tmp_path))

    try:
        yield {
            "env": env,
            "services": services,
            "start_api_server": start_api_server,
            "start_scheduler": start_scheduler,
        }
    finally:
        for service in services:
            service.stop()


def test_backfill_create_runs_in_order_and_compacted_epochs_are_noops(
    conn, make_families, dagbag, airflow_services
):
    airflow_services["start_api_server"]()  # it takes a while; the setup below runs meanwhile
    day = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=2)
    base = day.replace(hour=12, minute=0, second=0, microsecond=0)
    families = make_families(
        {"shards": 1, "schedule": f"*/3 12 {base.day} {base.month} *", "tags": ["backfill"]}
    )
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    client.record(
        [Increment(("IBM",), i + 1, base + timedelta(minutes=i), ("w", i)) for i in range(10)]
    )
    # compacted up to 12:02 already (e.g. by counterctl): the 12:03 run's epoch is not newer
    engine.run_family(store, base + timedelta(minutes=2), "cli-before-backfill")
    bag = dagbag()
    sync_to_db(bag)
    only_backfill_runs(family.dag_id)
    ensure_pool()

    created = subprocess.run(
        [
            AIRFLOW,
            "backfill",
            "create",
            "--dag-id",
            family.dag_id,
            "--from-date",
            (base + timedelta(minutes=3)).isoformat(),
            "--to-date",
            (base + timedelta(minutes=9)).isoformat(),
            "--max-active-runs",
            "1",
        ],
        env=airflow_services["env"](),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    airflow_services["start_scheduler"]()

    started_at = time.monotonic()
    deadline = started_at + RUNS_TIMEOUT_S
    runs: list[Any] = []
    while time.monotonic() < deadline:
        runs = backfill_runs(family.dag_id)
        if len(runs) == 3 and all(r.state in ("success", "failed") for r in runs):
            break
        for service in airflow_services["services"]:
            assert service.alive(), service.tail()
        time.sleep(2)
    print(
        f"backfill of 3 runs done {time.monotonic() - started_at:.1f} s after the scheduler start"
    )
    logs = "\n".join(s.tail() for s in airflow_services["services"])
    assert [r.state for r in runs] == ["success"] * 3, (
        f"{[(r.run_id, r.state) for r in runs]}\n{logs}"
    )
    assert [r.logical_date.minute for r in runs] == [3, 6, 9]

    audit = store.read_audit(10)  # newest first
    assert [a["outcome"] for a in audit] == ["success", "success", "noop", "success"]
    assert [a["run_id"] for a in audit[:3]] == [r.run_id for r in reversed(runs)]
    assert [a["epoch_after"] for a in audit] == [base + timedelta(minutes=m) for m in (8, 5, 2, 2)]
    # in order: each run started after the previous one finished
    started = [a["started_at"] for a in reversed(audit[:3])]
    assert started == sorted(started)
    value = client.read_many(["IBM"])[0]
    assert (value.compact_value, value.epoch, value.value) == (45, base + timedelta(minutes=8), 55)
