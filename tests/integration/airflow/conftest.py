"""Fixtures for end-to-end DAG tests: real Airflow code paths (``dag.test()``), real Cassandra,
real alert receivers on loopback (an aiosmtpd SMTP server and an HTTP server).

Needs a migrated Airflow DB and the project's ``dags/`` as the dags folder: ``make test`` sets
``AIRFLOW_HOME=var/airflow-test`` and ``AIRFLOW__CORE__DAGS_FOLDER`` and migrates. By hand:

    source scripts/env.sh; airflow_env $PWD/var/airflow-test; airflow_db_migrate
    CASSANDRA_HOSTS=127.0.0.1 CASSANDRA_PORT=9142 \\
        .venv/bin/python -m pytest tests/integration/airflow
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.family_pool import TEST_FAILED, TablePool, TableSet, release_families
from tests.sweeps import with_sweep_offset

PROJECT = Path(__file__).resolve().parents[3]
DAGS = PROJECT / "dags"

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def airflow_ready() -> str | None:
    """Why the Airflow DB cannot be used, or None."""
    home = os.environ.get("AIRFLOW_HOME")
    if not home:
        return "AIRFLOW_HOME is not set"
    if Path(os.environ.get("AIRFLOW__CORE__DAGS_FOLDER", "")).resolve() != DAGS:
        return f"AIRFLOW__CORE__DAGS_FOLDER must be {DAGS}"
    if not (Path(home) / "airflow.db").exists():
        return f"no migrated Airflow DB in {home}"
    return None


HINT = (
    "Run `make test`, or: source scripts/env.sh; airflow_env $PWD/var/airflow-test; "
    "airflow_db_migrate; then pytest with CASSANDRA_HOSTS/CASSANDRA_PORT set."
)


@pytest.fixture(scope="session", autouse=True)
def airflow_env(cassandra_contact: tuple[list[str], int]) -> Iterator[None]:
    """The Airflow connection ``cassandra_default`` from the environment: outside a running
    task (and in ``dag.test()``) Airflow 3 does not read connections from its DB."""
    problem = airflow_ready()
    if problem:
        pytest.fail(f"{problem}. {HINT}", pytrace=False)
    hosts, port = cassandra_contact
    conn = {
        "conn_type": "cassandra",
        "host": ",".join(hosts),
        "port": port,
        "extra": {
            "load_balancing_policy": "TokenAwarePolicy",
            "load_balancing_policy_args": {
                "child_load_balancing_policy": "DCAwareRoundRobinPolicy",
                "child_load_balancing_policy_args": {
                    "local_dc": os.environ.get("CASSANDRA_LOCAL_DC") or "datacenter1"
                },
            },
            # negotiated, as a connection without it is, unless the run pins one
            **(
                {"protocol_version": int(os.environ["CASSANDRA_PROTOCOL_VERSION"])}
                if os.environ.get("CASSANDRA_PROTOCOL_VERSION")
                else {}
            ),
        },
    }
    if os.environ.get("CASSANDRA_USERNAME"):
        conn["login"] = os.environ["CASSANDRA_USERNAME"]
        conn["password"] = os.environ.get("CASSANDRA_PASSWORD", "")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_CASSANDRA_DEFAULT", json.dumps(conn))
        mp.setenv("GX_ANALYTICS_ENABLED", "false")
        mp.delenv("COUNTERS_ALERT_EMAIL", raising=False)
        mp.delenv("COUNTERS_ALERT_WEBHOOK_URL", raising=False)
        mp.delenv("COUNTERS_ALERT_SLACK_CONN_ID", raising=False)
        yield
    from counters.airflow import runtime

    runtime.close()


@pytest.fixture(scope="session")
def conn(airflow_env: None) -> Iterator[Any]:
    """The test's own Cassandra connection (for loading increments and reading results)."""
    from counters.connection import Connection, ConnectionSettings

    connection = Connection(ConnectionSettings.from_env())
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def dag_keyspace(conn: Any) -> Iterator[str]:
    name = f"t_dags_{secrets.token_hex(3)}"
    yield name
    # one schema change for every table the DAG tests made; slow on a busy 2-core machine
    conn.session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=300)


def answers(url: str, timeout: float = 2) -> bool:
    """Whether a local HTTP endpoint answers 200 (a service that is up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def api_request(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A call to a private Airflow's REST API (``/api/v2``, what the UI and clients call), as
    any user: the stack runs with ``simple_auth_manager_all_admins``. Its JSON answer."""
    request = urllib.request.Request(
        f"http://localhost:{port}/api/v2/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A metadata DB fresh from ``airflow db migrate`` (in a home of its own), made once per
    session: each private Airflow that needs a new DB starts from a copy of it."""
    import subprocess
    import sys

    home = tmp_path_factory.mktemp("airflow-migrated")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        env={**os.environ, "AIRFLOW_HOME": str(home), "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"airflow db migrate: {done.stdout}\n{done.stderr}"
    return home / "airflow.db"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fernet_key() -> str:
    """A private Airflow's Fernet key, given to every one of its services: a service started
    before another wrote airflow.cfg would make its own, and a triggerer then could not read
    the kwargs a scheduler wrote."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


# --- receivers ----------------------------------------------------------------------------


@dataclass
class Inbox:
    """What the local receivers got: SMTP messages and HTTP POST bodies by path."""

    mails: list[Any] = field(default_factory=list)
    posts: list[tuple[str, bytes]] = field(default_factory=list)
    smtp_port: int = 0
    http_port: int = 0

    def json_posts(self, path: str) -> list[dict[str, Any]]:
        return [json.loads(body) for p, body in self.posts if p == path]


@pytest.fixture
def receivers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Inbox]:
    """A real SMTP server (aiosmtpd) and an HTTP server on free loopback ports, plus the
    Airflow connections that point at them: ``counters_smtp`` and ``counters_slack``."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            inbox.mails.append(envelope)
            return "250 Message accepted for delivery"

    inbox.smtp_port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=inbox.smtp_port)
    controller.start()

    class Http(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            inbox.posts.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    inbox.http_port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(
        "AIRFLOW_CONN_COUNTERS_SMTP",
        json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": inbox.smtp_port,
                "extra": {
                    "disable_tls": True,
                    "disable_ssl": True,
                    "from_email": "counters@localhost",
                    "timeout": 10,
                    "retry_limit": 1,
                },
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_COUNTERS_SLACK",
        json.dumps(
            {
                "conn_type": "slackwebhook",
                "password": f"http://127.0.0.1:{inbox.http_port}/slack",
            }
        ),
    )
    try:
        yield inbox
    finally:
        server.shutdown()
        server.server_close()
        controller.stop()


# --- families -----------------------------------------------------------------------------


@dataclass
class Families:
    """Throw-away families in a YAML that ``$COUNTERS_CONFIG`` points at, with tables."""

    path: Path
    keyspace: str
    entries: list[dict[str, Any]]

    def family(self, name: str) -> Any:
        from counters.config import Family

        return Family.model_validate(next(e for e in self.entries if e["name"] == name))

    def family_at(self, index: int) -> Any:
        return self.family(self.entries[index]["name"])


FamiliesFactory = Callable[..., Families]


SHAPES = {"mapped": True, "one-task": False}
"""The DAG shapes a test names (``shard_tasks``): the five-task mapped shape, or the one-task
shape (the default of a family)."""


@pytest.fixture(scope="session")
def dag_table_pool(conn: Any) -> Iterator[TablePool]:
    """The session's table sets for ``make_families`` (tests/family_pool.py), by shape (the
    keyspace is part of it: a module with a keyspace of its own gets sets of its own)."""
    pool = TablePool(conn.session)
    yield pool
    print(f"\nDAG test families: {pool.summary()}")


@pytest.fixture
def make_families(
    conn: Any,
    dag_keyspace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dag_table_pool: TablePool,
    request: pytest.FixtureRequest,
) -> Iterator[FamiliesFactory]:
    """``make_families(dict(...), ..., shape="mapped" | "one-task")``: write the YAML, give each
    family a new name and empty tables (from the session's pool of table sets, else new ones;
    ``fresh=True``: new ones, for a test that changes its tables), point ``COUNTERS_CONFIG`` and
    ``COUNTERS_GX_RESULTS`` (the stored results and Data Docs) into the test's tmp dir. Every
    test names the DAG shape it tests (an entry's own ``shard_tasks`` wins). After the test its
    families are retired (``counterctl retire``'s call), as an operator retires removed
    families: the keyspace is shared, and the freshness check of a later test watches every
    family the cluster knows there (its tables' owners, for tables of its own, stay known).
    Before that, their rows in the shared tables are deleted and their pooled tables emptied
    for the next test (kept as they are when the test failed)."""
    from counters.store import Store

    made: list[tuple[Any, TableSet | None]] = []

    def factory(*overrides: dict[str, Any], shape: str, fresh: bool = False) -> Families:
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}")
        entries = []
        for override in overrides:
            suffix = secrets.token_hex(3)
            entry: dict[str, Any] = {
                "name": f"f_{suffix}",
                "keyspace": dag_keyspace,
                "raw_table": f"raw_{suffix}",
                "compact_table": f"compact_{suffix}",
                "lag": "1m",
                "shards": 2,
                "shard_tasks": SHAPES[shape],
                "tags": ["test"],
            }
            entry.update(override)
            entry = with_sweep_offset(entry, datetime.now(UTC))
            named = "raw_table" in override or "compact_table" in override
            family, _layout, tables = dag_table_pool.family(entry, fresh=fresh or named)
            made.append((family, tables))
            entries.append(
                {**entry, "raw_table": family.raw_table, "compact_table": family.compact_table}
            )
        path = tmp_path / "families.yaml"
        path.write_text(yaml.safe_dump({"families": entries}, sort_keys=False))
        monkeypatch.setenv("COUNTERS_CONFIG", str(path))
        monkeypatch.setenv("COUNTERS_GX_RESULTS", str(tmp_path / "gx-results"))
        return Families(path, dag_keyspace, entries)

    yield factory
    release_families(dag_table_pool, made, request.node.stash.get(TEST_FAILED, False))
    for family, _tables in made:  # after the release, which deletes the family's state row
        Store(conn, family).state.retire("tests")


@pytest.fixture
def dagbag() -> Callable[[], Any]:
    """Parse the project's dags folder now (with the test's environment)."""

    def parse() -> Any:
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(DAGS))
        assert not bag.import_errors, bag.import_errors
        return bag

    return parse


@pytest.fixture
def t0() -> datetime:
    """A minute boundary a day back: runs are in the past, so no epoch is "in the future"."""
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    return now - timedelta(days=1)


class TaskLog(logging.Handler):
    """The lines the project's loggers write during a test (a task run by ``dag.test()`` runs
    in the test's process). Read from the loggers themselves: the handler through which
    ``dag.test()`` prints keeps the stdout of the first test that ran one, so a later test's
    capsys sees nothing of it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def task_log() -> Iterator[TaskLog]:
    logger = logging.getLogger("counters")
    handler, level, disabled = TaskLog(), logger.level, logger.disabled
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled


@pytest.fixture
def api_requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What the task processes of ``dag.test()`` ask their supervisor, in order: (task id,
    message type). Each message is one execution-API request in a deployment (the supervisor
    adds the task's start and its heartbeats, the same for every task; ``MaskSecret``, which
    the supervisor handles itself, is left out)."""
    from airflow.sdk.execution_time import supervisor

    sent: list[tuple[str, str]] = []
    send = supervisor.InProcessSupervisorComms.send

    def recording(self: Any, msg: Any) -> Any:
        if type(msg).__name__ != "MaskSecret":
            sent.append((str(getattr(self.supervisor.ti, "task_id", "?")), type(msg).__name__))
        return send(self, msg)

    monkeypatch.setattr(supervisor.InProcessSupervisorComms, "send", recording)
    return sent
