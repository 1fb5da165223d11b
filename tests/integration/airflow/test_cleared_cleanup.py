"""A run's cleanup task cleared and run again after an operator released a counter the run had
quarantined: it deletes nothing its archive does not hold (issue #49 item 4), under Airflow's
own task runner (``dag.test()``, then the cleared task instance run again, real Cassandra)."""

from __future__ import annotations

from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from counters import engine
from counters.airflow import tasks
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.recount import recount
from counters.store import Store

from tests.copies import change_copy

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def below(store: Store, counter: str, epoch: Any) -> int:
    """The counter's raw rows at or below ``epoch``."""
    f = store.family
    rows = store.statements.session.execute(
        f"SELECT modify_time FROM {f.keyspace}.{f.raw_table} WHERE type = %s", (counter,)
    )
    return sum(1 for (at,) in rows if at <= epoch)


def test_a_cleared_cleanup_after_a_release_keeps_the_rows_its_archive_left_out(
    conn, make_families, dagbag, t0, tmp_path: Path
):
    """The run quarantines IBM (its readers' copy changed under the run) and archives and
    deletes AAPL; record_audit fails (partial). The operator releases IBM, then clears the
    run's cleanup task, which runs again with the run's own inputs: IBM's rows, left out of
    the archive, stay (the next run archives them first), and the recount holds. About a
    minute under load: one mapped run with GX, and the task run again."""
    from airflow.sdk.definitions.dag import _run_task

    families = make_families({"shards": 1, "archive": str(tmp_path / "archive")}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    client.record(
        [
            Increment((c,), i + 1, utc_aware(t0 + timedelta(minutes=i)), ("w", i))
            for c in ("IBM", "AAPL")
            for i in range(10)
        ]
    )
    epoch = t0 + timedelta(minutes=10)
    compact = f"{family.keyspace}.{family.compact_table}"

    def tamper(point: str) -> None:
        row = conn.session.execute(f"SELECT value FROM {compact} WHERE type = 'IBM'").one()
        if point == "copy" and row is not None and row.value == 55:
            change_copy(conn.session, compact, "IBM", 999)

    dag = dagbag().dags[family.dag_id]
    with tasks.fault_hook(tamper):
        run = dag.test(logical_date=(epoch + family.lag).replace(tzinfo=UTC))
    assert run.state == "failed"
    assert (below(store, "IBM", epoch), below(store, "AAPL", epoch)) == (10, 0)
    engine.release(store, ("IBM",))
    [cleanup] = [ti for ti in run.get_task_instances() if ti.task_id == "cleanup"]
    cleanup.try_number += 1  # "Clear": the task instance runs again, its inputs the run's
    _run_task(ti=cleanup, task=dag.task_dict["cleanup"])
    assert str(getattr(cleanup.state, "value", cleanup.state)) == "success"
    assert below(store, "IBM", epoch) == 10  # left out of the archive: not deleted
    assert client.read("IBM") == 55 and client.read("AAPL") == 55
    report = recount(store)
    assert report.ok and not report.cannot_rebuild, [r.as_dict() for r in report.counters]
