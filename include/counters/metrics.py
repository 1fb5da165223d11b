"""A family's metrics, sent through Airflow's metrics facade to whatever the deployment
configured (``[metrics] statsd_on``, ``statsd_datadog_enabled`` or ``otel_on``; nothing when none
is): a StatsD server (often Prometheus's statsd_exporter), DogStatsD or OpenTelemetry.

Every run sends the same metrics, whoever ran it: the DAG's tasks and ``counterctl compact``
call :func:`emit_run` with the run's audit record, whatever its outcome; the freshness DAG and
``counterctl health`` send the lag. Names (after Airflow's ``statsd_prefix``, ``airflow``), each
also tagged ``family`` (and ``outcome``) for backends that keep tags:

========================================  =======  ==========================================
``counters.<family>.lag_seconds``         gauge    now - the compacted epoch
``counters.<family>.rows_folded``         counter  raw rows folded by a run
``counters.<family>.rows_deleted``        counter  raw rows deleted by a run
``counters.<family>.late_rows``           counter  rows that arrived behind the epoch
``counters.<family>.quarantined``         counter  counters a run kept out of compaction
``counters.<family>.run_duration``        timer    a run's wall time, start to audit (ms)
``counters.<family>.runs.<outcome>``      counter  one per run: success, partial, failed,
                                                   noop, idle, dry_run
========================================  =======  ==========================================

The pure part (:func:`run_metrics`, :func:`lag_metrics`) builds the values; :func:`emit` sends
them. A metrics backend that fails never fails a run: it is logged.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from .core import utc_naive

log = logging.getLogger(__name__)

PREFIX = "counters"
OUTCOMES = ("success", "partial", "failed", "noop", "idle", "dry_run")
"""Every outcome a run can end with (the audit's ``dry-run`` is sent as ``dry_run``)."""

Kind = Literal["incr", "gauge", "timing"]


@dataclass(frozen=True)
class Metric:
    kind: Kind
    name: str
    value: float
    tags: dict[str, str] = field(default_factory=dict)


def _name(family: str, what: str) -> str:
    return f"{PREFIX}.{family}.{what}"


def lag_metrics(family: str, epoch: datetime | None, now: datetime) -> list[Metric]:
    """The lag gauge: seconds from the compacted epoch to ``now`` (none before the first run)."""
    if epoch is None:
        return []
    lag = (utc_naive(now) - utc_naive(epoch)).total_seconds()
    return [Metric("gauge", _name(family, "lag_seconds"), lag, {"family": family})]


def outcome_name(outcome: str) -> str:
    """The audit's outcome as a metric name part (``dry-run`` -> ``dry_run``)."""
    return outcome.replace("-", "_")


def run_metrics(record: Mapping[str, Any], quarantined: int, now: datetime) -> list[Metric]:
    """A run's metrics from its audit record (``engine.audit_record``) and the number of
    counters it quarantined: the counts, the outcome, the duration and the lag after it."""
    family = str(record["family"])
    outcome = outcome_name(str(record["outcome"]))
    tags = {"family": family}
    started = record.get("started_at")
    duration_ms = (
        max((utc_naive(now) - utc_naive(started)).total_seconds(), 0.0) * 1000 if started else 0.0
    )
    return [
        Metric("incr", _name(family, "rows_folded"), int(record.get("rows_folded") or 0), tags),
        Metric("incr", _name(family, "rows_deleted"), int(record.get("rows_deleted") or 0), tags),
        Metric("incr", _name(family, "late_rows"), int(record.get("late_rows") or 0), tags),
        Metric("incr", _name(family, "quarantined"), int(quarantined), tags),
        Metric("timing", _name(family, "run_duration"), duration_ms, tags),
        Metric("incr", _name(family, f"runs.{outcome}"), 1, {**tags, "outcome": outcome}),
        *lag_metrics(family, record.get("epoch_after"), now),
    ]


# --- the shell: Airflow's facade ------------------------------------------------------------

_CONFIG_KEYS = (
    "statsd_on",
    "statsd_host",
    "statsd_port",
    "statsd_prefix",
    "statsd_datadog_enabled",
    "otel_on",
    "otel_host",
    "otel_port",
    "legacy_names_on",
)
_configured: tuple[Any, ...] | None = None


def _stats() -> Any:
    """Airflow's metrics module. In a task process the task runner has set it up from
    ``[metrics]``: used as it is (a second StatsD client or OpenTelemetry meter provider would
    be wasteful, or refused). Elsewhere (``counterctl``, ``dag.test()``) this sets it up the
    same way, again when that configuration changed (a test, a long-lived process)."""
    global _configured
    from airflow.sdk._shared.observability.metrics import stats as facade
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    if _configured is None and getattr(facade, "_factory", None) is not None:
        return stats
    config = tuple(conf.get("metrics", key, fallback=None) for key in _CONFIG_KEYS)
    if config != _configured:
        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True),
        )
        _configured = config
    return stats


def airflow_configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process has an Airflow whose metrics settings apply: inside Airflow (a task,
    a component), or an ``airflow.cfg`` in ``$AIRFLOW_HOME`` (``~/airflow``), or ``[metrics]``
    set in the environment. ``counterctl`` elsewhere skips metrics (and importing Airflow, which
    costs seconds and creates ``$AIRFLOW_HOME/logs``)."""
    if env is None:
        if "airflow" in sys.modules:
            return True
        env = os.environ
    if any(key.startswith("AIRFLOW__METRICS__") for key in env):
        return True
    home = os.path.expanduser(env.get("AIRFLOW_HOME") or "~/airflow")
    return os.path.isfile(os.path.join(home, "airflow.cfg"))


def emit(metrics: Iterable[Metric]) -> None:
    """Send ``metrics`` through Airflow's facade; never raises (metrics must not fail a run)."""
    metrics = list(metrics)
    if not metrics or not airflow_configured():
        return
    try:
        stats = _stats()
        for m in metrics:
            if m.kind == "incr":
                stats.incr(m.name, count=int(m.value), tags=m.tags)
            elif m.kind == "gauge":
                stats.gauge(m.name, m.value, tags=m.tags)
            else:
                stats.timing(m.name, timedelta(milliseconds=m.value), tags=m.tags)
    except Exception:
        log.warning(
            "could not send %d metric(s) through Airflow's facade", len(metrics), exc_info=True
        )


def emit_run(record: Mapping[str, Any], quarantined: int, now: datetime | None = None) -> None:
    """Send a finished run's metrics (the DAG's tasks and ``counterctl compact`` call this with
    the audit record they wrote)."""
    emit(run_metrics(record, quarantined, now or datetime.now(UTC)))


def emit_lag(family: str, epoch: datetime | None, now: datetime | None = None) -> None:
    """Send a family's lag (the freshness DAG, ``counterctl health``)."""
    emit(lag_metrics(family, epoch, now or datetime.now(UTC)))
