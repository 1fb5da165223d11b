"""The metadata cleanup's pure parts: the retention setting, the CLI command, its environment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from counters.airflow.metadata import (
    DB_ACCESS_BLOCKED,
    db_clean_command,
    db_clean_env,
    metadata_retention,
)

pytestmark = pytest.mark.unit


def test_retention_defaults_to_14_days_and_refuses_what_is_not_whole_days() -> None:
    assert metadata_retention({}) == timedelta(days=14)
    assert metadata_retention({"COUNTERS_METADATA_RETENTION_DAYS": " 30 "}) == timedelta(days=30)
    for bad in ("0", "-3", "2w", "1.5"):
        with pytest.raises(ValueError, match=f"COUNTERS_METADATA_RETENTION_DAYS .* got '{bad}'"):
            metadata_retention({"COUNTERS_METADATA_RETENTION_DAYS": bad})


def test_command_cleans_every_table_before_the_cutoff_without_archive_or_prompt() -> None:
    before = datetime(2026, 11, 12, 3, 17, tzinfo=UTC)
    assert db_clean_command("/venv/bin/python", before) == [
        "/venv/bin/python",
        "-m",
        "airflow",
        "db",
        "clean",
        "--clean-before-timestamp",
        "2026-11-12T03:17:00.000Z",
        "--skip-archive",
        "--yes",
        "--error-on-cleanup-failure",
    ]


def test_env_drops_only_the_task_placeholder_for_the_db_url() -> None:
    blocked = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": DB_ACCESS_BLOCKED,
        "AIRFLOW__CORE__SQL_ALCHEMY_CONN": DB_ACCESS_BLOCKED,
        "AIRFLOW_HOME": "/opt/airflow",
    }
    assert db_clean_env(blocked) == {"AIRFLOW_HOME": "/opt/airflow"}
    real = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://db/airflow"}
    assert db_clean_env(real) == real
