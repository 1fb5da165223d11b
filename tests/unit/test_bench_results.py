"""docs/benchmarks.md's results table and the README's headline are generated from the kept
JSON results (``bench/results``), and say what they hold."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from bench import report, results

pytestmark = pytest.mark.unit


def test_the_docs_table_is_what_the_kept_results_say(capsys):
    assert results.load(), "bench/results/ holds no result"
    assert results.main(["--check"]) == 0, capsys.readouterr().err


def test_the_readme_headline_is_the_kept_results_figures(tmp_path):
    """The fastest and the latest 1M-row first run (a smaller run is not one), and the latest
    Airflow window."""
    machine = {"cpus": 2, "loadavg_at_start": [1.0]}
    million = {"rows": 1_000_000, "counters": 100000}
    engine = {"results": {"compaction": {"seconds": 14.2, **million}}}
    small = {"results": {"compaction": {"seconds": 7.6, "rows": 200_000, "counters": 20000}}}
    kept = [
        ("a.json", {"started_at": "1", "machine": machine, **engine}),
        (
            "b.json",
            {
                "started_at": "2",
                "machine": machine,
                "results": {"compaction": {"seconds": 29.4, **million}},
                "ratios": {"compaction_over_scan_floor": 20.2},
            },
        ),
        ("s.json", {"started_at": "2a", "machine": machine, **small}),
        (
            "c.json",
            {
                "started_at": "3",
                "families": 50,
                "active": {
                    "family_runs": 283,
                    "window": {"minutes": 6},
                    "airflow_cpu_s_per_family_run": 1.487,
                    "machine_busy_fraction": 0.784,
                },
            },
        ),
    ]
    text = results.headline(kept)
    assert "1M raw rows of 100,000 counters in 14 s at best, and 29 s (20x" in text
    assert "50 minute-families: 283 of 300 family-runs done in a 6-minute window" in text
    assert "1.49 CPU-s per family-run (the machine 78 % busy)" in text
    assert "No engine or Airflow result" in results.headline(kept[:2])
    kept[-1][1]["active"]["family_runs_finished"] = 281  # a run started is not a run done
    assert "281 of 300 family-runs done" in results.headline(kept)


def test_the_readme_keeps_within_its_cap():
    """A README a newcomer reads to the end: 250 lines at most (CONTRIBUTING.md); detail goes
    to docs/."""
    lines = results.README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines, over its cap of 250"


def test_every_kept_result_names_its_commit_machine_and_command():
    for name, result in results.load():
        assert result["code"]["commit"], name
        assert result["machine"]["cpus"], name
        assert result["command"].startswith(("python -m bench", "make bench-airflow")), name


def test_every_kept_result_is_named_by_its_start_time():
    """``<start>-<commit>-<sections>.json``, as the bench names its files: one name per run, so
    a later run is a new file beside the kept ones, never one written over them."""
    for name, result in results.load():
        start = datetime.fromisoformat(result["started_at"])
        head = f"{report.stamp(start)}-{result['code']['commit']}-"
        assert name.startswith(head), f"bench/results/{name}: not named {head}<sections>.json"


def test_a_result_becomes_a_column_and_absent_figures_no_row(tmp_path):
    result = {
        "started_at": "2026-11-25T20:00:00+00:00",
        "command": "python -m bench --only compaction",
        "code": {"commit": "abc1234", "dirty": []},
        "machine": {"cpus": 2, "loadavg_at_start": [0.5, 0.4, 0.3]},
        "results": {"compaction": {"seconds": 21.04, "client_cpu_s": 12.0, "server_cpu_s": 14.5}},
        "ratios": {"compaction_over_scan_floor": 6.93},
    }
    (tmp_path / "one.json").write_text(json.dumps(result))
    table = results.render(results.load(tmp_path))
    assert "[abc1234](../bench/results/one.json) 2026-11-25" in table
    assert "| 1M rows, first run (s) | 21.0 |" in table
    assert "| first run: client / node CPU (s) | 12.0 / 14.5 |" in table
    assert "| first run / scan floor | 6.9 |" in table
    assert "read of a compacted counter" not in table  # no such figure in this result


def test_the_table_is_replaced_between_its_markers_only():
    text = f"intro\n{results.BEGIN}\nold table\n{results.END}\nafter\n"
    assert results.rewrite(text, "new\n") == f"intro\n{results.BEGIN}\nnew\n{results.END}\nafter\n"
    with pytest.raises(SystemExit, match="markers"):
        results.rewrite("no markers here", "new\n")


def test_families_per_core_divide_a_busy_core_by_each_kinds_cost_per_run():
    """0.7 of a core's 60 CPU-s a minute over each kind's CPU-s per family-run: 100 runs that
    cost the task processes 84 CPU-s (0.84 each) leave room for 50 families on a core."""
    result = {
        "active": {
            "family_runs": 100,
            "airflow_cpu_by_kind_s": {"task processes": 84.0, "scheduler": 42.0},
            "cassandra_cpu_s": 21.0,
        }
    }
    assert results._families_per_core(result) == "50 / 100 / 200"
    result["active"]["airflow_cpu_by_kind_s"] = {"task processes": 84.0}
    assert results._families_per_core(result) == "50 / \N{EN DASH} / 200"
    assert results._families_per_core({"active": {}}) is None


def test_the_runs_work_is_the_task_processes_or_the_warm_pool_and_triggerer():
    """The two shapes compare: a run from the trigger is done by the warm pool and the
    triggerer, one on a worker by the task processes; the row sums both pairs."""
    trigger_shape = {
        "active": {
            "family_runs": 100,
            "airflow_cpu_by_kind_s": {"warm pool": 40.0, "triggerer": 12.0, "scheduler": 9.0},
            "cassandra_cpu_s": 42.0,
        }
    }
    assert results._work_cpu_s(trigger_shape) == 52.0
    assert results._families_per_core(trigger_shape) == "81 / 467 / 100"
    worker_shape = {"active": {"airflow_cpu_by_kind_s": {"task processes": 84.0}}}
    assert results._work_cpu_s(worker_shape) == 84.0
    assert results._work_cpu_s({"active": {"airflow_cpu_by_kind_s": {"scheduler": 1.0}}}) is None
