"""A family's metrics, sent through Airflow's metrics facade to whatever the deployment
configured (``[metrics] statsd_on``, ``statsd_datadog_enabled`` or ``otel_on``; nothing when none
is): a StatsD server (often Prometheus's statsd_exporter), DogStatsD or OpenTelemetry.

Every run sends the same metrics, whoever ran it: the DAG's tasks and ``counterctl compact``
call :func:`emit_run` with the run's audit record, whatever its outcome; the freshness DAG and
``counterctl health`` send the family's gauges. Names carry no data (Airflow 3's modern names:
backends turn tags into labels, so a name per family would be a new metric per family); the
family and the outcome are tags. After Airflow's ``statsd_prefix`` (``airflow``):

=====================================  =======  ===============================================
``counters.rows_folded``               counter  raw rows folded by a run (family, outcome)
``counters.rows_deleted``              counter  raw rows deleted by a run (family, outcome)
``counters.late_rows``                 counter  rows that arrived behind the epoch (family,
                                                outcome)
``counters.runs``                      counter  one per run (family, outcome: success, partial,
                                                failed, noop, idle, dry_run)
``counters.run_duration``              timer    a run's wall time, start to audit, ms (family,
                                                outcome)
``counters.compacted_epoch_seconds``   gauge    the compacted epoch, Unix seconds (family): what
                                                to alert on, ``time() -`` it keeps growing when
                                                runs stop, where a frozen lag would not
``counters.stale_after_seconds``       gauge    lag + freshness: the family's alert limit
``counters.lag_seconds``               gauge    now - the compacted epoch, when measured (family)
``counters.quarantined``               gauge    counters quarantined now (family)
``counters.clock_offset_seconds``      gauge    the sending host's clock minus the cluster's
                                                (a coordinator's ``now()``), when measured
                                                (family): compaction refuses a host off by more
                                                than a quarter of the family's lag
=====================================  =======  ===============================================

**Without tags.** Airflow sends tags to plain StatsD only in a tagged format
(``statsd_influxdb_enabled`` or ``statsd_datadog_enabled``); with ``statsd_on`` alone, its
default, it drops them, and every family would share one series of each name (two families'
epochs, one gauge). So there, and wherever ``COUNTERS_LEGACY_METRIC_NAMES=1`` asks for it, each
metric is sent instead under its per-family name, every tag in the name:
``counters.<family>.<what>`` and, for a run's metrics, ``counters.<family>.<what>.<outcome>``
(the shipped statsd_exporter mapping turns both forms into the same labelled series); a process
says so once, in a warning.

The pure part (:func:`run_metrics`, :func:`family_metrics`, :func:`tags_reach_backend`,
:func:`for_backend`) builds the values and names; :func:`emit` sends them. A metrics backend
that fails never fails a run: it is logged.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from .core import to_micros, utc_naive

log = logging.getLogger(__name__)

PREFIX = "counters"
OUTCOMES = ("success", "partial", "failed", "noop", "idle", "dry_run")
"""Every outcome a run can end with (the audit's ``dry-run`` is sent as ``dry_run``)."""
LEGACY_NAMES_ENV = "COUNTERS_LEGACY_METRIC_NAMES"

Kind = Literal["incr", "gauge", "timing"]


@dataclass(frozen=True)
class Metric:
    kind: Kind
    name: str
    value: float
    tags: dict[str, str] = field(default_factory=dict)


def _name(what: str) -> str:
    return f"{PREFIX}.{what}"


def unix_seconds(at: datetime) -> float:
    """``at`` (naive UTC, or aware) as Unix seconds: what Prometheus's ``time()`` compares."""
    return to_micros(at) / 1e6


def family_metrics(
    family: str,
    epoch: datetime | None,
    now: datetime,
    *,
    stale_after: timedelta | None = None,
    quarantined: int | None = None,
    clock_offset: float | None = None,
) -> list[Metric]:
    """The family's gauges: its compacted epoch (as a timestamp) and lag (none before the first
    run), its alert limit (``lag + freshness``), the counters quarantined now (when read) and
    the sending host's clock offset from the cluster's, in seconds (when measured)."""
    tags = {"family": family}
    gauges = []
    if epoch is not None:
        lag = (utc_naive(now) - utc_naive(epoch)).total_seconds()
        gauges.append(Metric("gauge", _name("compacted_epoch_seconds"), unix_seconds(epoch), tags))
        gauges.append(Metric("gauge", _name("lag_seconds"), lag, tags))
    if stale_after is not None:
        limit = stale_after.total_seconds()
        gauges.append(Metric("gauge", _name("stale_after_seconds"), limit, tags))
    if quarantined is not None:
        gauges.append(Metric("gauge", _name("quarantined"), int(quarantined), tags))
    if clock_offset is not None:
        gauges.append(Metric("gauge", _name("clock_offset_seconds"), clock_offset, tags))
    return gauges


def outcome_name(outcome: str) -> str:
    """The audit's outcome as a tag value (``dry-run`` -> ``dry_run``)."""
    return outcome.replace("-", "_")


def run_metrics(
    record: Mapping[str, Any],
    now: datetime,
    *,
    quarantined: int | None = None,
    stale_after: timedelta | None = None,
    clock_offset: float | None = None,
) -> list[Metric]:
    """A run's metrics from its audit row (``RunOutcome.audit_row``): the counts, the outcome
    and the duration, tagged with the family and the outcome; then the family's gauges after it
    (``quarantined``: the counters quarantined now, None when it could not be read;
    ``clock_offset``: the running host's, when measured)."""
    family = str(record["family"])
    tags = {"family": family, "outcome": outcome_name(str(record["outcome"]))}
    started = record.get("started_at")
    duration_ms = (
        max((utc_naive(now) - utc_naive(started)).total_seconds(), 0.0) * 1000 if started else 0.0
    )
    return [
        Metric("incr", _name("rows_folded"), int(record.get("rows_folded") or 0), tags),
        Metric("incr", _name("rows_deleted"), int(record.get("rows_deleted") or 0), tags),
        Metric("incr", _name("late_rows"), int(record.get("late_rows") or 0), tags),
        Metric("timing", _name("run_duration"), duration_ms, tags),
        Metric("incr", _name("runs"), 1, tags),
        *family_metrics(
            family,
            record.get("epoch_after"),
            now,
            stale_after=stale_after,
            quarantined=quarantined,
            clock_offset=clock_offset,
        ),
    ]


def per_family_name(metric: Metric) -> str:
    """The name with every tag in it, for a backend without tags: ``counters.<family>.<what>``,
    then ``.<outcome>`` for a run's metrics (``counters.<family>.runs.<outcome>``)."""
    what = metric.name.removeprefix(f"{PREFIX}.")
    name = f"{PREFIX}.{metric.tags['family']}.{what}"
    return f"{name}.{metric.tags['outcome']}" if "outcome" in metric.tags else name


def _on(value: object) -> bool:
    return str(value or "").strip().lower() in {"1", "true", "yes", "on", "t", "y"}


def tags_reach_backend(settings: Mapping[str, object]) -> bool:
    """Pure, over Airflow's ``[metrics]`` settings: whether the backend gets the tags.
    OpenTelemetry's attributes, DogStatsD and InfluxDB-style StatsD lines carry them; plain
    StatsD (``statsd_on`` alone, Airflow's default StatsD) drops them."""
    if _on(settings.get("otel_on")) or not _on(settings.get("statsd_on")):
        return True
    return _on(settings.get("statsd_datadog_enabled")) or _on(
        settings.get("statsd_influxdb_enabled")
    )


def for_backend(metrics: Iterable[Metric], *, tags_reach: bool, legacy: bool) -> list[Metric]:
    """``metrics`` as the backend can tell them apart: as they are where tags reach it, else
    (or when ``legacy`` asks) under their per-family names, without tags."""
    if tags_reach and not legacy:
        return list(metrics)
    return [Metric(m.kind, per_family_name(m), m.value, {}) for m in metrics]


def legacy_names_on(env: Mapping[str, str]) -> bool:
    """``COUNTERS_LEGACY_METRIC_NAMES``: 1/true/yes/on sends the per-family names, even where
    Airflow sends tags (a backend that drops them)."""
    return env.get(LEGACY_NAMES_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


# --- the shell: Airflow's facade ------------------------------------------------------------

_CONFIG_KEYS = (
    "statsd_on",
    "statsd_host",
    "statsd_port",
    "statsd_prefix",
    "statsd_datadog_enabled",
    "statsd_influxdb_enabled",
    "otel_on",
    "otel_host",
    "otel_port",
    "legacy_names_on",
)
_configured: tuple[Any, ...] | None = None


def _in_task() -> bool:
    """Whether this runs inside an Airflow task (``get_current_context`` answers only there)."""
    from airflow.sdk import get_current_context

    try:
        get_current_context()
    except Exception:
        return False
    return True


def _stats() -> Any:
    """Airflow's metrics module, through its public surface (``airflow.sdk.observability``). In
    a task the task runner has set it up from ``[metrics]``: used as it is (a second StatsD
    client or OpenTelemetry meter provider would be wasteful, or would lose what the first had
    not exported yet). Elsewhere (``counterctl``) this sets it up the same way, again when that
    configuration changed (a test, a long-lived process)."""
    global _configured
    from airflow.sdk import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    if _configured is None and _in_task():
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


_warned_untagged = False


def _settings() -> dict[str, object]:
    from airflow.sdk import conf

    return {key: conf.get("metrics", key, fallback=None) for key in _CONFIG_KEYS}


def _named(metrics: list[Metric]) -> list[Metric]:
    """The metrics under the names this deployment's backend can tell apart; says once per
    process when that is the per-family names."""
    global _warned_untagged
    tags_reach = tags_reach_backend(_settings())
    legacy = legacy_names_on(os.environ)
    if not tags_reach and not _warned_untagged:
        _warned_untagged = True
        log.warning(
            "[metrics] statsd_on without statsd_influxdb_enabled or statsd_datadog_enabled: "
            "StatsD gets no tags, so the counters metrics go under per-family names "
            "(counters.<family>.<what>[.<outcome>]; docs/monitoring/statsd_exporter.yml maps "
            "them to the same labelled series). Set statsd_influxdb_enabled = True for tags"
        )
    return for_backend(metrics, tags_reach=tags_reach, legacy=legacy)


def emit(metrics: Iterable[Metric]) -> None:
    """Send ``metrics`` through Airflow's facade, under the names the backend can tell apart
    (``for_backend``); never raises (metrics must not fail a run)."""
    metrics = list(metrics)
    if not metrics or not airflow_configured():
        return
    try:
        stats = _stats()
        for m in _named(metrics):
            tags = m.tags or None
            if m.kind == "incr":
                stats.incr(m.name, count=int(m.value), tags=tags)
            elif m.kind == "gauge":
                stats.gauge(m.name, m.value, tags=tags)
            else:
                stats.timing(m.name, timedelta(milliseconds=m.value), tags=tags)
    except Exception:
        log.warning(
            "could not send %d metric(s) through Airflow's facade", len(metrics), exc_info=True
        )


QuarantineCount = Callable[[], int | None]
"""Reads how many counters are quarantined now (None when it cannot): called only when metrics
are sent, so ``counterctl`` without Airflow does not read it."""


def _count(quarantined: QuarantineCount | None) -> int | None:
    return quarantined() if quarantined is not None else None


def emit_run(
    record: Mapping[str, Any],
    *,
    quarantined: QuarantineCount | None,
    stale_after: timedelta | None,
    now: datetime | None = None,
    clock_offset: Callable[[], float | None] | None = None,
) -> None:
    """Send a finished run's metrics (the DAG's tasks and ``counterctl compact`` call this with
    the audit record they wrote; ``clock_offset`` reads the running host's, when sent)."""
    if not airflow_configured():
        return
    now = now or datetime.now(UTC)
    count = _count(quarantined)
    offset = clock_offset() if clock_offset is not None else None
    emit(run_metrics(record, now, quarantined=count, stale_after=stale_after, clock_offset=offset))


def emit_family(
    family: str,
    epoch: datetime | None,
    *,
    stale_after: timedelta | None,
    quarantined: QuarantineCount | None = None,
    now: datetime | None = None,
    clock_offset: float | None = None,
) -> None:
    """Send a family's gauges (the freshness DAG, ``counterctl health``)."""
    if not airflow_configured():
        return
    now = now or datetime.now(UTC)
    count = _count(quarantined)
    emit(
        family_metrics(
            family,
            epoch,
            now,
            stale_after=stale_after,
            quarantined=count,
            clock_offset=clock_offset,
        )
    )
