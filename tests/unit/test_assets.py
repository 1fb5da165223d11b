"""Asset URIs name the cluster as OpenLineage's Cassandra datasets do, from the environment
alone (a DAG file is parsed without I/O), one spelling per table."""

from __future__ import annotations

from datetime import datetime

import pytest
from counters.airflow.assets import (
    CONN_ENV,
    AssetClusterError,
    CompactedRuns,
    cluster_address,
    configured_cluster,
    openlineage_dataset,
    table_uri,
)
from counters.airflow.runtime import CASSANDRA_CONN_ID
from counters.core.codec import decode, encode

pytestmark = pytest.mark.unit


def test_expect_two_clusters_with_the_same_keyspace_to_be_two_assets() -> None:
    one = table_uri("cass-a.example.com:9042", "counters_demo", "trade_totals")
    two = table_uri("cass-b.example.com:9042", "counters_demo", "trade_totals")
    assert one == "cassandra://cass-a.example.com:9042/counters_demo/trade_totals"
    assert one != two


def test_expect_one_uri_per_table_whatever_the_case_or_the_default_port() -> None:
    """CQL folds unquoted names (the only ones the YAML allows) and DNS ignores case."""
    assert table_uri("Cass-A.Example.com", "Counters_Demo", "Trade_Totals") == table_uri(
        "cass-a.example.com:9042", "counters_demo", "trade_totals"
    )


def test_expect_the_openlineage_namespace_and_name_of_a_table() -> None:
    uri = table_uri("10.0.0.7:9142", "counters_demo", "trade_totals")
    assert openlineage_dataset(uri) == ("cassandra://10.0.0.7:9142", "counters_demo.trade_totals")
    with pytest.raises(ValueError, match="not a Cassandra table asset URI"):
        openlineage_dataset("cassandra://counters_demo/trade_totals")  # the old, clusterless URI


def test_expect_the_cluster_from_the_setting_then_the_connection_then_the_driver_variables() -> (
    None
):
    driver = {"CASSANDRA_HOSTS": "Node1.Example.com, node2", "CASSANDRA_PORT": "9142"}
    assert configured_cluster(driver) == "node1.example.com:9142"
    assert configured_cluster({"CASSANDRA_HOSTS": "node1"}) == "node1:9042"
    as_json = '{"conn_type": "cassandra", "host": "Cass1.example.com,cass2", "port": 9142}'
    connection = {**driver, CONN_ENV: as_json}
    assert configured_cluster(connection) == "cass1.example.com:9142"
    as_uri = {CONN_ENV: "cassandra://user:secret@cass3.example.com:9043/counters?x=1"}
    assert configured_cluster(as_uri) == "cass3.example.com:9043"
    assert (
        configured_cluster({CONN_ENV: "cassandra://cass4.example.com"}) == "cass4.example.com:9042"
    )
    chosen = {**connection, "COUNTERS_ASSET_CLUSTER": "prod-cassandra:9043"}
    assert configured_cluster(chosen) == "prod-cassandra:9043"
    assert cluster_address("[::1]:9142") == "[::1]:9142"
    assert f"AIRFLOW_CONN_{CASSANDRA_CONN_ID.upper()}" == CONN_ENV  # the DAGs' connection


def test_expect_localhost_only_in_local_development_and_elsewhere_the_setting_required() -> None:
    """A deployment that keeps the connection in the metadata DB or a secrets backend would
    otherwise name every cluster's tables ``localhost:9042``."""
    assert configured_cluster({"COUNTERS_LOCAL_DEV": "1"}) == "localhost:9042"
    for env in ({}, {CONN_ENV: '{"conn_type": "cassandra"}'}, {"COUNTERS_ASSET_CLUSTER": " "}):
        with pytest.raises(AssetClusterError, match="COUNTERS_ASSET_CLUSTER is not set"):
            configured_cluster(env)


@pytest.mark.parametrize("value", ["cass/ks", "cass:port", "cass:0", "cass:1:2", "http://x"])
def test_expect_a_bad_cluster_refused_naming_the_setting_and_the_value(value: str) -> None:
    with pytest.raises(AssetClusterError) as refused:
        configured_cluster({"COUNTERS_ASSET_CLUSTER": value})
    assert "COUNTERS_ASSET_CLUSTER" in str(refused.value)
    assert repr(value) in str(refused.value)


def test_expect_the_example_consumer_to_sum_its_events_and_keep_the_latest_epoch() -> None:
    extras = [
        {
            "run_id": "a",
            "epoch": "2026-11-22T10:01:00.000Z",
            "counters": 2,
            "rows_folded": 5,
            "sum_folded": 50,
        },
        {
            "run_id": "b",
            "epoch": "2026-11-22T10:03:00.000Z",
            "counters": 1,
            "rows_folded": 1,
            "sum_folded": -3,
        },
        {},  # an event without an extra (another writer's) counts as nothing
    ]
    runs = CompactedRuns.of("trades", extras)
    assert runs == CompactedRuns("trades", ("a", "b"), datetime(2026, 11, 22, 10, 3), 3, 6, 47)
    encoded = encode(runs)
    assert encoded["epoch"] == "2026-11-22T10:03:00.000Z" and encoded["runs"] == ["a", "b"]  # type: ignore[typeddict-item]
    assert decode(CompactedRuns, encoded) == runs
    assert CompactedRuns.of("trades", []).epoch is None
