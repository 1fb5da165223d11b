"""`python -m bench --smoke` against the real node: the report's structure, every
measured figure present and positive, compaction totals exact. No timing assertions. The smoke
runs every section's code once at tiny sizes (one scaling size, two steady rounds, one DAG
parse size, each compaction's shards in its worker process), without ``--node-profile``:
tests/bench/test_bench_node.py records the node over one harness compaction instead of one
recording per run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.required import STEPS as REQUIRED_STEPS

pytestmark = [pytest.mark.integration, pytest.mark.bench]

PROJECT = Path(__file__).resolve().parents[2]


def _positive(report: dict, path: str) -> float:
    value: object = report
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"{path}: missing {part!r}"
        value = value[part]
    assert isinstance(value, int | float) and not isinstance(value, bool), f"{path}: {value!r}"
    assert value > 0, f"{path} = {value}"
    return value


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, cassandra_contact) -> tuple[dict, str]:
    hosts, port = cassandra_contact
    out = tmp_path_factory.mktemp("bench") / "report.json"
    env = {**os.environ, "CASSANDRA_HOSTS": ",".join(hosts), "CASSANDRA_PORT": str(port)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_report_structure(smoke):
    """Minutes, not seconds: the smoke runs every section of the bench once (about a dozen
    compactions, each in a worker process that imports the package, connects and warms the GX
    suite first), because only that proves the bench's own code still runs end to end; the
    sizes are the smallest each section accepts."""
    report, stdout = smoke
    for key in ("started_at", "command", "machine", "code", "params", "cassandra", "results"):
        assert key in report
    assert report["machine"]["cpus"] >= 1
    assert "errors" not in report["results"], report["results"].get("errors")
    for section in (
        "load", "scan_floor", "required", "naive", "compaction", "scaling", "steady", "idle",
        "read_latency", "limits", "probes", "dag_parse", "kinds", "audit", "archive",
    ):  # fmt: skip
        assert section in report["results"], section
    assert set(report["ratios"]) >= {
        "compaction_over_scan_floor",
        "naive_over_compaction",
        "idle_heavy_over_active_only",
        "p99_compacted_over_fresh",
    }
    assert set(report["targets"]) == {
        "compaction_over_scan_floor",
        "naive_over_compaction",
        "idle_heavy_over_active_only",
        "p99_compacted_over_fresh",
        "compaction_seconds_per_1M_rows",
        "dag_parse_s_100_families",
        "archive_over_plain",
    }
    assert "ratios and targets:" in stdout
    assert "3. compaction (engine.run_family)" in stdout


def test_every_figure_is_present_and_positive(smoke):
    report, _ = smoke
    r = {"r": report["results"], "q": report["ratios"]}
    for path in (
        "r.load.write_path.rows_per_s",
        "r.scan_floor.seconds",
        "r.scan_floor.rows_per_s",
        "r.naive.seconds",
        "r.naive.rows_per_s",
        "r.compaction.seconds",
        "r.compaction.rows_per_s",
        "r.compaction.client_cpu_s",
        "r.compaction.rss_peak_kb",
        "r.compaction.requests_per_counter",
        "r.compaction.next_run.seconds",
        "r.compaction.next_run.client_cpu_s",
        "q.next_run_over_scan_floor",
        "r.idle.active_only.seconds",
        "r.idle.idle_heavy.seconds",
        "r.idle.idle_heavy_recent_forgets.seconds",
        "r.idle.idle_heavy.rss_peak_kb",
        "q.compaction_over_scan_floor",
        "r.required.total.seconds",
        "r.required.total.client_cpu_s",
        "r.required.total.server_cpu_s",
        "q.required_over_scan_floor",
        "q.required_cpu_over_scan_floor_cpu",
        "q.compaction_cpu_over_required_cpu",
        "q.naive_over_compaction",
        "q.idle_heavy_over_active_only",
        "q.p99_compacted_over_fresh",
        "q.p99_uncompacted_over_fresh",
        "q.compaction_seconds_per_1M_rows",
        "r.kinds.increments.compaction_rows_per_s",
        "r.kinds.increments.read_p99_compacted_ms",
        "r.kinds.rows.compaction_rows_per_s",
        "r.kinds.rows.read_p99_compacted_ms",
        "r.kinds.rows.read_p99_fresh_ms",
        "r.kinds.unique.compaction_rows_per_s",
        "r.kinds.unique.read_p99_compacted_ms",
        "r.kinds.unique.read_p99_fresh_ms",
        "r.kind_details.unique.load.members_per_s",
    ):
        _positive(r, path)
    for name in ("compacted", "uncompacted", "fresh"):
        for stat in ("p50_ms", "p99_ms", "mean_ms"):
            _positive(r, f"r.read_latency.counters.{name}.{stat}")
    probes = {**report["results"]["probes"]["commit"], **report["results"]["probes"]["fold_io"]}
    for name, probe in probes.items():
        if isinstance(probe, dict):
            assert probe["rows_per_s"] > 0, name
    assert report["results"]["probes"]["fold_io"]["reads_complete"]
    for name, probe in report["results"]["probes"]["fold_io"].items():
        if name.startswith("delete_"):
            assert probe["rows_left"] == 0, name
    assert all(v > 0 for v in report["results"]["compaction"]["phases_s"].values() if v)
    # each measured step started on a node done with the earlier steps' compactions and flushes
    for run in (report["results"]["compaction"], report["results"]["compaction"]["next_run"]):
        assert 0 <= run["quiet_wait_s"] <= 61, run["quiet_wait_s"]
    assert len(report["results"]["scan_floor"]["quiet_wait_s"]) == report["params"]["scan_repeats"]
    # no node profile without --node-profile (test_bench_node.py records one)
    assert "node_profile" not in report["results"]["compaction"]
    parse = report["results"]["dag_parse"]
    if parse["status"] == "measured":
        for n, size in parse["sizes"].items():
            assert "error" not in size, size
            assert size["parse_s"] > 0 and size["dags"] >= int(n), (n, size)
            assert not size["import_errors"], size["import_errors"]
    else:
        assert parse["status"] == "dags folder not present"


def test_required_work_did_every_step_over_the_whole_data_set(smoke):
    """The design's floor is only a floor if every step did all of its work: every row read,
    recounted and deleted, every counter committed and its copy read back."""
    report, stdout = smoke
    required, load = report["results"]["required"], report["results"]["load"]
    assert required["complete"], required
    assert required["rows_read"] == required["rows_recounted"] == load["rows"]
    assert required["rows_deleted"] == load["rows"]
    assert required["counters_committed"] == required["copies_read_back"] == load["counters"]
    for step in REQUIRED_STEPS:
        assert required[step]["seconds"] > 0, step
    total = required["total"]
    assert total["seconds"] == pytest.approx(
        sum(required[step]["seconds"] for step in REQUIRED_STEPS), abs=0.01
    )
    assert "1b. required work (engine primitives only)" in stdout


def test_compaction_totals_are_exact(smoke):
    report, _ = smoke
    r = report["results"]
    rows = r["load"]["rows"]
    compaction = r["compaction"]
    assert compaction["ok"], compaction["error"]
    assert compaction["exactness"]["exact"], compaction["exactness"]
    assert compaction["exactness"]["counters_found"] == r["load"]["counters"]
    assert compaction["tally_matches"]
    assert compaction["tally"]["rows_folded"] == rows
    assert compaction["read_rule_sample_exact"]
    later = compaction["next_run"]  # the family's next run: a minute's run, not a sweep
    assert compaction["sweep"] is True and later["sweep"] is False
    assert later["ok"] and later["exactness"]["exact"], later["exactness"]
    assert later["exactness"]["counters_found"] == r["load"]["counters"]
    assert r["naive"]["exactness"]["exact"], r["naive"]["exactness"]
    for name, run in r["idle"].items():
        assert run["ok"], (name, run["error"])
        assert run["exactness"]["exact"], (name, run["exactness"])
        assert run["counters_committed"] == run["active_counters"], name
    assert r["scan_floor"]["rows"] == rows and r["scan_floor"]["sum_matches"]
    assert [run["counters"] for run in r["scaling"]["runs"]] == [100]
    assert all(run["ok"] and run["exact"] and run["requests"] > 0 for run in r["scaling"]["runs"])
    steady = r["steady"]["rounds"]  # run after run on one family, each checked exact
    assert [run["round"] for run in steady] == [0, 1]
    assert [run["sweep"] for run in steady] == [True, False]
    assert all(run["ok"] and run["exact"] for run in steady), steady
    assert [run["tombstones_per_counter_before"] for run in steady] == [0, 5]
    assert all(c["value_exact"] for c in r["read_latency"]["counters"].values())
    assert r["kinds"]["increments"]["exact"] is True
    for kind in ("rows", "unique"):
        assert r["kinds"][kind]["exact"] is True, r["kind_details"][kind]["exactness"]
        details = r["kind_details"][kind]
        assert details["tally"]["rows_folded"] == rows, details["tally"]
        assert all(c["value_exact"] for c in details["read_latency"].values()), kind
    assert r["kind_details"]["rows"]["exactness"]["business_rows_after"] == rows
    assert r["kind_details"]["rows"]["tally"]["rows_deleted"] == 0
    assert r["kind_details"]["unique"]["tally"]["rows_deleted"] == rows
    assert r["kind_details"]["unique"]["load"]["retried_members"] > 0
    assert r["limits"]["read_exact"]  # at the smoke size the hot counter folds normally
    assert all(fold["ok"] for fold in r["limits"]["folds"]), r["limits"]["folds"]


def test_bench_keyspace_is_dropped(smoke, cassandra_session):
    report, _ = smoke
    row = cassandra_session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (report["keyspace"],),
    ).one()
    assert row is None


def test_audit_trail_read_and_exported_across_its_months(smoke):
    report, stdout = smoke
    trail = report["results"]["audit"]
    assert trail["rows"] == 3000 and trail["months"] >= 1
    for path in (
        "family_page_newest.median_s",
        "export.csv.median_s",
        "export.parquet.median_s",
        "export.csv.result.rows",
        "export.parquet.result.bytes",
        "tablestats.month_partitions.partition_max_bytes",
        "tablestats.one_partition_per_family.partition_max_bytes",
    ):
        _positive(trail, path)
    assert trail["family_page_newest"]["result"] == 60  # a full page: health and 60 rows
    exported = trail["export"]["csv"]["result"]["rows"]
    assert exported == trail["export"]["parquet"]["result"]["rows"] == trail["month_rows"]
    assert "8. audit family page (health + 60 rows)" in stdout


def test_the_archive_section_runs_both_sides_exact_and_archives_every_row_once(smoke):
    report, stdout = smoke
    archive = report["results"]["archive"]
    assert len(archive["off"]) == len(archive["on"]) == archive["rounds"] == 1
    for run in archive["off"] + archive["on"]:
        assert run["ok"] and run["exactness"]["exact"], run
    [on] = archive["on"]
    assert on["archived_once"] and on["archived_rows"] == archive["rows"]
    assert on["recount_sample_equal"] and on["archive_files"] > 0
    _positive(report, "ratios.archive_over_plain")
    assert "archive on / off (medians)" in stdout
