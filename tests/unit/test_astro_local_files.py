"""The astro CLI's local files: ``docker-compose.override.yml`` adds a Cassandra 5.0 node and
points every Airflow container's ``cassandra_default`` at it (not run here: no Docker engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
AIRFLOW_SERVICES = ("scheduler", "dag-processor", "api-server", "triggerer")
"""The containers `astro dev start` runs Airflow in (Airflow 3), besides postgres."""

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((PROJECT / "docker-compose.override.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_cassandra_5_service_with_healthcheck_on_astros_network(compose: dict[str, Any]) -> None:
    cassandra = compose["services"]["cassandra"]
    assert cassandra["image"].startswith("cassandra:5.0")
    assert cassandra["environment"]["CASSANDRA_DC"] == "datacenter1"
    assert "cqlsh" in " ".join(cassandra["healthcheck"]["test"])
    assert cassandra["networks"] == ["airflow"]
    assert "9042:9042" in cassandra["ports"]
    volume = cassandra["volumes"][0].split(":")[0]
    assert volume in compose["volumes"]


def test_every_airflow_container_connects_to_that_node(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"cassandra", *AIRFLOW_SERVICES}
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        conn = json.loads(env["AIRFLOW_CONN_CASSANDRA_DEFAULT"])
        assert (conn["conn_type"], conn["host"], conn["port"]) == ("cassandra", "cassandra", 9042)
        policy = conn["extra"]["load_balancing_policy_args"]["child_load_balancing_policy_args"]
        assert policy["local_dc"] == services["cassandra"]["environment"]["CASSANDRA_DC"]
        assert (env["CASSANDRA_HOSTS"], env["CASSANDRA_PORT"]) == ("cassandra", "9042")
    depends = services["scheduler"]["depends_on"]["cassandra"]
    assert depends == {"condition": "service_healthy"}
