"""The families' tables in lineage: the package's provider info, which registers the
``cassandra`` asset URI scheme with Airflow's providers manager (the ``apache_airflow_provider``
entry point in pyproject.toml, as a provider's), so that OpenLineage's Airflow integration
turns each family's assets into Cassandra datasets instead of dropping them.

* ``sanitize_uri`` is the scheme's normalizer: Airflow normalizes every ``cassandra://`` asset
  URI with it (and an asset without one has no ``normalized_uri``, which OpenLineage needs).
  ``cassandra://<host>[:<port>]/<keyspace>/<table>``, lower-cased, port 9042 by default; any
  other shape is refused, naming the URI and the shape.
* ``convert_asset_to_openlineage`` gives OpenLineage's naming for a Cassandra table: namespace
  ``cassandra://<host>:<port>``, name ``<keyspace>.<table>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

if TYPE_CHECKING:
    from airflow.sdk import Asset

# Nothing from Airflow (nor ``.assets``, which imports it) at module level: Airflow reads the
# provider info while its configuration module is still initialising.
PACKAGE = "counters-compaction"
SCHEME = "cassandra"
"""``assets.SCHEME``, which this module cannot import at load."""
_URIS = [
    {
        "schemes": [SCHEME],
        "handler": "counters.airflow.lineage.sanitize_uri",
        "to_openlineage_converter": "counters.airflow.lineage.convert_asset_to_openlineage",
    }
]


def get_provider_info() -> dict[str, Any]:
    """What Airflow's providers manager reads from the entry point: the package (its
    distribution's name) and the asset URI scheme it handles (``dataset-uris`` too, the
    older key, as providers give both)."""
    return {
        "package-name": PACKAGE,
        "name": "Counters compaction",
        "description": "Compaction of event-sourced counters in Cassandra: the `cassandra` "
        "asset URI scheme and its OpenLineage datasets.",
        "asset-uris": _URIS,
        "dataset-uris": _URIS,
    }


def sanitize_uri(parts: SplitResult) -> SplitResult:
    """The ``cassandra`` scheme's normalizer: ``cassandra://host:port/keyspace/table``,
    lower-cased (CQL folds unquoted names), the port 9042 when none is given. ``ValueError``
    names the URI and the expected shape (Airflow then refuses the asset)."""
    from .assets import cluster_address

    keyspace, _, table = parts.path.strip("/").partition("/")
    try:
        if not keyspace or not table or "/" in table:
            raise ValueError("no /<keyspace>/<table> path")
        cluster = cluster_address(parts.netloc, "the cluster")
    except ValueError as exc:
        raise ValueError(
            f"{parts.geturl()!r} is not a Cassandra table asset URI "
            f"(cassandra://<host>[:<port>]/<keyspace>/<table>): {exc}"
        ) from None
    return parts._replace(netloc=cluster, path=f"/{keyspace.lower()}/{table.lower()}")


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """OpenLineage's dataset for a table's asset: namespace ``cassandra://host:port``, name
    ``keyspace.table`` (its Cassandra naming)."""
    del lineage_context  # the URI holds everything
    from airflow.providers.common.compat.openlineage.facet import Dataset

    from .assets import openlineage_dataset

    uri = urlsplit(asset.uri)
    namespace, name = openlineage_dataset(sanitize_uri(uri).geturl())
    return Dataset(namespace=namespace, name=name)
