"""What the pages and the JSON API show, built from ``counters.status`` records (pure).

The HTML templates and the JSON endpoints take the same dictionaries, so what a test reads from
the API is what a person sees on the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ...config import Family
from ...core import format_key, to_text, utc_naive
from ...status import AuditRow, CounterState, FamilyHealth, Totals, check_names
from .charts import Point, time_chart


def span(delta: timedelta | float | None) -> str:
    """``1 h 02 min``, ``4 min 05 s``, ``12.3 s``, ``0.41 s``; ``-`` for None."""
    if delta is None:
        return "-"
    seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds:.1f} s" if seconds >= 10 else f"{sign}{seconds:.2f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes} min {secs:02d} s" if secs else f"{sign}{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours} h {minutes:02d} min" if minutes else f"{sign}{hours} h"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours:02d} h" if hours else f"{sign}{days} d"


def ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    delta = utc_naive(now) - utc_naive(moment)
    return "just now" if abs(delta.total_seconds()) < 1 else f"{span(delta)} ago"


def family_config(family: Family, alerts: str) -> dict[str, Any]:
    """The family's configuration as the page lists it (``alerts``: where alerts go, after the
    environment defaults: ``notifiers.Channels.describe``)."""
    columns = family.columns
    return {
        "name": family.name,
        "description": family.description,
        "kind": family.kind.value,
        "dag_id": family.dag_id,
        "keyspace": family.keyspace,
        "raw_table": f"{family.keyspace}.{family.raw_table}",
        "compact_table": f"{family.keyspace}.{family.compact_table}",
        "key_columns": list(columns.key),
        "time_column": columns.time,
        "increment_column": columns.increment if family.rules.summed else None,
        "member_column": columns.member,
        "compact_columns": {
            "value": family.compact_columns.value,
            "epoch": family.compact_columns.epoch,
        },
        "retention": family.effective_retention.value,
        "lag": span(family.lag),
        "freshness": span(family.freshness),
        "schedule": family.schedule,
        "shards": family.shards,
        "discovery": family.discovery.value,
        "sweep_interval": span(family.sweep_interval),
        "sweep_phase": span(family.sweep_phase),
        "consistency": family.consistency.value,
        "catchup": family.catchup,
        "owner": family.owner,
        "tags": list(family.tags),
        "alerts": alerts,
    }


def totals_dict(window: Totals) -> dict[str, Any]:
    return {
        "runs": window.runs,
        "worked": window.worked,
        "failed": window.failed,
        "rows_folded": window.rows_folded,
        "rows_deleted": window.rows_deleted,
        "late_rows": window.late_rows,
        "conflicts": window.conflicts,
        "truncated": window.truncated,
    }


def health_dict(health: FamilyHealth, now: datetime) -> dict[str, Any]:
    """One overview row."""
    family = health.family
    last = health.last_run
    return {
        "name": family.name,
        "kind": family.kind.value,
        "description": family.description,
        "dag_id": family.dag_id,
        "epoch": to_text(health.epoch),
        "last_sweep": to_text(health.last_sweep),
        "foreign_rows_within": span(health.foreign_rows_within),
        "lag": {
            "state": health.lag.state.value,
            "behind_s": None if health.lag.behind is None else health.lag.behind.total_seconds(),
            "behind": span(health.lag.behind),
            "limit_s": health.lag.limit.total_seconds(),
            "limit": span(health.lag.limit),
        },
        "last_run": None
        if last is None
        else {
            **last.as_dict(),
            "ago": ago(last.started_at, now),
            "duration": span(last.duration_s),
            "failed_checks": last.failed_checks,
        },
        "last_hour": totals_dict(health.window),
        "quarantined": len(health.quarantined),
        "quarantined_more": health.quarantined_more,
    }


def quarantine_dicts(health: FamilyHealth) -> list[dict[str, Any]]:
    return [
        {
            "counter": format_key(q.counter),
            "reason": q.reason,
            "run_id": q.run_id,
            "detail": q.detail,
        }
        for q in health.quarantined
    ]


def check_summary(rows: Sequence[AuditRow]) -> list[dict[str, Any]]:
    """Per check over the rows: how many runs passed and failed it, and the newest failure."""
    summary = []
    for name in check_names(rows):
        results = [(row, row.checks[name]) for row in rows if name in row.checks]
        failures = [(row, result) for row, result in results if result != "pass"]
        summary.append(
            {
                "check": name,
                "passed": len(results) - len(failures),
                "failed": len(failures),
                "last_failure": None
                if not failures
                else {
                    "run_id": failures[0][0].run_id,
                    "started_at": to_text(failures[0][0].started_at),
                    "detail": failures[0][1].removeprefix("FAIL: "),
                },
            }
        )
    return summary


def late_reports(rows: Sequence[AuditRow]) -> list[dict[str, Any]]:
    """The runs that found rows written at or below an epoch already compacted."""
    return [
        {
            "started_at": to_text(row.started_at),
            "run_id": row.run_id,
            "late_rows": row.late_rows,
            "late_sum": row.late_sum,
            "max_lateness": span(row.max_lateness_ms / 1000),
            "max_lateness_ms": row.max_lateness_ms,
        }
        for row in rows
        if row.late_rows
    ]


def charts(rows: Sequence[AuditRow], family: Family) -> dict[str, str]:
    """The family page's plots (SVG): rows folded per run, run duration, lag over time."""
    worked = [row for row in rows if not row.dry_run]
    lag_limit = (family.freshness + family.lag).total_seconds()
    return {
        "rows_folded": time_chart(
            [
                Point(r.started_at, r.rows_folded, f"{r.run_id}: {r.rows_folded} row(s) folded")
                for r in worked
            ],
            title="Rows folded per run",
            unit="rows",
            bars=True,
        ),
        "duration": time_chart(
            [
                Point(r.started_at, r.duration_s, f"{r.run_id}: {span(r.duration_s)} ({r.outcome})")
                for r in worked
            ],
            title="Run duration (sum of the phases)",
            unit="s",
        ),
        "lag": time_chart(
            [
                Point(r.started_at, r.lag_s, f"{r.run_id}: epoch {span(r.lag_s)} behind its start")
                for r in worked
                if r.lag_s is not None
            ],
            title="Lag: run start minus the compacted epoch it left",
            unit="s",
            limit=lag_limit,
            limit_label=f"freshness limit + lag: {span(lag_limit)}",
        ),
    }


def counter_dict(state: CounterState) -> dict[str, Any]:
    value = state.value
    ledger = state.ledger
    return {
        "counter": state.key_text,
        "value": value.value,
        "compact_value": value.compact_value,
        "epoch": to_text(value.epoch),
        "newer_sum": value.newer_sum,
        "shard": state.shard,
        "bucket": state.bucket,
        "ledger": None
        if ledger is None
        else {
            "value": ledger.value,
            "epoch": to_text(state.ledger_epoch),
            "run_id": ledger.run_id,
            "commit_id": str(ledger.commit_id) if ledger.commit_id else None,
            "version": ledger.version,
        },
        "quarantine": None
        if state.quarantine is None
        else {
            "reason": state.quarantine.reason,
            "run_id": state.quarantine.run_id,
            "detail": state.quarantine.detail,
        },
        "history": [row.as_dict() for row in state.history],
        "runs_searched": state.runs_searched,
    }
