"""Each family's tables as Airflow Assets, so other DAGs can run after "trades compacted".

A table is ``cassandra://<host>:<port>/<keyspace>/<table>``: OpenLineage's Cassandra dataset
naming (namespace ``cassandra://<host>:<port>``, name ``<keyspace>.<table>``), so two clusters
with the same keyspace are two assets, and lineage tools name the table as the provider
integrations do. The cluster comes from ``COUNTERS_ASSET_CLUSTER`` (``host:port``), else the
``cassandra_default`` connection's host when the environment holds it, else the first of
``CASSANDRA_HOSTS`` with ``CASSANDRA_PORT``; ``localhost:9042`` only in the local dev setup, an
error elsewhere (``configured_cluster``): environment only, because a DAG file is parsed
without I/O (a connection in the metadata DB or a secrets backend is a read). The package
registers the ``cassandra`` scheme's normalizer and OpenLineage converter (``lineage``), so
OpenLineage names these tables as Cassandra datasets. Host, keyspace and table are lower-cased:
CQL folds unquoted names, and the families YAML allows only those, so ``Trades`` and ``trades``
are one table.

The asset's name is its URI, so a DAG anywhere in the deployment schedules on
``Asset("cassandra://cassandra.example.com:9042/counters_demo/trade_totals")`` and means the
same asset (``compact_asset(family)`` builds it). A family's DAG reads its raw table (an inlet
of ``run`` and ``record_audit``) and updates its compact table, with an asset event only when
the run committed something: an idle or no-op run (``run`` skipped), a run that committed no
counter and a failed or partial run emit none.

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

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import Asset, AssetAlias

from ..config import LOCAL_DEV_ENV, Family
from ..core import from_text

SCHEME = "cassandra"
CLUSTER_ENV = "COUNTERS_ASSET_CLUSTER"
CONN_ENV = "AIRFLOW_CONN_CASSANDRA_DEFAULT"
"""The DAGs' connection (``runtime.CASSANDRA_CONN_ID``) when the environment holds it."""
DEFAULT_PORT = 9042
DEFAULT_CLUSTER = f"localhost:{DEFAULT_PORT}"
_HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


class AssetClusterError(ValueError):
    """The cluster address for asset URIs is not ``host[:port]``."""


def cluster_address(value: str, setting: str = CLUSTER_ENV) -> str:
    """Pure: ``host[:port]`` as the URI's authority, lower-cased, port defaulted to 9042 (two
    spellings of one cluster must be one asset); an error names the setting and the value."""
    text = value.strip()
    host, port = text, str(DEFAULT_PORT)
    if text.count(":") == 1 or (text.startswith("[") and "]:" in text):
        host, _, port = text.rpartition(":")
    if not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise AssetClusterError(
            f"{setting} must be host[:port] (the cluster in asset URIs, e.g. "
            f"cassandra.example.com:9042), got {value!r}"
        )
    return f"{host.lower()}:{int(port)}"


def connection_cluster(value: str) -> str | None:
    """Pure: the first host and the port of an ``AIRFLOW_CONN_<ID>`` value (Airflow's JSON or
    URI form), as ``host:port``; None when it names no host."""
    text = value.strip()
    if text.startswith("{"):
        try:
            conn = json.loads(text)
        except ValueError:
            return None
        host, port = str(conn.get("host") or ""), conn.get("port")
    else:
        netloc = urlsplit(text).netloc.rpartition("@")[2]
        host, _, port = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", None)
    first = host.split(",")[0].strip()
    if not first:
        return None
    return cluster_address(f"{first}:{port or DEFAULT_PORT}", CONN_ENV)


def configured_cluster(env: Mapping[str, str] | None = None) -> str:
    """The cluster in asset URIs, from the environment (no I/O at DAG parse):
    ``COUNTERS_ASSET_CLUSTER``, else the host of the ``cassandra_default`` connection when the
    environment holds it (``AIRFLOW_CONN_CASSANDRA_DEFAULT``), else the first
    ``CASSANDRA_HOSTS`` host with ``CASSANDRA_PORT``, else ``localhost:9042`` in the local dev
    setup (``COUNTERS_LOCAL_DEV=1``) only. Elsewhere an error names the setting: a connection
    kept in the metadata DB or a secrets backend cannot be read while a DAG file is parsed, and
    a guessed ``localhost:9042`` would name every deployment's tables alike."""
    env = os.environ if env is None else env
    if env.get(CLUSTER_ENV, "").strip():
        return cluster_address(env[CLUSTER_ENV])
    from_connection = connection_cluster(env.get(CONN_ENV, ""))
    if from_connection:
        return from_connection
    hosts = [h.strip() for h in env.get("CASSANDRA_HOSTS", "").split(",") if h.strip()]
    if hosts:
        port = env.get("CASSANDRA_PORT", "").strip() or str(DEFAULT_PORT)
        return cluster_address(f"{hosts[0]}:{port}", "CASSANDRA_HOSTS/CASSANDRA_PORT")
    if env.get(LOCAL_DEV_ENV) == "1":
        return DEFAULT_CLUSTER
    raise AssetClusterError(
        f"{CLUSTER_ENV} is not set: the families' asset URIs name their cluster "
        f"(cassandra://<host>:<port>/<keyspace>/<table>), and the cassandra_default connection "
        f"is not in the environment ({CONN_ENV}) where a DAG file could read it without I/O. "
        f"Set {CLUSTER_ENV} to one stable host:port of the cluster (e.g. "
        "cassandra.example.com:9042), the same on every Airflow component"
    )


def table_uri(cluster: str, keyspace: str, table: str) -> str:
    """Pure: the table's asset URI, ``cassandra://host:port/keyspace/table``, lower-cased."""
    return f"{SCHEME}://{cluster_address(cluster)}/{keyspace.lower()}/{table.lower()}"


def openlineage_dataset(uri: str) -> tuple[str, str]:
    """Pure: the OpenLineage dataset of a table's URI: (``cassandra://host:port``,
    ``keyspace.table``), what a lineage converter for the ``cassandra`` scheme returns."""
    parts = urlsplit(uri)
    keyspace, _, table = parts.path.strip("/").partition("/")
    if parts.scheme != SCHEME or not keyspace or not table or "/" in table:
        raise ValueError(f"not a Cassandra table asset URI: {uri!r}")
    return f"{SCHEME}://{parts.netloc}", f"{keyspace}.{table}"


def compact_asset(family: Family, cluster: str | None = None) -> Asset:
    """The family's compact table (what downstream DAGs schedule on)."""
    cluster = cluster or configured_cluster()
    return Asset(table_uri(cluster, family.keyspace, family.compact_table))


def raw_asset(family: Family, cluster: str | None = None) -> Asset:
    cluster = cluster or configured_cluster()
    return Asset(table_uri(cluster, family.keyspace, family.raw_table))


def compacted_alias(family: Family) -> AssetAlias:
    """The alias a small run (done whole in ``run``) announces its compact-table event through."""
    return AssetAlias(f"counters_compacted_{family.name}")


@dataclass(frozen=True)
class CompactedRuns:
    """What the family's runs behind a consumer's asset events folded, summed (the example
    consumer's XCom, through ``core.codec``)."""

    family: str
    runs: tuple[str, ...]
    epoch: datetime | None
    """The latest epoch among them."""
    counters: int
    rows_folded: int
    sum_folded: int

    @classmethod
    def of(cls, family: str, extras: Iterable[Mapping[str, Any]]) -> CompactedRuns:
        """Pure: summed from the events' ``extra`` (any field missing counts as none)."""
        found = [dict(extra or {}) for extra in extras]
        epochs = [from_text(e["epoch"]) for e in found if e.get("epoch")]
        return cls(
            family,
            tuple(str(e["run_id"]) for e in found if e.get("run_id")),
            max(epochs, default=None),
            sum(int(e.get("counters") or 0) for e in found),
            sum(int(e.get("rows_folded") or 0) for e in found),
            sum(int(e.get("sum_folded") or 0) for e in found),
        )
