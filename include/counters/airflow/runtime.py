"""Per-process resources of the tasks: one Cassandra connection and one ``Store`` per family,
created on first use.

Nothing here runs at DAG parse time. Inside a task, the connection settings come from the Airflow
connection ``cassandra_default`` (``airflow_settings.yaml``); in tests, from the environment
variable ``AIRFLOW_CONN_CASSANDRA_DEFAULT``. A task process lives for one task, so what is
fetched once (the settings: one execution-API request) or read once (a family's table layout,
its prepared statements) cannot go stale within it.
"""

from __future__ import annotations

import logging
import os
import threading

from ..config import Family
from ..connection import Connection, ConnectionSettings
from ..store import Store

log = logging.getLogger(__name__)

CASSANDRA_CONN_ID = "cassandra_default"

_lock = threading.RLock()
_connection: Connection | None = None
_settings: dict[tuple[str, str | None], ConnectionSettings] = {}
"""Per connection id (and the value of its ``AIRFLOW_CONN_<ID>`` variable, which tests set),
the settings fetched from Airflow."""
_stores: dict[str, Store] = {}
"""Per family name, the process's ``Store`` (on the current connection)."""

DRIVER_LOGGER = "cassandra"


def connection_settings(conn_id: str = CASSANDRA_CONN_ID) -> ConnectionSettings:
    """The Airflow connection's settings, fetched once per process: each fetch is a request to
    the execution API (through the task's supervisor), and a run asked ~5 times."""
    key = (conn_id, os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}"))
    with _lock:
        settings = _settings.get(key)
    if settings is None:
        from airflow.sdk import BaseHook

        settings = ConnectionSettings.from_airflow_connection(BaseHook.get_connection(conn_id))
        with _lock:
            _settings[key] = settings
    return settings


def fetch_connection_settings(conn_id: str = CASSANDRA_CONN_ID) -> ConnectionSettings:
    """The Airflow connection's settings, fetched now (not the process's memo): a long-lived
    process (the triggerer) fetches them for each run, so a changed connection applies to the
    next run, as it does to the next task."""
    from airflow.sdk import BaseHook

    return ConnectionSettings.from_airflow_connection(BaseHook.get_connection(conn_id))


def use_connection_settings(settings: ConnectionSettings, conn_id: str = CASSANDRA_CONN_ID) -> None:
    """This process's settings of ``conn_id``, given by the process that fetched them (a warm
    pool process has no Airflow to ask); ``connection`` reconnects when they changed."""
    with _lock:
        _settings[(conn_id, os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}"))] = settings


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
            _stores.clear()
        if _connection is None:
            quiet_driver_logs()
            _connection = Connection(settings)
            log.info("connected to Cassandra at %s:%s", ",".join(settings.hosts), settings.port)
        return _connection


def quiet_driver_logs(logger: logging.Logger | None = None) -> None:
    """The driver's INFO lines (the data center it picked, hosts it added) at every connect are
    noise in each task's log (every line is copied by the supervisor and the executor): keep
    its warnings. A level set explicitly (logging config) is left as it is."""
    logger = logger or logging.getLogger(DRIVER_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def store_for(family: Family, *, reset: bool = True) -> Store:
    """The process's ``Store`` of the family: its layout is read and its statements prepared
    once per process, not per phase; a changed family (another YAML) or a new connection gets
    a new Store. What a Store keeps about a run (the request counts a phase reports, who started
    the changes) is reset here, so it does not leak into the next phase or run; ``reset=False``
    keeps it, for a call in the middle of a run: the metrics sent after a run's audit, while
    its summary still counts the run's requests (the warm pool, the one-task shape)."""
    conn = connection()
    with _lock:
        store = _stores.get(family.name)
        if store is None or store.conn is not conn or store.family != family:
            store = Store(conn, family)
            _stores[family.name] = store
        if reset:
            store.statements.requests.clear()
            store.audit.provenance = None
        return store


def start_try() -> None:
    """A try of a run starts in a process that outlives runs (the warm pool): each kept
    ``Store`` forgets the family checks an earlier try passed. They are skipped within one
    run by its run id, and a retry or a cleared task keeps its run id: without this, a retry
    in the process of its first try would not see a table changed in between (a TTL set on
    the compact table), where a worker's fresh process does."""
    with _lock:
        for store in _stores.values():
            store.owners.checked_run = None


def close() -> None:
    """Close the process's connection and forget its settings and stores (tests; a worker
    process just exits)."""
    global _connection
    with _lock:
        if _connection is not None:
            _connection.close()
            _connection = None
        _stores.clear()
        _settings.clear()
