"""Tables found the moment another client created them (``counterctl init`` from one process,
the run from another, seconds apart). The driver learns of new keyspaces and tables from schema
events, later and not at all when they are switched off, and drops a table refresh for a
keyspace it does not know yet: the browser test's seeding failed on that once
(``raw table ... does not exist`` for a table created a moment before)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, Session
from counters import schema
from counters.connection import CONTROL_CONNECTION_TIMEOUT, Connection, ConnectionSettings

pytestmark = pytest.mark.integration


@pytest.fixture
def unaware_session(cassandra_contact: tuple[list[str], int]) -> Iterator[Session]:
    """A session whose driver ignores schema events: it knows only what it asks for."""
    hosts, port = cassandra_contact
    settings = ConnectionSettings.from_env()
    auth = settings.username and PlainTextAuthProvider(settings.username, settings.password)
    pinned = {"protocol_version": settings.protocol_version} if settings.protocol_version else {}
    cluster = Cluster(
        contact_points=hosts,
        port=port,
        **pinned,
        auth_provider=auth or None,
        ssl_context=settings.ssl_context(),
        schema_event_refresh_window=-1,
        # The driver's defaults (5 s to connect, 2 s for the schema read on connect) time out
        # on a node busy with the suite's few hundred tables: CI failed on that once.
        connect_timeout=10,
        control_connection_timeout=CONTROL_CONNECTION_TIMEOUT,
    )
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def test_a_table_in_a_keyspace_created_by_another_client_is_found(
    conn: Connection, unaware_session: Session
) -> None:
    keyspace = f"t_meta_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    try:
        conn.session.execute(
            f"CREATE TABLE {keyspace}.raw (type text, modify_time timestamp, increment bigint, "
            "PRIMARY KEY ((type), modify_time))"
        )
        assert keyspace not in unaware_session.cluster.metadata.keyspaces  # the race, held open
        meta = schema._table_meta(unaware_session, keyspace, "raw")
        assert meta is not None and set(meta.columns) == {"type", "modify_time", "increment"}
        assert schema._table_meta(unaware_session, keyspace, "missing") is None
    finally:
        conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
