"""What a task process sets up once: the connection's settings, the driver's schema model and
log level, and the Airflow settings for minute DAGs."""

import logging
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from counters.airflow import runtime
from counters.connection import ConnectionConfigError, ConnectionSettings, build_cluster

from tests.airflow_connections import airflow_conn

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

MINUTE_DAG_SETTINGS = {
    ("workers", "min_heartbeat_interval"): "30",
    ("dag_processor", "min_file_process_interval"): "120",
    ("dag_processor", "parsing_processes"): "1",
    ("core", "mp_start_method"): "fork",
}


def test_the_driver_connects_without_its_full_schema_model_unless_asked() -> None:
    lean = build_cluster(ConnectionSettings())
    full = build_cluster(ConnectionSettings(schema_metadata=True))
    try:
        assert lean.schema_metadata_enabled is False
        assert lean.token_metadata_enabled is True  # the token map is still built
        assert full.schema_metadata_enabled is True
    finally:
        lean.shutdown()
        full.shutdown()


def test_schema_metadata_is_read_from_the_environment_and_the_airflow_connection() -> None:
    assert ConnectionSettings.from_env({}).schema_metadata is False
    assert ConnectionSettings.from_env({"CASSANDRA_SCHEMA_METADATA": "true"}).schema_metadata
    from_conn = ConnectionSettings.from_airflow_connection
    assert from_conn(airflow_conn({})).schema_metadata is False
    assert from_conn(airflow_conn({"schema_metadata": True})).schema_metadata is True
    with pytest.raises(ConnectionConfigError, match=r"extra\.schema_metadata.*'maybe'"):
        from_conn(airflow_conn({"schema_metadata": "maybe"}))
    with pytest.raises(ConnectionConfigError, match="CASSANDRA_SCHEMA_METADATA"):
        ConnectionSettings.from_env({"CASSANDRA_SCHEMA_METADATA": "maybe"})


def test_the_connection_settings_are_fetched_once_per_process(monkeypatch) -> None:
    """Each fetch is an execution-API request; a run asked for them in every phase."""
    from airflow.sdk import BaseHook

    fetched: list[str] = []

    def get_connection(conn_id: str) -> SimpleNamespace:
        fetched.append(conn_id)
        return airflow_conn({})

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(get_connection))
    monkeypatch.delenv("AIRFLOW_CONN_CASSANDRA_DEFAULT", raising=False)
    runtime.close()
    try:
        first = runtime.connection_settings()
        assert [runtime.connection_settings() for _ in range(4)] == [first] * 4
        assert fetched == ["cassandra_default"]
        # a test that points the connection elsewhere (its environment variable) is seen
        monkeypatch.setenv("AIRFLOW_CONN_CASSANDRA_DEFAULT", "cassandra://elsewhere:9042")
        runtime.connection_settings()
        assert fetched == ["cassandra_default"] * 2
    finally:
        runtime.close()


def test_the_drivers_info_lines_are_left_out_unless_a_level_was_set() -> None:
    quiet = logging.getLogger("counters_test_driver_quiet")
    quiet.setLevel(logging.NOTSET)
    runtime.quiet_driver_logs(quiet)
    assert quiet.level == logging.WARNING
    chosen = logging.getLogger("counters_test_driver_chosen")
    chosen.setLevel(logging.DEBUG)
    runtime.quiet_driver_logs(chosen)
    assert chosen.level == logging.DEBUG


def _airflow_env(home: Path, extra: str = "") -> dict[str, str]:
    script = f"{extra} source {ROOT}/scripts/env.sh; airflow_env {home}; env"
    out = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/bin:/usr/bin"},
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_the_minute_dag_settings_are_set_for_local_runs_and_exist_in_airflow(tmp_path) -> None:
    """scripts/env.sh sets them (for `make run`, tests and the benchmarks), each an option of
    this Airflow's config.yml under that section."""
    import airflow.config_templates

    known = yaml.safe_load(
        (Path(airflow.config_templates.__file__).parent / "config.yml").read_text()
    )
    env = _airflow_env(tmp_path)
    for (section, option), value in MINUTE_DAG_SETTINGS.items():
        assert option in known[section]["options"], (section, option)
        assert env[f"AIRFLOW__{section.upper()}__{option.upper()}"] == value
    # a value the caller set wins
    env = _airflow_env(tmp_path, "export AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=7;")
    assert env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] == "7"


def test_the_settings_are_documented_with_their_reason() -> None:
    text = (ROOT / "docs/airflow.md").read_text()
    for (section, option), value in MINUTE_DAG_SETTINGS.items():
        assert f"`[{section}] {option}`" in text
        row = next(line for line in text.splitlines() if f"`[{section}] {option}` |" in line)
        assert f"| {value} |" in row or f"| `{value}` |" in row
