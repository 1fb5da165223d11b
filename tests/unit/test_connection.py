"""The driver's cluster as the engine builds it (no connection is opened)."""

import socket

import pytest
from counters.connection import ConnectionSettings, build_cluster

pytestmark = pytest.mark.unit


def test_sockets_send_at_once() -> None:
    """Nagle's algorithm off: with it, a request larger than one TCP segment (a commit's batch,
    a batch of deletes) waited ~40 ms for the node's delayed ACK (docs/benchmarks.md)."""
    cluster = build_cluster(ConnectionSettings())
    try:
        assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in cluster.sockopts
    finally:
        cluster.shutdown()
