"""The driver's cluster as the engine builds it (no connection is opened)."""

import socket

import pytest
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    LoadBalancingPolicy,
    RoundRobinPolicy,
    TokenAwarePolicy,
    WhiteListRoundRobinPolicy,
)
from counters.connection import ConnectionConfigError, ConnectionSettings, build_cluster

from tests.airflow_connections import airflow_conn

pytestmark = pytest.mark.unit


def test_sockets_send_at_once() -> None:
    """Nagle's algorithm off: with it, a request larger than one TCP segment (a commit's batch,
    a batch of deletes) waited ~40 ms for the node's delayed ACK (docs/benchmarks.md)."""
    cluster = build_cluster(ConnectionSettings())
    try:
        assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in cluster.sockopts
    finally:
        cluster.shutdown()


def _response_frame(stream: int, body: bytes) -> bytes:
    """A native protocol v5 response frame (RESULT), as the node sends it inside segments."""
    return (
        bytes([0x85, 0])
        + stream.to_bytes(2, "big")
        + bytes([0x08])
        + len(body).to_bytes(4, "big")
        + body
    )


def _receive(data: bytes, cuts: list[int]) -> tuple[list[bytes], list[Exception]]:
    """Feed ``data`` to the engine's connection as socket reads ending at ``cuts``: the frames
    it decoded and the errors that would have killed it (no socket is opened)."""
    from cassandra.connection import _ConnectionIOBuffer, segment_codec_no_compression
    from counters.connection import QueueingConnection

    conn = QueueingConnection.__new__(QueueingConnection)
    frames: list[bytes] = []
    errors: list[Exception] = []
    conn._is_checksumming_enabled = True
    conn._io_buffer = _ConnectionIOBuffer(conn)
    conn._io_buffer.set_checksumming_buffer()
    conn._segment_codec = segment_codec_no_compression
    conn._current_frame = None
    conn.endpoint = "127.0.0.1:9042"
    conn.defunct = errors.append
    conn.process_msg = lambda _header, body: frames.append(body)
    last = 0
    for cut in [*cuts, len(data)]:
        conn._io_buffer.io_buffer.write(data[last:cut])
        last = cut
        conn.process_io_buffer()
    return frames, errors


def test_a_segment_header_split_across_reads_is_kept() -> None:
    """Protocol v5 wraps frames in checksummed segments; a socket read can end anywhere, also
    inside the 6 bytes of a segment header. The stock connection lost those bytes, read the next
    header out of step and died ("CRC mismatch on header"): a run failed so."""
    import io

    from cassandra.segment import SegmentCodec

    bodies = [bytes([i]) * (40 + i) for i in range(3)]
    wire = io.BytesIO()
    for stream, body in enumerate(bodies):
        SegmentCodec().encode(wire, _response_frame(stream, body))
    data = wire.getvalue()
    for cut in range(1, len(data)):  # every place one read can end and the next begin
        frames, errors = _receive(data, [cut])
        assert errors == [], (cut, errors)
        assert frames == bodies, cut
    frames, errors = _receive(data, list(range(1, len(data))))  # a byte a read
    assert (frames, errors) == (bodies, [])


def settings_of(extra: dict[str, object]) -> ConnectionSettings:
    return ConnectionSettings.from_airflow_connection(airflow_conn(extra))


def test_the_protocol_is_negotiated_unless_pinned() -> None:
    """A pinned version the driver never lowers: Cassandra 3.11/4.x (v4), DSE, ScyllaDB could
    not be reached when v5 was always passed."""
    assert ConnectionSettings.from_env({}).protocol_version is None
    assert settings_of({}).protocol_version is None
    assert settings_of({"protocol_version": 0}).protocol_version is None  # the hook: falsy
    negotiated = build_cluster(ConnectionSettings.from_env({}))
    pinned = build_cluster(ConnectionSettings.from_env({"CASSANDRA_PROTOCOL_VERSION": "4"}))
    try:
        assert not negotiated._protocol_version_explicit
        assert pinned._protocol_version_explicit and pinned.protocol_version == 4
    finally:
        negotiated.shutdown()
        pinned.shutdown()
    assert settings_of({"protocol_version": "4"}).protocol_version == 4
    assert settings_of({"protocol_version": 66}).protocol_version == 66


@pytest.mark.parametrize("value", ["3", "7", "v4", "4.0", True])
def test_a_protocol_version_the_engine_cannot_use_is_refused_by_name(value: object) -> None:
    with pytest.raises(ConnectionConfigError, match=r"CASSANDRA_PROTOCOL_VERSION .*got"):
        ConnectionSettings.from_env({"CASSANDRA_PROTOCOL_VERSION": str(value)})
    with pytest.raises(
        ConnectionConfigError, match=r"'cassandra_default': extra\.protocol_version"
    ):
        settings_of({"protocol_version": value})


def test_cql_version_is_passed_to_the_driver() -> None:
    settings = settings_of({"cql_version": "3.4.5"})
    assert settings.cql_version == "3.4.5"
    cluster = build_cluster(settings)
    try:
        assert cluster.cql_version == "3.4.5"
    finally:
        cluster.shutdown()
    assert settings_of({}).cql_version is None
    with pytest.raises(ConnectionConfigError, match=r"extra\.cql_version .*'three'"):
        settings_of({"cql_version": "three"})


def policy_chain(settings: ConnectionSettings) -> list[LoadBalancingPolicy]:
    cluster = build_cluster(settings)
    try:
        policy = cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT].load_balancing_policy
    finally:
        cluster.shutdown()
    chain = [policy]
    while getattr(chain[-1], "_child_policy", None) is not None:
        chain.append(chain[-1]._child_policy)
    return chain


def test_load_balancing_policies_are_read_as_the_provider_hook_reads_them() -> None:
    top, dc_aware = policy_chain(
        settings_of(
            {
                "load_balancing_policy": "DCAwareRoundRobinPolicy",
                "load_balancing_policy_args": {"local_dc": "eu", "used_hosts_per_remote_dc": "2"},
            }
        )
    )
    assert isinstance(top, TokenAwarePolicy) and isinstance(dc_aware, DCAwareRoundRobinPolicy)
    assert (dc_aware.local_dc, dc_aware.used_hosts_per_remote_dc) == ("eu", 2)

    _, white = policy_chain(
        settings_of(
            {
                "load_balancing_policy": "WhiteListRoundRobinPolicy",
                "load_balancing_policy_args": {"hosts": ["127.0.0.1", "127.0.0.2"]},
            }
        )
    )
    assert isinstance(white, WhiteListRoundRobinPolicy)
    assert sorted(white._allowed_hosts) == ["127.0.0.1", "127.0.0.2"]

    child = {
        "load_balancing_policy": "TokenAwarePolicy",
        "load_balancing_policy_args": {
            "child_load_balancing_policy": "DCAwareRoundRobinPolicy",
            "child_load_balancing_policy_args": {"local_dc": "us"},
        },
    }
    settings = settings_of(child)
    assert settings.local_dc == "us"
    assert policy_chain(settings)[1].local_dc == "us"
    # the hook's TokenAwarePolicy without a child: round robin under it
    chain = policy_chain(settings_of({"load_balancing_policy": "TokenAwarePolicy"}))
    assert type(chain[1]) is RoundRobinPolicy
    chain = policy_chain(settings_of({"load_balancing_policy": "RoundRobinPolicy"}))
    assert type(chain[1]) is RoundRobinPolicy
    # no name: the engine's default, DC-aware (with the args' local_dc)
    chain = policy_chain(settings_of({"load_balancing_policy_args": {"local_dc": "ap"}}))
    assert isinstance(chain[1], DCAwareRoundRobinPolicy) and chain[1].local_dc == "ap"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"load_balancing_policy": "LatencyAwarePolicy"},
            r"extra\.load_balancing_policy must be one of .*got 'LatencyAwarePolicy'",
        ),
        (
            {
                "load_balancing_policy": "TokenAwarePolicy",
                "load_balancing_policy_args": {"child_load_balancing_policy": "Nope"},
            },
            r"extra\.load_balancing_policy_args\.child_load_balancing_policy must be one of "
            r".*got 'Nope'",
        ),
        (
            {"load_balancing_policy": "WhiteListRoundRobinPolicy"},
            r"extra\.load_balancing_policy_args\.hosts: WhiteListRoundRobinPolicy needs",
        ),
        (
            {
                "load_balancing_policy": "DCAwareRoundRobinPolicy",
                "load_balancing_policy_args": {"localdc": "eu"},
            },
            r"extra\.load_balancing_policy_args: unknown keys \['localdc'\]",
        ),
        (
            {
                "load_balancing_policy": "DCAwareRoundRobinPolicy",
                "load_balancing_policy_args": {"used_hosts_per_remote_dc": "many"},
            },
            r"extra\.load_balancing_policy_args\.used_hosts_per_remote_dc must be a whole number "
            r">= 0, got 'many'",
        ),
    ],
)
def test_a_load_balancing_setting_the_hook_would_ignore_is_refused_by_name(
    extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ConnectionConfigError, match=r"'cassandra_default': " + message):
        settings_of(extra)


def test_a_driver_outside_the_tested_range_is_refused_at_import() -> None:
    """QueueingConnection overrides the driver's private connection internals: a driver it was
    not checked against must fail every process at once, naming the version and the range,
    rather than a run under load. requirements.txt admits exactly the checked versions."""
    import subprocess
    import sys
    from pathlib import Path

    from cassandra.connection import Connection as DriverConnection
    from counters.connection import TESTED_DRIVER, DefaultConnection, untested_driver
    from packaging.requirements import Requirement

    for version in ("3.30.0", "3.30.1"):
        assert untested_driver(version, DefaultConnection) is None, version
    for version in ("3.29.3", "3.31.0", "4.0.0", "not-a-version"):
        why = untested_driver(version, DefaultConnection)
        assert why and version in why and TESTED_DRIVER in why, (version, why)
    assert "_process_segment_buffer" in str(untested_driver("3.30.1", type("Bare", (), {})))
    assert issubclass(DefaultConnection, DriverConnection)

    lines = (Path(__file__).resolve().parents[2] / "requirements.txt").read_text().splitlines()
    [driver] = [Requirement(x) for x in lines if x.startswith("cassandra-driver")]
    assert str(driver.specifier) == str(Requirement(f"x{TESTED_DRIVER}").specifier)

    # the import itself refuses: a driver reporting another version fails `import counters...`
    probe = (
        "import cassandra; cassandra.__version__ = '3.31.0'\n"
        "try:\n    import counters.connection\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert "cassandra-driver 3.31.0 is outside the tested range" in done.stdout, done
    assert "requirements.txt" in done.stdout
