"""What an audit row says beyond a run's counts: who did it, with which parameters, under which
code and configuration, and which month partition of the audit table keeps it (pure; the
reads and writes are ``store.auditlog.AuditLog``).

Every change to a family leaves a row: each compaction run (the DAG's, a backfill's, a manual
``counterctl compact``) and each operator action (``reset``, ``reconcile --repair``,
``quarantine --release``). The interface that starts the change says who (``Provenance``: the
Airflow user who triggered a DAG run, or ``cli``); the row adds the OS user and host of the
process that wrote it, the Cassandra role it wrote as, the code version and a hash of the
family's configuration.
"""

from __future__ import annotations

import getpass
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any

from .config import CHECKOUT, Family
from .core import utc_naive

PROJECT_ROOT = CHECKOUT
CODE_VERSION_ENV = "COUNTERS_CODE_VERSION"
"""Set by a deployment that ships the code without its git history (an image): the version
audit rows carry. Without it: the package version and ``git describe`` of the checkout."""
ANONYMOUS_ROLE = "anonymous"
"""What Cassandra calls a client without authentication (``AllowAllAuthenticator``)."""

MESSAGE_MAX = 2000
"""An audit row's message is cut here (a run's notes included, an operator's action's)."""
MAP_COLUMNS = frozenset({"archive"})
"""Columns written as CQL maps; every other dict or list is written as JSON text."""


class Action(StrEnum):
    """What an audit row records (column ``action``)."""

    COMPACT = "compact"
    RESET = "reset"
    RECONCILE_REPAIR = "reconcile-repair"
    QUARANTINE_RELEASE = "quarantine-release"
    RETIRE = "retire"


# --- month partitions ------------------------------------------------------------------------


def month_of(moment: datetime) -> str:
    """The audit partition of a row started at ``moment``: its UTC month, ``YYYY-MM``."""
    moment = utc_naive(moment)
    return f"{moment.year:04d}-{moment.month:02d}"


def month_start(month: str) -> datetime:
    """The first instant of a ``YYYY-MM`` month (naive UTC)."""
    try:
        year, number = (int(part) for part in month.split("-"))
        return datetime(year, number, 1)
    except ValueError:
        raise ValueError(f"audit month {month!r} is not YYYY-MM") from None


def next_month(month: str) -> str:
    start = month_start(month)
    return month_of((start + timedelta(days=32)).replace(day=1))


def month_overlaps(month: str, since: datetime | None, before: datetime | None) -> bool:
    """Whether the month holds any time in ``[since, before)`` (open ends when None)."""
    start, end = month_start(month), month_start(next_month(month))
    return (since is None or end > utc_naive(since)) and (
        before is None or start < utc_naive(before)
    )


# --- who, what version, what configuration -----------------------------------------------------


@dataclass(frozen=True)
class Provenance:
    """Who started a change and with what parameters, as the interface knows it.

    ``triggered_by``: ``cli`` (``counterctl``), or a DAG run's type (``scheduled``, ``manual``
    for a run triggered in the UI or the REST API, ``backfill``, ``asset_triggered``), or
    ``library`` (a program calling the engine directly). ``airflow_user``: the Airflow user who
    triggered the DAG run or backfill (None for the scheduler's own runs)."""

    triggered_by: str = "library"
    airflow_user: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


def config_fingerprint(family: Family) -> str:
    """``sha256:<hex>`` of the family's configuration as loaded (every field, defaults
    included, keys sorted): two rows with the same hash ran under the same configuration;
    ``counterctl families --hashes`` prints the current one."""
    text = json.dumps(family.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@cache
def code_version() -> str:
    """``$COUNTERS_CODE_VERSION``, else the package version plus the checkout's commit
    (``0.1.0+git.018a74a1b2c3``, ``.dirty`` when files differ from it); computed once per
    process."""
    configured = os.environ.get(CODE_VERSION_ENV)
    if configured:
        return configured
    try:
        version = importlib.metadata.version("counters-compaction")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        described = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+git.{described.replace('-dirty', '.dirty')}" if described else version


@cache
def machine() -> tuple[str, str]:
    """(OS user, host name) of this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container)
        user = str(os.getuid())
    return user, socket.gethostname()


INTEGER_COLUMNS = {
    "counters": 31,
    "conflicts": 31,
    "rows_folded": 63,
    "sum_folded": 63,
    "late_rows": 63,
    "late_sum": 63,
    "max_lateness_ms": 63,
    "rows_deleted": 63,
}
"""The audit table's ``int`` and ``bigint`` columns, by the bits their magnitude may take."""


def fit_integers(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record with every integer its column cannot hold left out (the column stays empty)
    and its exact value added to the message: a family's total past 2^63 (counters that each
    fit) must not keep a run that already deleted its rows from writing its audit row. The
    existing schema holds this form, so tables of every version keep working."""
    row = dict(record)
    notes = []
    for column, bits in INTEGER_COLUMNS.items():
        value = row.get(column)
        if isinstance(value, int) and not -(2**bits) <= value < 2**bits:
            notes.append(f"{column} {value}")
            row[column] = None
    if notes:
        kept = f" [past the audit table's integer columns, left empty: {'; '.join(notes)}]"
        row["message"] = str(row.get("message") or "") + kept
    return row


def stamped(
    record: Mapping[str, Any],
    family: Family,
    provenance: Provenance | None,
    cassandra_user: str | None,
) -> dict[str, Any]:
    """The record as the audit table keeps it: its month partition, who wrote it (the
    provenance's, the process's OS user and host, the Cassandra role), the code version and
    the configuration hash. Parameters the record names itself come first; the interface's
    are added (``Provenance.parameters``)."""
    provenance = provenance or Provenance()
    started_at = record["started_at"]
    os_user, host = machine()
    parameters = {**provenance.parameters, **dict(record.get("parameters") or {})}
    return {
        "action": Action.COMPACT,
        **fit_integers(record),
        "month": month_of(started_at),
        "triggered_by": provenance.triggered_by,
        "airflow_user": provenance.airflow_user,
        "os_user": os_user,
        "host": host,
        "cassandra_role": cassandra_user or ANONYMOUS_ROLE,
        "parameters": parameters,
        "code_version": code_version(),
        "config_hash": config_fingerprint(family),
    }


def operator_record(
    family: Family,
    *,
    action: str,
    outcome: str,
    run_id: str,
    message: str,
    parameters: Mapping[str, Any],
    counters: int = 0,
    sum_folded: int = 0,
    started_at: datetime | None = None,
) -> dict[str, Any]:
    """The audit row of an operator action that is not a compaction run (a repair, a
    release): what it changed, in the same columns a run uses."""
    return {
        "family": family.name,
        "started_at": started_at or datetime.now(UTC),
        "run_id": run_id,
        "action": action,
        "kind": family.kind.value,
        "outcome": outcome,
        "dry_run": False,
        "counters": counters,
        "sum_folded": sum_folded,
        "parameters": dict(parameters),
        "message": message[:MESSAGE_MAX],
    }
