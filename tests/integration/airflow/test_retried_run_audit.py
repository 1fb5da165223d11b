"""A run whose compact task is retried after its first attempt committed: the run's one audit
row accounts for every commit of the run, the earlier attempt's included (issue #49 item 4),
under Airflow's own retry of the task (``dag.test()``, real Cassandra)."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest
from counters.airflow import factory, tasks
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


class Failed(RuntimeError):
    """A transient failure of the task after its commits (the worker lost Cassandra): retried."""


def states(run: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ti in run.get_task_instances():
        out.setdefault(ti.task_id, []).append(str(getattr(ti.state, "value", ti.state)))
    return out


def test_a_retried_compact_tasks_earlier_commits_are_in_the_runs_audit_row(
    conn, make_families, dagbag, t0, monkeypatch
):
    """Shard 0's compact task commits a bucket, verifies it, and fails; Airflow retries it (no
    delay here); the retry carries the first attempt's counted rows into its own commit and
    folds the rest. The success row says what the run did: every row folded and deleted, the
    values' whole rise, every counter once. About 30 s (load 10 on 2 cores): one first run
    of a family (a sweep, so its phases are mapped tasks), GX included, one task retried."""
    monkeypatch.setattr(factory, "RETRY_DELAY", timedelta(0))
    families = make_families({"shards": 2}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    counters = [f"k{i}" for i in range(40)]
    client.record(
        [
            Increment((c,), i + 1, utc_aware(t0 + timedelta(minutes=1, seconds=i)), ("w", i))
            for c in counters
            for i in range(3)
        ]
    )  # 120 rows, each counter 1 + 2 + 3 = 6: the values rise by 240
    epoch = t0 + timedelta(minutes=5)
    failed: list[str] = []

    def fail_once_after_a_verified_bucket(point: str) -> None:
        if point == "verify" and not failed:
            failed.append(point)
            raise Failed("the worker lost its connection after a bucket was verified")

    dag = dagbag().dags[family.dag_id]
    with tasks.fault_hook(fail_once_after_a_verified_bucket):
        run = dag.test(logical_date=(epoch + family.lag).replace(tzinfo=UTC))

    assert run.state == "success", states(run)
    assert failed and sorted(states(run)["compact"]) == ["success", "success"]
    tries = {
        ti.map_index: ti.try_number for ti in run.get_task_instances() if ti.task_id == "compact"
    }
    assert sorted(tries.values()) == [1, 2], tries  # one shard's task was retried
    assert {v.counter[0]: v.value for v in client.read_many(counters)} == dict.fromkeys(counters, 6)
    [row] = [a for a in store.audit.page(5) if a["run_id"] == run.run_id]
    assert row["outcome"] == "success"
    assert (row["rows_folded"], row["sum_folded"], row["rows_deleted"]) == (120, 240, 120), row
    assert row["counters"] == 40, row
    assert not any(store.raw.read_rows([(c,)])[(c,)] for c in counters)
