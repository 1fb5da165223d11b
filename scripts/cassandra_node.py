#!/usr/bin/env python3
"""Run a real Apache Cassandra 5.0.9 from Maven Central jars (one node, or a local cluster of
nodes on 127.0.0.1..N), for development and tests.

    python scripts/cassandra_node.py up     [--instance dev|test|NAME] [--port N] [--timeout S]
    python scripts/cassandra_node.py down   [--instance NAME]
    python scripts/cassandra_node.py status [--instance NAME] [--json]
    python scripts/cassandra_node.py cql    [--instance NAME] "SELECT ..." | -f file.cql
    python scripts/cassandra_node.py fetch  (only download the jars into .cache/)

    python scripts/cassandra_node.py up     --cluster NAME [--nodes 3] [--auth] [--client-tls DIR]
                                            [--fresh] [--node N]
    python scripts/cassandra_node.py down   --cluster NAME [--node N] [--kill]
    python scripts/cassandra_node.py status --cluster NAME [--node N] [--json]
    python scripts/cassandra_node.py cql    --cluster NAME "LIST ROLES"
    python scripts/cassandra_node.py nodetool --cluster NAME --node N -- status

A cluster's nodes NAME-1..NAME-N listen on 127.0.0.1..127.0.0.N with the same native and storage
ports (9342/7400 by default, off the dev and test instances') and JMX ports 7401, 7402, ...;
every node is a seed, tokens are evenly spaced, 512 MiB heaps. The nodes are started together
and `up` waits until each sees every other up (read from their logs). `up --node N` restarts
one node with the cluster's stored settings (var/cassandra/NAME/cluster.json); `status --json`
gives each node's pid, so a test can SIGKILL one. With --auth the launcher replaces the default
cassandra/cassandra superuser by `admin` (password in var/cassandra/NAME/admin.json, 0600).

Run it with the project venv's python (needs only the standard library and cassandra-driver).

Jars: org.apache.cassandra:cassandra-all:<version> and its runtime dependencies, copied by Maven
into <project>/.cache/cassandra-<version>/lib (local Maven repo <project>/.cache/m2). No conf/
comes from Maven, so this script writes cassandra.yaml and logback.xml itself.

Instances live in <project>/var/cassandra/<NAME>/ (conf/, data/, logs/, triggers/, cassandra.pid).
Default ports: dev 9042/7000/7199, test 9142/7100/7299 (native/storage/jmx), so `make test` can run
while `make run` is up. Flags beat environment (CASSANDRA_PORT, CASSANDRA_STORAGE_PORT,
CASSANDRA_JMX_PORT, CASSANDRA_HEAP, CASSANDRA_START_TIMEOUT), which beats the instance defaults.

If CASSANDRA_HOSTS is set, `up` and `down` of an instance do nothing (an external cluster is in
use) and `cql` talks to that cluster (CASSANDRA_PORT, CASSANDRA_USERNAME, CASSANDRA_PASSWORD,
CASSANDRA_LOCAL_DC, CASSANDRA_TLS_CA_FILE). `--cluster` always means the local cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
CASSANDRA_VERSION = "5.0.9"
CACHE_DIR = PROJECT / ".cache"
M2_REPO = CACHE_DIR / "m2"
DIST_DIR = CACHE_DIR / f"cassandra-{CASSANDRA_VERSION}"
LIB_DIR = DIST_DIR / "lib"
LIB_COMPLETE = LIB_DIR / ".complete"
VAR_DIR = PROJECT / "var" / "cassandra"

# native, storage, jmx
DEFAULT_PORTS = {"dev": (9042, 7000, 7199), "test": (9142, 7100, 7299)}
LISTEN_ADDRESS = "127.0.0.1"
DEFAULT_HEAP = "1G"
UNSAFE_SYSTEM_INSTANCES = frozenset({"test"})
"""Single-node instances started with ``-Dcassandra.unsafesystem=true``: the node does not
flush its system tables after each schema change or TRUNCATE (schema changes several times
faster). A node killed meanwhile may lose recent schema: fine for the throw-away keyspaces
of ``make test`` and ``make bench``, never for ``dev`` (its demo data) or cluster nodes
(killed and restarted by the tests)."""
DEFAULT_START_TIMEOUT = 120.0
STALL_S = 90.0
"""Past its start timeout a node is still waited for while its log grows (it is starting,
slowly: a busy machine), and given up once its log is silent this long."""
START_TIMEOUT_FACTOR = 4
"""However busy the machine, a node that does not answer within this many start timeouts is
given up."""
GOSSIP_WAIT_S = 60.0
"""Once every node answers CQL, how long they get to see each other up (at least)."""
DEFAULT_STOP_TIMEOUT = 60.0
# Native jars for other platforms, shipped inside the Maven artifacts; not needed on Linux x86_64.
FOREIGN_NATIVE_MARKERS = ("osx", "macos", "windows", "win32", "aarch64", "aarch_64", "riscv")

# The JPMS block of Cassandra's conf/jvm17-server.options. Only four of these are strictly needed
# to start (see shared notes), but SAI, tools and repair were not exercised without the rest.
JPMS_FLAGS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(
        f"--add-exports={m}=ALL-UNNAMED"
        for m in (
            "java.base/jdk.internal.misc",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
            "jdk.compiler/com.sun.tools.javac.file",
            "jdk.attach/sun.tools.attach",
        )
    ),
    *(
        f"--add-opens=java.base/{p}=ALL-UNNAMED"
        for p in (
            "java.lang.module",
            "jdk.internal.loader",
            "jdk.internal.ref",
            "jdk.internal.reflect",
            "jdk.internal.math",
            "jdk.internal.module",
            "jdk.internal.util.jar",
            "sun.nio.ch",
            "java.io",
            "java.lang.reflect",
            "java.lang",
            "java.util",
        )
    ),
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
]


class NodeError(Exception):
    """A failure with a message for the user; exits 1."""


def say(message: str) -> None:
    print(f"[cassandra] {message}", flush=True)


# --------------------------------------------------------------------------------------------
# Jars from Maven Central


POM = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.counters</groupId>
  <artifactId>cassandra-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>{CASSANDRA_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lib_jars() -> list[Path]:
    return sorted(LIB_DIR.glob("*.jar"))


def ensure_jars() -> list[Path]:
    """Download cassandra-all and its runtime dependencies once; reuse them afterwards."""
    if LIB_COMPLETE.exists():
        return lib_jars()
    with file_lock(CACHE_DIR / f"cassandra-{CASSANDRA_VERSION}.lock"):
        if LIB_COMPLETE.exists():  # another process finished it while we waited
            return lib_jars()
        mvn = shutil.which("mvn")
        if mvn is None:
            raise NodeError("Maven (mvn) is not on PATH; it is needed once to fetch the jars")
        DIST_DIR.mkdir(parents=True, exist_ok=True)
        pom = DIST_DIR / "pom.xml"
        pom.write_text(POM)
        tmp = DIST_DIR / "lib.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        say(
            f"fetching org.apache.cassandra:cassandra-all:{CASSANDRA_VERSION} and runtime "
            f"dependencies from Maven Central into {LIB_DIR.relative_to(PROJECT)} (once, ~70 MB)"
        )
        started = time.monotonic()
        cmd = [
            mvn, "-q", "-B", "-f", str(pom),
            f"-Dmaven.repo.local={M2_REPO}",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ]  # fmt: skip
        result = subprocess.run(cmd, cwd=DIST_DIR, capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
            raise NodeError(f"mvn failed (exit {result.returncode}):\n{tail}")
        removed = 0
        for jar in tmp.glob("*.jar"):
            if any(marker in jar.name.lower() for marker in FOREIGN_NATIVE_MARKERS):
                jar.unlink()
                removed += 1
        shutil.rmtree(LIB_DIR, ignore_errors=True)
        tmp.rename(LIB_DIR)
        LIB_COMPLETE.write_text(f"cassandra-all {CASSANDRA_VERSION}\n")
        jars = lib_jars()
        size = sum(j.stat().st_size for j in jars) / 1e6
        say(
            f"got {len(jars)} jars ({size:.0f} MB; removed {removed} non-Linux-x86_64 native jars) "
            f"in {time.monotonic() - started:.1f} s"
        )
        return jars


# --------------------------------------------------------------------------------------------
# Instances


@dataclass
class Instance:
    name: str
    native_port: int
    storage_port: int
    jmx_port: int
    heap: str
    # A node of a local cluster (see ClusterSpec) differs from a single node in these:
    address: str = LISTEN_ADDRESS
    cluster: ClusterSpec | None = None
    node: int = 1

    @property
    def home(self) -> Path:
        return VAR_DIR / self.name

    @property
    def conf_dir(self) -> Path:
        return self.home / "conf"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def triggers_dir(self) -> Path:
        return self.home / "triggers"

    @property
    def pid_file(self) -> Path:
        return self.home / "cassandra.pid"

    @property
    def state_file(self) -> Path:
        return self.home / "instance.json"

    @property
    def system_log(self) -> Path:
        return self.log_dir / "system.log"

    @property
    def stdout_log(self) -> Path:
        return self.log_dir / "stdout.log"


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise NodeError(f"{name} must be an integer, got {value!r}") from exc


def resolve_instance(args: argparse.Namespace) -> Instance:
    name = args.instance
    if not name.replace("-", "").replace("_", "").isalnum():
        raise NodeError(f"instance name must be alphanumeric (with - or _), got {name!r}")
    native, storage, jmx = DEFAULT_PORTS.get(name, DEFAULT_PORTS["dev"])
    state = read_state(VAR_DIR / name / "instance.json")
    # A running node keeps the ports it was started with (status/down/cql of a running node).
    if state and args.command != "up":
        native = state.get("native_port", native)
        storage = state.get("storage_port", storage)
        jmx = state.get("jmx_port", jmx)
    else:
        native = env_int("CASSANDRA_PORT") or native
        storage = env_int("CASSANDRA_STORAGE_PORT") or storage
        jmx = env_int("CASSANDRA_JMX_PORT") or jmx
    native = getattr(args, "port", None) or native
    storage = getattr(args, "storage_port", None) or storage
    jmx = getattr(args, "jmx_port", None) or jmx
    heap = getattr(args, "heap", None) or os.environ.get("CASSANDRA_HEAP") or DEFAULT_HEAP
    return Instance(name, native, storage, jmx, heap)


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_pid(inst: Instance) -> int | None:
    try:
        return int(inst.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def is_instance_process(pid: int, inst: Instance) -> bool:
    """Guards against pid reuse: the process must be a CassandraDaemon of this instance."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"org.apache.cassandra.service.CassandraDaemon" in cmdline and (
        f"-Dcassandra.storagedir={inst.data_dir}".encode() in cmdline
    )


def running_pid(inst: Instance) -> int | None:
    pid = read_pid(inst)
    if pid is not None and pid_alive(pid) and is_instance_process(pid, inst):
        return pid
    return None


def tail_logs(inst: Instance, lines: int = 30) -> str:
    parts = []
    for log in (inst.system_log, inst.stdout_log):
        try:
            text = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if text:
            parts.append(f"--- last {min(lines, len(text))} lines of {log} ---")
            # Some lines (node configuration, classpath) run to many KB: cut them.
            parts.extend(t if len(t) <= 300 else t[:300] + " [...]" for t in text[-lines:])
    return "\n".join(parts) if parts else "(no log output yet)"


def port_in_use(port: int, host: str = LISTEN_ADDRESS) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# Local clusters: nodes NAME-1..NAME-N on 127.0.0.1..127.0.0.N (same ports, own addresses)

DEFAULT_CLUSTER = "cluster"
DEFAULT_CLUSTER_NODES = 3
# native, storage, first node's JMX (node n gets +n-1): off the dev and test instances' defaults
DEFAULT_CLUSTER_PORTS = (9342, 7400, 7401)
DEFAULT_CLUSTER_HEAP = "512M"
ADMIN_ROLE = "admin"
# How a node's log says what gossip thinks of a peer (Gossiper, 5.0).
GOSSIP_UP = re.compile(r"InetAddress /(\d+\.\d+\.\d+\.\d+):\d+ is now UP")
LOG_TIME = re.compile(r"\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ ")
GOSSIP_DOWN = re.compile(
    r"InetAddress /(\d+\.\d+\.\d+\.\d+):\d+ is now DOWN"
    r"|Node /(\d+\.\d+\.\d+\.\d+):\d+ state jump to shutdown"
)


@dataclass(frozen=True)
class ClusterSpec:
    """What a local cluster was created with; kept in var/cassandra/NAME/cluster.json so a
    node restarted alone (`up --cluster NAME --node 2`) gets the same configuration."""

    name: str
    nodes: int = DEFAULT_CLUSTER_NODES
    native_port: int = DEFAULT_CLUSTER_PORTS[0]
    storage_port: int = DEFAULT_CLUSTER_PORTS[1]
    jmx_port: int = DEFAULT_CLUSTER_PORTS[2]
    heap: str = DEFAULT_CLUSTER_HEAP
    auth: bool = False
    client_tls: str | None = None  # a directory: ca.pem and <address>.pem (key + chain) per node
    client_auth: bool = False  # the nodes require a client certificate (DIR/client.pem: mutual TLS)

    @property
    def home(self) -> Path:
        return VAR_DIR / self.name

    @property
    def spec_file(self) -> Path:
        return self.home / "cluster.json"

    @property
    def admin_file(self) -> Path:
        """The superuser the launcher creates on an --auth cluster (0600; replaces the default
        cassandra/cassandra, which it disables)."""
        return self.home / "admin.json"

    @property
    def tls_ca(self) -> Path | None:
        return Path(self.client_tls) / "ca.pem" if self.client_tls else None

    @property
    def tls_client(self) -> Path | None:
        """The launcher's own client certificate (key + chain) on a --client-auth cluster."""
        return (
            Path(self.client_tls) / "client.pem" if self.client_tls and self.client_auth else None
        )

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(f"127.0.0.{n}" for n in range(1, self.nodes + 1))

    def initial_token(self, node: int) -> int:
        """Evenly spaced Murmur3 tokens, one per node."""
        return -(2**63) + (node - 1) * (2**64 // self.nodes)

    def instance(self, node: int) -> Instance:
        return Instance(
            name=f"{self.name}-{node}",
            native_port=self.native_port,
            storage_port=self.storage_port,
            jmx_port=self.jmx_port + node - 1,
            heap=self.heap,
            address=self.addresses[node - 1],
            cluster=self,
            node=node,
        )

    def instances(self, node: int | None = None) -> list[Instance]:
        if node is not None and not 1 <= node <= self.nodes:
            raise NodeError(f"cluster '{self.name}' has nodes 1..{self.nodes}; no node {node}")
        return [self.instance(n) for n in range(1, self.nodes + 1) if node in (None, n)]

    def credentials(self) -> tuple[str, str] | None:
        if not self.auth:
            return None
        try:
            data = json.loads(self.admin_file.read_text())
        except (OSError, ValueError):
            return None
        return data["username"], data["password"]


def cluster_flags(spec: ClusterSpec) -> list[str]:
    return [
        "-Dcassandra.ring_delay_ms=5000",  # join in ~20 s instead of ~45 s (shared notes)
        f"-Dcassandra.system_auth.default_rf={min(3, spec.nodes)}",  # roles survive a node down
        "-Dcassandra.superuser_setup_delay_ms=2000",
    ]


def stored_cluster(name: str) -> ClusterSpec | None:
    stored = read_state(VAR_DIR / name / "cluster.json")
    return ClusterSpec(**stored) if stored else None


def resolve_cluster(args: argparse.Namespace) -> ClusterSpec:
    """The stored spec of an existing cluster; the settings flags of `up` create one (or must
    match the stored one, unless --fresh)."""
    name = args.cluster
    if not name.replace("-", "").replace("_", "").isalnum():
        raise NodeError(f"cluster name must be alphanumeric (with - or _), got {name!r}")
    stored = stored_cluster(name)
    creating = args.command == "up" and (
        args.fresh
        or stored is None
        or args.auth
        or args.client_tls
        or args.client_auth
        or any(getattr(args, k) for k in ("nodes", "port", "storage_port", "jmx_port", "heap"))
    )
    if not creating:
        if stored is None:
            raise NodeError(
                f"no cluster '{name}' (start one with `up --cluster {name}`; "
                f"its state goes to var/cassandra/{name}/)"
            )
        return stored
    native, storage, jmx = DEFAULT_CLUSTER_PORTS
    spec = ClusterSpec(
        name=name,
        nodes=args.nodes or DEFAULT_CLUSTER_NODES,
        native_port=args.port or env_int("CASSANDRA_CLUSTER_PORT") or native,
        storage_port=args.storage_port or env_int("CASSANDRA_CLUSTER_STORAGE_PORT") or storage,
        jmx_port=args.jmx_port or env_int("CASSANDRA_CLUSTER_JMX_PORT") or jmx,
        heap=args.heap or os.environ.get("CASSANDRA_CLUSTER_HEAP") or DEFAULT_CLUSTER_HEAP,
        auth=bool(args.auth),
        client_tls=str(Path(args.client_tls).resolve()) if args.client_tls else None,
        client_auth=bool(args.client_auth),
    )
    if spec.client_auth and not spec.client_tls:
        raise NodeError("--client-auth needs --client-tls DIR (DIR/client.pem: the launcher's)")
    if not 1 <= spec.nodes <= 9:
        raise NodeError(f"--nodes must be 1..9, got {spec.nodes}")
    if stored and not args.fresh and stored != spec:
        raise NodeError(
            f"cluster '{name}' exists with other settings ({var_path(spec.spec_file)}); start it "
            "without settings flags, or with --fresh to wipe it and start over"
        )
    return spec


def var_path(path: Path) -> str:
    try:
        return str(path.relative_to(PROJECT))
    except ValueError:
        return str(path)


def tls_files_missing(spec: ClusterSpec) -> list[str]:
    if not spec.client_tls:
        return []
    folder = Path(spec.client_tls)
    wanted = [folder / "ca.pem", *(folder / f"{a}.pem" for a in spec.addresses)]
    if spec.tls_client:
        wanted.append(spec.tls_client)
    return [str(f) for f in wanted if not f.is_file()]


def native_probe(inst: Instance, timeout: float = 2.0) -> bool:
    """True if the node's native port answers an OPTIONS frame (no login needed; over TLS,
    checked against the cluster's CA and the node's address, when the cluster has one)."""
    ca = inst.cluster.tls_ca if inst.cluster else None
    client = inst.cluster.tls_client if inst.cluster else None
    try:
        with socket.create_connection((inst.address, inst.native_port), timeout=timeout) as raw:
            context = tls_context(ca, client) if ca else None
            sock = context.wrap_socket(raw, server_hostname=inst.address) if context else raw
            with sock:
                sock.sendall(bytes([0x04, 0, 0, 0, 0x05, 0, 0, 0, 0]))  # v4 OPTIONS, stream 0
                header = b""
                while len(header) < 9:
                    chunk = sock.recv(9 - len(header))
                    if not chunk:
                        return False
                    header += chunk
                return header[0] == 0x84 and header[4] == 0x06  # response, SUPPORTED
    except ssl.SSLCertVerificationError as exc:
        raise NodeError(
            f"node {inst.name} at {inst.address}:{inst.native_port}: its TLS certificate does not "
            f"verify against {ca}: {exc.verify_message}"
        ) from exc
    except OSError:
        return False


def node_answers(inst: Instance) -> str | None:
    """The release version (a single node), or the launched version once a cluster node's
    native port answers (its CQL may need a login)."""
    if inst.cluster is None:
        return cql_answers(inst.address, inst.native_port)
    return CASSANDRA_VERSION if native_probe(inst) else None


def gossip_view(inst: Instance) -> dict[str, tuple[bool, float]]:
    """Peer address -> (up, when), the latest word of this node's log since its last start."""
    state = read_state(inst.state_file) or {}
    try:
        with open(inst.system_log, "rb") as log:
            log.seek(int(state.get("log_offset", 0)))
            text = log.read().decode(errors="replace")
    except OSError:
        return {}
    view: dict[str, tuple[bool, float]] = {}
    for line in text.splitlines():
        up = GOSSIP_UP.search(line)
        down = None if up else GOSSIP_DOWN.search(line)
        stamp = LOG_TIME.search(line)
        if (up or down) and stamp:
            when = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
            if up:
                view[up.group(1)] = (True, when)
            elif down:
                view[down.group(1) or down.group(2)] = (False, when)
    return view


def sees_up(inst: Instance, peer: Instance) -> bool:
    """``inst`` has seen ``peer`` come up since the peer's latest start."""
    up, when = gossip_view(inst).get(peer.address, (False, 0.0))
    started = (read_state(peer.state_file) or {}).get("started_at", 0.0)
    return up and when >= int(started) - 1  # log times have whole seconds here


def wait_gossip(spec: ClusterSpec, deadline: float) -> float:
    """Wait until every running node has seen every other running node up since its last
    start (hints, reads and writes at QUORUM need that). Returns the seconds waited."""
    started = time.monotonic()
    while True:
        running = [i for i in spec.instances() if running_pid(i) is not None]
        missing = {
            i.name: [p.address for p in running if p.node != i.node and not sees_up(i, p)]
            for i in running
        }
        missing = {k: v for k, v in missing.items() if v}
        if not missing:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise NodeError(
                f"cluster '{spec.name}': nodes do not see each other up yet: "
                + "; ".join(f"{k} waits for {', '.join(v)}" for k, v in missing.items())
            )
        time.sleep(0.5)


def ensure_admin(spec: ClusterSpec, deadline: float) -> None:
    """On a new --auth cluster: log in as the default cassandra/cassandra (created by a node
    a few seconds after start), create the superuser `admin` with a random password in
    admin.json (0600), and take login and superuser away from `cassandra`."""
    if spec.credentials():
        return
    import secrets

    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    quiet_driver_logs()
    password = secrets.token_urlsafe(18)
    while True:
        cluster = make_cluster(
            list(spec.addresses),
            spec.native_port,
            5,
            ("cassandra", "cassandra"),
            spec.tls_ca,
            spec.tls_client,
        )
        try:
            session = cluster.connect()
            session.execute(
                f"CREATE ROLE IF NOT EXISTS {ADMIN_ROLE} WITH SUPERUSER = true AND LOGIN = true "
                "AND PASSWORD = %s",
                (password,),
            )
            break
        except (AuthenticationFailed, NoHostAvailable) as exc:
            if time.monotonic() > deadline:
                raise NodeError(
                    f"cluster '{spec.name}': cannot log in as the default superuser to set up "
                    f"roles: {exc}"
                ) from exc
            time.sleep(1)
        finally:
            cluster.shutdown()
    spec.admin_file.touch(mode=0o600)
    spec.admin_file.write_text(json.dumps({"username": ADMIN_ROLE, "password": password}) + "\n")
    cluster = make_cluster(
        list(spec.addresses),
        spec.native_port,
        5,
        (ADMIN_ROLE, password),
        spec.tls_ca,
        spec.tls_client,
    )
    try:
        cluster.connect().execute("ALTER ROLE cassandra WITH SUPERUSER = false AND LOGIN = false")
    finally:
        cluster.shutdown()
    say(
        f"cluster '{spec.name}': superuser '{ADMIN_ROLE}' created (password in "
        f"{var_path(spec.admin_file)}); the default 'cassandra' role can no longer log in"
    )


def cmd_cluster_up(args: argparse.Namespace) -> int:
    spec = resolve_cluster(args)
    timeout = args.timeout or float(
        os.environ.get("CASSANDRA_START_TIMEOUT") or DEFAULT_START_TIMEOUT
    )
    if heap_bytes(spec.heap) > (1 << 30) and not args.allow_big_heap:
        raise NodeError(f"heap {spec.heap} is over 1 GiB; pass --allow-big-heap if you mean it")
    missing = tls_files_missing(spec)
    if missing:
        raise NodeError(f"--client-tls: missing {', '.join(missing)}")
    jars = ensure_jars()
    started = time.monotonic()
    deadline = started + timeout
    if args.fresh:  # wipe the old cluster's nodes and state (refused while any runs)
        old = stored_cluster(spec.name) or spec
        nodes = old.instances() + spec.instances()
        alive = sorted({i.name for i in nodes if running_pid(i) is not None})
        if alive:
            raise NodeError(f"--fresh: nodes {', '.join(alive)} are running; `down` them first")
        for inst in nodes:
            shutil.rmtree(inst.home, ignore_errors=True)
        shutil.rmtree(spec.home, ignore_errors=True)
    spec.home.mkdir(parents=True, exist_ok=True)
    spec.spec_file.write_text(json.dumps(spec.__dict__, indent=2) + "\n")
    launched: list[tuple[Instance, subprocess.Popen]] = []
    for inst in spec.instances(args.node):
        inst.home.mkdir(parents=True, exist_ok=True)
        with file_lock(inst.home / ".lock"):
            pid = running_pid(inst)
            if pid is not None:
                say(f"node {inst.name} is already running (pid {pid}, {inst.address})")
                continue
            inst.pid_file.unlink(missing_ok=True)
            check_ports_free(inst)
            proc = launch(inst, jars)
            launched.append((inst, proc))
            say(
                f"starting node {inst.name} (pid {proc.pid}, {inst.address}:{inst.native_port}, "
                f"storage {inst.storage_port}, jmx {inst.jmx_port}, heap {inst.heap})"
            )
    for inst, proc in launched:  # started together: seeds find each other at once
        wait_ready(inst, proc.pid, proc, timeout, started)
    waited = wait_gossip(spec, max(deadline, time.monotonic() + GOSSIP_WAIT_S))
    if spec.auth:
        ensure_admin(spec, deadline)
    say(
        f"cluster '{spec.name}' is up: {spec.nodes} node(s) at "
        f"{','.join(spec.addresses)}:{spec.native_port}"
        f"{' (TLS)' if spec.client_tls else ''}{' with authentication' if spec.auth else ''}, "
        f"all in gossip after {time.monotonic() - started:.1f} s (gossip wait {waited:.1f} s)"
    )
    return 0


def cmd_cluster_down(args: argparse.Namespace) -> int:
    """SIGTERM (or SIGKILL with --kill) the selected nodes together, then wait for them."""
    spec = resolve_cluster(args)
    timeout = args.timeout or DEFAULT_STOP_TIMEOUT
    victims = [(i, running_pid(i)) for i in spec.instances(args.node)]
    for inst, pid in victims:
        if pid is None:
            say(f"node {inst.name} is not running")
            inst.pid_file.unlink(missing_ok=True)
            continue
        sig = signal.SIGKILL if args.kill else signal.SIGTERM
        say(f"{'killing' if args.kill else 'stopping'} node {inst.name} ({sig.name} to pid {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    started = time.monotonic()
    for inst, pid in victims:
        if pid is None:
            continue
        graceful = kill_pid_wait(pid, grace=max(0.0, started + timeout - time.monotonic()))
        inst.pid_file.unlink(missing_ok=True)
        how = "stopped" if graceful else "killed (SIGKILL)"
        say(f"node {inst.name} {how} after {time.monotonic() - started:.1f} s")
    return 0


def kill_pid_wait(pid: int, grace: float) -> bool:
    """Wait up to ``grace`` seconds for a signalled pid, then SIGKILL it. True if it ended."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while pid_alive(pid):
        time.sleep(0.1)
    return False


def cluster_status(spec: ClusterSpec, node: int | None) -> dict:
    nodes = []
    for inst in spec.instances(node):
        pid = running_pid(inst)
        nodes.append(
            {
                "node": inst.node,
                "instance": inst.name,
                "address": inst.address,
                "state": "running" if pid else "stopped",
                "pid": pid,
                "cql": "answering" if pid and native_probe(inst) else "not answering",
                "native_port": inst.native_port,
                "storage_port": inst.storage_port,
                "jmx_port": inst.jmx_port,
                "sees_up": [
                    p.address for p in spec.instances() if p.node != inst.node and sees_up(inst, p)
                ]
                if pid
                else [],
                "data_dir": str(inst.data_dir),
                "log_dir": str(inst.log_dir),
            }
        )
    return {
        "cluster": spec.name,
        "contact_points": list(spec.addresses),
        "native_port": spec.native_port,
        "auth": spec.auth,
        "admin_credentials": str(spec.admin_file) if spec.credentials() else None,
        "tls_ca": str(spec.tls_ca) if spec.tls_ca else None,
        "client_auth": spec.client_auth,
        "heap": spec.heap,
        "nodes": nodes,
    }


def cmd_cluster_status(args: argparse.Namespace) -> int:
    spec = resolve_cluster(args)
    info = cluster_status(spec, args.node)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(
            f"cluster {spec.name}: {','.join(spec.addresses)}:{spec.native_port}, heap "
            f"{spec.heap}, auth {'on' if spec.auth else 'off'}, client TLS "
            f"{'on' if spec.client_tls else 'off'}"
            f"{' (client certificates required)' if spec.client_auth else ''}"
        )
        for n in info["nodes"]:
            print(
                f"  {n['instance']:<14} {n['address']:<10} {n['state']:<8} pid "
                f"{n['pid'] or '-':<8} cql {n['cql']:<14} jmx {n['jmx_port']}  sees up: "
                f"{','.join(n['sees_up']) or '-'}"
            )
    ok = all(n["state"] == "running" and n["cql"] == "answering" for n in info["nodes"])
    return 0 if ok else 3


def cmd_nodetool(args: argparse.Namespace) -> int:
    """nodetool against one local node over its JMX port (e.g. pausehandoff, repair, status)."""
    if args.cluster:
        spec = resolve_cluster(args)
        inst = spec.instances(args.node or 1)[0]
    else:
        inst = resolve_instance(args)
    jars = ensure_jars()
    tools_logback = inst.conf_dir / "logback-tools.xml"
    inst.conf_dir.mkdir(parents=True, exist_ok=True)
    tools_logback.write_text(TOOLS_LOGBACK_XML)
    java = shutil.which("java") or "java"
    cmd = [
        java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
        f"-Dlogback.configurationFile=file://{tools_logback}",
        f"-Duser.home={inst.home}",
        *JPMS_FLAGS,
        "-cp", ":".join(str(j) for j in jars),
        "org.apache.cassandra.tools.NodeTool",
        "-h", LISTEN_ADDRESS, "-p", str(inst.jmx_port),
        *args.arguments,
    ]  # fmt: skip
    return subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode


# --------------------------------------------------------------------------------------------
# CQL


def quiet_driver_logs() -> None:
    # Without handlers, the driver's connection WARNINGs would go to stderr while we poll.
    logging.getLogger("cassandra").setLevel(logging.CRITICAL)


def make_cluster(
    hosts: list[str],
    port: int,
    protocol_version: int | None = None,
    credentials: tuple[str, str] | None = None,
    tls_ca: Path | None = None,
    tls_client: Path | None = None,
):
    """A driver Cluster; credentials default to CASSANDRA_USERNAME/CASSANDRA_PASSWORD, and with
    ``tls_ca`` the connection is TLS, checked against that CA and the node's address (showing
    the certificate in ``tls_client``, key and chain, when the nodes require one)."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=os.environ.get("CASSANDRA_LOCAL_DC") or None)
        ),
        request_timeout=60,
    )
    kwargs = {}
    if protocol_version:
        kwargs["protocol_version"] = protocol_version
    user = os.environ.get("CASSANDRA_USERNAME")
    if credentials:
        kwargs["auth_provider"] = PlainTextAuthProvider(*credentials)
    elif user:
        kwargs["auth_provider"] = PlainTextAuthProvider(user, os.environ.get("CASSANDRA_PASSWORD"))
    if tls_ca:
        kwargs["ssl_context"] = tls_context(tls_ca, tls_client)
    return Cluster(
        contact_points=hosts,
        port=port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=5,
        **kwargs,
    )


def tls_context(ca_file: Path, client_pem: Path | None = None) -> ssl.SSLContext:
    """Verify the node's certificate against the CA and its address (check_hostname); show
    ``client_pem`` (key and chain) to nodes that require a client certificate."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = True
    if client_pem:
        context.load_cert_chain(str(client_pem))
    return context


def cql_answers(host: str, port: int) -> str | None:
    """release_version if the node answers CQL, else None."""
    if not port_accepts(host, port):
        return None
    quiet_driver_logs()
    cluster = make_cluster([host], port)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=10).one()
        return row.release_version if row else None
    except Exception:
        return None
    finally:
        cluster.shutdown()


def split_statements(text: str) -> list[str]:
    """Split CQL on ';' outside quotes, $$ strings and comments (comments are dropped)."""
    statements: list[str] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        two = text[i : i + 2]
        if c in ("'", '"'):
            j = i + 1
            while j < n:
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:  # doubled quote escapes itself
                        j += 2
                        continue
                    break
                j += 1
            buf.append(text[i : j + 1])
            i = j + 1
        elif two == "$$":
            j = text.find("$$", i + 2)
            j = n if j < 0 else j + 2
            buf.append(text[i:j])
            i = j
        elif two in ("--", "//"):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif two == "/*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == ";":
            statements.append("".join(buf))
            buf = []
            i += 1
        else:
            buf.append(c)
            i += 1
    statements.append("".join(buf))
    return [s.strip() for s in statements if s.strip()]


def format_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    return repr(value) if isinstance(value, bytes) else str(value)


def print_table(columns: list[str], rows: list[tuple]) -> None:
    cells = [[format_value(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    print("-+-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    print(f"\n({len(rows)} row{'s' if len(rows) != 1 else ''})")


# --------------------------------------------------------------------------------------------
# Config files


def cassandra_yaml(inst: Instance) -> str:
    spec = inst.cluster
    cluster_name = spec.name if spec else inst.name
    seeds = (
        ",".join(f"{address}:{inst.storage_port}" for address in spec.addresses)
        if spec
        else f"{inst.address}:{inst.storage_port}"
    )
    token = spec.initial_token(inst.node) if spec else 0
    if spec and spec.auth:
        security = (
            "authenticator: PasswordAuthenticator\n"
            "authorizer: CassandraAuthorizer\n"
            "role_manager: CassandraRoleManager\n"
        )
    else:
        security = "authenticator: AllowAllAuthenticator\nauthorizer: AllowAllAuthorizer\n"
    if spec and spec.client_tls:
        # TLS only on the native port (clients); a PEM file with the node's key and chain.
        security += (
            "client_encryption_options:\n"
            "  enabled: true\n"
            "  optional: false\n"
            f"  require_client_auth: {'true' if spec.client_auth else 'false'}\n"
            f"  keystore: {Path(spec.client_tls) / (inst.address + '.pem')}\n"
            + (f"  truststore: {spec.tls_ca}\n" if spec.client_auth else "")
            + "  ssl_context_factory:\n"
            "    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory\n"
        )
    return f"""# Written by scripts/cassandra_node.py (instance '{inst.name}'); rewritten by `up`.
cluster_name: counters-{cluster_name}
num_tokens: 1
initial_token: {token}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seeds}"
listen_address: {inst.address}
rpc_address: {inst.address}
storage_port: {inst.storage_port}
native_transport_port: {inst.native_port}
commitlog_sync: periodic
commitlog_sync_period: 10000ms
auto_snapshot: false
# memtables at Cassandra's default sizes (a quarter of the heap on and off it), cells off the
# heap: 64 MiB memtables made a 1M-row compaction flush and compact all through the run
memtable_allocation_type: offheap_objects
key_cache_size: 8MiB
counter_cache_size: 0MiB
concurrent_reads: 8
concurrent_writes: 8
concurrent_counter_writes: 2
paxos_variant: v2
{security}"""


LOGBACK_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by scripts/cassandra_node.py. -->
<configuration scan="false">
  <appender name="SYSTEMLOG" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>${cassandra.logdir}/system.log</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>${cassandra.logdir}/system.log.%i</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>3</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>50MB</maxFileSize>
    </triggeringPolicy>
    <encoder>
      <pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter">
      <level>WARN</level>
    </filter>
    <encoder>
      <pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="SYSTEMLOG" />
    <appender-ref ref="STDOUT" />
  </root>
  <logger name="org.apache.cassandra" level="INFO" />
</configuration>
"""


TOOLS_LOGBACK_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by scripts/cassandra_node.py: nodetool logs warnings to stderr only. -->
<configuration scan="false">
  <appender name="STDERR" class="ch.qos.logback.core.ConsoleAppender">
    <target>System.err</target>
    <encoder><pattern>%-5level %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDERR" /></root>
</configuration>
"""


def unsafe_system(inst: Instance) -> bool:
    """Whether the node skips flushing its system tables (``UNSAFE_SYSTEM_INSTANCES``)."""
    return inst.cluster is None and inst.name in UNSAFE_SYSTEM_INSTANCES


def java_command(inst: Instance, jars: list[Path]) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise NodeError("java is not on PATH (Cassandra 5.0 needs Java 11 or 17)")
    classpath = ":".join([str(inst.conf_dir), *(str(j) for j in jars)])
    cmd = [
        java,
        f"-Xms{inst.heap}",
        f"-Xmx{inst.heap}",
        "-Xss256k",
        "-XX:+PerfDisableSharedMem",
        "-XX:+ExitOnOutOfMemoryError",
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config=file://{inst.conf_dir / 'cassandra.yaml'}",
        f"-Dcassandra.storagedir={inst.data_dir}",
        f"-Dcassandra.logdir={inst.log_dir}",
        f"-Dlogback.configurationFile=file://{inst.conf_dir / 'logback.xml'}",
        f"-Dcassandra.jmx.local.port={inst.jmx_port}",
        f"-Dcassandra.triggers_dir={inst.triggers_dir}",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        *(["-Dcassandra.unsafesystem=true"] if unsafe_system(inst) else []),
        f"-Duser.home={inst.home}",
        "-Djava.net.preferIPv4Stack=true",
        *(cluster_flags(inst.cluster) if inst.cluster else []),
        *JPMS_FLAGS,
        "-cp",
        classpath,
        "org.apache.cassandra.service.CassandraDaemon",
    ]
    # As root the JVM mlockall()s the whole heap (RSS ~1.5 GB for a 1 GB heap). Dropping
    # CAP_IPC_LOCK makes that fail harmlessly ("Unable to lock JVM memory") and halves RSS.
    setpriv = shutil.which("setpriv")
    if setpriv:
        drop = [setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
        probe = subprocess.run([*drop, "true"], capture_output=True)
        if probe.returncode == 0:
            cmd = [*drop, *cmd]
    return cmd


def heap_bytes(heap: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    heap = heap.strip().lower()
    try:
        if heap[-1] in units:
            return int(heap[:-1]) * units[heap[-1]]
        return int(heap)
    except (ValueError, IndexError) as exc:
        raise NodeError(f"bad heap size {heap!r} (use e.g. 512M or 1G)") from exc


# --------------------------------------------------------------------------------------------
# Commands


def external_cluster() -> str | None:
    return os.environ.get("CASSANDRA_HOSTS") or None


def cmd_up(args: argparse.Namespace) -> int:
    if args.cluster:
        return cmd_cluster_up(args)
    if external_cluster():
        say(f"CASSANDRA_HOSTS={external_cluster()} is set: using that cluster, not starting one")
        return 0
    inst = resolve_instance(args)
    timeout = args.timeout or float(
        os.environ.get("CASSANDRA_START_TIMEOUT") or DEFAULT_START_TIMEOUT
    )
    if heap_bytes(inst.heap) > (1 << 30) and not args.allow_big_heap:
        raise NodeError(f"heap {inst.heap} is over 1 GiB; pass --allow-big-heap if you mean it")
    jars = ensure_jars()
    inst.home.mkdir(parents=True, exist_ok=True)
    with file_lock(inst.home / ".lock"):
        pid = running_pid(inst)
        if pid is not None:
            state = read_state(inst.state_file) or {}
            port = state.get("native_port", inst.native_port)
            version = cql_answers(LISTEN_ADDRESS, port)
            if version:
                say(
                    f"instance '{inst.name}' is already running (pid {pid}, "
                    f"{LISTEN_ADDRESS}:{port}, Cassandra {version}); nothing to do"
                )
                return 0
            say(f"instance '{inst.name}' has pid {pid} but CQL does not answer yet; waiting")
            inst.native_port = port
            return wait_ready(inst, pid, None, timeout, time.monotonic())
        if inst.pid_file.exists():
            say(f"removing stale pid file {inst.pid_file} (pid {read_pid(inst)} is not running)")
            inst.pid_file.unlink()

        check_ports_free(inst)
        started = time.monotonic()
        proc = launch(inst, jars)
        say(
            f"starting Cassandra {CASSANDRA_VERSION} instance '{inst.name}' (pid {proc.pid}, "
            f"native {inst.native_port}, storage {inst.storage_port}, jmx {inst.jmx_port}, "
            f"heap {inst.heap}); waiting up to {timeout:.0f} s for CQL"
        )
        return wait_ready(inst, proc.pid, proc, timeout, started)


def check_ports_free(inst: Instance) -> None:
    for label, port in (
        ("native_transport_port", inst.native_port),
        ("storage_port", inst.storage_port),
        ("JMX port", inst.jmx_port),
    ):
        # JMX listens on the loopback address whatever the node's address
        host = LISTEN_ADDRESS if label == "JMX port" else inst.address
        if port_in_use(port, host):
            raise NodeError(
                f"{label} {port} on {host} is already in use (another Cassandra, "
                f"another instance, or some other program?). See who holds it with "
                f"`ss -ltnp 'sport = :{port}'`, or pick other ports with --port/--storage-port/"
                f"--jmx-port (env CASSANDRA_PORT/CASSANDRA_STORAGE_PORT/CASSANDRA_JMX_PORT)."
            )


def launch(inst: Instance, jars: list[Path]) -> subprocess.Popen:
    """Write the node's config and start its JVM (no waiting); record pid and state."""
    for d in (inst.conf_dir, inst.data_dir, inst.log_dir, inst.triggers_dir):
        d.mkdir(parents=True, exist_ok=True)
    (inst.conf_dir / "cassandra.yaml").write_text(cassandra_yaml(inst))
    (inst.conf_dir / "logback.xml").write_text(LOGBACK_XML)
    cmd = java_command(inst, jars)
    try:  # where this start's log lines begin (the gossip check reads only those)
        log_offset = inst.system_log.stat().st_size
    except OSError:
        log_offset = 0
    with open(inst.stdout_log, "ab") as out:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        out.write(f"\n=== {stamp} starting instance {inst.name}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=inst.home,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Own session and process group: a Ctrl-C in the calling shell does not reach it.
            start_new_session=True,
            close_fds=True,
        )
    inst.pid_file.write_text(f"{proc.pid}\n")
    state = {
        "instance": inst.name,
        "pid": proc.pid,
        "address": inst.address,
        "native_port": inst.native_port,
        "storage_port": inst.storage_port,
        "jmx_port": inst.jmx_port,
        "heap": inst.heap,
        "version": CASSANDRA_VERSION,
        "started_at": time.time(),
        "log_offset": log_offset,
    }
    if inst.cluster:
        state.update(cluster=inst.cluster.name, node=inst.node)
    inst.state_file.write_text(json.dumps(state, indent=2) + "\n")
    return proc


def gives_up(now: float, started: float, timeout: float, progress_at: float) -> bool:
    """Whether a node that does not answer yet is given up: past ``timeout`` when its log has
    been silent for ``STALL_S`` (since ``progress_at``), and past ``START_TIMEOUT_FACTOR``
    timeouts in any case. Pure."""
    if now - started > timeout * START_TIMEOUT_FACTOR:
        return True
    return now - started > timeout and now - progress_at > STALL_S


def log_size(inst: Instance) -> int:
    """How much the node has logged (its log files' sizes): grows while it starts."""
    size = 0
    for path in (inst.system_log, inst.stdout_log):
        with contextlib.suppress(OSError):
            size += path.stat().st_size
    return size


def wait_ready(
    inst: Instance, pid: int, proc: subprocess.Popen | None, timeout: float, started: float
) -> int:
    """Until the node answers CQL: ``timeout`` seconds from ``started``, and after that as long
    as its log grows (``gives_up``)."""
    logged, progress_at = log_size(inst), time.monotonic()
    while not gives_up(time.monotonic(), started, timeout, progress_at):
        exited = proc.poll() is not None if proc is not None else not pid_alive(pid)
        if exited:
            inst.pid_file.unlink(missing_ok=True)
            code = f" with exit code {proc.returncode}" if proc is not None else ""
            raise NodeError(
                f"Cassandra instance '{inst.name}' (pid {pid}) exited{code} during startup.\n"
                f"{tail_logs(inst)}"
            )
        version = node_answers(inst)
        if version:
            say(
                f"instance '{inst.name}' is up: Cassandra {version} at {inst.address}:"
                f"{inst.native_port}, pid {pid}, ready after {time.monotonic() - started:.1f} s "
                f"(logs: {inst.log_dir.relative_to(PROJECT)})"
            )
            return 0
        time.sleep(0.5)
        if (size := log_size(inst)) != logged:
            logged, progress_at = size, time.monotonic()
    logs = tail_logs(inst)
    kill_pid(pid, proc, grace=10.0)
    inst.pid_file.unlink(missing_ok=True)
    waited, silent = time.monotonic() - started, time.monotonic() - progress_at
    raise NodeError(
        f"Cassandra instance '{inst.name}' did not answer CQL on {inst.address}:"
        f"{inst.native_port} after {waited:.0f} s (its log silent for the last {silent:.0f} s; "
        f"start timeout {timeout:.0f} s); killed pid {pid}.\n{logs}\n"
        f"(raise the limit with --timeout or CASSANDRA_START_TIMEOUT)"
    )


def kill_pid(pid: int, proc: subprocess.Popen | None, grace: float) -> bool:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL. True if it stopped gracefully."""

    def gone() -> bool:
        return proc.poll() is not None if proc is not None else not pid_alive(pid)

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if gone():
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not gone():
        time.sleep(0.1)
    return False


def cmd_down(args: argparse.Namespace) -> int:
    if args.cluster:
        return cmd_cluster_down(args)
    if external_cluster():
        say(f"CASSANDRA_HOSTS={external_cluster()} is set: using that cluster, nothing to stop")
        return 0
    inst = resolve_instance(args)
    timeout = args.timeout or DEFAULT_STOP_TIMEOUT
    if not inst.home.exists():
        say(f"instance '{inst.name}' is not running (never started)")
        return 0
    with file_lock(inst.home / ".lock"):
        pid = read_pid(inst)
        if pid is None:
            say(f"instance '{inst.name}' is not running (no pid file)")
            return 0
        if not (pid_alive(pid) and is_instance_process(pid, inst)):
            say(f"instance '{inst.name}' is not running (stale pid {pid}); removing the pid file")
            inst.pid_file.unlink(missing_ok=True)
            return 0
        say(f"stopping instance '{inst.name}' (SIGTERM to pid {pid}, up to {timeout:.0f} s)")
        started = time.monotonic()
        graceful = kill_pid(pid, None, grace=timeout)
        inst.pid_file.unlink(missing_ok=True)
        if pid_alive(pid):
            raise NodeError(f"pid {pid} is still alive after SIGKILL")
        how = "stopped" if graceful else f"did not stop within {timeout:.0f} s; killed (SIGKILL)"
        say(f"instance '{inst.name}' {how} after {time.monotonic() - started:.1f} s")
        return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.cluster:
        return cmd_cluster_status(args)
    inst = resolve_instance(args)
    pid = running_pid(inst)
    version = cql_answers(LISTEN_ADDRESS, inst.native_port) if pid else None
    info = {
        "instance": inst.name,
        "state": "running" if pid else "stopped",
        "pid": pid,
        "cql": "answering" if version else "not answering",
        "release_version": version,
        "native_port": inst.native_port,
        "storage_port": inst.storage_port,
        "jmx_port": inst.jmx_port,
        "data_dir": str(inst.data_dir),
        "log_dir": str(inst.log_dir),
        "external_cluster": external_cluster(),
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            if key == "external_cluster" and not value:
                continue
            print(f"{key + ':':<17} {'-' if value is None else value}")
    return 0 if pid else 3


def cmd_cql(args: argparse.Namespace) -> int:
    if args.file:
        source = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    elif args.statement:
        source = args.statement
    else:
        raise NodeError('give a statement (cql "SELECT ...") or a file (cql -f file.cql)')
    statements = split_statements(source)
    if not statements:
        raise NodeError("no CQL statement found")
    credentials, tls_ca, tls_client = None, None, None
    if args.cluster:
        spec = resolve_cluster(args)
        hosts, port, protocol = list(spec.addresses), spec.native_port, 5
        credentials, tls_ca, tls_client = spec.credentials(), spec.tls_ca, spec.tls_client
    elif external_cluster():
        hosts = [h.strip() for h in external_cluster().split(",") if h.strip()]
        port = env_int("CASSANDRA_PORT") or 9042
        protocol = None
        ca = os.environ.get("CASSANDRA_TLS_CA_FILE")
        tls_ca = Path(ca) if ca else None
    else:
        inst = resolve_instance(args)
        hosts, port, protocol = [LISTEN_ADDRESS], inst.native_port, 5
    quiet_driver_logs()
    cluster = make_cluster(hosts, port, protocol, credentials, tls_ca, tls_client)
    try:
        try:
            session = cluster.connect(args.keyspace) if args.keyspace else cluster.connect()
        except Exception as exc:
            raise NodeError(
                f"cannot connect to {','.join(hosts)}:{port}: {exc}\n"
                f"(is it up? `python scripts/cassandra_node.py status --instance {args.instance}`)"
            ) from exc
        for i, statement in enumerate(statements):
            if len(statements) > 1:
                print(f"{'' if i == 0 else chr(10)}cql> {statement}")
            try:
                result = session.execute(statement, timeout=args.request_timeout)
            except Exception as exc:
                raise NodeError(f"{type(exc).__name__}: {exc}") from exc
            columns = result.column_names
            if columns:
                print_table(list(columns), [tuple(row) for row in result])
            else:
                print("OK")
    finally:
        cluster.shutdown()
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    jars = ensure_jars()
    say(f"{len(jars)} jars ready in {LIB_DIR.relative_to(PROJECT)}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="cassandra_node.py",
        description=f"Local Cassandra {CASSANDRA_VERSION} (one node, or a cluster of nodes on "
        "127.0.0.1..N) from Maven Central jars.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def instance_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--instance",
            default=os.environ.get("CASSANDRA_INSTANCE") or "dev",
            help="instance name (default: $CASSANDRA_INSTANCE or dev); state in var/cassandra/NAME",
        )

    def cluster_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--cluster",
            metavar="NAME",
            help="a local cluster instead of a single instance: nodes NAME-1..NAME-N on "
            "127.0.0.1..127.0.0.N (state in var/cassandra/NAME and NAME-<n>)",
        )
        p.add_argument("--node", type=int, help="with --cluster: only this node (1..N)")

    up = sub.add_parser("up", help="start the node (no-op if it already runs) and wait for CQL")
    instance_arg(up)
    cluster_args(up)
    up.add_argument(
        "--port",
        type=int,
        help="native (CQL) port (env CASSANDRA_PORT; a cluster's: CASSANDRA_CLUSTER_PORT, "
        f"{DEFAULT_CLUSTER_PORTS[0]})",
    )
    up.add_argument(
        "--storage-port",
        type=int,
        help="storage port (env CASSANDRA_STORAGE_PORT; CASSANDRA_CLUSTER_STORAGE_PORT, "
        f"{DEFAULT_CLUSTER_PORTS[1]})",
    )
    up.add_argument(
        "--jmx-port",
        type=int,
        help="JMX port (env CASSANDRA_JMX_PORT); a cluster's first node's, the next get +1, +2 "
        f"(CASSANDRA_CLUSTER_JMX_PORT, {DEFAULT_CLUSTER_PORTS[2]})",
    )
    up.add_argument(
        "--heap",
        help=f"JVM heap, e.g. 512M (env CASSANDRA_HEAP, {DEFAULT_HEAP}; a cluster's nodes: "
        f"CASSANDRA_CLUSTER_HEAP, {DEFAULT_CLUSTER_HEAP})",
    )
    up.add_argument("--allow-big-heap", action="store_true", help="allow a heap over 1 GiB")
    up.add_argument(
        "--timeout",
        type=float,
        help=f"seconds to wait for CQL, longer while the node's log still grows (env "
        f"CASSANDRA_START_TIMEOUT; {DEFAULT_START_TIMEOUT:.0f})",
    )
    up.add_argument(
        "--nodes", type=int, help=f"with --cluster: number of nodes ({DEFAULT_CLUSTER_NODES})"
    )
    up.add_argument(
        "--auth",
        action="store_true",
        help="with --cluster: PasswordAuthenticator + CassandraAuthorizer; creates the superuser "
        f"'{ADMIN_ROLE}' (password in var/cassandra/NAME/admin.json) and disables 'cassandra'",
    )
    up.add_argument(
        "--client-tls",
        metavar="DIR",
        help="with --cluster: TLS required on the native port; DIR holds ca.pem and, per node, "
        "<address>.pem (its private key and certificate chain, PEM)",
    )
    up.add_argument(
        "--client-auth",
        action="store_true",
        help="with --client-tls: the nodes require a client certificate signed by DIR/ca.pem "
        "(mutual TLS); the launcher shows DIR/client.pem (its key and certificate chain)",
    )
    up.add_argument(
        "--fresh",
        action="store_true",
        help="with --cluster: wipe the cluster's data and state first (refused while it runs)",
    )
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="SIGTERM the recorded pid, wait (SIGKILL after --timeout)")
    instance_arg(down)
    cluster_args(down)
    down.add_argument("--timeout", type=float, help=f"seconds (default {DEFAULT_STOP_TIMEOUT:.0f})")
    down.add_argument(
        "--kill", action="store_true", help="with --cluster: SIGKILL at once (a crash)"
    )
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="running/stopped, pid, ports, data dir (3 if stopped)")
    instance_arg(status)
    cluster_args(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    cql = sub.add_parser("cql", help="run CQL and print rows as a table")
    instance_arg(cql)
    cql.add_argument(
        "--cluster",
        metavar="NAME",
        help="a local cluster (as its admin superuser, over TLS if it has it)",
    )
    cql.add_argument("statement", nargs="?", help="CQL statement(s), ';'-separated")
    cql.add_argument("-f", "--file", help="file of ';'-separated statements ('-' for stdin)")
    cql.add_argument("-k", "--keyspace", help="keyspace to USE")
    cql.add_argument("--request-timeout", type=float, default=60.0, help="seconds per statement")
    cql.set_defaults(func=cmd_cql)

    nodetool = sub.add_parser(
        "nodetool", help="run nodetool against a local node's JMX port (args after --)"
    )
    instance_arg(nodetool)
    cluster_args(nodetool)
    nodetool.add_argument("arguments", nargs=argparse.REMAINDER, help="e.g. -- status")
    nodetool.set_defaults(func=cmd_nodetool)

    fetch = sub.add_parser("fetch", help="only download the Cassandra jars into .cache/")
    fetch.set_defaults(func=cmd_fetch)
    args = parser.parse_args(argv)
    if getattr(args, "arguments", None) and args.arguments[0] == "--":
        args.arguments = args.arguments[1:]
    if getattr(args, "node", None) is not None and not args.cluster:
        parser.error("--node needs --cluster")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.func(args)
    except NodeError as exc:
        print(f"[cassandra] ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("[cassandra] interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
