"""The local 3-node cluster the fault and security tests run against, started once for the
tests of this folder and stopped when the last of them ends.

Nodes on 127.0.0.1..3 (``scripts/cassandra_node.py up --cluster``), native port 9342, storage
7400, JMX 7401-7403 (``CASSANDRA_CLUSTER_PORT``, ``CASSANDRA_CLUSTER_STORAGE_PORT``,
``CASSANDRA_CLUSTER_JMX_PORT`` move them), 512 MiB heaps, PasswordAuthenticator,
CassandraAuthorizer and client TLS with a CA this session generates; the nodes require a client
certificate signed by it (mutual TLS: every client here shows ``client.pem``). The families live
in a keyspace at RF=3 and run at LOCAL_QUORUM as the least-privilege ``compactor`` role, whose
grants are the ones ``counterctl init --print-grants`` prints.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cassandra import ConsistencyLevel, DriverException
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement
from click.testing import CliRunner
from counters.cli import cli
from counters.client import CounterClient
from counters.config import Family
from counters.connection import Connection, ConnectionSettings
from counters.schema import ensure_schema
from counters.store import Store

from tests.conftest import CLUSTER_NODES
from tests.integration.airflow.conftest import Inbox, receivers  # noqa: F401 (a fixture)
from tests.sweeps import with_sweep_offset

from .pki import write_test_pki

PROJECT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = PROJECT / "scripts" / "cassandra_node.py"
CLUSTER = os.environ.get("CASSANDRA_CLUSTER_NAME") or "testcluster"
REPLICATION = "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"
LOCAL_DC = "datacenter1"
COMPACTOR = "compactor"


def launcher(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(NODE_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    took = time.monotonic() - started
    print(f"[cluster] {' '.join(args[:3])}: {took:.1f} s", file=sys.stderr)
    if result.returncode not in (0, 3):
        output = result.stdout + result.stderr
        raise AssertionError(f"cassandra_node.py {' '.join(args)} failed:\n{output}")
    return result


@dataclass
class LocalCluster:
    """The running cluster, and what a test may do to its nodes (by pid)."""

    name: str
    addresses: tuple[str, ...]
    port: int
    ca_file: Path
    admin: tuple[str, str]
    client_pem: Path
    """The clients' certificate (key and chain): the nodes require one (mutual TLS)."""
    isolated: dict[int, int] = field(default_factory=dict)
    """Nodes out of the cluster by ``isolate`` (their JVMs frozen), by pid, until ``rejoin``."""

    def status(self) -> dict[str, Any]:
        return json.loads(launcher("status", "--cluster", self.name, "--json").stdout)

    def pid(self, node: int) -> int | None:
        return self.status()["nodes"][node - 1]["pid"]

    def live_pids(self) -> list[int]:
        """The pids of the nodes running now (a restarted node has a new one)."""
        return [n["pid"] for n in self.status()["nodes"] if n["pid"] and _alive(n["pid"])]

    def kill(self, node: int) -> None:
        """SIGKILL one node's JVM (a crash), and wait until it is gone."""
        self._signal([node], signal.SIGKILL)

    def stop(self, *nodes: int) -> None:
        """A clean shutdown (peers see the nodes leave at once): one node through the
        launcher (`down --cluster NAME --node N`), several by SIGTERM to their pids together."""
        if len(nodes) == 1:
            launcher("down", "--cluster", self.name, "--node", str(nodes[0]))
            assert self.status()["nodes"][nodes[0] - 1]["state"] == "stopped"
        else:
            self._signal(nodes, signal.SIGTERM)

    def _signal(self, nodes: tuple[int, ...] | list[int], sig: signal.Signals) -> None:
        pids = [self.pid(n) for n in nodes]
        assert all(pids), f"nodes {nodes} are not all running: pids {pids}"
        for pid in pids:
            os.kill(pid, sig)
        deadline = time.monotonic() + 90
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"pids {pids} did not exit after {sig.name}"
            time.sleep(0.2)

    def isolate(self, *nodes: int) -> None:
        """Take nodes out of the cluster without ending their JVMs: ``nodetool disablebinary``
        (clients are refused, open connections closed), ``disablegossip`` (the node announces
        its shutdown: peers mark it down at once), then SIGSTOP. The freeze is what makes it
        down: under Cassandra 5.0 a node with gossip disabled that still answers is marked up
        again within seconds, and then gets writes; a frozen one answers nothing (peers that
        took it for up again convict it). Waits until every other node's last word on it is
        DOWN. Clients and peers then see what they see of a stopped node, and ``rejoin`` takes
        seconds where a JVM start takes most of a minute. The crash test kills instead."""
        marks = self._log_marks()
        self._nodetool_each(nodes, "disablebinary", "disablegossip")
        for node in nodes:
            pid = self.pid(node)
            assert pid, f"node {node} is not running"
            os.kill(pid, signal.SIGSTOP)
            self.isolated[node] = pid
        self._wait_logged(marks, nodes, "DOWN")

    def rejoin(self) -> float:
        """Bring the isolated nodes back (SIGCONT; ``enablegossip``, then ``enablebinary``:
        peers tell the clients the node is up once its native port is ready) and wait until
        every node that stayed logs each of them UP again; returns the seconds it took. (A
        node does not convict its peers for the time it was frozen: Cassandra ignores a local
        pause.)"""
        started = time.monotonic()
        nodes = tuple(sorted(self.isolated))
        marks = self._log_marks()
        for node in nodes:
            os.kill(self.isolated[node], signal.SIGCONT)
        self._nodetool_each(nodes, "enablegossip", "enablebinary")
        for node in nodes:
            del self.isolated[node]
        self._wait_logged(marks, nodes, "UP")
        return time.monotonic() - started

    def _nodetool_each(self, nodes: tuple[int, ...], *commands: str) -> None:
        """The commands in order on each node, the nodes in parallel (a nodetool is a JVM)."""
        errors: list[BaseException] = []

        def on(node: int) -> None:
            try:
                for command in commands:
                    self.nodetool(node, command)
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=on, args=(n,)) for n in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    @functools.cached_property
    def system_logs(self) -> dict[int, Path]:
        """Each node's system.log (where it is does not change while the cluster lives)."""
        return {n["node"]: Path(n["log_dir"]) / "system.log" for n in self.status()["nodes"]}

    def _log_marks(self) -> dict[int, int]:
        """Each node's system.log size now: what a node logs after it is read from there."""
        return {node: _size(log) for node, log in self.system_logs.items()}

    def _wait_logged(self, marks: dict[int, int], nodes: tuple[int, ...], state: str) -> None:
        """Until the last word on each of ``nodes`` (Gossiper's "InetAddress /ADDRESS:PORT is
        now UP|DOWN", or "state jump to shutdown" for down) logged since ``marks`` by every
        node that is neither one of them nor isolated is ``state``."""
        watchers = [n for n in self.system_logs if n not in nodes and n not in self.isolated]
        deadline = time.monotonic() + 90
        while True:
            missing = [
                (w, n)
                for w in watchers
                for n in nodes
                if _last_word(self.system_logs[w], marks[w], self.addresses[n - 1]) != state
            ]
            if not missing:
                return
            assert time.monotonic() < deadline, f"not logged {state} within 90 s: {missing}"
            time.sleep(0.2)

    def start(self) -> float:
        """Start every node that is not running (together) and wait until all see each other
        up; returns the seconds it took. The launcher waits while a node's log grows; a start
        that fails anyway (a node silent, or killed by the launcher's bound) is tried once
        more: a busy machine, not the code under test."""
        started = time.monotonic()
        try:
            launcher("up", "--cluster", self.name)
        except AssertionError as first:
            print(f"[cluster] start failed, trying once more: {first}", file=sys.stderr)
            launcher("up", "--cluster", self.name)
        return time.monotonic() - started

    def stopped(self) -> list[int]:
        """The nodes not running now."""
        return [i + 1 for i, n in enumerate(self.status()["nodes"]) if n["state"] != "running"]

    def hint_files(self, conn: Connection, address: str) -> list[Path]:
        """Hints the other nodes hold for the node at ``address`` (files named by its host
        id; delivered and removed once it is back and handoff is not paused)."""
        host_id = next(h.host_id for h in conn.cluster.metadata.all_hosts() if h.address == address)
        folders = [Path(n["data_dir"]) / "hints" for n in self.status()["nodes"]]
        return [f for folder in folders for f in folder.glob(f"{host_id}-*.hints")]

    def nodetool(self, node: int, *args: str) -> str:
        result = launcher("nodetool", "--cluster", self.name, "--node", str(node), "--", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def settings(self, username: str, password: str, **overrides: Any) -> ConnectionSettings:
        fields: dict[str, Any] = {
            "hosts": self.addresses,
            "port": self.port,
            "username": username,
            "password": password,
            "local_dc": LOCAL_DC,
            "tls": True,
            "tls_ca_file": str(self.ca_file),
            "tls_cert_file": str(self.client_pem),
        }
        fields.update(overrides)
        return ConnectionSettings(**fields)

    def env(self, username: str, password: str) -> dict[str, str]:
        """The environment ``counterctl`` connects with (user, password, TLS with CA file)."""
        return {
            **os.environ,
            "CASSANDRA_HOSTS": ",".join(self.addresses),
            "CASSANDRA_PORT": str(self.port),
            "CASSANDRA_USERNAME": username,
            "CASSANDRA_PASSWORD": password,
            "CASSANDRA_LOCAL_DC": LOCAL_DC,
            "CASSANDRA_TLS_CA_FILE": str(self.ca_file),
            "CASSANDRA_TLS_CERT_FILE": str(self.client_pem),
            "PYTHONWARNINGS": "ignore",
        }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _last_word(log: Path, offset: int, address: str) -> str | None:
    """UP or DOWN: what Gossiper last logged of the peer at ``address`` past ``offset`` ("is
    now UP", "is now DOWN", "state jump to shutdown"), or None."""
    with open(log, "rb") as text:
        text.seek(offset)
        lines = text.read().decode(errors="replace").splitlines()
    word = None
    for line in lines:
        if f"/{address}:" not in line:
            continue
        if " is now UP" in line:
            word = "UP"
        elif " is now DOWN" in line or " state jump to shutdown" in line:
            word = "DOWN"
    return word


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="package")
def local_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A fresh 3-node cluster with authentication and client TLS (a new test CA), stopped when
    the last test of tests/cluster ends: three JVMs must not idle through the rest of the
    suite. The launcher stops each node by its pid; the pids read just before are checked gone
    here, and ``tests/conftest.py`` fails the next test if a node still runs."""
    addresses = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    tls = write_test_pki(tmp_path_factory.mktemp("cluster-tls"), addresses)
    if (PROJECT / "var" / "cassandra" / CLUSTER / "cluster.json").exists():
        launcher("down", "--cluster", CLUSTER)  # left running by an interrupted session
    started = time.monotonic()
    up = launcher(
        "up", "--cluster", CLUSTER, "--fresh", "--nodes", "3", "--auth",
        "--client-tls", str(tls), "--client-auth", "--timeout", "300",
    )  # fmt: skip
    print(f"\n[cluster] up in {time.monotonic() - started:.1f} s\n{up.stdout}", file=sys.stderr)
    status = json.loads(launcher("status", "--cluster", CLUSTER, "--json").stdout)
    admin = json.loads(Path(status["admin_credentials"]).read_text())
    cluster = LocalCluster(
        name=CLUSTER,
        addresses=addresses,
        port=status["native_port"],
        ca_file=tls / "ca.pem",
        admin=(admin["username"], admin["password"]),
        client_pem=tls / "client.pem",
    )
    request.config.stash[CLUSTER_NODES] = cluster.live_pids
    try:
        yield cluster
    finally:
        for pid in cluster.isolated.values():  # frozen by a test that failed: SIGTERM waits
            os.kill(pid, signal.SIGCONT)
        pids = cluster.live_pids()
        launcher("down", "--cluster", CLUSTER)
        left = [pid for pid in pids if _alive(pid)]
        assert not left, f"cluster nodes still running after `down`: pids {left}"


@pytest.fixture(autouse=True)
def whole_cluster(local_cluster: LocalCluster) -> None:
    """Every test starts on the whole cluster: a test whose restart of a node failed (or that
    failed with a node down) leaves it stopped, and the next test starts it again rather than
    failing on a half-started cluster."""
    if local_cluster.isolated:
        isolated = sorted(local_cluster.isolated)
        print(f"[cluster] nodes {isolated} isolated by an earlier test: back", file=sys.stderr)
        local_cluster.rejoin()
    stopped = local_cluster.stopped()
    if stopped:
        print(f"[cluster] nodes {stopped} stopped by an earlier test: starting", file=sys.stderr)
        local_cluster.start()


@pytest.fixture(scope="package")
def admin_conn(local_cluster: LocalCluster) -> Iterator[Connection]:
    """The superuser the launcher created: makes keyspaces, tables, roles; writes and checks."""
    connection = Connection(local_cluster.settings(*local_cluster.admin))
    yield connection
    connection.close()


@pytest.fixture(scope="package")
def cluster_keyspace(admin_conn: Connection) -> str:
    name = f"t_cluster_{secrets.token_hex(3)}"
    admin_conn.session.execute(
        f"CREATE KEYSPACE {name} WITH replication = {REPLICATION}", timeout=120
    )
    return name


@pytest.fixture(scope="package")
def compactor_password(admin_conn: Connection) -> str:
    """The compactor role's password: distinctive, so a test can grep outputs for it."""
    password = f"pw-{secrets.token_hex(12)}-@:/+"
    admin_conn.session.execute(
        f"CREATE ROLE {COMPACTOR} WITH LOGIN = true AND PASSWORD = %s", (password,)
    )
    return password


@pytest.fixture(scope="package")
def compactor_conn(local_cluster: LocalCluster, compactor_password: str) -> Iterator[Connection]:
    connection = Connection(local_cluster.settings(COMPACTOR, compactor_password))
    yield connection
    connection.close()


@dataclass
class ClusterFamily:
    """A family at RF=3 in the cluster: its YAML, the compactor's store, the admin's client."""

    family: Family
    config: Path
    store: Store
    client: CounterClient
    admin: Store


def grant_printed(config: Path, family: str, admin_conn: Connection) -> list[str]:
    """Run ``counterctl init --print-grants`` and apply what it prints, as the admin."""
    result = CliRunner().invoke(
        cli, ["--config", str(config), "init", "--print-grants", "--family", family]
    )
    assert result.exit_code == 0, result.output
    statements = [
        line.rstrip(";") for line in result.output.splitlines() if line.startswith("GRANT ")
    ]
    assert statements, result.output
    for statement in statements:
        admin_conn.session.execute(statement)
    return statements


@pytest.fixture
def cluster_family(
    admin_conn: Connection,
    compactor_conn: Connection,
    cluster_keyspace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., ClusterFamily]:
    """``cluster_family(**overrides)``: tables created by the admin (as `counterctl init`
    does), the compactor granted what ``--print-grants`` prints; ``COUNTERS_CONFIG`` and
    ``COUNTERS_GX_RESULTS`` point into the test's tmp dir."""

    def factory(**overrides: Any) -> ClusterFamily:
        suffix = secrets.token_hex(3)
        entry: dict[str, Any] = {
            "name": f"c_{suffix}",
            "keyspace": cluster_keyspace,
            "raw_table": f"raw_{suffix}",
            "compact_table": f"compact_{suffix}",
            "lag": "1m",
            "shards": 2,
            "tags": ["cluster"],
        }
        entry.update(overrides)
        entry = with_sweep_offset(entry, datetime.now(UTC))
        config = tmp_path / f"families-{suffix}.yaml"
        config.write_text(yaml.safe_dump({"families": [entry]}, sort_keys=False))
        family = Family.model_validate(entry)
        settle(admin_conn)
        layout = ensure_schema(admin_conn.session, family, REPLICATION)
        grant_printed(config, family.name, admin_conn)
        monkeypatch.setenv("COUNTERS_CONFIG", str(config))
        monkeypatch.setenv("COUNTERS_GX_RESULTS", str(tmp_path / "gx-results"))
        admin = Store(admin_conn, family, layout)
        return ClusterFamily(
            family=family,
            config=config,
            store=Store(compactor_conn, family, layout),
            client=CounterClient(admin_conn, family, admin),
            admin=admin,
        )

    return factory


def settle(conn: Connection, timeout: float = 60) -> None:
    """Until the driver's control connection is back (after nodes were down, it reconnects
    with backoff) and schema metadata can be refreshed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.cluster.refresh_schema_metadata(max_schema_agreement_wait=30)
            return
        except DriverException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.fixture
def t0() -> datetime:
    """A minute boundary a day back (naive UTC): every epoch of a test is in the past."""
    return datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0) - timedelta(days=1)


def pinned(settings: ConnectionSettings, address: str) -> Connection:
    """A connection whose every request goes to one node (it coordinates them all)."""
    return Connection(settings, load_balancing_policy=WhiteListRoundRobinPolicy([address]))


def rows_at_or_below(
    store: Store, counters: list[str], epoch: datetime, level: int = ConsistencyLevel.QUORUM
) -> int:
    """Raw rows at or below ``epoch`` of these counters, read at ``level``."""
    f = store.family
    statement = SimpleStatement(
        f'SELECT count(*) FROM {f.keyspace}.{f.raw_table} WHERE "{f.columns.key[0]}" = %s '
        f'AND "{f.columns.time}" <= %s',
        consistency_level=level,
    )
    return sum(store.statements.session.execute(statement, (c, epoch)).one()[0] for c in counters)


def assert_exact(cf: ClusterFamily, expected: dict[str, int], epoch: datetime) -> None:
    """Every counter's value is what was written, no row at or below the compacted epoch is
    left (nothing counted twice later), nothing is quarantined (nothing lost or held back)."""
    from counters import engine

    values = {v.counter[0]: v.value for v in cf.client.read_many(list(expected))}
    assert values == expected
    assert rows_at_or_below(cf.admin, list(expected), epoch) == 0
    assert engine.quarantined(cf.admin) == []
    assert cf.admin.state.family_epoch() == epoch
