"""The benchmark's pure parts: data generation, percentiles, exactness, ratios and targets."""

from __future__ import annotations

import json
from collections import namedtuple
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from counters.compaction.common import cluster_micros
from counters.config import parse_catalog
from counters.core import utc_aware

from bench import dags as bench_dags
from bench import params as bench_params
from bench import report as bench_report
from bench.kinds import KINDS, KindContext
from bench.ops import (
    Dataset,
    compare,
    engine_step_failed_in,
    node_background_tasks,
    percentile,
    wait_for_quiet_node,
)

pytestmark = [pytest.mark.unit, pytest.mark.bench]


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([3.0], 99) == 3.0


def test_a_failed_engine_step_is_named_by_its_module_and_function():
    """The limits section's ``failed_in``: the innermost engine step an error passed through."""
    with pytest.raises(AttributeError) as in_step:
        cluster_micros("not a store")  # type: ignore[arg-type]
    assert engine_step_failed_in(in_step.value) == "common.cluster_clock"
    with pytest.raises(ValueError) as elsewhere:
        int("x")
    assert engine_step_failed_in(elsewhere.value) is None


def test_dataset_rows_are_at_or_below_epoch_and_totals_match_events():
    data = Dataset("c", counters=7, rows=4, t0=datetime(2026, 1, 1))
    events = data.events(list(data.indexes()))
    assert len(events) == data.row_count == 28
    assert all(e.time <= utc_aware(data.epoch) for e in events)  # the write API's aware form
    totals: dict[tuple, int] = {}
    for e in events:
        totals[e.counter] = totals.get(e.counter, 0) + e.increment
    assert totals == data.expected()
    assert len({(e.counter, e.time, e.identity) for e in events}) == 28  # no duplicate rows


def test_compare_flags_mismatch_missing_and_leftovers():
    expected = {("a",): 1, ("b",): 2, ("c",): 3}
    assert compare(expected, dict(expected), 0).exact
    off = compare(expected, {("a",): 1, ("b",): 5}, 0)
    assert (off.mismatches, off.missing, off.exact) == (1, 1, False)
    assert not compare(expected, dict(expected), 1).exact


def test_ratios_and_targets_from_partial_results():
    results = {
        "scan_floor": {"rows_per_s": 400_000},
        "compaction": {"ok": True, "rows_per_s": 100_000, "seconds": 10.0,
                       "seconds_per_1M_rows": 10.0},
        "naive": {"seconds": 50.0},
    }  # fmt: skip
    ratios = bench_report.ratios(results)
    assert ratios["compaction_over_scan_floor"] == 4.0  # 4x the time of one read of the rows
    assert ratios["naive_over_compaction"] == 5.0
    assert ratios["p99_compacted_over_fresh"] is None
    targets = bench_report.targets(ratios)
    assert targets["compaction_over_scan_floor"]["met"] is True
    assert targets["naive_over_compaction"]["met"] is False
    assert targets["compaction_seconds_per_1M_rows"]["met"] is True
    assert targets["idle_heavy_over_active_only"]["met"] is None
    report = {
        "started_at": "now",
        "machine": {"cpus": 2},
        "results": {"dag_parse": bench_dags.measure([1], dags_folder=Path("/nonexistent"))},
        "ratios": ratios,
        "targets": targets,
    }
    text = bench_report.table(report)
    assert "dags folder not present" in text and "MISSED" in text


def test_generated_families_file_is_valid():
    catalog = parse_catalog(bench_dags.families_yaml(12), Path("generated.yaml"))
    assert len(catalog.families) == 12


def test_increments_line_tolerates_missing_sections():
    """The increments line reuses the compaction and reads sections; without them it says so."""
    ctx = KindContext(conn=None, keyspace="k", params=bench_params.Params(), results={})
    line = KINDS["increments"](ctx)
    assert line.kind == "increments" and "compaction, reads" in line.note
    assert line.compaction_rows_per_s is None and line.p99_ratio is None


def test_every_family_kind_has_a_bench_line():
    from counters.config import Kind

    assert set(KINDS) == {kind.value for kind in Kind}


def test_smoke_params_are_small():
    params = bench_params.parse_args(["--smoke", "--only", "scan"])
    assert params.smoke and params.counters <= 1000 and params.only == ("scan",)
    params = bench_params.parse_args(["--counters", "5", "--families", "1,2"])
    assert params.counters == 5 and params.families == (1, 2)


def test_a_profile_without_pyinstrument_is_refused_before_any_work(monkeypatch, capsys):
    """pyinstrument is not in requirements.txt: the bench says so at once, not after the load."""
    real = bench_params.importlib.util.find_spec
    monkeypatch.setattr(
        bench_params.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyinstrument" else real(name, *a),
    )
    with pytest.raises(SystemExit) as exit_:
        bench_params.parse_args(["--only", "compaction", "--profile"])
    assert exit_.value.code == 2
    assert "--profile needs pyinstrument" in capsys.readouterr().err


def test_node_samples_are_told_apart_by_their_frames():
    from bench.nodeprofile import kind_of, samples

    text = """
jdk.ExecutionSample {
  startTime = 10:27:45.101
  sampledThread = "Native-Transport-Requests-3" (javaThreadId = 45)
  stackTrace = [
    org.apache.cassandra.db.rows.Cell.valueSize() line: 9
    org.apache.cassandra.service.paxos.PaxosState.applyCommit(Commit) line: 3
    org.apache.cassandra.cql3.statements.BatchStatement.execute(QueryState) line: 4
  ]
}
jdk.ExecutionSample {
  sampledThread = "CompactionExecutor:2" (javaThreadId = 60)
  stackTrace = [
    org.apache.cassandra.io.util.BufferedDataOutputStreamPlus.write(byte[]) line: 7
  ]
}
jdk.ExecutionSample {
  sampledThread = "MutationStage-1" (javaThreadId = 61)
  stackTrace = [
    org.apache.cassandra.db.ReadResponse$LocalDataResponse.build(X) line: 1
    org.apache.cassandra.service.StorageProxy$LocalReadRunnable.runMayThrow() line: 2
  ]
}
"""
    found = [kind_of(t, f) for t, f in samples(text.splitlines())]
    assert found == [
        "paxos: conditional batches, leases",  # before the batch that carries it
        "background: compaction",
        "reads: iterating and serializing rows",  # a pooled thread: by its frames
    ]
    assert kind_of("Native-Transport-Requests-1", ["java.lang.Thread.run"]) == "other"


def test_the_node_cpu_a_profile_stands_for_leaves_jit_and_gc_out():
    from bench.nodeprofile import sampled_cpu_s
    from bench.ops import Meter

    meter = Meter(server_cpu_s=20.0)
    meter.server_threads = {"request stages": 10.0, "C2 CompilerThre": 2.0, "GC Thread": 1.0}
    meter.server_threads |= {"G1 Conc": 0.5, "CompactionExecu": 3.0}
    assert sampled_cpu_s(meter) == 16.5
    assert sampled_cpu_s(Meter()) is None  # a remote node: no CPU figure


Pool = namedtuple("Pool", "name active_tasks pending_tasks")


class _Node:
    """What ``system_views`` answers of a node that compacts for ``busy`` more polls."""

    def __init__(self, busy: int):
        self.busy = busy
        self.session = self

    def execute(self, query: str) -> list:
        if "sstable_tasks" in query:
            return [("compaction",)] if self.busy else []
        self.busy = max(0, self.busy - 1)
        return [
            Pool("CompactionExecutor", 1 if self.busy else 0, 2 if self.busy else 0),
            Pool("MemtableFlushWriter", 0, 0),
            Pool("ReadStage", 5, 9),  # requests, not left-over work
        ]


def test_the_quiet_node_wait_ends_when_compactions_and_flushes_do():
    assert node_background_tasks(_Node(0)) == 0
    assert node_background_tasks(_Node(3)) == 4  # 1 active + 2 pending + 1 SSTable task
    node = _Node(3)
    waited = wait_for_quiet_node(node, most_s=5, poll_s=0.01)
    assert node.busy == 0 and 0.015 < waited < 1
    assert wait_for_quiet_node(_Node(10**9), most_s=0.05, poll_s=0.01) < 0.5  # bounded


def test_a_result_file_is_never_written_over(tmp_path):
    """A file at ``--out`` is kept as it was: refused before any work, and one that appears
    during the run leaves the new results beside it, under the run's start time."""
    kept = tmp_path / "kept.json"
    kept.write_text('{"kept": true}')
    with pytest.raises(SystemExit) as refused:
        bench_params.parse_args(["--only", "dags", "--out", str(kept)])
    assert refused.value.code == 2
    started = datetime(2026, 11, 26, 21, 5, 7, tzinfo=UTC)
    written = bench_report.write_new(kept, {"new": True}, started)
    again = bench_report.write_new(kept, {"newer": True}, started)
    assert kept.read_text() == '{"kept": true}'
    assert written.name == "kept-2026-11-26T210507Z.json"
    assert again.name == "kept-2026-11-26T210507Z-2.json"
    assert json.loads(written.read_text()) == {"new": True}
    assert json.loads(again.read_text()) == {"newer": True}


def test_a_result_is_named_by_its_start_commit_and_sections():
    started = datetime(2026, 11, 26, 22, 5, 7, tzinfo=timezone(timedelta(hours=1)))
    name = bench_report.result_name(started, "abc1234", ("scan", "compaction"))
    assert name == "2026-11-26T210507Z-abc1234-scan-compaction.json"
    assert bench_report.result_name(started, None, bench_params.SECTIONS).endswith("-all.json")
    assert bench_params.parse_args(["--only", "dags"]).out is None  # named when the run starts
