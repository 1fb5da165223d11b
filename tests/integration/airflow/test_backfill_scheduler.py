"""``airflow backfill create`` executed by a real scheduler (LocalExecutor) and API server.

The services run in a private ``AIRFLOW_HOME`` (a copy of the test's migrated DB), so they never
see another test run's DAGs, and use free ports. The family's schedule ticks only at minutes of
one past hour, and its next scheduled run is cleared: every run the scheduler executes is the
backfill's.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

from .conftest import DAGS, answers, fernet_key, free_port

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
RUNS_TIMEOUT_S = 240
API_START_TIMEOUT_S = 120

# What the DAG processor would do (serialize the DAGs), plus what make run does (the pool), and
# the isolation: only this DAG unpaused, no scheduled run of it.
PREPARE = """
import sys
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
from airflow.models.dag import DagModel
from airflow.models.pool import Pool
from airflow.utils.session import create_session
from sqlalchemy import update

dags, dag_id, pool = sys.argv[1:4]
DagBundlesManager().sync_bundles_to_db()
bag = DagBag(dag_folder=dags)
assert not bag.import_errors, bag.import_errors
sync_bag_to_db(bag, "dags-folder", None)
with create_session() as session:
    session.execute(update(DagModel).values(is_paused=DagModel.dag_id != dag_id))
    session.execute(
        update(DagModel)
        .where(DagModel.dag_id == dag_id)
        .values(next_dagrun=None, next_dagrun_create_after=None)
    )
Pool.create_or_update_pool(pool, 4, "Concurrent compaction tasks", include_deferred=False)
"""


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


class Airflow:
    """A private Airflow installation for one test: home, env, services, DB reads."""

    def __init__(self, home: Path):
        self.home = home
        self.port = free_port()
        self.services: list[Service] = []
        self.settings = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{self.port}/execution/",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(16),
            "AIRFLOW__CORE__FERNET_KEY": fernet_key(),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "PYTHONWARNINGS": "ignore",
        }

    def env(self) -> dict[str, str]:
        """The test's environment now (its families YAML, its connections)."""
        return {**os.environ, **self.settings}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(args), env=self.env(), capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"{args[:3]}: {done.stdout}\n{done.stderr}"
        return done

    def start_api_server(self) -> None:
        self.services.append(
            Service("api-server", ["api-server", "--port", str(self.port)], self.env(), self.home)
        )

    def start_scheduler(self) -> None:
        """Once the API server answers: a task started before would fail its first try."""
        api = self.services[0]
        deadline = time.monotonic() + API_START_TIMEOUT_S
        while not answers(f"http://localhost:{self.port}/api/v2/version"):
            assert api.alive() and time.monotonic() < deadline, api.tail()
            time.sleep(0.5)
        self.services.append(Service("scheduler", ["scheduler"], self.env(), self.home))

    def backfill_runs(self, dag_id: str) -> list[tuple[str, str, str]]:
        """(run_id, state, logical_date) of the DAG's backfill runs, by logical date."""
        with sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True) as db:
            return db.execute(
                "SELECT run_id, state, logical_date FROM dag_run "
                "WHERE dag_id = ? AND run_type = 'backfill' ORDER BY logical_date",
                (dag_id,),
            ).fetchall()

    def logs(self) -> str:
        return "\n".join(service.tail() for service in self.services)

    def stop(self) -> None:
        for service in self.services:
            service.stop()


@pytest.fixture
def private_airflow(tmp_path: Path) -> Iterator[Airflow]:
    home = tmp_path / "airflow"
    home.mkdir()
    shutil.copy(Path(os.environ["AIRFLOW_HOME"]) / "airflow.db", home / "airflow.db")
    airflow = Airflow(home)
    try:
        yield airflow
    finally:
        airflow.stop()


def test_backfill_create_runs_in_order_and_compacted_epochs_are_noops(
    conn, make_families, private_airflow
):
    """A backfill created through Airflow, run by a real scheduler. Over 30 s, and why: the
    private Airflow's scheduler schedules every run of the backfill in order; ``dag.test()``
    cannot create a backfill."""
    from counters.airflow.factory import pool

    day = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=2)
    base = day.replace(hour=12, minute=0, second=0, microsecond=0)
    families = make_families(
        {"shards": 1, "schedule": f"*/3 12 {base.day} {base.month} *", "tags": ["backfill"]},
        shape="mapped",
    )
    family = families.family(families.entries[0]["name"])
    private_airflow.run(sys.executable, "-c", PREPARE, str(DAGS), family.dag_id, pool())
    private_airflow.start_api_server()  # it takes a while; the setup below runs meanwhile
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    client.record(
        [
            Increment(("IBM",), i + 1, utc_aware(base + timedelta(minutes=i)), ("w", i))
            for i in range(10)
        ]
    )
    # compacted up to 12:02 already (e.g. by counterctl): the 12:03 run's epoch is not newer
    engine.run_family(store, base + timedelta(minutes=2), "cli-before-backfill")
    private_airflow.run(
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
    )
    private_airflow.start_scheduler()

    started = time.monotonic()
    runs: list[tuple[str, str, str]] = []
    while time.monotonic() < started + RUNS_TIMEOUT_S:
        runs = private_airflow.backfill_runs(family.dag_id)
        if len(runs) == 3 and all(state in ("success", "failed") for _, state, _ in runs):
            break
        for service in private_airflow.services:
            assert service.alive(), service.tail()
        time.sleep(2)
    print(f"3 backfill runs took {time.monotonic() - started:.1f} s after the scheduler start")
    assert [state for _, state, _ in runs] == ["success"] * 3, f"{runs}\n{private_airflow.logs()}"
    assert [logical[11:16] for _, _, logical in runs] == ["12:03", "12:06", "12:09"]

    audit = store.audit.page(10)  # newest first
    assert [a["outcome"] for a in audit] == ["success", "success", "noop", "success"]
    assert [a["run_id"] for a in audit[:3]] == [run_id for run_id, _, _ in reversed(runs)]
    assert [a["epoch_after"] for a in audit] == [base + timedelta(minutes=m) for m in (8, 5, 2, 2)]
    # who: the backfill's runs name the user who created it (`airflow backfill create`: the
    # OS user), the run before it the library call that made it
    assert [a["triggered_by"] for a in audit] == ["backfill"] * 3 + ["library"]
    assert [a["airflow_user"] for a in audit[:3]] == [getpass.getuser()] * 3
    # in order: each run started after the previous one
    started_at = [a["started_at"] for a in reversed(audit[:3])]
    assert started_at == sorted(started_at)
    value = client.read_many(["IBM"])[0]
    assert (value.compact_value, value.epoch, value.value) == (45, base + timedelta(minutes=8), 55)
