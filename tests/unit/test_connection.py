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
