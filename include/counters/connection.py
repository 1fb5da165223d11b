"""Connecting to Cassandra: from the environment (CLI, tests, benchmarks) or an Airflow connection.

The cluster is built once per process and shared; execution profiles carry the load balancing
policy (token aware, so a single-partition request goes straight to a replica).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    DefaultConnection,
    ExecutionProfile,
    Session,
)
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    LoadBalancingPolicy,
    TokenAwarePolicy,
)
from cassandra.query import PreparedStatement, tuple_factory

BULK_PROFILE = "bulk"
"""Execution profile for engine reads: rows as plain tuples (cheaper than named tuples)."""


EXPECTED_SERVER_WARNINGS = (
    "Aggregation query used on multiple partition keys",
    "exceeding specified threshold",
    "Unlogged batch covering",
)
"""Server warnings the engine's bulk statements cause by design (aggregates over ``IN``,
large multi-partition unlogged batches of one token range); logged once per message kind."""


class _ExpectedWarnings(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for expected in EXPECTED_SERVER_WARNINGS:
            if expected in message:
                if expected in self.seen:
                    return False
                self.seen.add(expected)
        return True


logging.getLogger("cassandra.protocol").addFilter(_ExpectedWarnings())

CONTROL_CONNECTION_TIMEOUT = 10.0
"""Seconds for the control connection's queries, the full schema read on connect among them
(the driver's 2 s default times out on a busy node holding a few hundred tables)."""


class CassandraUnavailable(RuntimeError):
    """No contact point answered."""


class ConnectionConfigError(ValueError):
    """A connection setting is wrong (names the variable or the Airflow connection field)."""


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _flag(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConnectionConfigError(f"{where} must be true or false, got {value!r}")


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and how to connect. ``password`` never shows in a repr (nor in logs that print
    the settings); TLS checks the nodes' certificates against ``tls_ca_file`` (the system's
    trusted CAs without one) and, by default, that a certificate names the address dialled."""

    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    local_dc: str | None = None
    protocol_version: int = 5
    request_timeout: float = 30.0
    tls: bool = False
    tls_ca_file: str | None = None
    tls_check_hostname: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConnectionSettings:
        """``CASSANDRA_HOSTS`` (comma separated), ``CASSANDRA_PORT``, ``CASSANDRA_USERNAME``,
        ``CASSANDRA_PASSWORD``, ``CASSANDRA_LOCAL_DC``, ``CASSANDRA_PROTOCOL_VERSION``; TLS with
        ``CASSANDRA_TLS=true`` or a ``CASSANDRA_TLS_CA_FILE`` (PEM), host names checked unless
        ``CASSANDRA_TLS_CHECK_HOSTNAME=false``."""
        env = os.environ if env is None else env
        hosts = tuple(h.strip() for h in env.get("CASSANDRA_HOSTS", "127.0.0.1").split(",") if h)
        try:
            port = int(env.get("CASSANDRA_PORT", "9042"))
            protocol = int(env.get("CASSANDRA_PROTOCOL_VERSION", "5"))
        except ValueError as exc:
            raise ConnectionConfigError(
                f"CASSANDRA_PORT/CASSANDRA_PROTOCOL_VERSION must be integers: {exc}"
            ) from None
        ca_file = env.get("CASSANDRA_TLS_CA_FILE") or None
        settings = cls(
            hosts=hosts or ("127.0.0.1",),
            port=port,
            username=env.get("CASSANDRA_USERNAME") or None,
            password=env.get("CASSANDRA_PASSWORD") or None,
            local_dc=env.get("CASSANDRA_LOCAL_DC") or None,
            protocol_version=protocol,
            tls=bool(ca_file) or _flag(env.get("CASSANDRA_TLS") or "false", "CASSANDRA_TLS"),
            tls_ca_file=ca_file,
            tls_check_hostname=_flag(
                env.get("CASSANDRA_TLS_CHECK_HOSTNAME") or "true", "CASSANDRA_TLS_CHECK_HOSTNAME"
            ),
        )
        settings.check_tls_files("CASSANDRA_TLS_CA_FILE")
        return settings

    @classmethod
    def from_airflow_connection(cls, conn: Any) -> ConnectionSettings:
        """Build settings from an Airflow ``Connection`` (type cassandra). TLS from the extra's
        ``ssl_options`` (the provider's CassandraHook reads the same): ``ca_certs`` (a PEM
        file) and ``check_hostname`` (default true)."""
        extra = conn.extra_dejson or {}
        lb_args = extra.get("load_balancing_policy_args") or {}
        local_dc = lb_args.get("local_dc") or (
            lb_args.get("child_load_balancing_policy_args") or {}
        ).get("local_dc")
        hosts = tuple(h.strip() for h in (conn.host or "127.0.0.1").split(",") if h.strip())
        where = f"Airflow connection {conn.conn_id!r}: extra.ssl_options"
        ssl_options = extra.get("ssl_options")
        if ssl_options is not None and not isinstance(ssl_options, dict):
            raise ConnectionConfigError(f"{where} must be a mapping, got {ssl_options!r}")
        ssl_options = ssl_options or {}
        unknown = set(ssl_options) - {"ca_certs", "check_hostname"}
        if unknown:
            raise ConnectionConfigError(
                f"{where}: unknown keys {sorted(unknown)} (supported: ca_certs, check_hostname)"
            )
        settings = cls(
            hosts=hosts,
            port=int(conn.port or 9042),
            username=conn.login or None,
            password=conn.password or None,
            local_dc=local_dc,
            protocol_version=int(extra.get("protocol_version", 5)),
            tls="ssl_options" in extra,
            tls_ca_file=ssl_options.get("ca_certs") or None,
            tls_check_hostname=_flag(
                ssl_options.get("check_hostname", True), f"{where}.check_hostname"
            ),
        )
        settings.check_tls_files(f"{where}.ca_certs")
        return settings

    def check_tls_files(self, where: str) -> None:
        if self.tls_ca_file and not os.path.isfile(self.tls_ca_file):
            raise ConnectionConfigError(f"{where}: no such file {self.tls_ca_file!r}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client side of TLS: the nodes' certificates must chain to the CA (and name the
        host dialled, unless the check is off)."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        context.check_hostname = self.tls_check_hostname
        return context

    def describe(self) -> str:
        """Where the connection goes, for messages (no password)."""
        who = f"{self.username}@" if self.username else ""
        return f"{who}{','.join(self.hosts)}:{self.port}{' (TLS)' if self.tls else ''}"


class QueueingConnection(DefaultConnection):
    """The driver's connection, minus two failures.

    While the socket's send buffer is full (the node reads more slowly than the engine sends),
    the stock connection fails every new request at once with ``ConnectionBusy`` (on one node,
    ``NoHostAvailable``), although it only has to wait. A 3M-row run's cleanup failed so, four
    threads each sending 64 batches of deletes. This one queues the request behind the others
    (the driver drains the queue whenever the socket can take more); what bounds the bytes in
    flight is the engine's own concurrency (``Store.concurrency`` requests per thread, a few
    threads per process).

    And under protocol v5 the stock connection drops the first bytes of a segment header when a
    socket read ends inside it (fewer bytes than a header: it neither decodes them nor keeps
    them), so the next header is read out of step and the connection dies with "CRC mismatch on
    header": every request on it fails. A 1M-row run of the steady bench failed so. This one
    keeps them for the next read."""

    @property
    def _socket_writable(self) -> bool:
        return True

    @_socket_writable.setter
    def _socket_writable(self, value: bool) -> None:
        del value  # the reactor's "buffer full" mark: requests queue instead of failing

    def _process_segment_buffer(self) -> None:
        buffer = self._io_buffer
        if buffer.readable_io_bytes() < self._segment_codec.header_length_with_crc:
            # part of a header: rewind, so that ``process_io_buffer``'s ``reset_io_buffer()``
            # (which keeps what lies after the position) keeps it for the next read
            buffer._segment_consumed = False
            buffer.io_buffer.seek(0)
            return
        super()._process_segment_buffer()


def build_cluster(
    settings: ConnectionSettings, load_balancing_policy: LoadBalancingPolicy | None = None
) -> Cluster:
    """The driver cluster; ``load_balancing_policy`` replaces the token-aware DC round robin
    (tests pin a run's coordinator with it)."""
    policy = load_balancing_policy or TokenAwarePolicy(
        DCAwareRoundRobinPolicy(local_dc=settings.local_dc)
    )
    profile = ExecutionProfile(
        load_balancing_policy=policy,
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=settings.request_timeout,
    )
    auth = (
        PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
    )
    bulk = ExecutionProfile(
        load_balancing_policy=policy,
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=settings.request_timeout,
        row_factory=tuple_factory,
    )
    return Cluster(
        contact_points=list(settings.hosts),
        port=settings.port,
        auth_provider=auth,
        protocol_version=settings.protocol_version,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile, BULK_PROFILE: bulk},
        reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
        connect_timeout=10,
        control_connection_timeout=CONTROL_CONNECTION_TIMEOUT,
        idle_heartbeat_interval=10,
        ssl_context=settings.ssl_context(),
        # The driver leaves Nagle's algorithm on: a request larger than one TCP segment (a
        # commit's batch, a keys record, a batch of deletes) then waits for the node's delayed
        # ACK, ~40 ms each (a 25 KB insert: 44 ms, 0.8 ms with this option; the probes of
        # `make bench ARGS="--only probes"`).
        sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        connection_class=QueueingConnection,
    )


def why_unreachable(exc: BaseException) -> str:
    """One reason per contact point (``NoHostAvailable`` holds them), without tracebacks."""
    errors = getattr(exc, "errors", None)
    if not isinstance(errors, dict) or not errors:
        return f"{type(exc).__name__}: {exc}"
    reasons = []
    for host, error in errors.items():
        if isinstance(error, ConnectionRefusedError):
            reasons.append(f"{host} refused the connection (down?)")
        else:
            reasons.append(f"{host}: {type(error).__name__}: {error}")
    return "; ".join(reasons)


class Connection:
    """A cluster and two sessions: the usual one, and one whose writes get server timestamps.

    The touched-counter index is written with server-assigned timestamps, so a writer whose
    clock runs behind cannot have its mark shadowed by the compactor's conditional delete
    (see ``Store.forget_touched``).
    """

    def __init__(
        self,
        settings: ConnectionSettings,
        load_balancing_policy: LoadBalancingPolicy | None = None,
    ):
        self.settings = settings
        self.cluster = build_cluster(settings, load_balancing_policy)
        try:
            self.session: Session = self.cluster.connect()
        except Exception as exc:  # NoHostAvailable, OperationTimedOut, auth errors
            self.cluster.shutdown()
            raise CassandraUnavailable(
                f"cannot reach Cassandra at {settings.describe()}: {why_unreachable(exc)}"
            ) from exc
        self.session.default_fetch_size = 5000
        self._server_ts: Session | None = None
        self._lock = threading.Lock()
        self._prepared: dict[tuple[str, Hashable], PreparedStatement] = {}

    def prepare(self, cql: str, variant: Hashable = None) -> tuple[PreparedStatement, bool]:
        """One prepared statement per CQL text (and ``variant``: the settings the caller gives
        it) for the connection's life, and whether it is new (the caller then sets it up).
        The driver finds a statement to re-prepare on a node that lost it (a restarted node,
        for a batch's statements) in a weak map by id holding the newest object prepared for
        that text: another object for the same text, once garbage collected, took the entry
        with it, and every later batch on that node failed."""
        with self._lock:
            statement = self._prepared.get((cql, variant))
            if statement is not None:
                return statement, False
            statement = self.session.prepare(cql)
            self._prepared[cql, variant] = statement
            return statement, True

    @property
    def server_timestamp_session(self) -> Session:
        with self._lock:
            if self._server_ts is None:
                session = self.cluster.connect()
                session.use_client_timestamp = False
                self._server_ts = session
            return self._server_ts

    def close(self) -> None:
        self.cluster.shutdown()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(settings: ConnectionSettings | None = None) -> Connection:
    return Connection(settings or ConnectionSettings.from_env())
