"""The orchestration benchmark's pure parts: process kinds, CPU attribution, delays, families."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from counters.config import parse_catalog

from bench import orchestration as orch

pytestmark = [pytest.mark.unit, pytest.mark.bench]


def test_kind_of_airflow_process_titles():
    assert orch.kind_of("airflow worker -- LocalExecutor: <idle>") == "executor workers"
    assert orch.kind_of("airflow task runner: compact_x plan run 1") == "task processes"
    assert orch.kind_of("/venv/bin/python /venv/bin/airflow scheduler") == "scheduler"
    assert orch.kind_of("/venv/bin/airflow dag-processor") == "dag processor"
    assert orch.kind_of("/venv/bin/airflow api-server") == "api server"
    assert orch.kind_of("java ... org.apache.cassandra.service.CassandraDaemon") == "cassandra"
    assert orch.kind_of("counters warm pool: f_trades") == "warm pool"
    assert orch.kind_of("python -c from multiprocessing.resource_tracker import main") == (
        "warm pool"
    )
    assert orch.kind_of("bash") == "other"


def test_cpu_by_kind_counts_own_time_and_reaped_children_once():
    before = {
        1: orch.Proc(1, 0, "scheduler", 10.0, 0.0),
        2: orch.Proc(2, 1, "executor workers", 1.0, 5.0),
        3: orch.Proc(3, 2, "task processes", 0.5, 0.0),  # ends in the window: reaped by 2
    }
    after = {
        1: orch.Proc(1, 0, "scheduler", 12.5, 0.0),
        2: orch.Proc(2, 1, "executor workers", 1.5, 9.0),
        4: orch.Proc(4, 2, "task processes", 0.7, 0.0),  # born in the window, still running
    }
    cpu = orch.cpu_by_kind(before, after)
    assert cpu == {"task processes": 4.7, "scheduler": 2.5, "executor workers": 0.5}


def test_delays_are_measured_from_the_data_interval_end():
    end = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    runs = [
        orch.RunRow(
            "compact_orch000",
            "success",
            end + timedelta(minutes=i),
            end + timedelta(minutes=i, seconds=2 + i),
            end + timedelta(minutes=i, seconds=10 + i),
            end + timedelta(minutes=i, seconds=3 + i),
            1,
        )
        for i in range(3)
    ]
    found = orch.delays(runs)
    assert found["start_delay_s"] == {"p50": 3.0, "p99": 4.0, "max": 4.0}
    assert found["first_task_queued_delay_s"]["max"] == 5.0
    assert found["run_duration_s"]["p50"] == 8.0
    assert orch.delays([])["start_delay_s"]["p50"] is None


def test_families_yaml_is_a_valid_catalog():
    import yaml

    catalog = parse_catalog(yaml.safe_load(orch.families_yaml(3, 2)), Path("bench.yaml"))
    assert [f.name for f in catalog.families] == ["orch000", "orch001", "orch002"]
    assert {f.shards for f in catalog.families} == {2}
    assert {f.schedule for f in catalog.families} == {"* * * * *"}
    assert {f.shard_tasks for f in catalog.families} == {False}  # the default shape
    mapped = yaml.safe_load(orch.families_yaml(2, 2, shard_tasks=True))
    assert {f.shard_tasks for f in parse_catalog(mapped, Path("b.yaml")).families} == {True}


def test_read_proc_of_this_process():
    proc = orch.read_proc(os.getpid())
    assert proc is not None and proc.own_s >= 0 and proc.ppid == os.getppid()
