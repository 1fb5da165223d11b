"""Many large requests at once from several threads, as a big run's cleanup sends them: the
node reads them more slowly than they are sent, the socket's send buffer fills, and the driver's
stock connection then fails every new request at once ("Connection ... is overloaded", on one
node ``NoHostAvailable``). A 3M-row run's cleanup failed so. The engine's connection queues them
instead (``counters.connection.QueueingConnection``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from cassandra.concurrent import execute_concurrent_with_args
from counters.connection import Connection, ConnectionSettings

pytestmark = pytest.mark.integration

THREADS = 4
REQUESTS = 300
BLOB = 100_000


@pytest.fixture
def own_connection() -> Iterator[Connection]:
    """A connection of its own: a full socket must not disturb the other tests' connection."""
    connection = Connection(ConnectionSettings.from_env())
    yield connection
    connection.close()


def test_a_full_socket_queues_requests_instead_of_failing_them(
    own_connection: Connection, engine_keyspace: str
) -> None:
    session = own_connection.session
    table = f"{engine_keyspace}.blobs"
    session.execute(f"CREATE TABLE IF NOT EXISTS {table} (k int PRIMARY KEY, b blob)")
    insert = session.prepare(f"INSERT INTO {table} (k, b) VALUES (?, ?)")
    blob = os.urandom(BLOB)
    errors: list[BaseException] = []

    def send(thread: int) -> None:
        rows = [(thread * REQUESTS + i, blob) for i in range(REQUESTS)]
        try:
            execute_concurrent_with_args(session, insert, rows, concurrency=64)
        except BaseException as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    count = session.execute(f"SELECT count(*) FROM {table}", timeout=60).one()[0]
    assert count == THREADS * REQUESTS
