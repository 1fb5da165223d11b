"""The families' assets reach OpenLineage: the package's provider entry point registers the
``cassandra`` scheme with Airflow's providers managers (the scheduler's and the task runtime's),
and the OpenLineage provider's own translation turns a family's table into the Cassandra
dataset of OpenLineage's naming. Without the registration that translation returns None and
the provider drops the asset from every lineage event."""

from __future__ import annotations

import pytest
from airflow.providers.openlineage.utils.utils import translate_airflow_asset
from airflow.providers_manager import ProvidersManager
from airflow.sdk import Asset
from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
from counters.airflow import assets
from counters.airflow.assets import compact_asset, raw_asset
from counters.airflow.lineage import SCHEME, convert_asset_to_openlineage, sanitize_uri
from counters.config import load_catalog

from tests.dags.test_dag_import import EXAMPLE_FAMILIES

pytestmark = pytest.mark.airflow


def test_the_package_registers_the_cassandra_scheme_as_a_provider() -> None:
    assert "counters-compaction" in ProvidersManager().providers  # `airflow providers list`
    assert SCHEME == assets.SCHEME
    runtime = ProvidersManagerTaskRuntime()  # what Asset() and OpenLineage ask
    assert runtime.asset_uri_handlers["cassandra"] is sanitize_uri
    assert runtime.asset_to_openlineage_converters["cassandra"] is convert_asset_to_openlineage


def test_openlineage_translates_a_familys_tables_to_cassandra_datasets() -> None:
    trades = load_catalog(EXAMPLE_FAMILIES).get("trades")
    for asset, table in (
        (compact_asset(trades, "Cass1.Example.com:9142"), trades.compact_table),
        (raw_asset(trades, "cass1.example.com:9142"), trades.raw_table),
    ):
        dataset = translate_airflow_asset(asset, lineage_context=None)
        assert dataset is not None, f"OpenLineage dropped {asset.uri}"
        assert (dataset.namespace, dataset.name) == (
            "cassandra://cass1.example.com:9142",
            f"{trades.keyspace}.{table}",
        )


def test_a_hand_written_uri_is_one_spelling_and_a_clusterless_one_is_refused() -> None:
    """A downstream DAG's ``Asset("cassandra://...")`` means the family's table whatever its
    case or default port; the URIs of earlier versions (no cluster) are refused, naming the
    shape, instead of scheduling on an asset that never gets an event."""
    written = Asset("cassandra://Cass1.Example.com/Counters_Demo/Trade_Totals")
    assert written.uri == "cassandra://cass1.example.com:9042/counters_demo/trade_totals"
    with pytest.raises(ValueError, match=r"cassandra://<host>\[:<port>\]/<keyspace>/<table>"):
        Asset("cassandra://counters_demo/trade_totals")
