"""Each family's tables as Airflow Assets, so other DAGs can run after "trades compacted".

A table is ``cassandra://<keyspace>/<table>`` (the asset's name is its URI, so a DAG anywhere in
the deployment schedules on ``Asset("cassandra://counters_demo/trade_totals")`` and means the same
asset). A family's DAG reads its raw table (an inlet of ``run`` and ``record_audit``) and updates
its compact table, with an asset event only when the run committed something: an idle or no-op
run (``run`` skipped), a run that committed no counter and a failed or partial run emit none.

* A larger run: ``record_audit`` has the compact table as its outlet (Airflow records the event
  when the task succeeds); it ends ``skipped`` when the run committed nothing. This outlet also
  draws raw -> compact in the UI's asset graph.
* A small run, done whole in ``run``: ``run`` cannot have the table as an outlet (for a larger
  run it succeeds before anything is compacted), so it announces the event through an asset
  alias, ``counters_compacted_<family>``, only when it committed.

The event's ``extra`` holds the run: ``family``, ``run_id``, ``epoch_before``, ``epoch``,
``counters`` (committed), ``rows_folded``, ``sum_folded``, ``rows_deleted``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

from ..config import Family

SCHEME = "cassandra"


def table_uri(keyspace: str, table: str) -> str:
    return f"{SCHEME}://{keyspace}/{table}"


def compact_asset(family: Family) -> Asset:
    """The family's compact table (what downstream DAGs schedule on)."""
    return Asset(table_uri(family.keyspace, family.compact_table))


def raw_asset(family: Family) -> Asset:
    return Asset(table_uri(family.keyspace, family.raw_table))


def compacted_alias(family: Family) -> AssetAlias:
    """The alias a small run (done whole in ``run``) announces its compact-table event through."""
    return AssetAlias(f"counters_compacted_{family.name}")


def committed(summary: Mapping[str, Any]) -> bool:
    """Whether the run committed anything (a counter's compact value changed)."""
    return int(summary.get("counters_committed") or 0) > 0


def event_extra(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The asset event's ``extra``: which run, up to which epoch, how much it folded."""
    return {
        "family": summary.get("family"),
        "run_id": summary.get("run_id"),
        "epoch_before": summary.get("epoch_before"),
        "epoch": summary.get("epoch"),
        "counters": int(summary.get("counters_committed") or 0),
        "rows_folded": int(summary.get("rows_folded") or 0),
        "sum_folded": int(summary.get("sum_folded") or 0),
        "rows_deleted": int(summary.get("rows_deleted") or 0),
    }
