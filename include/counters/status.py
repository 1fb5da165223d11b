"""What the Airflow UI (and anyone auditing) reads about a family: health, audit trail, a
counter's state and history.

Reads only, and every read is bounded (a ``LIMIT``, a page, a point read), so a family with
millions of counters costs the same few requests as a small one. The pure parts (freshness,
audit rows as typed records, totals, CSV) are separate from the reads and unit-tested.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .config import Family
from .core import Checkpoint, Key, format_key, from_millis, to_text, utc_naive

if TYPE_CHECKING:
    from .client import CounterValue
    from .store import Quarantined, Store

MAX_PAGE = 1000
"""The most audit rows one request reads (a page of the family page, a page of an export,
which streams any number of them)."""
WINDOW = timedelta(hours=1)
"""The overview's totals cover the runs of this last stretch of time."""
WINDOW_LIMIT = 500
"""... read up to this many audit rows (a family scheduled every minute has 60)."""
QUARANTINE_LIMIT = 100
HISTORY_RUNS = 20
"""A counter look-up searches the run logs of this many latest runs that committed anything."""
HISTORY_AUDIT_LIMIT = 200
"""... among this many latest audit rows (idle and no-op runs commit nothing)."""


# --- freshness ------------------------------------------------------------------------------


class Freshness(StrEnum):
    """How far the compacted epoch is behind ``now - lag``, against the family's freshness
    limit: ``stale`` is what the ``counters_freshness`` DAG alerts on."""

    FRESH = "fresh"
    """at most half the limit behind (green)"""
    LATE = "late"
    """more than half the limit (amber)"""
    STALE = "stale"
    """more than the limit (red)"""
    NEVER = "never"
    """never compacted"""


@dataclass(frozen=True)
class Lag:
    state: Freshness
    behind: timedelta | None
    """``(now - lag) - compacted epoch``; None when never compacted"""
    limit: timedelta


def freshness(epoch: datetime | None, now: datetime, family: Family) -> Lag:
    """The family's lag behind now (the ``counters_freshness`` DAG's rule, plus an amber band
    above half the limit, so a family drifting behind shows before it alerts)."""
    limit = family.freshness
    if epoch is None:
        return Lag(Freshness.NEVER, None, limit)
    behind = (utc_naive(now) - family.lag) - utc_naive(epoch)
    if behind > limit:
        state = Freshness.STALE
    elif behind > limit / 2:
        state = Freshness.LATE
    else:
        state = Freshness.FRESH
    return Lag(state, behind, limit)


# --- audit rows -----------------------------------------------------------------------------

AUDIT_COLUMNS = (
    "started_at",
    "run_id",
    "action",
    "kind",
    "outcome",
    "dry_run",
    "sweep",
    "epoch_before",
    "epoch_after",
    "counters",
    "rows_folded",
    "sum_folded",
    "rows_deleted",
    "late_rows",
    "late_sum",
    "max_lateness_ms",
    "conflicts",
    "duration_s",
    "checks",
    "durations",
    "message",
    "triggered_by",
    "airflow_user",
    "os_user",
    "host",
    "cassandra_role",
    "parameters",
    "code_version",
    "config_hash",
    "gx_suite",
    "gx_result",
    "archive",
)
"""The export's columns, in order (``checks``, ``durations``, ``parameters`` and ``archive``
as JSON text in CSV)."""
JSON_COLUMNS = ("checks", "durations", "parameters", "archive")


def _json_field(text: Any) -> dict[str, Any]:
    """A JSON column of the audit table as a dict; a value that is not a JSON object (written
    by hand, or truncated) is kept under ``"(unparsed)"`` rather than dropped."""
    if not text:
        return {}
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {"(unparsed)": str(text)}
    return value if isinstance(value, dict) else {"(unparsed)": str(text)}


def _int(value: Any) -> int:
    return int(value or 0)


@dataclass(frozen=True)
class AuditRow:
    """One run's audit row, typed (the table keeps checks and durations as JSON text)."""

    started_at: datetime
    run_id: str
    kind: str = ""
    outcome: str = ""
    dry_run: bool = False
    epoch_before: datetime | None = None
    epoch_after: datetime | None = None
    counters: int = 0
    rows_folded: int = 0
    sum_folded: int = 0
    rows_deleted: int = 0
    late_rows: int = 0
    late_sum: int = 0
    max_lateness_ms: int = 0
    conflicts: int = 0
    checks: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    message: str = ""
    action: str = "compact"
    sweep: bool = False
    triggered_by: str = ""
    """``cli``, ``library``, or the DAG run's type (``scheduled``, ``manual``, ``backfill``)"""
    airflow_user: str = ""
    os_user: str = ""
    host: str = ""
    cassandra_role: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    code_version: str = ""
    config_hash: str = ""
    gx_suite: str = ""
    """the fingerprint of the GX suite that validated the run ('' when GX did not)"""
    gx_result: str = ""
    """where the GX result and its Data Docs page are stored (``evidence``)"""
    archive: dict[str, str] = field(default_factory=dict)
    """the manifest of the raw rows the run archived before deleting them"""

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> AuditRow:
        """From a row of ``store.audit.page`` (missing or NULL columns read as empty)."""
        durations = {}
        for phase, seconds in _json_field(record.get("durations")).items():
            try:
                durations[phase] = float(seconds)
            except (TypeError, ValueError):
                continue
        return cls(
            started_at=record["started_at"],
            run_id=record.get("run_id") or "",
            kind=record.get("kind") or "",
            outcome=record.get("outcome") or "",
            dry_run=bool(record.get("dry_run")),
            epoch_before=record.get("epoch_before"),
            epoch_after=record.get("epoch_after"),
            counters=_int(record.get("counters")),
            rows_folded=_int(record.get("rows_folded")),
            sum_folded=_int(record.get("sum_folded")),
            rows_deleted=_int(record.get("rows_deleted")),
            late_rows=_int(record.get("late_rows")),
            late_sum=_int(record.get("late_sum")),
            max_lateness_ms=_int(record.get("max_lateness_ms")),
            conflicts=_int(record.get("conflicts")),
            checks={k: str(v) for k, v in _json_field(record.get("checks")).items()},
            durations=durations,
            message=record.get("message") or "",
            action=record.get("action") or "compact",
            sweep=bool(record.get("sweep")),
            triggered_by=record.get("triggered_by") or "",
            airflow_user=record.get("airflow_user") or "",
            os_user=record.get("os_user") or "",
            host=record.get("host") or "",
            cassandra_role=record.get("cassandra_role") or "",
            parameters=_json_field(record.get("parameters")),
            code_version=record.get("code_version") or "",
            config_hash=record.get("config_hash") or "",
            gx_suite=record.get("gx_suite") or "",
            gx_result=record.get("gx_result") or "",
            archive={str(k): str(v) for k, v in (record.get("archive") or {}).items()},
        )

    @property
    def duration_s(self) -> float:
        """The run's work: the sum of its phases' seconds (Airflow's scheduling and task
        start-up come on top)."""
        return round(sum(self.durations.values()), 3)

    @property
    def lag_s(self) -> float | None:
        """How far behind its start the run left the compacted epoch (None if it has none)."""
        if self.epoch_after is None:
            return None
        return (utc_naive(self.started_at) - utc_naive(self.epoch_after)).total_seconds()

    @property
    def failed_checks(self) -> dict[str, str]:
        return {name: result for name, result in self.checks.items() if result != "pass"}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, in ``AUDIT_COLUMNS`` order (times ISO 8601 UTC)."""
        values = {
            "started_at": to_text(self.started_at),
            "run_id": self.run_id,
            "kind": self.kind,
            "outcome": self.outcome,
            "dry_run": self.dry_run,
            "epoch_before": to_text(self.epoch_before),
            "epoch_after": to_text(self.epoch_after),
            "counters": self.counters,
            "rows_folded": self.rows_folded,
            "sum_folded": self.sum_folded,
            "rows_deleted": self.rows_deleted,
            "late_rows": self.late_rows,
            "late_sum": self.late_sum,
            "max_lateness_ms": self.max_lateness_ms,
            "conflicts": self.conflicts,
            "duration_s": self.duration_s,
            "checks": dict(self.checks),
            "durations": dict(self.durations),
            "message": self.message,
            "action": self.action,
            "sweep": self.sweep,
            "triggered_by": self.triggered_by,
            "airflow_user": self.airflow_user,
            "os_user": self.os_user,
            "host": self.host,
            "cassandra_role": self.cassandra_role,
            "parameters": dict(self.parameters),
            "code_version": self.code_version,
            "config_hash": self.config_hash,
            "gx_suite": self.gx_suite,
            "gx_result": self.gx_result,
            "archive": dict(self.archive),
        }
        return {column: values[column] for column in AUDIT_COLUMNS}


def csv_cells(row: AuditRow) -> list[Any]:
    """One CSV line's cells, in ``AUDIT_COLUMNS`` order (JSON columns as JSON text)."""
    values = row.as_dict()
    return [
        json.dumps(values[c], sort_keys=True)
        if c in JSON_COLUMNS
        else ("" if values[c] is None else values[c])
        for c in AUDIT_COLUMNS
    ]


def audit_csv(rows: Iterable[AuditRow]) -> str:
    """The rows as CSV with a header (the JSON columns as JSON text)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(AUDIT_COLUMNS)
    for row in rows:
        writer.writerow(csv_cells(row))
    return out.getvalue()


@dataclass(frozen=True)
class Totals:
    """What a stretch of runs did (the overview's last hour)."""

    runs: int = 0
    worked: int = 0
    """runs that committed at least one counter"""
    failed: int = 0
    rows_folded: int = 0
    rows_deleted: int = 0
    late_rows: int = 0
    conflicts: int = 0
    truncated: bool = False
    """more runs happened than were read: the totals are a lower bound"""


def totals(rows: Sequence[AuditRow], truncated: bool = False) -> Totals:
    return Totals(
        runs=len(rows),
        worked=sum(1 for r in rows if r.counters),
        failed=sum(1 for r in rows if r.outcome in ("failed", "partial")),
        rows_folded=sum(r.rows_folded for r in rows),
        rows_deleted=sum(r.rows_deleted for r in rows),
        late_rows=sum(r.late_rows for r in rows),
        conflicts=sum(r.conflicts for r in rows),
        truncated=truncated,
    )


def check_names(rows: Iterable[AuditRow]) -> list[str]:
    """Every check the rows name, in first-seen order (the family page's check columns)."""
    return list(dict.fromkeys(name for row in rows for name in row.checks))


# --- counter keys ---------------------------------------------------------------------------


def split_counter(family: Family, text: str) -> list[str]:
    """A counter key as typed (``IBM``; a composite key's parts joined by ``/``, as
    ``counterctl read`` takes them) into one text per key column."""
    text = text.strip()
    if not text:
        raise ValueError(f"family {family.name!r}: give a counter key {list(family.columns.key)}")
    parts = text.split("/") if len(family.columns.key) > 1 else [text]
    if len(parts) != len(family.columns.key):
        raise ValueError(
            f"counter {text!r}: family {family.name!r} has key {list(family.columns.key)}; "
            "give one value per column, separated by '/'"
        )
    return parts


# --- reads ----------------------------------------------------------------------------------


def audit_page(
    store: Store,
    limit: int,
    before: datetime | None = None,
    since: datetime | None = None,
) -> list[AuditRow]:
    """Up to ``limit`` audit rows (at most ``MAX_PAGE``) started in ``[since, before)``,
    newest first."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    limit = min(limit, MAX_PAGE)
    since = utc_naive(since) if since else None
    before = utc_naive(before) if before else None
    return [AuditRow.from_record(r) for r in store.audit.page(limit, since, before)]


def audit_stream(
    store: Store,
    since: datetime | None = None,
    before: datetime | None = None,
    page_rows: int = MAX_PAGE,
) -> Iterator[AuditRow]:
    """Every audit row started in ``[since, before)``, newest first, read ``page_rows`` at a
    time across the month partitions (the CLI's and the UI's export)."""
    since = utc_naive(since) if since else None
    before = utc_naive(before) if before else None
    if since and before and since >= before:
        raise ValueError(f"since ({to_text(since)}) must be before until ({to_text(before)})")
    for record in store.audit.stream(since, before, page_rows):
        yield AuditRow.from_record(record)


@dataclass(frozen=True)
class FamilyHealth:
    """One row of the overview."""

    family: Family
    epoch: datetime | None
    last_sweep: datetime | None
    foreign_rows_within: timedelta
    """How long after it is written a row of any writer (plain CQL too) is folded at the
    latest: a run when the family sweeps every run, else its sweep interval more."""
    lag: Lag
    last_run: AuditRow | None
    window: Totals
    quarantined: list[Quarantined]
    quarantine_limit: int

    @property
    def quarantined_more(self) -> bool:
        """More counters are quarantined than were read."""
        return len(self.quarantined) >= self.quarantine_limit


def family_health(
    store: Store,
    now: datetime,
    *,
    window: timedelta = WINDOW,
    window_limit: int = WINDOW_LIMIT,
    quarantine_limit: int = QUARANTINE_LIMIT,
) -> FamilyHealth:
    """The family's state, its latest run and its last hour: three bounded reads."""
    from .compaction.plan import foreign_rows_bound

    state = store.state.family_state()
    epoch, last_sweep = state.epoch, state.last_sweep
    within = foreign_rows_bound(store.family, state.last_sweep_size)
    rows = [
        AuditRow.from_record(r)
        for r in store.audit.page(window_limit, since=utc_naive(now) - window)
    ]
    last = rows[0] if rows else next(iter(audit_page(store, 1)), None)
    return FamilyHealth(
        family=store.family,
        epoch=epoch,
        last_sweep=last_sweep,
        foreign_rows_within=within,
        lag=freshness(epoch, now, store.family),
        last_run=last,
        window=totals(rows, truncated=len(rows) >= window_limit),
        quarantined=store.quarantine.read_quarantine_sample(quarantine_limit),
        quarantine_limit=quarantine_limit,
    )


@dataclass(frozen=True)
class CounterState:
    """A counter as readers see it, as the engine's ledger holds it, and the recent runs that
    committed it."""

    value: CounterValue
    shard: int
    bucket: int
    ledger: Checkpoint | None
    quarantine: Quarantined | None
    history: list[AuditRow]
    """the searched runs that committed the counter, newest first"""
    runs_searched: int

    @property
    def counter(self) -> Key:
        return self.value.counter

    @property
    def key_text(self) -> str:
        return format_key(self.value.counter)

    @property
    def ledger_epoch(self) -> datetime | None:
        if self.ledger is None or self.ledger.epoch_ms is None:
            return None
        return from_millis(self.ledger.epoch_ms)


def look_up(
    store: Store,
    text: str,
    *,
    history_runs: int = HISTORY_RUNS,
    audit_limit: int = HISTORY_AUDIT_LIMIT,
) -> CounterState:
    """Read one counter (the client's read rule), its ledger checkpoint and quarantine entry,
    and which of the latest ``history_runs`` runs that committed anything committed it:
    a handful of point reads, whatever the family's size. A key that does not parse raises
    ``ValueError`` naming the key's columns."""
    from .client import CounterClient

    counter = store.keys.parse_key(split_counter(store.family, text))
    value = CounterClient(store.conn, store.family, store).read_many([counter])[0]
    shard, bucket = store.keys.bucket(counter)
    ledger = store.ledger.read_ledger(shard, bucket, [counter], with_pending=False).checkpoints
    worked = [row for row in audit_page(store, audit_limit) if row.counters and not row.dry_run][
        :history_runs
    ]
    committed = store.runs.runs_with_counter([row.run_id for row in worked], counter)
    return CounterState(
        value=value,
        shard=shard,
        bucket=bucket,
        ledger=ledger.get(counter),
        quarantine=store.quarantine.quarantined_entry(counter),
        history=[row for row in worked if row.run_id in committed],
        runs_searched=len(worked),
    )
