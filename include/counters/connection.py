"""Connecting to Cassandra: from the environment (CLI, tests, benchmarks) or an Airflow connection.

The cluster is built once per process and shared; execution profiles carry the load balancing
policy (token aware, so a single-partition request goes straight to a replica).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import tuple_factory

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


@dataclass(frozen=True)
class ConnectionSettings:
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    local_dc: str | None = None
    protocol_version: int = 5
    request_timeout: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConnectionSettings:
        """``CASSANDRA_HOSTS`` (comma separated), ``CASSANDRA_PORT``, ``CASSANDRA_USERNAME``,
        ``CASSANDRA_PASSWORD``, ``CASSANDRA_LOCAL_DC``, ``CASSANDRA_PROTOCOL_VERSION``."""
        env = os.environ if env is None else env
        hosts = tuple(h.strip() for h in env.get("CASSANDRA_HOSTS", "127.0.0.1").split(",") if h)
        try:
            port = int(env.get("CASSANDRA_PORT", "9042"))
            protocol = int(env.get("CASSANDRA_PROTOCOL_VERSION", "5"))
        except ValueError as exc:
            raise ValueError(
                f"CASSANDRA_PORT/CASSANDRA_PROTOCOL_VERSION must be integers: {exc}"
            ) from None
        return cls(
            hosts=hosts or ("127.0.0.1",),
            port=port,
            username=env.get("CASSANDRA_USERNAME") or None,
            password=env.get("CASSANDRA_PASSWORD") or None,
            local_dc=env.get("CASSANDRA_LOCAL_DC") or None,
            protocol_version=protocol,
        )

    @classmethod
    def from_airflow_connection(cls, conn: Any) -> ConnectionSettings:
        """Build settings from an Airflow ``Connection`` (type cassandra)."""
        extra = conn.extra_dejson or {}
        lb_args = extra.get("load_balancing_policy_args") or {}
        local_dc = lb_args.get("local_dc") or (
            lb_args.get("child_load_balancing_policy_args") or {}
        ).get("local_dc")
        hosts = tuple(h.strip() for h in (conn.host or "127.0.0.1").split(",") if h.strip())
        return cls(
            hosts=hosts,
            port=int(conn.port or 9042),
            username=conn.login or None,
            password=conn.password or None,
            local_dc=local_dc,
            protocol_version=int(extra.get("protocol_version", 5)),
        )


def build_cluster(settings: ConnectionSettings) -> Cluster:
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc)),
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=settings.request_timeout,
    )
    auth = (
        PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
    )
    bulk = ExecutionProfile(
        load_balancing_policy=profile.load_balancing_policy,
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
    )


class Connection:
    """A cluster and two sessions: the usual one, and one whose writes get server timestamps.

    The touched-counter index is written with server-assigned timestamps, so a writer whose
    clock runs behind cannot have its mark shadowed by the compactor's conditional delete
    (see ``Store.forget_touched``).
    """

    def __init__(self, settings: ConnectionSettings):
        self.settings = settings
        self.cluster = build_cluster(settings)
        try:
            self.session: Session = self.cluster.connect()
        except Exception as exc:  # NoHostAvailable, OperationTimedOut, auth errors
            self.cluster.shutdown()
            raise CassandraUnavailable(
                f"cannot reach Cassandra at {','.join(settings.hosts)}:{settings.port}: {exc}"
            ) from exc
        self.session.default_fetch_size = 5000
        self._server_ts: Session | None = None
        self._lock = threading.Lock()

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
