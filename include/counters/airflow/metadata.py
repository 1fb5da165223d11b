"""Airflow's metadata DB as task code meets it: the placeholder URL Airflow 3 puts in a task
process (and the trigger runner) to keep task code off the DB, and the daily retention cleanup
(``counters_metadata_cleanup``: ``airflow db clean`` of what is older than the retention).

Light on purpose (the standard library only): the warm pool reads the placeholder here too.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..core import to_text

log = logging.getLogger(__name__)

METADATA_RETENTION_ENV = "COUNTERS_METADATA_RETENTION_DAYS"
DEFAULT_METADATA_RETENTION_DAYS = 14
"""How many days of Airflow metadata (runs, task instances, XComs, logs, ...) are kept: 100
minute-families write ~720k task-instance rows a day (five a run)."""
DB_ACCESS_BLOCKED = "airflow-db-not-allowed:///"
"""What Airflow 3's task supervisor sets the metadata DB's URL to in a task process
(``block_orm_access``), so task code cannot reach the DB."""
DB_URL_VARIABLES = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN")
DB_CLEAN_TIMEOUT_S = 3600


def metadata_retention(env: Mapping[str, str]) -> timedelta:
    """``$COUNTERS_METADATA_RETENTION_DAYS`` (whole days, at least 1), else 14 days."""
    text = (env.get(METADATA_RETENTION_ENV) or "").strip()
    if not text:
        return timedelta(days=DEFAULT_METADATA_RETENTION_DAYS)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(
            f"{METADATA_RETENTION_ENV} must be a whole number of days (at least 1), got {text!r}"
        )
    return timedelta(days=int(text))


def db_clean_command(python: str, before: datetime) -> list[str]:
    """``airflow db clean`` of every table for rows older than ``before`` (pure): no archive
    tables (they would keep what the cleanup removes), no prompt, and a failed table fails the
    command (by default it only logs and exits 0)."""
    return [
        python,
        "-m",
        "airflow",
        "db",
        "clean",
        "--clean-before-timestamp",
        to_text(before),
        "--skip-archive",
        "--yes",
        "--error-on-cleanup-failure",
    ]


def db_clean_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The CLI's environment (pure): the task's, without the placeholder URL Airflow 3 puts
    there to keep task code off the metadata DB, so the CLI finds the DB as the deployment
    configured it (``airflow.cfg``, ``*_CMD``, ``*_SECRET``). A real URL is left alone."""
    return {
        name: value
        for name, value in environ.items()
        if not (name in DB_URL_VARIABLES and value == DB_ACCESS_BLOCKED)
    }


@dataclass(frozen=True)
class MetadataCleaned:
    """What the daily cleanup deleted up to (its XCom, through ``core.codec``)."""

    clean_before: datetime
    retention_days: int


def clean_metadata(*, now: datetime | None = None) -> MetadataCleaned:
    """Delete Airflow metadata older than the retention, through ``airflow db clean`` (the CLI:
    Airflow has no public Python or REST API for it). Fails, naming the CLI's error, when the
    command does."""
    retention = metadata_retention(os.environ)
    before = (now or datetime.now(UTC)) - retention
    command = db_clean_command(sys.executable, before)
    log.info("cleaning Airflow metadata older than %s: %s", to_text(before), " ".join(command))
    done = subprocess.run(
        command,
        env=db_clean_env(os.environ),
        capture_output=True,
        text=True,
        timeout=DB_CLEAN_TIMEOUT_S,
        check=False,
    )
    for line in (done.stdout + done.stderr).splitlines():
        log.info("airflow db clean: %s", line)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(
            f"airflow db clean (rows before {to_text(before)}, retention "
            f"{METADATA_RETENTION_ENV}={retention.days}) exited {done.returncode}: "
            + " | ".join(tail)
        )
    return MetadataCleaned(before, retention.days)
