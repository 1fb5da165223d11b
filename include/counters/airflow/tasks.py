"""The bodies of a compaction DAG's tasks: thin adapters over the engine's one sequence of a
run's steps (``engine.RunSteps``, ``engine.run_steps``: what ``counterctl compact`` runs).

Each function takes the family, the run's ``RunPlan`` and what earlier tasks returned, calls
one engine step (``whole_run``: all of them after the plan), and returns the engine's typed
value: ``ShardReport``, ``VerifiedRun``, ``CleanupReport``, ``CleanedRun``, and how the run
ended, ``RunOutcome``. The DAG factory encodes them across XCom with the one codec
(``core.codec``; the plan is read back with ``received_plan``) and pushes the outcome's
``summary()``, the JSON ``counterctl compact --json`` prints.
What stays here is Airflow's: a run that stopped (noop, idle, dry-run) skips the rest
(``AirflowSkipException``), a failed check fails the task (``CheckFailed``, not retried), the
logs, the metrics. The DAG factory wraps them in ``@task``; tests may call them directly.

Audit rows: one per run, keyed by the run's start (``started_at``) and run id, written by the
engine's step that ends the run (``plan``: noop, idle; ``verify``: dry-run or a failed check;
the cleanup check; the conclusion: success, partial, failed), or by ``record_failure`` when a
task failed for good on an error no step audited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from .. import engine, health, metrics
from ..audit import Provenance
from ..config import BrokenEntry, Family
from ..connection import Connection
from ..core import ClockOffset, Tally, to_text, utc_naive
from ..core import run_epoch as core_run_epoch
from ..core.codec import decode, versioned
from ..core.codec import encode as encode  # the DAG factory's, at the XCom boundary
from ..engine import CleanupReport, Phases, RunOutcome, RunPlan, ShardReport
from ..health import FamilyLag, LagSummary, Unconfigured
from ..status import Freshness
from ..store import Store
from .alerting import STALE
from .errors import CheckFailed, FamilyStale, RunRefused
from .notifiers import Channels, notify_failure, notify_recovery
from .runtime import connection, store_for

log = logging.getLogger(__name__)

# --- fault points (tests) -----------------------------------------------------------------

_fault_hooks: list[Callable[[str], None]] = []


def _fault(point: str) -> None:
    """Passed to the engine as its ``fault`` callback; calls the hooks tests installed."""
    for hook in tuple(_fault_hooks):
        hook(point)


@contextmanager
def fault_hook(hook: Callable[[str], None]) -> Iterator[None]:
    """Call ``hook(point)`` at the engine's fault points while the block runs (tests only).

    Tasks run in the test's process under ``dag.test()``, so a test can, for example, corrupt a
    compact row right after the commit (point ``"commit"``) and watch ``verify`` catch it.
    """
    _fault_hooks.append(hook)
    try:
        yield
    finally:
        _fault_hooks.remove(hook)


# --- helpers ------------------------------------------------------------------------------


def run_epoch(family: Family, scheduled: datetime, override: str | None) -> datetime:
    """The run's epoch (``core.run_epoch``: the ``epoch`` param if given, else its scheduled
    time minus the lag); a malformed param is refused as the run's failure."""
    try:
        return core_run_epoch(scheduled, family.lag, override)
    except ValueError as exc:
        raise RunRefused(f"param epoch: {exc}", checks=["epoch_param"]) from None


def received_plan(payload: Mapping[str, Any]) -> RunPlan:
    """The plan as a later task receives it from XCom (``core.codec``, strict; a plan a
    previous release pushed still reads)."""
    return decode(RunPlan, payload)


def scheduled_time(dag_run: Any) -> datetime:
    """A run's own scheduled time: its logical date; manual runs in Airflow 3 have none, so
    their ``run_after`` (when they were triggered)."""
    return dag_run.logical_date or dag_run.run_after


VerifiedRun = engine.VerifiedRun
"""What ``verify`` returns (its XCom: ``core.codec``), the engine's type."""


def provenance(dag_run: Any, params: Mapping[str, Any] | None = None) -> Provenance:
    """Who started a DAG run, as its audit rows record it: the run's type (``scheduled``,
    ``manual`` for a run triggered in the UI or the REST API, ``backfill``, ...), the Airflow
    user who triggered it (None for the scheduler's), and its params."""
    run_type = getattr(dag_run, "run_type", None)
    return Provenance(
        str(getattr(run_type, "value", run_type) or "airflow"),
        getattr(dag_run, "triggering_user_name", None),
        {
            "dag_id": getattr(dag_run, "dag_id", None),
            "dag_run_id": getattr(dag_run, "run_id", None),
            **{k: v for k, v in (params or {}).items() if v is not None},
        },
    )


def _emit_metrics(family: Family) -> engine.AuditHook:
    """The audit hook of a task's steps: the run's metrics, from how it ended."""

    def emit(ended: RunOutcome) -> None:
        health.emit_run_metrics(store_for(family, reset=False), ended)

    return emit


def _steps(family: Family, run: RunPlan) -> engine.RunSteps:
    """The engine's steps of the planned run, on the process's store."""
    return engine.RunSteps(
        store_for(family),
        run,
        run.started_at or utc_naive(datetime.now(UTC)),
        fault=_fault,
        on_audit=_emit_metrics(family),
    )


@contextmanager
def _as_task() -> Iterator[None]:
    """A step's ending as Airflow's: a run that stopped without failing (noop, idle, dry-run)
    skips the rest; a failed check (or a partial run) fails the task, not retried, already
    audited by the step."""
    try:
        yield
    except engine.RunStopped as stop:
        log.info("family %s run %s: %s", stop.ended.plan.family, stop.ended.plan.run_id, stop)
        raise AirflowSkipException(str(stop)) from None
    except engine.RunFailed as failed:
        raise CheckFailed(
            str(failed), checks=failed.failed, counters=failed.counters, audited=True
        ) from failed


_planned: dict[tuple[str, str, int], RunPlan] = {}
"""The plan of each run this process planned, by family, run id and try. Airflow 3 runs a
task's failure callback in the task's own process, so ``record_failure`` finds the plan of a
one-task run here: that shape pushes no ``run`` XCom (one execution-API request fewer a run)."""


def remember_plan(family: Family, run: RunPlan, try_number: int) -> None:
    _planned[(family.name, run.run_id, try_number)] = run


def _failed_run_plan(family: Family, context: Mapping[str, Any]) -> RunPlan:
    """The plan of the run a task failed in: the one this process made (the one-task shape),
    else the ``run`` XCom (a mapped task's), else the plan the run would have had (the task
    failed before planning)."""
    ti, dag_run = context["ti"], context["dag_run"]
    params = context.get("params") or {}
    run = _planned.get((family.name, dag_run.run_id, int(getattr(ti, "try_number", 0) or 0)))
    if run is not None:
        return run
    payload = ti.xcom_pull(task_ids="run", key="run")
    if payload:
        return received_plan(payload)
    scheduled = scheduled_time(dag_run)
    try:
        epoch = run_epoch(family, scheduled, params.get("epoch"))
    except RunRefused:
        epoch = run_epoch(family, scheduled, None)
    return RunPlan(
        family.name,
        dag_run.run_id,
        epoch,
        None,
        (),
        started_at=utc_naive(datetime.now(UTC)),
        dry_run=bool(params.get("dry_run")),
        scheduled=utc_naive(scheduled),
        provenance=provenance(dag_run, params),
    )


def record_failure(family: Family, context: Mapping[str, Any]) -> None:
    """``on_failure_callback`` of a compaction DAG's tasks: a task that failed for good (no
    retry left) on an error no task audited (a Cassandra error, a timeout, a refused epoch, a
    schema that changed) still leaves the run's ``failed`` audit row, naming the task. Best
    effort: Cassandra may be what failed."""
    error = context.get("exception")
    if getattr(error, "audited", False):
        return
    ti = context["ti"]
    task = ti.task_id if getattr(ti, "map_index", -1) < 0 else f"{ti.task_id}[{ti.map_index}]"
    try:
        run = _failed_run_plan(family, context)
        message = f"task {task} failed for good: {type(error).__name__}: {error}"
        _steps(family, run).audit("failed", tally=Tally(), phases=Phases(), message=message)
    except Exception:
        log.warning(
            "could not write the failed audit row after task %s failed", task, exc_info=True
        )


# --- the tasks: each one step of the engine's sequence (``engine.RunSteps``) ----------------


def plan(
    family: Family,
    *,
    run_id: str,
    scheduled: datetime,
    epoch: str | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    started_by: Provenance | None = None,
) -> RunPlan:
    """Decide the run's epoch and whether it sweeps (``engine.plan_step``); a run with nothing
    to do (epoch not newer, or nothing touched and no sweep due) records its audit row there
    and skips the rest. ``started_by``: who started the run (``provenance``), carried to every
    audit row. ``now``: the cluster's time unless given (the epoch is checked against it, not
    against this worker's clock)."""
    at = run_epoch(family, scheduled, epoch)
    started = started_by or Provenance("airflow")
    try:
        with _as_task():
            run = engine.plan_step(
                store_for(family),
                run_id,
                at,
                now,
                dry_run=bool(dry_run),
                scheduled=utc_naive(scheduled),
                provenance=started,
                on_audit=_emit_metrics(family),
            )
    except engine.EpochInFuture as exc:
        raise RunRefused(str(exc), checks=["epoch_not_in_future"]) from exc
    log.info(
        "family %s run %s: fold rows up to %s (compacted epoch before: %s) over %d shard(s)%s%s",
        family.name,
        run_id,
        to_text(run.epoch),
        to_text(run.epoch_before),
        len(run.shards),
        " (sweep)" if run.sweep else "",
        " (dry run)" if dry_run else "",
    )
    return run


def _log_compacted(report: ShardReport) -> None:
    tally = report.tally
    log.info(
        "shard %d: %d counter(s) committed, %d row(s) folded (sum %d), %d late row(s) "
        "(sum %d), %d conflict(s), %d quarantined%s",
        report.shard,
        tally.counters_committed,
        tally.rows_folded,
        tally.sum_folded,
        tally.late_rows,
        tally.late_sum,
        tally.conflicts,
        tally.counters_quarantined,
        " (dry run: nothing written)" if report.dry_run else "",
    )


def _log_cleaned(report: CleanupReport) -> None:
    log.info(
        "shard %d: %d raw row(s) deleted; %d late row(s) arrived after the fold",
        report.shard,
        report.rows_deleted,
        report.late_rows,
    )
    if report.archive_files or report.archive_deferred:
        log.info(
            "shard %d: %d row(s) (sum %d) archived first to %s; %d commit(s) from before "
            "the archive left for the next run",
            report.shard,
            report.archived_rows,
            report.archived_sum,
            ", ".join(report.archive_files) or "-",
            report.archive_deferred,
        )


def compact(family: Family, run: RunPlan, shards: Sequence[int]) -> list[ShardReport]:
    """The engine's compact step over the given shards (token ranges), one after the other."""
    reports = _steps(family, run).compact(shards)
    for report in reports:
        _log_compacted(report)
    return reports


def verify(family: Family, run: RunPlan, reports: Iterable[ShardReport]) -> VerifiedRun:
    """The engine's verify step (its checks, then the GX suite) over the shards' reports; a
    dry run stops here, skipping the rest."""
    with _as_task():
        verified = _steps(family, run).verify(list(reports))
    tally = verified.tally
    log.info(
        "verified: %d counter(s) committed, %d row(s) folded (sum %d), %d late row(s) (sum %d), "
        "%d quarantined",
        tally.counters_committed,
        tally.rows_folded,
        tally.sum_folded,
        tally.late_rows,
        tally.late_sum,
        tally.counters_quarantined,
    )
    return verified


def cleanup(
    family: Family, run: RunPlan, verified: VerifiedRun, shards: Sequence[int]
) -> list[CleanupReport]:
    """The engine's cleanup step over the given shards: exactly the rows of the compact
    attempts ``verify`` passed (a shard whose report did not reach it deletes nothing)."""
    reports = _steps(family, run).cleanup(verified, shards)
    for report in reports:
        _log_cleaned(report)
    return reports


def verify_cleanup(
    family: Family,
    run: RunPlan,
    verified: VerifiedRun,
    cleanups: Iterable[CleanupReport],
) -> engine.CleanedRun:
    """The engine's cleanup check: no row the run counted is left at or below its epoch."""
    with _as_task():
        cleaned = _steps(family, run).check_cleanup(verified, list(cleanups))
    log.info("cleanup check: %s", cleaned.check.detail)
    return cleaned


def _finished(ended: RunOutcome) -> RunOutcome:
    log.info("run finished: %s", ended.summary())
    return ended


def record_audit(
    family: Family, run: RunPlan, verified: VerifiedRun, cleaned: engine.CleanedRun
) -> RunOutcome:
    """The engine's conclude step: advance the family's compacted epoch, check it moved, and
    write the run's audit row: ``success``, or ``partial`` when counters were quarantined
    (then the task fails, so the run alerts; the rest of the family was compacted)."""
    with _as_task():
        ended = _steps(family, run).conclude(verified, cleaned)
    return _finished(ended)


def finish(
    family: Family,
    run: RunPlan,
    verified: VerifiedRun,
    cleanups: Iterable[CleanupReport],
) -> RunOutcome:
    """A larger run's last task: ``verify_cleanup``, then ``record_audit``. One task instance
    instead of two: each costs the scheduler more than these reads, and a failed cleanup
    check still fails here, audited, before the epoch advances."""
    cleaned = verify_cleanup(family, run, verified, cleanups)
    return record_audit(family, run, verified, cleaned)


def whole_run(family: Family, run: RunPlan, *, any_size: bool = False) -> RunOutcome:
    """A small run's steps in the ``run`` task (one process instead of five): the engine's
    ``run_steps``, what ``counterctl compact`` runs after its plan. Each step raises and audits
    as in its own task, so a failure still deletes nothing; an engine or driver error is left
    to the task's retries (and its failure callback's audit row). A larger run's steps run as
    their own (mapped) tasks, unless ``any_size`` (a family without ``shard_tasks``: every run
    here, its shards one after another)."""
    if not (run.small or any_size):
        raise AirflowSkipException("not a small run: its phases run as mapped tasks")
    with _as_task():
        ended = engine.run_steps(_steps(family, run), audit_errors=False)
    if ended.outcome == "dry-run":  # a dry run ends after verify, as its tasks do
        raise AirflowSkipException(f"dry-run: {ended.message}")
    return _finished(ended)


@versioned(1)
@dataclass(frozen=True)
class FreshnessSummary:
    """What the freshness task returns (its XCom, and XCom ``freshness`` when it fails),
    through ``core.codec``: every family's state, by name."""

    checked_at: datetime
    """The cluster's time the families were checked at."""
    clock_offset_s: float | None
    """The checking worker's clock against the cluster's; None when it was not read."""
    clock_refused: tuple[str, ...]
    stale: tuple[str, ...]
    unreadable: Mapping[str, str]
    never_compacted: tuple[str, ...]
    fresh: tuple[str, ...]
    families: Mapping[str, LagSummary]
    unconfigured: Mapping[str, str]
    retired: Mapping[str, str]
    problems: tuple[str, ...]
    unalerted: tuple[str, ...]
    """The families whose alert could not be sent (each fails the task)."""


@dataclass(frozen=True)
class FreshnessVerdict:
    """What one freshness check found, family by family (pure: from the families' lags, and
    the families the cluster knows that the YAML does not load)."""

    lags: tuple[FamilyLag, ...]
    now: datetime
    clock: ClockOffset | None = None
    """The checking worker's clock against the cluster's (``now`` is the cluster's time)."""
    unconfigured: tuple[Unconfigured, ...] = ()
    problems: tuple[str, ...] = ()
    """What the check itself could not do (the families YAML unreadable, the cluster's
    families unreadable): each fails the check."""

    @property
    def not_compacted(self) -> list[Unconfigured]:
        """Known to the cluster, not loaded from the YAML, not retired: each alerts."""
        return [u for u in self.unconfigured if u.retired is None]

    def named(self, *states: Freshness) -> list[str]:
        return [lag.family.name for lag in self.lags if lag.problem is None and lag.state in states]

    @property
    def stale(self) -> list[str]:
        return self.named(Freshness.STALE)

    @property
    def fresh(self) -> list[str]:
        """Fresh or late: within the limit (a stale streak of theirs is over)."""
        return self.named(Freshness.FRESH, Freshness.LATE)

    @property
    def never_compacted(self) -> list[str]:
        return self.named(Freshness.NEVER)

    @property
    def unreadable(self) -> dict[str, str]:
        return {lag.family.name: lag.problem for lag in self.lags if lag.problem is not None}

    @property
    def clock_refused(self) -> list[str]:
        """The families this worker's clock would be refused for compacting."""
        return [lag.family.name for lag in self.lags if lag.clock_refused]

    def summary(self, unalerted: Sequence[str] = ()) -> FreshnessSummary:
        """The task's return value (and XCom ``freshness`` when it fails): every family."""
        return FreshnessSummary(
            checked_at=self.now,
            clock_offset_s=None if self.clock is None else self.clock.seconds,
            clock_refused=tuple(self.clock_refused),
            stale=tuple(self.stale),
            unreadable=self.unreadable,
            never_compacted=tuple(self.never_compacted),
            fresh=tuple(self.fresh),
            families={lag.family.name: lag.summary() for lag in self.lags},
            unconfigured={u.name: u.problem for u in self.not_compacted},
            retired={u.name: u.retired for u in self.unconfigured if u.retired},
            problems=self.problems,
            unalerted=tuple(unalerted),
        )

    def failure(self) -> str | None:
        """Why the check fails (naming every stale and unreadable family), or None."""
        parts = []
        if self.stale:
            parts.append(f"{len(self.stale)} stale: {', '.join(self.stale)}")
        if self.unreadable:
            unread = "; ".join(f"{name} ({why})" for name, why in self.unreadable.items())
            parts.append(f"{len(self.unreadable)} unreadable: {unread}")
        if self.not_compacted:
            names = ", ".join(u.name for u in self.not_compacted)
            parts.append(f"{len(self.not_compacted)} not in the YAML or not loading: {names}")
        parts += list(self.problems)
        if not parts:
            return None
        checked = f"{len(self.lags)} famil{'y' if len(self.lags) == 1 else 'ies'} checked"
        return f"{checked}, {'; '.join(parts)}"


class FreshnessUnreadable(RuntimeError):
    """A family's state could not be read (a Cassandra timeout): the task is tried again."""


def stale_message(lag: FamilyLag, now: datetime) -> str:
    """The alert's text for a stale family (pure)."""
    family = lag.family
    expected = utc_naive(now) - family.lag
    return (
        f"family {family.name!r} is stale: compacted epoch {to_text(lag.epoch)} is {lag.behind} "
        f"behind now - lag ({to_text(expected)}), more than its freshness {family.freshness}; "
        f"check the {family.dag_id} DAG (paused, failing, or the scheduler stopped)"
    )


def _read_lag(
    family: Family, conn: Connection, now: datetime, clock: ClockOffset | None = None
) -> FamilyLag:
    """One family's lag (one point read), its gauges sent (the worker's ``clock`` offset
    among them); an error is the family's ``problem``, so one unreadable family does not stop
    the check of the others."""
    try:
        store = Store(conn, family)
        epoch = store.state.family_epoch()
        metrics.emit_family(
            family.name,
            epoch,
            stale_after=health.stale_after(family),
            quarantined=lambda: health.quarantined_now(store),
            now=now,
            clock_offset=None if clock is None else clock.seconds,
        )
    except Exception as exc:
        log.warning("family %s: freshness unreadable", family.name, exc_info=True)
        never = health.family_lag(family, None, now, clock)
        return replace(never, problem=f"{type(exc).__name__}: {exc}")
    return health.family_lag(family, epoch, now, clock)


def _final_try(context: Mapping[str, Any]) -> bool:
    ti = context.get("ti")
    return int(getattr(ti, "try_number", 1) or 1) > int(getattr(ti, "max_tries", 0) or 0)


FRESHNESS_ALERT_NAME = "counters_freshness"
"""The name the freshness check alerts under (the deployment's default channels) when it
cannot check at all: the families YAML does not load."""


def check_freshness(
    families: Sequence[Family],
    channels: Mapping[str, Channels],
    context: Mapping[str, Any],
    *,
    broken: Sequence[BrokenEntry] = (),
    config: str = "the families YAML",
    config_problem: str | None = None,
    now: datetime | None = None,
) -> FreshnessSummary:
    """Check every family in one task (one process per 5 minutes, not one per family), each
    through its own channels and ``stale`` streak, as its own task did: a stale family alerts
    (once, then reminders), a fresh or late one closes its streak; a family never compacted is
    left alone. An unreadable family is retried with the task, and alerts on its last try.
    Fails naming every stale and unreadable family; returns every family's state. ``now``: the
    cluster's time unless given; the worker's clock offset from it is logged and returned.
    Then the families the cluster knows in the YAML's keyspaces that the YAML does not load
    (a typo in one entry removes its DAG): each alerts its entry's ``alerts`` when they still
    validate, else the deployment's default channels, until it loads again or is retired
    (``broken``: the entries that do not load; ``config``: the file, for the messages). A
    YAML that does not load at all (``config_problem``) alerts the default channels. Fails
    naming every stale, unreadable and unconfigured family too."""
    clock: ClockOffset | None = None
    found: tuple[Unconfigured, ...] = ()
    problems: list[str] = []
    if config_problem is not None:
        problems.append(f"the families YAML does not load: {config_problem}")
    try:
        conn = connection()  # once: a Store per family shares it
        cluster = conn.cluster_clock()
    except Exception as exc:  # no family can be read: each one is unreadable, and alerts
        log.warning("cannot connect to Cassandra", exc_info=True)
        problem = f"{type(exc).__name__}: {exc}"
        now = utc_naive(now or datetime.now(UTC))
        lags = tuple(replace(health.family_lag(f, None, now), problem=problem) for f in families)
    else:
        clock = cluster.offset
        now = utc_naive(now or cluster.now())
        log.info("clock: this worker is %s", clock.describe())
        lags = tuple(_read_lag(f, conn, now, clock) for f in families)
        listed, unread = health.read_unconfigured(conn, families, broken, config)
        found = tuple(listed)
        problems += unread
    verdict = FreshnessVerdict(lags, now, clock, found, tuple(problems))
    refused = verdict.clock_refused
    if refused and clock is not None:
        log.warning(
            "this worker's clock, %s, would be refused for compacting %s",
            clock.describe(),
            ", ".join(refused),
        )
    final = _final_try(context)
    unalerted: list[str] = []
    for lag in verdict.lags:
        log.info("freshness %s", lag.line())
        try:  # one family's alert that cannot be sent does not silence the families after it
            _alert_freshness(lag, channels[lag.family.name], context, now, final)
        except Exception:
            log.exception("family %s: its freshness alert could not be sent", lag.family.name)
            unalerted.append(lag.family.name)
    for family in verdict.unconfigured:
        log.info("freshness %s", family.line())
        if family.retired is not None:
            continue
        try:
            error = FamilyStale(family.problem, checks=["family_unconfigured"])
            where = Channels.for_alerts(family.entry.alerts if family.entry else None)
            notify_failure(family.name, where, STALE, {**context, "exception": error})
        except Exception:
            log.exception("family %s: its alert could not be sent", family.name)
            unalerted.append(family.name)
    if config_problem is not None:
        try:
            error = FamilyStale(problems[0], checks=["families_yaml"])
            notify_failure(
                FRESHNESS_ALERT_NAME,
                Channels.for_alerts(None),
                STALE,
                {**context, "exception": error},
            )
        except Exception:
            log.exception("the families YAML's alert could not be sent")
            unalerted.append(FRESHNESS_ALERT_NAME)
    summary = verdict.summary(unalerted)
    failure = verdict.failure()
    if unalerted:
        failure = f"{failure or 'no family stale'}; alerts not sent for: {', '.join(unalerted)}"
    if failure is None:
        log.info("every family is fresh (or never compacted): %s", summary)
        return summary
    ti = context.get("ti")
    if ti is not None:
        ti.xcom_push(key="freshness", value=encode(summary))
    if (verdict.unreadable or len(problems) > (config_problem is not None)) and not final:
        raise FreshnessUnreadable(f"{failure}; retrying")
    raise FamilyStale(failure, checks=["freshness"])


def _alert_freshness(
    lag: FamilyLag,
    channels: Channels,
    context: Mapping[str, Any],
    now: datetime,
    final: bool,
) -> None:
    """One family's alert or recovery notice, through its own channels and streak."""
    name = lag.family.name
    if lag.problem is not None:
        if final:
            error = FamilyStale(
                f"family {name!r}: freshness unreadable: {lag.problem}",
                checks=["freshness_unreadable"],
            )
            notify_failure(name, channels, STALE, {**context, "exception": error})
    elif lag.state is Freshness.STALE:
        error = FamilyStale(stale_message(lag, now), checks=["freshness"])
        notify_failure(name, channels, STALE, {**context, "exception": error})
    elif lag.state is not Freshness.NEVER:
        notify_recovery(name, channels, STALE, context)
