"""Shared fixtures for tests that talk to a real Cassandra.

`make test` (scripts/test.sh) starts the local `test` instance on 127.0.0.1:9142 and exports
CASSANDRA_HOSTS/CASSANDRA_PORT for pytest. Run by hand, the default is 127.0.0.1:9042 (the `dev`
instance of `make run`). Point at another cluster with CASSANDRA_HOSTS (comma separated),
CASSANDRA_PORT, CASSANDRA_USERNAME, CASSANDRA_PASSWORD and CASSANDRA_LOCAL_DC. The protocol
version is negotiated; CASSANDRA_PROTOCOL_VERSION=4 (or --protocol-version 4) pins it, for the
fixtures and for the library, as it would be against a Cassandra 3.11 or 4.x cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from counters.connection import CONTROL_CONNECTION_TIMEOUT, ConnectionSettings

from tests.background import MYPY, Background
from tests.family_pool import TEST_FAILED
from tests.lanes import TIMES_ENV
from tests.timing import TestTime, failure_line, per_test, summary

DEFAULT_HOST = "127.0.0.1"
EXAMPLE_FAMILIES = Path(__file__).resolve().parents[1] / "include/examples/counter_families.yaml"
# As scripts/env.sh sets them for `make test`: the demo families, in the local dev setup.
os.environ.setdefault("COUNTERS_CONFIG", str(EXAMPLE_FAMILIES))
os.environ.setdefault("COUNTERS_LOCAL_DEV", "1")
TIERS = ("unit", "integration", "airflow", "cluster")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--protocol-version",
        help="Pin the native protocol version (sets CASSANDRA_PROTOCOL_VERSION for the fixtures "
        "and the library; default: negotiated).",
    )


def pytest_configure(config: pytest.Config) -> None:
    pinned = config.getoption("--protocol-version", None)
    if pinned:
        os.environ["CASSANDRA_PROTOCOL_VERSION"] = str(pinned)


def pytest_report_header(config: pytest.Config) -> str:
    pinned = os.environ.get("CASSANDRA_PROTOCOL_VERSION")
    return f"Cassandra protocol: {'v' + pinned + ' (pinned)' if pinned else 'negotiated'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test declares its tier (``pytestmark`` in its module): ``unit`` (no services),
    ``integration`` (the real Cassandra node), ``airflow`` (the Airflow metadata DB) or
    ``cluster`` (the local 3-node cluster)."""
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if unmarked:
        raise pytest.UsageError(
            "tests without a tier marker (unit, integration, airflow or cluster): "
            + ", ".join(unmarked)
        )


SESSION_START = pytest.StashKey[float]()
DOCUMENTED = pytest.StashKey[set[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[SESSION_START] = time.monotonic()


def _error_of(report: pytest.TestReport) -> str:
    """A failed report's error (``assert 16 == 17``), or its whole text when it has none."""
    crash = getattr(report.longrepr, "reprcrash", None)
    return str(getattr(crash, "message", "")) or report.longreprtext


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The time budget: the session's time, each tier's share, the slowest tests
    (tests/timing.py)."""
    config = terminalreporter.config
    reports = [
        (r.nodeid, r.duration)
        for reports in terminalreporter.stats.values()
        for r in reports
        if isinstance(r, pytest.TestReport)
    ]
    if not reports:
        return
    documented = config.stash.get(DOCUMENTED, set())
    tests = [TestTime(n, s, n in documented) for n, s in per_test(reports).items()]
    wall = time.monotonic() - config.stash.get(SESSION_START, time.monotonic())
    terminalreporter.section("time budget")
    for line in summary(wall, tests):
        terminalreporter.write_line(line)
    times = os.environ.get(TIMES_ENV)
    if times:  # a lane of the whole suite: tests/lanes.py sums both sessions' times
        failed = [
            failure_line(r.nodeid, r.when, _error_of(r))
            for key in ("failed", "error")
            for r in terminalreporter.stats.get(key, [])
            if isinstance(r, pytest.TestReport)
        ]
        Path(times).write_text(
            json.dumps(
                {"wall_s": wall, "tests": [dataclasses.asdict(t) for t in tests], "failed": failed}
            )
        )


MYPY_RUN = pytest.StashKey[Background]()
TYPES_TEST = "test_types.py"
"""The module of the mypy test (tests/unit): mypy starts when it is selected."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """mypy starts now, in the background, when its test is selected (``mypy_result``); the
    tests with a docstring are noted for the time budget."""
    session.config.stash[DOCUMENTED] = {
        item.nodeid
        for item in session.items
        if isinstance(item, pytest.Function) and item.obj.__doc__
    }
    if any(item.path.name == TYPES_TEST for item in session.items):
        session.config.stash[MYPY_RUN] = Background(MYPY).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    background = session.config.stash.get(MYPY_RUN, None)
    if background is not None:
        background.stop()


@pytest.fixture(scope="session")
def mypy_result(request: pytest.FixtureRequest) -> subprocess.CompletedProcess[str]:
    """mypy over the package, started at the session's start (or now, if it was not)."""
    background = request.config.stash.get(MYPY_RUN, None)
    if background is None:
        background = request.config.stash[MYPY_RUN] = Background(MYPY).start()
    return background.result(timeout_s=900)


CLUSTER_NODES = pytest.StashKey[Callable[[], list[int]]]()
"""Set by tests/cluster's ``local_cluster`` while its nodes may run: their live pids."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The first test after the cluster tests fails if a node of theirs still runs: the local
    cluster is stopped when the last cluster test ends, not left to idle through the rest of
    the suite (three JVMs on a 2-core machine)."""
    live_pids = item.config.stash.get(CLUSTER_NODES, None)
    if live_pids is None or item.get_closest_marker("cluster"):
        return
    del item.config.stash[CLUSTER_NODES]  # checked once
    left = live_pids()
    if left:
        pytest.fail(
            f"the local cluster's nodes (pids {left}) outlived the cluster tests", pytrace=False
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Marks a test whose setup or call failed: its pooled family tables are then kept as they
    are, not emptied for the next test (tests/family_pool.py)."""
    report = yield
    if report.failed:
        item.stash[TEST_FAILED] = True
    return report


DEFAULT_PORT = 9042


def _answers(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def cassandra_contact() -> tuple[list[str], int]:
    """(hosts, port) from CASSANDRA_HOSTS / CASSANDRA_PORT; fails the test if nothing answers."""
    raw = os.environ.get("CASSANDRA_HOSTS") or DEFAULT_HOST
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    port = int(os.environ.get("CASSANDRA_PORT") or DEFAULT_PORT)
    if not any(_answers(h, port) for h in hosts):
        pytest.fail(
            f"no Cassandra answers at {','.join(hosts)}:{port}. Run the tests with `make test` "
            f"(it starts a local node on port 9142), or start one with "
            f"`python scripts/cassandra_node.py up --instance test` and export "
            f"CASSANDRA_HOSTS=127.0.0.1 CASSANDRA_PORT=9142.",
            pytrace=False,
        )
    return hosts, port


@pytest.fixture(scope="session")
def local_instance() -> str:
    """The local instance (``scripts/cassandra_node.py``) the tests run against: make test
    exports CASSANDRA_LOCAL_INSTANCE; skipped against an external cluster, which has none."""
    instance = os.environ.get("CASSANDRA_LOCAL_INSTANCE")
    if instance:
        return instance
    if os.environ.get("CASSANDRA_HOSTS"):
        pytest.skip(
            "CASSANDRA_HOSTS is set to an external cluster: there is no local instance to check"
        )
    return "dev"  # pytest run by hand against the default 127.0.0.1:9042


@pytest.fixture(scope="session")
def cassandra_cluster(cassandra_contact: tuple[list[str], int]) -> Iterator[Cluster]:
    """A driver Cluster: token aware over DC-aware round robin, the protocol negotiated
    unless CASSANDRA_PROTOCOL_VERSION pins it."""
    hosts, port = cassandra_contact
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=os.environ.get("CASSANDRA_LOCAL_DC") or None)
        ),
        request_timeout=30,
    )
    username = os.environ.get("CASSANDRA_USERNAME")
    password = os.environ.get("CASSANDRA_PASSWORD")
    auth = PlainTextAuthProvider(username, password) if username else None
    settings = ConnectionSettings.from_env()  # CASSANDRA_TLS_*, CASSANDRA_PROTOCOL_VERSION
    pinned = {"protocol_version": settings.protocol_version} if settings.protocol_version else {}
    cluster = Cluster(
        contact_points=hosts,
        port=port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        auth_provider=auth,
        connect_timeout=10,
        control_connection_timeout=CONTROL_CONNECTION_TIMEOUT,
        ssl_context=settings.ssl_context(),
        **pinned,
    )
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="session")
def cassandra_session(cassandra_cluster: Cluster) -> Session:
    """A session with no keyspace set (use fully qualified names or the `keyspace` fixture)."""
    return cassandra_cluster.connect()


@pytest.fixture
def keyspace(cassandra_session: Session) -> Iterator[str]:
    """A fresh keyspace t_<random hex> (SimpleStrategy, RF 1), dropped after the test."""
    name = f"t_{secrets.token_hex(6)}"
    cassandra_session.execute(
        f"CREATE KEYSPACE {name} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    try:
        yield name
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {name}")
