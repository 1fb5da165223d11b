"""The bodies of a compaction DAG's tasks: thin calls into ``counters.engine``.

Each function takes the family and what earlier tasks returned (plain JSON: XCom), calls the
engine function ``counterctl compact`` calls for the same phase, and returns plain JSON. The
DAG factory wraps them in ``@task``; tests may call them directly.

Audit rows: one per run, keyed by the run's start (``started_at``) and run id, written by the
task that decides the outcome: ``plan`` (noop), ``verify`` (dry-run), ``record_audit``
(success), or the task that failed a check or was refused (failed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from .. import engine, health, metrics
from ..audit import Provenance
from ..config import Family
from ..core import CheckOutcome, Tally, epoch_for, utc_naive
from ..core import parse_epoch as core_parse_epoch
from ..engine import CleanupReport, Phases, RunPlan, ShardReport
from . import checks, evidence
from .errors import CheckFailed, FamilyStale, RunRefused
from .runtime import store_for

log = logging.getLogger(__name__)

Run = dict[str, Any]
"""What ``plan`` returns and every later task gets: run_id, epoch, epoch_before, shards,
sweep, dry_run, started_at, scheduled (ISO strings for times)."""

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


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else utc_naive(moment).isoformat()


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def parse_epoch(text: str) -> datetime:
    """An ``epoch`` param (``core.parse_epoch``), refused as the run's failure when malformed."""
    try:
        return core_parse_epoch(text)
    except ValueError as exc:
        raise RunRefused(f"param epoch: {exc}", checks=["epoch_param"]) from None


def run_epoch(family: Family, scheduled: datetime, override: str | None) -> datetime:
    """The run's epoch: the ``epoch`` param if given, else its scheduled time minus the lag."""
    return parse_epoch(override) if override else epoch_for(scheduled, family.lag)


def scheduled_time(dag_run: Any) -> datetime:
    """A run's own scheduled time: its logical date; manual runs in Airflow 3 have none, so
    their ``run_after`` (when they were triggered)."""
    return dag_run.logical_date or dag_run.run_after


def _plan(family: Family, run: Run) -> RunPlan:
    return RunPlan(
        family.name,
        run["run_id"],
        datetime.fromisoformat(run["epoch"]),
        _time(run["epoch_before"]),
        tuple(run["shards"]),
        bool(run.get("sweep")),
        started_at=_time(run.get("started_at")),
    )


def _outcome_dict(outcome: CheckOutcome) -> dict[str, Any]:
    return {
        "name": outcome.name,
        "success": outcome.success,
        "critical": outcome.critical,
        "detail": outcome.detail,
        "counters": list(outcome.counters),
    }


def _outcome(data: Mapping[str, Any]) -> CheckOutcome:
    return CheckOutcome(
        data["name"], data["success"], data["critical"], data["detail"], tuple(data["counters"])
    )


def _shard_reports(reports: Iterable[Mapping[str, Any]]) -> tuple[list[ShardReport], Phases]:
    parsed = [ShardReport.from_dict(dict(report)) for report in reports]
    phases = Phases()
    for report in parsed:
        phases = phases.merge(report.phases)
    return parsed, phases


def provenance(dag_run: Any, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
    ).as_dict()


def _audit(
    family: Family,
    run: Run,
    outcome: str,
    *,
    tally: Tally,
    phases: Phases,
    checks_: Sequence[CheckOutcome] = (),
    message: str = "",
    gx: Mapping[str, Any] | None = None,
) -> None:
    """Write the run's audit row; ``gx``: the GX suite's fingerprint and where its result is
    stored (``gx_suite``, ``gx_result``) when the suite validated the run."""
    record = engine.audit_record(
        family,
        _plan(family, run),
        outcome=outcome,
        tally=tally,
        phases=phases,
        checks=checks_,
        dry_run=run["dry_run"],
        message=message,
        started_at=_time(run["started_at"]),
        gx_suite=(gx or {}).get("gx_suite"),
        gx_result=(gx or {}).get("gx_result"),
    )
    store = store_for(family)
    store.provenance = Provenance.from_dict(run.get("provenance"))
    store.write_audit(record)
    log.info("audit row written: family %s run %s outcome %s", family.name, run["run_id"], outcome)
    metrics.emit_run(
        record,
        quarantined=lambda: health.quarantined_now(store),
        stale_after=health.stale_after(family),
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
    params = context.get("params") or {}
    try:
        run = ti.xcom_pull(task_ids="run", key="run")
        if not run:  # the run task failed before planning: the epoch it would have taken
            dag_run = context["dag_run"]
            scheduled = scheduled_time(dag_run)
            try:
                epoch = run_epoch(family, scheduled, params.get("epoch"))
            except RunRefused:
                epoch = run_epoch(family, scheduled, None)
            run = {
                "run_id": dag_run.run_id,
                "epoch": _iso(epoch),
                "epoch_before": None,
                "shards": [],
                "sweep": False,
                "dry_run": bool(params.get("dry_run")),
                "started_at": _iso(datetime.now(UTC)),
                "scheduled": _iso(scheduled),
                "provenance": provenance(dag_run, params),
            }
        message = f"task {task} failed for good: {type(error).__name__}: {error}"
        _audit(family, run, "failed", tally=Tally(), phases=Phases(), message=message)
    except Exception:
        log.warning(
            "could not write the failed audit row after task %s failed", task, exc_info=True
        )


# --- the tasks ----------------------------------------------------------------------------


def plan(
    family: Family,
    *,
    run_id: str,
    scheduled: datetime,
    epoch: str | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    started_by: Mapping[str, Any] | None = None,
) -> Run:
    """Decide the run's epoch and whether it sweeps; a run with nothing to do (epoch not newer,
    or nothing touched and no sweep due) records its audit row here and skips the rest.
    ``started_by``: who started the run (``provenance``), carried to every audit row."""
    started = time.perf_counter()
    now = now or datetime.now(UTC)
    at = run_epoch(family, scheduled, epoch)
    store = store_for(family)
    try:
        decided = engine.plan_run(store, run_id, at, now)
    except engine.EpochInFuture as exc:
        raise RunRefused(str(exc), checks=["epoch_not_in_future"]) from exc
    run: Run = {
        "run_id": run_id,
        "epoch": _iso(decided.epoch),
        "epoch_before": _iso(decided.epoch_before),
        "shards": list(decided.shards),
        "groups": [list(group) for group in decided.shard_groups],
        "whole": decided.small,
        "sweep": decided.sweep,
        "dry_run": bool(dry_run),
        "started_at": _iso(now),
        "scheduled": _iso(scheduled),
        "provenance": dict(started_by or Provenance("airflow").as_dict()),
    }
    phases = Phases({"plan": time.perf_counter() - started})
    if decided.noop or decided.idle:
        outcome = "noop" if decided.noop else "idle"
        reason = decided.noop_reason or "nothing touched since the last run, no sweep due"
        _audit(family, run, outcome, tally=Tally(), phases=phases, message=reason)
        log.info("family %s run %s: %s", family.name, run_id, reason)
        raise AirflowSkipException(f"{outcome}: {reason}")
    log.info(
        "family %s run %s: fold rows up to %s (compacted epoch before: %s) over %d shard(s)%s%s",
        family.name,
        run_id,
        run["epoch"],
        run["epoch_before"],
        len(run["shards"]),
        " (sweep)" if decided.sweep else "",
        " (dry run)" if dry_run else "",
    )
    return run


def compact(family: Family, run: Run, shards: Sequence[int]) -> list[dict[str, Any]]:
    """Fold, commit, copy and verify the given shards (token ranges), one after the other; a
    counter that fails its checks is quarantined there, before anything is deleted."""
    store = store_for(family)
    reports = []
    for shard in shards:
        report = engine.compact_shard(
            store,
            shard,
            datetime.fromisoformat(run["epoch"]),
            run["run_id"],
            sweep=bool(run.get("sweep")),
            dry_run=run["dry_run"],
            fault=_fault,
        )
        tally = report.tally
        log.info(
            "shard %d: %d counter(s) committed, %d row(s) folded (sum %d), %d late row(s) "
            "(sum %d), %d conflict(s), %d quarantined%s",
            shard,
            tally.counters_committed,
            tally.rows_folded,
            tally.sum_folded,
            tally.late_rows,
            tally.late_sum,
            tally.conflicts,
            tally.counters_quarantined,
            " (dry run: nothing written)" if report.dry_run else "",
        )
        reports.append(report.as_dict())
    return reports


def verify(
    family: Family,
    run: Run,
    reports: Iterable[Mapping[str, Any]],
    *,
    push: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """The family-level conservation checks over the shards' evidence (engine rules, then the
    GX suite with Data Docs). A dry run stops here with a ``dry-run`` audit row.

    ``push(key, value)`` stores the full GX result (XCom ``gx_result``).
    """
    shard_reports, phases = _shard_reports(reports)
    with phases.timed("verify"):
        verification = engine.verify_run(shard_reports)
    tally = verification.tally
    if run["dry_run"]:
        message = engine.dry_run_message(tally)
        _audit(family, run, "dry-run", tally=tally, phases=phases, message=message)
        raise AirflowSkipException(message)
    with phases.timed("verify_gx"):
        suite = checks.validate_evidence(family.name, run["run_id"], verification.evidence)
    log.info(
        "Great Expectations: %s expectation(s) passed of %s; Data Docs: %s (this run: %s)",
        suite.statistics.get("successful_expectations"),
        suite.statistics.get("evaluated_expectations"),
        suite.docs_index,
        suite.docs_page,
    )
    if push is not None:
        push("gx_result", suite.result)
    gx = {
        "gx_suite": suite.fingerprint,
        "gx_result": evidence.keep(family.name, run["run_id"], suite),
    }
    log.info("GX result and page stored at %s", gx["gx_result"])
    outcomes = list(verification.outcomes) + [
        CheckOutcome(f"gx:{o.name}", o.success, o.critical, o.detail, o.counters)
        for o in suite.outcomes
    ]
    if not (verification.passed and suite.success):
        failed = [o for o in outcomes if o.critical and not o.success]
        message = (
            verification.failure_message(family.name, run["run_id"])
            if not verification.passed
            else f"conservation check failed for family {family.name!r} run "
            f"{run['run_id']!r}; nothing was deleted: "
            + " | ".join(f"{o.name}: {o.detail} [{'; '.join(o.counters[:5])}]" for o in failed)
        ) + (
            f". Full GX result: XCom 'gx_result' of task 'verify'; Data Docs: "
            f"{suite.docs_page or suite.docs_index}"
        )
        _audit(
            family,
            run,
            "failed",
            tally=tally,
            phases=phases,
            checks_=outcomes,
            message=message,
            gx=gx,
        )
        raise CheckFailed(
            message,
            checks=list(dict.fromkeys(o.name.removeprefix("gx:") for o in failed)),
            counters=list(dict.fromkeys(c for o in failed for c in o.counters)),
            audited=True,
        )
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
    return {
        "tally": tally.as_dict(),
        "seconds": dict(phases.seconds),
        "executions": {str(k): v for k, v in verification.executions.items()},
        "checks": [_outcome_dict(o) for o in outcomes],
        "data_docs": str(suite.docs_index) if suite.docs_index else None,
        "data_docs_page": suite.docs_page,
        **gx,
    }


def cleanup(
    family: Family, run: Run, verified: Mapping[str, Any], shards: Sequence[int]
) -> list[dict[str, Any]]:
    """Delete the raw rows counted by the commits of the compact attempts whose reports passed
    ``verify`` (exactly those rows), then count what is left. A shard whose report did not
    reach ``verify`` (its task marked successful by hand, say) deletes nothing."""
    store = store_for(family)
    executions = {int(k): v for k, v in verified.get("executions", {}).items()}
    reports = []
    for shard in shards:
        report = engine.cleanup_shard(
            store,
            shard,
            run["run_id"],
            executions.get(shard, []),
            fault=_fault,
            started_at=_time(run["started_at"]),
        )
        log.info(
            "shard %d: %d raw row(s) deleted; %d late row(s) arrived after the fold",
            shard,
            report.rows_deleted,
            report.late_rows,
        )
        if report.archive_files or report.archive_deferred:
            log.info(
                "shard %d: %d row(s) (sum %d) archived first to %s; %d commit(s) from before "
                "the archive left for the next run",
                shard,
                report.archived_rows,
                report.archived_sum,
                ", ".join(report.archive_files) or "-",
                report.archive_deferred,
            )
        reports.append(report.as_dict())
    return reports


def verify_cleanup(
    family: Family, run: Run, verified: Mapping[str, Any], cleanups: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """No row the run counted is left at or below its epoch; late arrivals are reported."""
    reports = [CleanupReport.from_dict(dict(c)) for c in cleanups]
    outcome = engine.verify_cleanup(reports)
    log.info("cleanup check: %s", outcome.detail)
    rows_deleted = sum(r.rows_deleted for r in reports)
    if outcome.critical and not outcome.success:
        tally = Tally.from_dict(dict(verified["tally"]))
        tally.rows_deleted = rows_deleted
        phases = Phases(dict(verified["seconds"]))
        message = engine.cleanup_failure_message(family.name, run["run_id"], outcome)
        checks_ = [_outcome(c) for c in verified["checks"]] + [outcome]
        _audit(
            family,
            run,
            "failed",
            tally=tally,
            phases=phases,
            checks_=checks_,
            message=message,
            gx=verified,
        )
        raise CheckFailed(message, checks=[outcome.name], counters=outcome.counters, audited=True)
    return {
        "check": _outcome_dict(outcome),
        "rows_deleted": rows_deleted,
        "seconds": {"cleanup": max((r.seconds for r in reports), default=0.0)},
    }


def record_audit(
    family: Family, run: Run, verified: Mapping[str, Any], cleaned: Mapping[str, Any]
) -> dict[str, Any]:
    """Advance the family's compacted epoch, check it moved, and write the run's audit row:
    ``success``, or ``partial`` when counters were quarantined (then the task fails, so the
    run alerts; the rest of the family was compacted)."""
    store = store_for(family)
    phases = Phases(dict(verified["seconds"])).merge(Phases(dict(cleaned["seconds"])))
    tally = Tally.from_dict(dict(verified["tally"]))
    tally.rows_deleted = cleaned["rows_deleted"]
    checks_ = [_outcome(c) for c in verified["checks"]] + [_outcome(cleaned["check"])]
    with phases.timed("finish"):
        ended = engine.conclude_run(store, _plan(family, run), tally, checks_)
        engine.prune_archive(family)
    outcomes = ended.checks
    if ended.outcome != "success":
        _audit(
            family,
            run,
            ended.outcome,
            tally=tally,
            phases=phases,
            checks_=outcomes,
            message=ended.message,
            gx=verified,
        )
        raise CheckFailed(ended.message, checks=ended.failed, counters=ended.counters, audited=True)
    _audit(family, run, "success", tally=tally, phases=phases, checks_=outcomes, gx=verified)
    summary = {
        "family": family.name,
        "run_id": run["run_id"],
        "epoch_before": run["epoch_before"],
        "epoch": run["epoch"],
        **{k: v for k, v in tally.as_dict().items() if k != "quarantined"},
        "data_docs": verified.get("data_docs"),
    }
    log.info("run finished: %s", summary)
    return summary


def finish(
    family: Family, run: Run, verified: Mapping[str, Any], cleanups: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """A larger run's last task: ``verify_cleanup``, then ``record_audit``. One task instance
    instead of two: each costs the scheduler more than these reads, and a failed cleanup
    check still fails here, audited, before the epoch advances."""
    cleaned = verify_cleanup(family, run, verified, cleanups)
    return record_audit(family, run, verified, cleaned)


def whole_run(
    family: Family, run: Run, *, push: Callable[[str, Any], None] | None = None
) -> dict[str, Any]:
    """A small run's phases in the ``run`` task (one process instead of five): compact every
    shard, verify (engine checks and the GX suite), clean up, check the cleanup, audit. Each
    phase raises and audits exactly as its own task does, so a failure still deletes nothing. A
    larger run's phases run as their own (mapped) tasks."""
    if not run.get("whole"):
        raise AirflowSkipException("not a small run: its phases run as mapped tasks")
    shards = run["shards"]
    verified = verify(family, run, compact(family, run, shards), push=push)
    cleaned = verify_cleanup(family, run, verified, cleanup(family, run, verified, shards))
    summary = record_audit(family, run, verified, cleaned)
    summary["phases"] = {
        "compact": "success",
        "verify": "success",
        "cleanup": "success",
        "verify_cleanup": cleaned["check"]["detail"],
        "record_audit": "success",
    }
    return summary


def freshness(family: Family, *, now: datetime | None = None) -> dict[str, Any]:
    """Fail (and so alert) when the compacted epoch is behind ``now - lag`` by more than the
    family's ``freshness``; skip a family that was never compacted."""
    now = utc_naive(now or datetime.now(UTC))
    epoch = store_for(family).family_epoch()
    metrics.emit_family(
        family.name,
        epoch,
        stale_after=health.stale_after(family),
        quarantined=lambda: health.quarantined_now(store_for(family)),
        now=now,
    )
    if epoch is None:
        raise AirflowSkipException(f"family {family.name!r} has not been compacted yet")
    lag = health.family_lag(family, epoch, now)  # the rule `counterctl health` applies
    expected = now - family.lag
    behind = lag.behind or expected - utc_naive(epoch)
    state = {
        "family": family.name,
        "epoch": _iso(epoch),
        "expected": _iso(expected),
        "behind_s": behind.total_seconds(),
        "threshold_s": family.freshness.total_seconds(),
        "state": lag.state.value,
    }
    if not lag.healthy:
        raise FamilyStale(
            f"family {family.name!r} is stale: compacted epoch {_iso(epoch)} is {behind} behind "
            f"now - lag ({_iso(expected)}), more than its freshness {family.freshness}; "
            f"check the {family.dag_id} DAG (paused, failing, or the scheduler stopped)",
            checks=["freshness"],
        )
    log.info(
        "family %s is fresh: %s behind now - lag (threshold %s)",
        family.name,
        behind,
        family.freshness,
    )
    return state
