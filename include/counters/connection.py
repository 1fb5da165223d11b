"""Connecting to Cassandra: from the environment (CLI, tests, benchmarks) or an Airflow connection.

The cluster is built once per process and shared; execution profiles carry the load balancing
policy (token aware, so a single-partition request goes straight to a replica).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import cassandra
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
    RoundRobinPolicy,
    TokenAwarePolicy,
    WhiteListRoundRobinPolicy,
)
from cassandra.query import PreparedStatement, tuple_factory
from cassandra.timestamps import MonotonicTimestampGenerator

from .connection_settings import ConnectionConfigError as ConnectionConfigError
from .connection_settings import ConnectionSettings
from .core import ClockOffset, from_micros

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
log = logging.getLogger(__name__)

CONTROL_CONNECTION_TIMEOUT = 10.0
"""Seconds for the control connection's queries, the full schema read on connect among them
(the driver's 2 s default times out on a busy node holding a few hundred tables)."""


CLOCK_QUERY = "SELECT toUnixTimestamp(now()) FROM system.local"
"""The coordinator's time, in ms (``now()`` is read by every Cassandra since 2.2)."""
CLOCK_REUSE_S = 60.0
"""How long one measurement of the cluster's clock serves a process (the steps of one run)."""
CLOCK_STEP_US = 100_000
"""A host clock that moved this much against the monotonic clock since the measurement was
stepped (NTP, an operator): the offset is measured again."""


@dataclass(frozen=True)
class ClusterClock:
    """The cluster's time, from this host's clock corrected by a measured ``offset``, with the
    host's wall and monotonic clocks when it was measured (``fresh`` tells a stepped clock)."""

    offset: ClockOffset
    host_us: int
    monotonic_us: int

    def micros(self) -> int:
        """The cluster's time now, in µs since the Unix epoch (a write timestamp)."""
        return time.time_ns() // 1000 - self.offset.offset_us

    def now(self) -> datetime:
        """The cluster's time now, naive UTC."""
        return from_micros(self.micros())

    def fresh(self) -> bool:
        """Measured less than ``CLOCK_REUSE_S`` ago, and the host's clock not stepped since."""
        wall = time.time_ns() // 1000 - self.host_us
        steady = time.monotonic_ns() // 1000 - self.monotonic_us
        return steady < CLOCK_REUSE_S * 1e6 and abs(wall - steady) < CLOCK_STEP_US


def _elapsed_us() -> int:
    """A clock for time elapsed: no wall-clock step moves it, and it counts a suspended host's
    sleep (the monotonic clock stops then), where the platform has one."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic_ns() // 1000
    return time.clock_gettime_ns(boottime) // 1000


class ClusterTimestamps(MonotonicTimestampGenerator):
    """The driver's client-side write timestamps (every write without ``USING TIMESTAMP``) from
    the cluster's clock: the cluster's time its connection last measured
    (``Connection.cluster_clock``) plus the time elapsed since on a clock no wall-clock step
    moves (NTP, an operator) and that counts a suspended host's sleep (``CLOCK_BOOTTIME`` on
    Linux, else the monotonic clock); this host's clock before the first measurement.

    The driver's generator never goes back: one write stamped an hour ahead (the host's clock
    stepped, or it was ahead before the first measurement) would hold every later timestamp of
    the process an hour ahead, and each of its deletes (a release's, a lease's) would shadow
    the cells written after it for that hour. A measurement that finds the last timestamp ahead
    of the cluster's time by more than ``CLOCK_STEP_US`` starts again from the cluster's time."""

    last: int  # the driver's: the last timestamp given
    cluster_us: int | None = None
    elapsed_us = 0

    def measured(self, clock: ClusterClock) -> None:
        """Take the cluster's time from ``clock`` (just measured) from now on."""
        with self.lock:
            self.cluster_us, self.elapsed_us = clock.micros(), _elapsed_us()
            ahead = self.last - self._now()
            if ahead > CLOCK_STEP_US:
                log.warning(
                    "write timestamps were %.3f s ahead of the cluster's time (this host's "
                    "clock was ahead of it, or stepped back); they follow the cluster's again",
                    ahead / 1e6,
                )
                self.last = 0

    def _now(self) -> int:
        if self.cluster_us is None:
            return time.time_ns() // 1000
        return self.cluster_us + _elapsed_us() - self.elapsed_us

    def __call__(self) -> int:
        with self.lock:
            return int(self._next_timestamp(self._now(), self.last))


class CassandraUnavailable(RuntimeError):
    """No contact point answered."""


TESTED_DRIVER = ">=3.30.0,<3.31"
"""The cassandra-driver versions whose connection internals ``QueueingConnection`` overrides
were read and run: every test runs 3.30.1, and 3.30.0's ``connection.py`` and ``segment.py``
are the same byte for byte. requirements.txt's range is this one."""


class DriverVersionError(ImportError):
    """The installed cassandra-driver is outside ``TESTED_DRIVER``."""


def untested_driver(version: str, connection_class: type) -> str | None:
    """Pure: why ``QueueingConnection`` cannot trust this driver (its version is outside
    ``TESTED_DRIVER``, or the connection lacks a method it overrides), else None."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        tested = Version(version) in SpecifierSet(TESTED_DRIVER)
    except InvalidVersion:
        tested = False
    if not tested:
        return f"cassandra-driver {version} is outside the tested range {TESTED_DRIVER}"
    if not callable(getattr(connection_class, "_process_segment_buffer", None)):
        return f"cassandra-driver {version}'s connection has no _process_segment_buffer"
    return None


def _check_driver() -> None:
    """At import, so a driver upgrade fails every process at once (a DAG import error, a CLI
    error) instead of a run under load, where the overridden internals are used."""
    why = untested_driver(cassandra.__version__, DefaultConnection)
    if why:
        raise DriverVersionError(
            f"{why}: counters.connection.QueueingConnection overrides the driver's private "
            "connection internals (_socket_writable, _process_segment_buffer, its I/O buffer), "
            "checked for those versions only. Install cassandra-driver per requirements.txt "
            f"({TESTED_DRIVER}); a new driver needs QueueingConnection re-checked against it"
        )


_check_driver()


class QueueingConnection(DefaultConnection):
    """The driver's connection, minus two failures.

    While the socket's send buffer is full (the node reads more slowly than the engine sends),
    the stock connection fails every new request at once with ``ConnectionBusy`` (on one node,
    ``NoHostAvailable``), although it only has to wait. A 3M-row run's cleanup failed so, four
    threads each sending 64 batches of deletes. This one queues the request behind the others
    (the driver drains the queue whenever the socket can take more); what bounds the bytes in
    flight is the engine's own concurrency (``Statements.concurrency`` requests per thread, a few
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


def balancing_policy(settings: ConnectionSettings) -> LoadBalancingPolicy:
    """Token aware over the policy the settings name."""
    child: LoadBalancingPolicy
    if settings.balancing == "WhiteListRoundRobinPolicy":
        child = WhiteListRoundRobinPolicy(list(settings.allowed_hosts))
    elif settings.balancing == "RoundRobinPolicy":
        child = RoundRobinPolicy()
    else:
        child = DCAwareRoundRobinPolicy(
            local_dc=settings.local_dc, used_hosts_per_remote_dc=settings.used_hosts_per_remote_dc
        )
    return TokenAwarePolicy(child)


def build_cluster(
    settings: ConnectionSettings, load_balancing_policy: LoadBalancingPolicy | None = None
) -> Cluster:
    """The driver cluster; ``load_balancing_policy`` replaces the settings' (tests pin a run's
    coordinator with it). The protocol version is passed only when pinned: an explicit one
    the driver never lowers, so a cluster that does not speak it could not be reached."""
    policy = load_balancing_policy or balancing_policy(settings)
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
    pinned: dict[str, Any] = {}
    if settings.protocol_version is not None:
        pinned["protocol_version"] = settings.protocol_version
    if settings.cql_version is not None:
        pinned["cql_version"] = settings.cql_version
    return Cluster(
        contact_points=list(settings.hosts),
        port=settings.port,
        auth_provider=auth,
        **pinned,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile, BULK_PROFILE: bulk},
        reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
        connect_timeout=10,
        control_connection_timeout=CONTROL_CONNECTION_TIMEOUT,
        idle_heartbeat_interval=10,
        ssl_context=settings.ssl_context(),
        ssl_options=settings.ssl_socket_options() or None,
        # The driver leaves Nagle's algorithm on: a request larger than one TCP segment (a
        # commit's batch, a keys record, a batch of deletes) then waits for the node's delayed
        # ACK, ~40 ms each (a 25 KB insert: 44 ms, 0.8 ms with this option; the probes of
        # `make bench ARGS="--only probes"`).
        sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        connection_class=QueueingConnection,
        timestamp_generator=ClusterTimestamps(),
        # Without the full model the driver still builds the token map (token metadata stays
        # on); a keyspace's replicas are known once ``schema.keyspace_metadata`` has read it.
        schema_metadata_enabled=settings.schema_metadata,
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
    (see ``Store.index.forget_touched``).
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
        self._clock: ClusterClock | None = None

    def cluster_clock(self) -> ClusterClock:
        """The cluster's clock as this host sees it: one read of a coordinator's time
        (``CLOCK_QUERY``), reused for ``CLOCK_REUSE_S`` unless the host's clock was stepped.
        The offset is host - coordinator at the read's midpoint, within half its round trip."""
        with self._lock:
            clock = self._clock
        if clock is not None and clock.fresh():
            return clock
        before = time.time_ns() // 1000
        steady = time.monotonic_ns() // 1000
        # without a client timestamp: the driver's generator would take one from this host's
        # clock, before its offset is known, and hold every later one at or after it
        result = self.server_timestamp_session.execute(CLOCK_QUERY)
        after_steady = time.monotonic_ns() // 1000
        server_ms = result.one()[0]
        half = (after_steady - steady) // 2
        coordinator = getattr(result.response_future, "coordinator_host", None)
        offset = ClockOffset(
            before + half - (server_ms * 1000 + 500), half + 500, str(coordinator or "?")
        )
        clock = ClusterClock(offset, before + half, steady + half)
        with self._lock:
            self._clock = clock
        stamps = self.cluster.timestamp_generator
        if isinstance(stamps, ClusterTimestamps):
            stamps.measured(clock)
        return clock

    def prepare(
        self,
        cql: str,
        variant: Hashable = None,
        setup: Callable[[PreparedStatement], None] | None = None,
    ) -> PreparedStatement:
        """One prepared statement per CQL text (and ``variant``: the settings ``setup`` gives
        it) for the connection's life, set up before any thread gets it: a statement handed
        out before its setup ran at the execution profile's consistency, not the caller's
        (two threads asking for it at once, as a shard's buckets do on first use).
        The driver finds a statement to re-prepare on a node that lost it (a restarted node,
        for a batch's statements) in a weak map by id holding the newest object prepared for
        that text: another object for the same text, once garbage collected, took the entry
        with it, and every later batch on that node failed."""
        with self._lock:
            statement = self._prepared.get((cql, variant))
            if statement is None:
                statement = self.session.prepare(cql)
                if setup is not None:
                    setup(statement)
                self._prepared[cql, variant] = statement
            return statement

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
