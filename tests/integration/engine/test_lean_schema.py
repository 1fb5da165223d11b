"""A connection without the driver's full schema model (the default: each task process used to
read every keyspace's schema on connect) still routes a family's statements to their replicas
and still reads its keyspace's replication, because it reads the family's own keyspace."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from counters import identity, schema
from counters.connection import Connection, ConnectionSettings
from counters.store import Store, bind

pytestmark = pytest.mark.integration


@pytest.fixture
def lean() -> Iterator[Connection]:
    """A fresh connection as a task process makes it (from the environment: no full model)."""
    settings = ConnectionSettings.from_env()
    assert settings.schema_metadata is False
    connection = Connection(settings)
    yield connection
    connection.close()


def test_a_lean_connection_routes_a_familys_statements_to_its_replicas(
    conn: Connection, lean: Connection, make_family
) -> None:
    family, store, _client = make_family()
    meta = lean.cluster.metadata
    assert meta.token_map is not None  # token metadata stays on: the ring is known
    assert family.keyspace not in meta.keyspaces  # no schema read on connect
    assert "system_schema" not in meta.keyspaces
    # the same layout as a cached one: the Store reads no table here, only its keyspace
    lean_store = Store(lean, family, store.layout)
    statement = lean_store.statements.prepare(
        "compact_value", "SELECT {value}, {epoch} FROM {compact} WHERE {key_where}"
    )
    routing_key = bind(statement, ("IBM",)).routing_key
    replicas = meta.get_replicas(family.keyspace, routing_key)
    hosts = {h.endpoint for h in meta.all_hosts()}
    assert replicas and {h.endpoint for h in replicas} <= hosts
    assert replicas == conn.cluster.metadata.get_replicas(family.keyspace, routing_key)
    # the policy puts the replica first in the query plan
    policy = lean.cluster.profile_manager.profiles["bulk"].load_balancing_policy
    plan = list(policy.make_query_plan(family.keyspace, bind(statement, ("IBM",))))
    assert plan[0] in replicas


def test_a_lean_connection_reads_the_keyspaces_replication(
    conn: Connection, lean: Connection
) -> None:
    """``replication_dcs`` reads the keyspace's own replication (its data centers and factors),
    not only the hosts' data centers it falls back to for a keyspace it does not know. A single
    node cannot hold a keyspace of two data centers: the multi-DC rule is tested pure
    (``tests/unit/test_identity.py``)."""
    here = next(h.datacenter for h in conn.cluster.metadata.all_hosts())
    keyspace = f"t_lean_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        f"{{'class': 'NetworkTopologyStrategy', '{here}': 1}}"
    )
    try:
        assert keyspace not in lean.cluster.metadata.keyspaces
        assert identity.replication_dcs(lean.session, keyspace) == {here}
        known = lean.cluster.metadata.keyspaces[keyspace]
        assert known.replication_strategy.dc_replication_factors == {here: 1}
        assert schema.keyspace_metadata(lean.session, keyspace) is known
        assert schema.keyspace_metadata(lean.session, "t_lean_missing") is None
    finally:
        conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)


def test_a_family_checks_and_compacts_on_a_lean_connection(lean: Connection, make_family) -> None:
    """The family's checks (table options, replication, identity) and its layout need no full
    model: a Store made the way a task makes it reads what it needs."""
    family, _store, _client = make_family()
    lean_store = Store(lean, family)
    identity.check_family(lean_store, record=False)
    assert [c.name for c in lean_store.layout.key] == list(family.columns.key)
    assert schema.table_metadata(lean.session, family.keyspace, schema.ledger_table(family))


@pytest.fixture
def task_runtime(monkeypatch) -> Iterator[None]:
    """``counters.airflow.runtime`` as in a task process, its settings from the environment."""
    from counters.airflow import runtime

    monkeypatch.setattr(runtime, "connection_settings", lambda *a: ConnectionSettings.from_env())
    runtime.close()
    yield
    runtime.close()


def test_a_task_process_keeps_one_store_per_family_and_resets_its_run_state(
    task_runtime: None, make_family
) -> None:
    """The layout is read and statements prepared once per process; what a Store keeps of a
    run (request counts, who started it) does not leak into the next phase or run (tests run
    many DAG runs in one process), and another family (or another YAML of it) gets its own."""
    from counters.airflow import runtime
    from counters.audit import Provenance

    family, _store, _client = make_family()
    other, _other_store, _ = make_family()
    store = runtime.store_for(family)
    assert store.quarantine.read_quarantine(0) == {}
    assert sum(store.statements.requests.values()) > 0
    store.audit.provenance = Provenance("airflow")
    again = runtime.store_for(family)
    assert again is store
    assert not again.statements.requests and again.audit.provenance is None
    again.quarantine.read_quarantine(0)  # within a run (its metrics after its audit): kept
    kept = runtime.store_for(family, reset=False)
    assert kept is store and sum(kept.statements.requests.values()) > 0
    assert runtime.store_for(other) is not store
    assert runtime.store_for(other).family == other
    changed = family.model_copy(update={"lag": family.lag * 2})
    assert runtime.store_for(changed) is not store
    assert runtime.store_for(changed).family == changed


def test_the_family_checks_run_once_per_run_on_a_store_unless_a_step_may_record(
    conn: Connection, make_family
) -> None:
    """The plan and the shards one task compacts share one check of the family; a step that
    may record the identity checks again while a table's is unrecorded, and a new run checks
    again."""
    from counters.schema import SchemaError

    family, store, _client = make_family(fresh=True)  # its compact table's TTL changes
    table = f"{family.keyspace}.{family.compact_table}"

    def check(run_id: str, record: bool) -> None:
        identity.check_family(store, record=record, run_id=run_id, once_per_run=True)

    check("r1", record=False)  # the plan: nothing recorded yet
    conn.session.execute(f"ALTER TABLE {table} WITH default_time_to_live = 60")
    check("r1", record=False)  # the same run, checked already
    with pytest.raises(SchemaError, match="default_time_to_live = 60"):
        check("r1", record=True)  # its first commit: checked again before recording
    conn.session.execute(f"ALTER TABLE {table} WITH default_time_to_live = 0")
    check("r1", record=True)  # records the identity
    assert set(store.owners.table_owners()) == set(family.tables)
    conn.session.execute(f"ALTER TABLE {table} WITH default_time_to_live = 60")
    check("r1", record=True)  # recorded and checked in this run
    with pytest.raises(SchemaError, match="default_time_to_live = 60"):
        check("r2", record=False)  # a new run checks again
    conn.session.execute(f"ALTER TABLE {table} WITH default_time_to_live = 0")
