"""Per-process resources of the tasks: one Cassandra connection, created on first use.

Nothing here runs at DAG parse time. Inside a task, the connection settings come from the Airflow
connection ``cassandra_default`` (``airflow_settings.yaml``); in tests, from the environment
variable ``AIRFLOW_CONN_CASSANDRA_DEFAULT``.
"""

from __future__ import annotations

import logging
import threading

from ..config import Family
from ..connection import Connection, ConnectionSettings
from ..store import Store

log = logging.getLogger(__name__)

CASSANDRA_CONN_ID = "cassandra_default"

_lock = threading.Lock()
_connection: Connection | None = None


def connection_settings(conn_id: str = CASSANDRA_CONN_ID) -> ConnectionSettings:
    from airflow.sdk import BaseHook

    return ConnectionSettings.from_airflow_connection(BaseHook.get_connection(conn_id))


def server_connection_settings(conn_id: str = CASSANDRA_CONN_ID) -> ConnectionSettings:
    """The settings in an Airflow server process (the API server, for the UI plugin): there
    the Task SDK does not read connections from the metadata DB, the core model does."""
    from airflow.models.connection import Connection as AirflowConnection

    return ConnectionSettings.from_airflow_connection(
        AirflowConnection.get_connection_from_secrets(conn_id)
    )


def connection(
    conn_id: str = CASSANDRA_CONN_ID, settings: ConnectionSettings | None = None
) -> Connection:
    """The process's connection (to ``settings``, by default the Airflow connection's);
    rebuilt if the settings changed."""
    global _connection
    settings = settings or connection_settings(conn_id)
    with _lock:
        if _connection is not None and _connection.settings != settings:
            log.info("Cassandra connection settings changed; reconnecting")
            _connection.close()
            _connection = None
        if _connection is None:
            _connection = Connection(settings)
            log.info("connected to Cassandra at %s:%s", ",".join(settings.hosts), settings.port)
        return _connection


def store_for(family: Family) -> Store:
    return Store(connection(), family)


def close() -> None:
    """Close the process's connection (tests; a worker process just exits)."""
    global _connection
    with _lock:
        if _connection is not None:
            _connection.close()
            _connection = None
