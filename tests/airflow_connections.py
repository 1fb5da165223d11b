"""An Airflow connection as ``ConnectionSettings.from_airflow_connection`` reads it, for unit
tests of the settings taken from one (no Airflow metadata database needed)."""

from __future__ import annotations

from types import SimpleNamespace


def airflow_conn(extra: dict[str, object], **fields: object) -> SimpleNamespace:
    """The ``cassandra_default`` connection with ``extra`` as its Extra field; ``fields`` (host,
    port, login, password) replace the plain defaults."""
    return SimpleNamespace(
        **{
            "conn_id": "cassandra_default",
            "host": "10.0.0.1",
            "port": 9042,
            "login": None,
            "password": None,
            **fields,
        },
        extra_dejson=extra,
    )
