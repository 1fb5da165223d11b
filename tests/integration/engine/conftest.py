"""Fixtures for engine tests: a real Cassandra connection and throw-away families."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from counters.client import CounterClient
from counters.config import Family
from counters.connection import CassandraUnavailable, Connection, ConnectionSettings
from counters.schema import ensure_schema
from counters.store import Store

from tests.sweeps import with_sweep_offset

pytestmark = pytest.mark.integration


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler in the engine runs."""


@pytest.fixture(scope="session")
def conn() -> Iterator[Connection]:
    settings = ConnectionSettings.from_env()
    try:
        connection = Connection(settings)
    except CassandraUnavailable as exc:
        pytest.fail(
            f"{exc}. Start the test node with `make test` or "
            "`python scripts/cassandra_node.py up --instance test` (CASSANDRA_HOSTS/CASSANDRA_PORT "
            "select another cluster)."
        )
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def engine_keyspace(conn: Connection) -> Iterator[str]:
    name = f"t_engine_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE KEYSPACE {name} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    yield name
    # one schema change for every table the engine tests made; slow on a busy 2-core machine
    conn.session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=300)


FamilyFactory = Callable[..., tuple[Family, Store, CounterClient]]


@pytest.fixture
def make_family(conn: Connection, engine_keyspace: str, t0: datetime) -> FamilyFactory:
    """Create a family with fresh tables in the test keyspace; its sweeps fall half an interval
    after ``t0``, then every interval (runs are at whole minutes)."""

    def factory(**overrides: object) -> tuple[Family, Store, CounterClient]:
        suffix = secrets.token_hex(3)
        fields: dict[str, object] = {
            "name": f"f_{suffix}",
            "keyspace": engine_keyspace,
            "raw_table": f"raw_{suffix}",
            "compact_table": f"compact_{suffix}",
            "lag": "1m",
            "shards": 2,
        }
        fields.update(overrides)
        family = Family.model_validate(with_sweep_offset(fields, t0))
        layout = ensure_schema(conn.session, family)
        store = Store(conn, family, layout, concurrency=8)
        return family, store, CounterClient(conn, family, store)

    return factory


@pytest.fixture
def t0() -> datetime:
    """A virtual clock start, a day back, on a minute boundary."""
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    return now - timedelta(days=1)
