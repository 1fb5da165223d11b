"""``counters_metadata_cleanup``: ``airflow db clean`` deletes the metadata older than the
retention and keeps the rest, on the test's metadata DB."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest
from counters.airflow import metadata
from counters.airflow.metadata import DB_ACCESS_BLOCKED

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def add_log(event: str, when: datetime) -> None:
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    with create_session() as session:
        row = Log(event=event)
        row.dttm = when
        session.add(row)


def events(prefix: str) -> list[str]:
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(Log.event).filter(Log.event.like(f"{prefix}%")).all()
    return sorted(event for (event,) in rows)


def test_cleanup_deletes_rows_past_retention_and_keeps_recent_ones(dagbag, monkeypatch):
    prefix = f"counters_test_{secrets.token_hex(3)}"
    now = datetime.now(UTC)
    add_log(f"{prefix}_old", now - timedelta(days=30))
    add_log(f"{prefix}_edge", now - timedelta(days=9, hours=1))
    add_log(f"{prefix}_recent", now - timedelta(days=8, hours=23))
    monkeypatch.setenv("COUNTERS_METADATA_RETENTION_DAYS", "9")
    dag = dagbag().dags["counters_metadata_cleanup"]
    # in a real task process Airflow 3 puts this placeholder where the DB's URL was
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", DB_ACCESS_BLOCKED)

    run = dag.test()

    assert run.state == "success"
    assert events(prefix) == [f"{prefix}_recent"]
    (ti,) = run.get_task_instances()
    result = ti.xcom_pull(task_ids="clean_metadata")
    assert result["retention_days"] == 9
    cutoff = datetime.fromisoformat(result["clean_before"])
    assert timedelta(days=9) <= now - cutoff + timedelta(minutes=5) < timedelta(days=9, hours=1)


def test_a_bad_retention_fails_the_run_naming_the_setting_and_deletes_nothing(dagbag, monkeypatch):
    prefix = f"counters_test_{secrets.token_hex(3)}"
    add_log(f"{prefix}_old", datetime.now(UTC) - timedelta(days=300))
    monkeypatch.setenv("COUNTERS_METADATA_RETENTION_DAYS", "two weeks")

    run = dagbag().dags["counters_metadata_cleanup"].test()

    assert run.state == "failed"
    assert events(prefix) == [f"{prefix}_old"]
    with pytest.raises(ValueError, match="COUNTERS_METADATA_RETENTION_DAYS must be a whole"):
        metadata.clean_metadata()  # what the task raised, and its log shows
