"""Fixtures for engine tests: a real Cassandra connection and throw-away families."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from counters.client import CounterClient
from counters.config import Family
from counters.connection import CassandraUnavailable, Connection, ConnectionSettings
from counters.schema import RawLayout
from counters.store import Store

from tests.family_pool import TEST_FAILED, TablePool, TableSet, release_families
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


@pytest.fixture(scope="session")
def table_pool(conn: Connection, engine_keyspace: str) -> Iterator[TablePool]:
    """The session's table sets for ``make_family`` (tests/family_pool.py)."""
    pool = TablePool(conn.session)
    yield pool
    print(f"\nengine families: {pool.summary()}")


@pytest.fixture
def make_family(
    conn: Connection,
    engine_keyspace: str,
    t0: datetime,
    table_pool: TablePool,
    request: pytest.FixtureRequest,
) -> Iterator[FamilyFactory]:
    """A family of its own for the test, in the test keyspace: a new name and empty tables
    (from the session's pool of table sets, else new ones); its sweeps fall half an interval
    after ``t0``, then every interval (runs are at whole minutes). ``fresh=True``: new tables,
    never reused, for a test that changes its tables (ALTER, DROP, table options); so are
    tables the test names itself (``raw_table``, ``compact_table``); with ``layout`` (the
    raw layout an earlier family of the test got for them) they are not checked again, for a
    test that gives many families the same tables it does not change. When the test ends, its
    families' rows in the shared tables are deleted and their pooled tables emptied for the
    next test (tests/family_pool.py)."""
    made: list[tuple[Family, TableSet | None]] = []

    def factory(
        *, fresh: bool = False, layout: RawLayout | None = None, **overrides: object
    ) -> tuple[Family, Store, CounterClient]:
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
        named = "raw_table" in overrides or "compact_table" in overrides
        tables: TableSet | None = None
        if layout is None:
            family, layout, tables = table_pool.family(
                with_sweep_offset(fields, t0), fresh=fresh or named
            )
        else:  # the test's own tables again, as an earlier family of it left them
            assert named, "layout= is for tables the test names (an earlier family's)"
            family = Family.model_validate(with_sweep_offset(fields, t0))
        made.append((family, tables))
        store = Store(conn, family, layout, concurrency=8)
        return family, store, CounterClient(conn, family, store)

    yield factory
    release_families(table_pool, made, request.node.stash.get(TEST_FAILED, False))


@pytest.fixture
def marks_forgotten_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Time compressed: a run forgets every index mark written before it read the index (not
    only those ``FORGET_MARGIN``, 2 minutes, older), as runs minutes apart do; so the runs
    after it read a counter only from its newer marks' minutes (``core.read_floor``)."""
    monkeypatch.setattr("counters.compaction.verify.FORGET_MARGIN", timedelta(0))


@pytest.fixture
def t0() -> datetime:
    """A virtual clock start, a day back, on a minute boundary."""
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    return now - timedelta(days=1)
