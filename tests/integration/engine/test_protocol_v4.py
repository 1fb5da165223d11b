"""The engine over native protocol v4, as it runs against Cassandra 3.11/4.x (DSE, ScyllaDB and
Keyspaces speak v4 too): a few of the engine's own tests again, on a connection pinned to v4,
in every `make test`. The whole engine suite runs at v4 with CASSANDRA_PROTOCOL_VERSION=4 (or
`pytest --protocol-version 4`)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import replace

import pytest
from counters.client import CounterClient
from counters.config import Family
from counters.connection import Connection, ConnectionSettings
from counters.schema import ensure_schema
from counters.store import Store

from tests.sweeps import with_sweep_offset

from . import test_engine, test_kinds
from .conftest import FamilyFactory

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def conn_v4() -> Iterator[Connection]:
    settings = replace(ConnectionSettings.from_env(), protocol_version=4)
    with Connection(settings) as connection:
        assert connection.cluster.protocol_version == 4  # pinned, not negotiated up to v5
        yield connection


@pytest.fixture
def make_family_v4(conn_v4: Connection, engine_keyspace: str, t0) -> FamilyFactory:
    """The engine conftest's ``make_family``, on the v4 connection."""

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
        layout = ensure_schema(conn_v4.session, family)
        store = Store(conn_v4, family, layout, concurrency=8)
        assert store.statements.session.cluster.protocol_version == 4
        return family, store, CounterClient(conn_v4, family, store)

    return factory


def test_v4_fold_counts_rows_at_or_below_epoch_and_deletes_exactly_them(make_family_v4, t0):
    test_engine.test_fold_counts_rows_at_or_below_epoch_and_deletes_exactly_them(make_family_v4, t0)


def test_v4_overlapping_commits_stay_exact(make_family_v4, t0):
    """Two runs' compare-and-sets on one bucket: the loser re-reads and builds on the winner."""
    test_engine.test_overlapping_runs_without_lease_stay_exact(make_family_v4, t0, "commit")


def test_v4_reset_is_idempotent_and_later_increments_count(make_family_v4, t0):
    test_kinds.test_reset_is_idempotent_and_later_increments_count(make_family_v4, t0)


def test_unpinned_the_protocol_is_negotiated_to_the_nodes_highest(cassandra_contact):
    """No version pinned: the driver settles on what the node speaks (v5 on Cassandra 5.0),
    where a pinned v5 would have shut out a v4-only cluster."""
    hosts, port = cassandra_contact
    settings = replace(
        ConnectionSettings.from_env(), hosts=tuple(hosts), port=port, protocol_version=None
    )
    with Connection(settings) as connection:
        release = connection.session.execute("SELECT release_version FROM system.local").one()
        assert connection.cluster._protocol_version_explicit is False
        if release.release_version.split(".")[0] in ("4", "5"):
            assert connection.cluster.protocol_version == 5
