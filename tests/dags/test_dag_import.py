"""The dags folder parses, builds one DAG per family as configured, and reports broken families.

No Cassandra here and no metadata DB: only ``DagBag`` over the project's ``dags/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from counters.config import Family, load_catalog

PROJECT = Path(__file__).resolve().parents[2]
DAGS = PROJECT / "dags"
CHECK_FILE = str(DAGS / "counters_config_check.py")

pytestmark = pytest.mark.airflow
EXAMPLE_FAMILIES = Path(__file__).resolve().parents[2] / "include/examples/counter_families.yaml"


def parse(monkeypatch: pytest.MonkeyPatch, config: Path) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("COUNTERS_CONFIG", str(config))
    return DagBag(dag_folder=str(DAGS))


@pytest.fixture(scope="module")
def families() -> list[Family]:
    return list(load_catalog(EXAMPLE_FAMILIES).families)


CLUSTER = "Cassandra.Example.COM:9042"
"""``COUNTERS_ASSET_CLUSTER`` for the bag: asset URIs carry it, lower-cased."""


def table_uri(keyspace: str, table: str) -> str:
    return f"cassandra://cassandra.example.com:9042/{keyspace.lower()}/{table.lower()}"


@pytest.fixture(scope="module")
def bag(families: list[Family]) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COUNTERS_ASSET_CLUSTER", CLUSTER)
        return parse(mp, EXAMPLE_FAMILIES)


def test_no_import_errors(bag: Any) -> None:
    assert bag.import_errors == {}


def test_one_dag_per_family_plus_freshness_cleanup_and_the_example(
    bag: Any, families: list[Family]
) -> None:
    example = {"counters_example_after_trades"}  # the demo YAML has `trades`
    fixed = {"counters_freshness", "counters_metadata_cleanup"}
    assert set(bag.dag_ids) == {f.dag_id for f in families} | fixed | example
    freshness = bag.dags["counters_freshness"]
    assert [t.task_id for t in freshness.tasks] == ["check_freshness"]  # one task, every family
    assert all(f"`{f.name}`" in freshness.doc_md for f in families)


def test_each_family_reads_its_raw_table_and_updates_its_compact_table_asset(
    bag: Any, families: list[Family], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The assets the UI's graph draws raw -> compact with, and downstream DAGs schedule on:
    ``run`` reads the raw table and announces its update of the compact table through the
    family's alias (in the mapped shape it cannot list the table: it succeeds before a larger
    run compacted anything; there ``record_audit`` updates the table)."""
    mapped = mapped_bag(tmp_path, monkeypatch)
    for family in families:
        raw = table_uri(family.keyspace, family.raw_table)
        compact = table_uri(family.keyspace, family.compact_table)
        for dag in (bag.dags[family.dag_id], mapped.dags[family.dag_id]):
            run = dag.task_dict["run"]
            assert [a.uri for a in run.inlets] == [raw]
            assert [type(a).__name__ for a in run.outlets] == ["AssetAlias"]
            assert run.outlets[0].name == f"counters_compacted_{family.name}"
        dag = mapped.dags[family.dag_id]
        audit = dag.task_dict["record_audit"]
        assert [a.uri for a in audit.inlets] == [raw]
        assert [a.uri for a in audit.outlets] == [compact]
        for task_id in ("compact", "verify", "cleanup"):
            assert not dag.task_dict[task_id].outlets, f"{task_id} must not update an asset"


def test_the_example_consumer_is_scheduled_on_the_compact_table(bag: Any, families) -> None:
    trades = next(f for f in families if f.name == "trades")
    dag = bag.dags["counters_example_after_trades"]
    uri = table_uri(trades.keyspace, trades.compact_table)
    assert [a.uri for a in dag.timetable.asset_condition.objects] == [uri]
    assert dag.max_active_runs == 1 and "example" in dag.tags


def test_a_bad_asset_cluster_is_an_import_error_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COUNTERS_ASSET_CLUSTER", "cassandra.example.com/9042")
    errors = parse(monkeypatch, EXAMPLE_FAMILIES).import_errors
    assert errors, "a bad COUNTERS_ASSET_CLUSTER must not build DAGs with wrong assets"
    for error in errors.values():
        assert "COUNTERS_ASSET_CLUSTER" in error and "cassandra.example.com/9042" in error


def test_dags_are_configured_as_their_family(bag: Any, families: list[Family]) -> None:
    for family in families:
        dag = bag.dags[family.dag_id]
        where = f"{dag.dag_id} in {dag.fileloc}"
        assert dag.timetable.expression == family.schedule, where
        assert dag.catchup is family.catchup, where
        assert dag.max_active_runs == 1, where
        assert {"counters", family.kind.value, *family.tags} <= set(dag.tags), where
        assert dag.params["epoch"] is None and dag.params["dry_run"] is False, where
        assert dag.params.get_param("epoch").schema["type"] == ["null", "string"]
        assert f"{family.keyspace}.{family.raw_table}" in dag.doc_md, where
        assert f"{family.keyspace}.{family.compact_table}" in dag.doc_md, where
        assert f"| lag | {family.lag}:" in dag.doc_md, where
        assert "Read rule" in dag.doc_md, where


def mapped_bag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example families in the mapped shape (``shard_tasks: true``)."""
    entries = yaml.safe_load(EXAMPLE_FAMILIES.read_text())["families"]
    for entry in entries:
        entry["shard_tasks"] = True
    monkeypatch.setenv("COUNTERS_ASSET_CLUSTER", CLUSTER)
    return parse(monkeypatch, write_families(tmp_path / "mapped.yaml", entries))


def check_retries(dag: Any, family: Family) -> None:
    for task in dag.tasks:
        where = f"{dag.dag_id}.{task.task_id} in {dag.fileloc}"
        assert task.retries >= 2, f"{where} must have task retries >= 2"
        assert task.retry_exponential_backoff > 1, where
        assert task.owner == family.owner, where
        assert task.retry_policy is not None, where
        assert task.on_failure_callback, f"{where} must alert on failure"


def test_task_graph_and_retry_policy_of_the_one_task_shape(
    bag: Any, families: list[Family]
) -> None:
    """The default shape: ``run`` alone, started from the trigger with the family's own
    configuration (the triggerer reads no YAML), resumed on a worker by ``resume``; a plain
    operator without template fields."""
    from airflow.serialization.decoders import smart_decode_trigger_kwargs
    from airflow.serialization.serialized_objects import BaseSerialization
    from counters.airflow.factory import TRIGGER_CLASS

    for family in families:
        assert not family.shard_tasks
        dag = bag.dags[family.dag_id]
        assert {t.task_id: set(t.upstream_task_ids) for t in dag.tasks} == {"run": set()}
        run = dag.task_dict["run"]
        assert run.template_fields == ()
        assert run.start_from_trigger is True
        args = run.start_trigger_args
        assert (args.trigger_cls, args.next_method) == (TRIGGER_CLASS, "resume")
        wire = json.loads(json.dumps(BaseSerialization.serialize(args.trigger_kwargs)))
        kwargs = smart_decode_trigger_kwargs(wire)
        assert Family.model_validate(kwargs["family"]) == family
        check_retries(dag, family)


def test_task_graph_and_retry_policy_of_the_mapped_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, families: list[Family]
) -> None:
    bag = mapped_bag(tmp_path, monkeypatch)
    for family in families:
        dag = bag.dags[family.dag_id]
        upstream = {t.task_id: set(t.upstream_task_ids) for t in dag.tasks}
        assert upstream == {
            "run": set(),
            "compact": {"run"},
            "verify": {"run", "compact"},
            "cleanup": {"run", "verify"},
            "record_audit": {"run", "verify", "cleanup"},
        }
        assert not dag.task_dict["run"].start_from_trigger  # the mapped shape: on a worker
        check_retries(dag, family)
        assert dag.task_dict["compact"].is_mapped and dag.task_dict["cleanup"].is_mapped


def test_without_the_warm_pool_every_run_starts_on_a_worker(
    monkeypatch: pytest.MonkeyPatch, families: list[Family]
) -> None:
    monkeypatch.setenv("COUNTERS_WARM_POOL", "off")
    bag = parse(monkeypatch, EXAMPLE_FAMILIES)
    assert not any(bag.dags[f.dag_id].task_dict["run"].start_from_trigger for f in families)
    monkeypatch.setenv("COUNTERS_WARM_POOL", "sometimes")
    errors = parse(monkeypatch, EXAMPLE_FAMILIES).import_errors
    assert any(
        "COUNTERS_WARM_POOL must be 'on' or 'off', got 'sometimes'" in e for e in errors.values()
    )


def test_retry_policy_fails_checks_at_once_and_retries_the_rest(bag: Any, families) -> None:
    from airflow.sdk.definitions.retry_policy import RetryAction
    from counters import engine
    from counters.connection import CassandraUnavailable

    policy = bag.dags[families[0].dag_id].task_dict["run"].retry_policy

    def action(error: BaseException) -> RetryAction:
        return policy.evaluate(error, try_number=1, max_tries=4).action

    assert action(engine.ChecksFailed("x", [])) is RetryAction.FAIL
    assert action(engine.LeaseHeld("x")) is RetryAction.RETRY
    assert action(CassandraUnavailable("x")) is RetryAction.DEFAULT  # retries with backoff


def write_families(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"families": entries}, sort_keys=False))
    return path


def good(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "keyspace": "ks",
        "raw_table": f"{name}_raw",
        "compact_table": f"{name}_compact",
        "lag": "1m",
    }


def test_broken_family_is_one_import_error_naming_it_and_the_others_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {**good("broken"), "lag": "soon", "shards": 0}
    config = write_families(tmp_path / "f.yaml", [good("alpha"), broken, good("gamma")])

    bag = parse(monkeypatch, config)

    assert list(bag.import_errors) == [CHECK_FILE]
    message = bag.import_errors[CHECK_FILE]
    assert "1 counter family could not be loaded" in message
    assert "- broken:" in message and "field 'lag'" in message and "field 'shards'" in message
    assert "alpha" not in message and "gamma" not in message
    assert set(bag.dag_ids) == {
        "compact_alpha",
        "compact_gamma",
        "counters_freshness",
        "counters_metadata_cleanup",
    }
    # the freshness check still watches the broken family (found in the cluster by name)
    assert "| `broken` | entry does not load |" in bag.dags["counters_freshness"].doc_md


def test_unreadable_families_file_is_one_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "f.yaml"
    config.write_text("families: [unclosed\n")

    bag = parse(monkeypatch, config)

    assert list(bag.import_errors) == [CHECK_FILE]
    assert "malformed YAML" in bag.import_errors[CHECK_FILE]
    # the freshness DAG stays: its task fails, alerting the default channels (issue #49)
    assert sorted(bag.dag_ids) == ["counters_freshness", "counters_metadata_cleanup"]
    assert "The families YAML does not load" in bag.dags["counters_freshness"].doc_md


PARSE_PROBE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
heavy = ("great_expectations", "pandas", "cassandra.cluster", "counters.engine")
heavy = sorted(m for m in heavy if m in sys.modules)
import counters.airflow.runtime as runtime
print(json.dumps({
    "dags": sorted(bag.dag_ids),
    "errors": list(bag.import_errors),
    "seconds": time.perf_counter() - started,
    "heavy": heavy,
    "connected": runtime._connection is not None,
}))
"""


def test_parsing_is_cheap_and_honours_the_parsing_context(families: list[Family]) -> None:
    """A worker parsing for one DAG builds only that one; no GX/pandas import, not even the
    engine or the Cassandra driver (task bodies import them when they run), no connection (the
    Cassandra connection points at a closed port: any attempt would show)."""
    wanted = families[0].dag_id
    env = {
        **os.environ,
        "COUNTERS_CONFIG": str(EXAMPLE_FAMILIES),
        "_AIRFLOW_PARSING_CONTEXT_DAG_ID": wanted,
        "AIRFLOW_CONN_CASSANDRA_DEFAULT": json.dumps(
            {"conn_type": "cassandra", "host": "127.0.0.1", "port": 9}
        ),
    }
    out = subprocess.run(
        [sys.executable, "-c", PARSE_PROBE, str(DAGS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["dags"] == [wanted]
    assert probe["errors"] == []
    assert probe["heavy"] == [] and probe["connected"] is False
