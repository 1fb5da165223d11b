"""``counterctl`` sends the DAGs' metrics where Airflow's metrics are configured: a run's from
the same function, whatever its outcome, and ``health``'s lags; a StatsD listener gets them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

from .test_scheduler_assets_metrics import StatsdListener

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def counterctl(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "counters", "--config", str(config), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_counterctl_sends_a_runs_metrics_and_the_lag_through_airflows_statsd(
    conn, make_families, t0, tmp_path
):
    families = make_families({}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    client = CounterClient(conn, family, Store(conn, family))
    client.record([Increment((f"K{i}",), i + 1, utc_aware(t0), ("w", i)) for i in range(12)])
    listener = StatsdListener()
    try:
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(tmp_path / "airflow"),  # no airflow.cfg: the variables say it
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",  # tags reach StatsD
            "PYTHONWARNINGS": "ignore",
        }
        epoch = (t0 + timedelta(minutes=5)).isoformat()
        done = counterctl(families.path, env, "compact", "--family", family.name, "--epoch", epoch)
        assert done.returncode == 0, done.stdout + done.stderr
        bad = counterctl(families.path, env, "compact", "--family", family.name, "--epoch", "soon")
        assert bad.returncode == 2  # refused before planning: no run, no metrics
        ahead = (t0 + timedelta(days=400)).isoformat()  # past the cluster's now: the plan refuses
        late = counterctl(families.path, env, "compact", "--family", family.name, "--epoch", ahead)
        assert late.returncode != 0 and "later than now - lag" in late.stderr, (
            late.stdout + late.stderr
        )
        health = counterctl(families.path, env, "health", "--family", family.name)
        assert health.returncode == 8  # its epoch is a day old: stale
        tag = {"family": family.name}

        def values(what: str, **tags: str) -> list[tuple[float, str]]:
            return listener.values(f"airflow.counters.{what}", **tag, **tags)

        for _ in range(100):  # sent before the commands exited; the reader thread may lag
            if (
                values("runs", outcome="success")
                and values("runs", outcome="failed")
                and len(values("lag_seconds")) == 2
            ):
                break
            time.sleep(0.1)
        assert values("runs", outcome="success") == [(1.0, "c")]
        assert values("rows_folded", outcome="success") == [(12.0, "c")]
        assert values("rows_deleted", outcome="success") == [(12.0, "c")]
        lags = values("lag_seconds")
        assert len(lags) == 2 and all(kind == "g" and lag > 86_000 for lag, kind in lags)
        epoch = (t0 + timedelta(minutes=5)).replace(tzinfo=UTC).timestamp()
        assert values("compacted_epoch_seconds") == [(epoch, "g")] * 2
        limit = (family.lag + family.freshness).total_seconds()
        # compact, the refused compact (no epoch: it moved nothing), health
        assert values("stale_after_seconds") == [(limit, "g")] * 3
        assert values("quarantined") == [(0.0, "g")] * 3  # a gauge: the count now
        # the refused run wrote no audit row; its RunOutcome still counts it, with no figures
        assert values("runs", outcome="failed") == [(1.0, "c")]
        assert values("rows_folded", outcome="failed") == [(0.0, "c")]
        assert not any(f".{family.name}." in line for line in listener.lines)  # no legacy names
    finally:
        listener.close()


def test_without_tags_each_family_gets_its_own_names_and_a_warning_says_so(
    conn, make_families, t0, tmp_path
):
    """Airflow's default StatsD (``statsd_on`` alone) drops tags: two families' gauges went to
    one series. Now each metric goes under its per-family name (which the shipped mapping turns
    into the same labelled series), none under the shared name, and the process warns once,
    on stderr. One ``counterctl`` process: it imports Airflow (about 10 s on an idle machine)."""
    from counters import engine

    families = make_families({}, {}, shape="mapped")
    one, two = (families.family(e["name"]) for e in families.entries)
    store = Store(conn, one)
    CounterClient(conn, one, store).record([Increment(("K",), 5, utc_aware(t0), ("w", 0))])
    engine.run_family(store, t0 + timedelta(minutes=5))  # in-process: no metrics here
    listener = StatsdListener()
    try:
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(tmp_path / "airflow"),
            "AIRFLOW__METRICS__STATSD_ON": "True",  # and nothing else: Airflow's default StatsD
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
            "PYTHONWARNINGS": "ignore",
        }
        env.pop("AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED", None)
        health = counterctl(families.path, env, "health")
        assert health.returncode == 8, health.stdout + health.stderr  # day-old epoch, never run
        assert health.stderr.count("StatsD gets no tags") == 1, health.stderr
        assert "StatsD" not in health.stdout  # the output stays the command's
        want = {
            f"airflow.counters.{one.name}.compacted_epoch_seconds",
            f"airflow.counters.{one.name}.stale_after_seconds",
            f"airflow.counters.{two.name}.stale_after_seconds",
            f"airflow.counters.{two.name}.quarantined",
        }
        for _ in range(100):  # sent before the command exited; the reader thread may lag
            names = {line.partition(":")[0] for line in listener.lines}
            if want <= names:
                break
            time.sleep(0.1)
        assert want <= names, sorted(names)
        epoch = (t0 + timedelta(minutes=5)).replace(tzinfo=UTC).timestamp()
        assert listener.values(f"airflow.counters.{one.name}.compacted_epoch_seconds") == [
            (epoch, "g")
        ]
        ours = {n for n in names if n.startswith("airflow.counters.")}
        shared = {n for n in ours if n.count(".") == 2}  # airflow.counters.<what>: no family
        assert not shared, shared
    finally:
        listener.close()
