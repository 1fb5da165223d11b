"""A real scheduler: Assets drive a downstream DAG, metrics reach a StatsD listener, and the pool
is created by the project.

A private Airflow (fresh ``AIRFLOW_HOME`` in the test's tmp dir, a copy of a DB fresh from
``airflow db migrate``, free ports, LocalExecutor): ``airflow api-server``, ``dag-processor`` and
``scheduler``, each in its own session and stopped by pid. Nothing creates the pool
``cassandra_compaction`` but the project's plugin, when the scheduler starts. ``[metrics]
statsd_on`` points at a UDP socket the test reads. The downstream DAG is the project's example
consumer, scheduled on the family's compact table (``COUNTERS_EXAMPLE_FAMILY``).

Runs, triggered with their epochs: a first run that folds rows (a sweep: mapped tasks, the
event from ``record_audit``), an idle run (nothing written since: it commits nothing), and a
small run that folds rows (done whole in ``run``, the event through the family's alias). The
downstream DAG runs after each run that folded rows, not after the idle one.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import sqlite3
import threading
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
from .test_backfill_scheduler import Service

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180


class StatsdListener:
    """A UDP socket on a free loopback port, read by a thread: every StatsD line received."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            self.lines.extend(line for line in data.decode().splitlines() if line)

    def values(self, name: str, **tags: str) -> list[tuple[float, str]]:
        """(value, type) of every line for metric ``name`` carrying ``tags`` (InfluxDB format,
        ``name,family=f:1|c``: Airflow's ``statsd_influxdb_enabled``), in arrival order."""
        out = []
        for line in list(self.lines):
            metric, _, rest = line.partition(":")
            sent, *pairs = metric.split(",")
            sent_tags = dict(pair.partition("=")[::2] for pair in pairs)
            if sent == name and tags.items() <= sent_tags.items():
                value, _, kind = rest.partition("|")
                out.append((float(value), kind.split("|")[0]))
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


class LocalAirflow:
    """A private Airflow with the LocalExecutor: home, settings, services, DB reads."""

    def __init__(self, home: Path, statsd_port: int, example_family: str):
        self.home = home
        self.port = free_port()
        self.services: list[Service] = []
        self.settings = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{self.port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": fernet_key(),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(statsd_port),
            "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",  # tags reach StatsD
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # the API without a token
            "COUNTERS_EXAMPLE_FAMILY": example_family,
            "COUNTERS_ASSET_CLUSTER": "Cassandra-Test",  # asset URIs: cassandra-test:9042
            "PYTHONWARNINGS": "ignore",
        }

    def env(self) -> dict[str, str]:
        import os

        env = {**os.environ, **self.settings}
        env.pop("COUNTERS_POOL", None)
        return env

    def start(self, name: str, *args: str) -> None:
        self.services.append(Service(name, list(args), self.env(), self.home))

    def check_alive(self) -> None:
        for service in self.services:
            assert service.alive(), service.tail()

    def wait_for(self, what: str, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.check_alive()
            assert time.monotonic() < deadline, f"{what}: not after {timeout} s\n{self.logs()}"
            time.sleep(0.2)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True) as db:
            return db.execute(sql, params).fetchall()

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query(
            "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id
        )
        return rows[0][0] if rows else None

    def unpause(self, dag_id: str) -> None:
        """What the UI's toggle sends (the REST API: no CLI process to start)."""
        api_request(self.port, "PATCH", f"dags/{dag_id}", {"is_paused": False})

    def trigger_and_wait(self, dag_id: str, run_id: str, epoch: datetime) -> None:
        """A manual run with its epoch, as the UI's Trigger sends it, until it ends."""
        api_request(
            self.port,
            "POST",
            f"dags/{dag_id}/dagRuns",
            {"dag_run_id": run_id, "logical_date": None, "conf": {"epoch": epoch.isoformat()}},
        )
        self.wait_for(
            f"{dag_id} run {run_id} done",
            lambda: self.run_state(dag_id, run_id) in ("success", "failed"),
            RUN_TIMEOUT_S,
        )
        assert self.run_state(dag_id, run_id) == "success", self.task_states(dag_id, run_id)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        rows = self.query(
            "SELECT task_id, map_index, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
            dag_id,
            run_id,
        )
        return {(t if m < 0 else f"{t}[{m}]"): s for t, m, s in rows}

    def runs(self, dag_id: str) -> list[tuple[str, str]]:
        """(run_id, state) of a DAG's runs, oldest first."""
        return self.query("SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id", dag_id)

    def asset_events(self, uri: str) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.uri = ? ORDER BY e.id",
            uri,
        )
        return [json.loads(extra) if extra else {} for (extra,) in rows]

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        rows = self.query(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? "
            "AND key = 'return_value'",
            dag_id,
            run_id,
            task_id,
        )
        return json.loads(rows[0][0]) if rows else None

    def logs(self) -> str:
        return "\n".join(service.tail() for service in self.services)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


def test_assets_drive_the_downstream_dag_and_metrics_reach_statsd(
    conn, make_families, statsd, tmp_path, migrated_airflow_db
):
    """Assets drive the downstream DAG and the metrics reach StatsD. Over 30 s, and why: a
    private Airflow (scheduler, dag-processor, api-server) runs the DAGs as scheduled and
    sends its metrics to a real StatsD listener."""
    started = datetime.now(UTC).replace(tzinfo=None)
    # a long sweep interval: only the first run sweeps, however long the services take
    families = make_families(
        {"schedule": "0 0 29 2 *", "sweep_interval": "1h", "tags": ["scheduler"]}, shape="mapped"
    )
    family = families.family(families.entries[0]["name"])
    home = tmp_path / "airflow"
    home.mkdir()
    airflow = LocalAirflow(home, statsd.port, family.name)
    downstream = f"counters_example_after_{family.name}"
    compact_uri = f"cassandra://cassandra-test:9042/{family.keyspace}/{family.compact_table}"
    try:
        shutil.copy(migrated_airflow_db, home / "airflow.db")
        assert airflow.query("SELECT 1 FROM slot_pool WHERE pool = 'cassandra_compaction'") == []
        airflow.start("api-server", "api-server", "--port", str(airflow.port))
        airflow.start("dag-processor", "dag-processor")
        # together: no run starts before the first trigger, which waits for the API server
        airflow.start("scheduler", "scheduler")

        # rows before epoch 1, written while the services start
        base = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
        base -= timedelta(hours=1)
        store = Store(conn, family)
        client = CounterClient(conn, family, store)
        first = [
            Increment((f"K{i}",), i + 1, utc_aware(base + timedelta(minutes=i % 3)), ("w", i))
            for i in range(30)
        ]
        client.record(first)

        # the project created the pool when the scheduler (or DAG processor) started
        airflow.wait_for(
            "the pool",
            lambda: airflow.query(
                "SELECT slots FROM slot_pool WHERE pool = ?", "cassandra_compaction"
            ),
            START_TIMEOUT_S,
        )
        assert airflow.query(
            "SELECT slots, description FROM slot_pool WHERE pool = 'cassandra_compaction'"
        ) == [(4, "Concurrent compaction tasks against Cassandra (counters-compaction)")]
        airflow.wait_for(
            "the API server",
            lambda: answers(f"http://localhost:{airflow.port}/api/v2/version"),
            START_TIMEOUT_S,
        )
        for dag_id in (family.dag_id, downstream):
            airflow.wait_for(
                f"{dag_id} parsed",
                lambda d=dag_id: airflow.query("SELECT 1 FROM dag WHERE dag_id = ?", d),
                START_TIMEOUT_S,
            )
            airflow.unpause(dag_id)

        # 1. a run that folds rows (the family's first: a sweep, mapped tasks)
        airflow.trigger_and_wait(family.dag_id, "fold-1", base + timedelta(minutes=5))
        assert airflow.task_states(family.dag_id, "fold-1")["record_audit"] == "success"
        airflow.wait_for(
            "the downstream run after fold-1",
            lambda: [s for _, s in airflow.runs(downstream)] == ["success"],
            RUN_TIMEOUT_S,
        )
        ((after_1, _),) = airflow.runs(downstream)
        report = airflow.xcom(downstream, after_1, "report_compaction")
        assert report["runs"] == ["fold-1"] and report["rows_folded"] == len(first)
        assert report["sum_folded"] == sum(e.increment for e in first)

        # 2. a run with nothing to fold (nothing written since): it commits nothing, so no
        # asset event (recorded when its task ends) and no downstream run
        airflow.trigger_and_wait(family.dag_id, "idle-2", base + timedelta(minutes=10))
        audit = {a["run_id"]: a for a in store.audit.page(5)}
        assert (audit["idle-2"]["counters"], audit["idle-2"]["rows_folded"]) == (0, 0)
        idle_outcome = audit["idle-2"]["outcome"]  # `idle`, or `success` with nothing committed
        assert [e["run_id"] for e in airflow.asset_events(compact_uri)] == ["fold-1"]

        # 3. a small run that folds rows: done whole in `run`, the event through the alias
        second = [Increment(("K1",), 100, utc_aware(base + timedelta(minutes=12)), ("w", 99))]
        client.record(second)
        airflow.trigger_and_wait(family.dag_id, "fold-3", base + timedelta(minutes=15))
        states = airflow.task_states(family.dag_id, "fold-3")
        assert states["run"] == "success" and states["record_audit"] == "skipped", states
        airflow.wait_for(
            "the downstream run after fold-3",
            lambda: [s for _, s in airflow.runs(downstream)] == ["success", "success"],
            RUN_TIMEOUT_S,
        )
        events = airflow.asset_events(compact_uri)
        assert [(e["run_id"], e["rows_folded"]) for e in events] == [
            ("fold-1", len(first)),
            ("fold-3", 1),
        ]
        after_3 = airflow.runs(downstream)[1][0]
        assert airflow.xcom(downstream, after_3, "report_compaction")["runs"] == ["fold-3"]
        assert client.read_many(["K1"])[0].compact_value == 2 + 100

        # the family's metrics reached the StatsD listener, one set per run, tagged
        tag = {"family": family.name}

        def values(what: str, **tags: str) -> list[tuple[float, str]]:
            return statsd.values(f"airflow.counters.{what}", **tag, **tags)

        wanted = {"success": 2 + (idle_outcome == "success"), "idle": int(idle_outcome == "idle")}
        airflow.wait_for(
            "the runs' metrics",
            lambda: all(len(values("runs", outcome=o)) >= n for o, n in wanted.items()),
            30,
        )
        assert sum(v for v, _ in values("rows_folded")) == len(first) + 1
        assert sum(v for v, _ in values("rows_deleted")) == len(first) + 1
        assert [k for _, k in values("rows_folded")] == ["c"] * 3  # one per run
        assert {v for v, _ in values("quarantined")} == {0} and len(values("quarantined")) == 3
        assert sum(v for v, _ in values("late_rows")) == 0
        assert [k for _, k in values("run_duration")] == ["ms"] * 3
        assert all(v > 0 for v, _ in values("run_duration"))
        lags = values("lag_seconds")
        assert len(lags) == 3 and {k for _, k in lags} == {"g"}
        # each lag is the moment it was sent minus the run's compacted epoch
        ended = datetime.now(UTC).replace(tzinfo=None)
        for (lag, _), minutes in zip(lags, (5, 10, 15), strict=True):
            sent = base + timedelta(minutes=minutes, seconds=lag)
            assert started <= sent <= ended, (lag, minutes)
        epochs = [v for v, _ in values("compacted_epoch_seconds")]
        assert epochs == [
            (base + timedelta(minutes=m)).replace(tzinfo=UTC).timestamp() for m in (5, 10, 15)
        ]
        assert values("runs", outcome="failed") == []
        assert not any(f".{family.name}." in line for line in statsd.lines)  # no legacy names
    finally:
        airflow.stop()
