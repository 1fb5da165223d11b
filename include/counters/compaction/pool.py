"""A whole run (``counterctl compact``): its steps in order, the shards in a process pool."""

from __future__ import annotations

import logging
import os
import pickle
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from multiprocessing import get_context
from typing import Any, Literal

from cassandra import DriverException

from ..config import Family
from ..connection import ConnectionSettings
from ..core import (
    CheckOutcome,
    Tally,
    to_text,
)
from ..errors import ChecksFailed, EngineError
from ..schema import RawLayout
from ..store import COMMIT_CHUNK, Store
from .cleanup import (
    CleanupReport,
    cleanup_failure_message,
    cleanup_shard,
    verify_cleanup,
)
from .common import (
    Fault,
    Phases,
    ShardReport,
    new_run_id,
    no_fault,
)
from .conclude import (
    audit_record,
    conclude_run,
    dry_run_message,
    prune_archive,
)
from .plan import (
    RunPlan,
    plan_run,
)
from .shard import (
    compact_shard,
)
from .verify import (
    verify_run,
)

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    plan: RunPlan
    outcome: str
    tally: Tally
    phases: Phases
    checks: list[CheckOutcome]
    message: str = ""
    requests: dict[str, int] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    """The largest peak resident memory of the processes that worked the shards."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "family": self.plan.family,
            "run_id": self.plan.run_id,
            "outcome": self.outcome,
            "epoch_before": to_text(self.plan.epoch_before),
            "epoch": to_text(self.plan.epoch),
            "sweep": self.plan.sweep,
            "message": self.message,
            **self.tally.as_dict(),
            "checks": {o.name: o.success for o in self.checks},
            "durations_s": {k: round(v, 3) for k, v in self.phases.seconds.items()},
            "requests": dict(self.requests),
        }


def _merge_requests(into: dict[str, int], more: dict[str, int]) -> None:
    for name, count in more.items():
        into[name] = into.get(name, 0) + count


def _die_with_parent(parent: int) -> None:
    """A shard worker ends with the run that started it, even one killed by SIGKILL (Linux:
    the kernel signals it; elsewhere it notices on its next task)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def portable_error(exc: BaseException, where: str) -> BaseException:
    """``exc`` if it survives the trip from a worker process to the run (pickled and rebuilt as
    the same type), else an ``EngineError`` that names it. A driver error holding a connection's
    lock, or an error whose constructor takes more than its message, would otherwise reach the
    run as "cannot pickle '_thread.RLock' object", without the error that happened."""
    try:
        if type(pickle.loads(pickle.dumps(exc))) is type(exc):
            return exc
    except Exception:  # unpicklable, or not rebuilt from its args
        pass
    return EngineError(f"{where}: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class ShardJob:
    """One shard's compact or cleanup step of a run, by name: what ``run_shard_job`` does in
    the run's own process or, pickled, in a worker process (the same fields either way)."""

    step: Literal["compact", "cleanup"]
    shard: int
    plan: RunPlan
    started_at: datetime
    """The run's start (its audit row's key; an archive's cleanup names its files by it)."""
    use_lease: bool = True
    commit_chunk: int = COMMIT_CHUNK
    now: datetime | None = None
    executions: tuple[str, ...] = ()
    """For a cleanup: the compact attempts of this shard whose reports passed ``verify``."""


def run_shard_job(
    store: Store, job: ShardJob, fault: Fault = no_fault
) -> ShardReport | CleanupReport:
    """One shard's step of a run, on ``store``."""
    plan = job.plan
    if job.step == "compact":
        return compact_shard(
            store,
            job.shard,
            plan.epoch,
            plan.run_id,
            sweep=plan.sweep,
            dry_run=plan.dry_run,
            use_lease=job.use_lease,
            commit_chunk=job.commit_chunk,
            fault=fault,
        )
    return cleanup_shard(
        store,
        job.shard,
        plan.run_id,
        list(job.executions),
        now=job.now,
        fault=fault,
        started_at=job.started_at,
    )


def _shard_step(
    settings: ConnectionSettings, family: Family, layout: RawLayout | None, job: ShardJob
) -> ShardReport | CleanupReport:
    """One shard's step in a worker process (its own connection)."""
    from ..connection import Connection

    try:
        with Connection(settings) as conn:
            return run_shard_job(Store(conn, family, layout), job)
    except BaseException as exc:
        where = f"family {family.name!r} shard {job.shard} {job.step}"
        portable = portable_error(exc, where)
        if portable is exc:
            raise
        log.error("shard %s %s failed", job.shard, job.step, exc_info=exc)  # the whole traceback
        raise portable from None


def run_family(
    store: Store,
    epoch: datetime,
    run_id: str | None = None,
    *,
    dry_run: bool = False,
    use_lease: bool = True,
    workers: int = 1,
    commit_chunk: int = COMMIT_CHUNK,
    fault: Fault = no_fault,
    progress: Callable[[str], None] | None = None,
    now: datetime | None = None,
    on_audit: Callable[[dict[str, Any], Tally], None] | None = None,
) -> RunSummary:
    """Every step of a run (what ``counterctl compact`` does); ``workers`` > 1 runs the shards
    in that many processes (both cores: the client's CPU is the bound, not Cassandra's).
    ``on_audit(record, tally)`` is called with the run's audit row once written (metrics)."""
    run_id = run_id or new_run_id()
    started = datetime.now(UTC)
    store.statements.requests.clear()
    peak = 0.0
    phases = Phases()
    with phases.timed("plan", store):
        plan = plan_run(store, run_id, epoch, now, dry_run=dry_run)
    tally = Tally()
    checks: list[CheckOutcome] = []
    requests: dict[str, int] = {}
    say = progress or (lambda _m: None)

    def finish(outcome: str, message: str = "") -> RunSummary:
        """Every run leaves one audit row, whatever its outcome."""
        record = audit_record(
            store.family,
            plan,
            outcome=outcome,
            tally=tally,
            phases=phases,
            checks=checks,
            dry_run=dry_run,
            message=message,
            started_at=started,
        )
        store.audit.write(record)
        if on_audit is not None:
            on_audit(record, tally)
        _merge_requests(requests, store.statements.requests)
        return RunSummary(plan, outcome, tally, phases, checks, message, requests, peak)

    if plan.noop:
        return finish("noop", plan.noop_reason or "")
    if plan.idle:
        return finish("idle", "nothing touched since the last run, no sweep due")
    parallel = workers > 1 and fault is no_fault and len(plan.shards) > 1
    pool = (
        ProcessPoolExecutor(
            min(workers, len(plan.shards)),
            mp_context=get_context("spawn"),
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        )
        if parallel
        else None
    )

    def each_shard(
        step: Literal["compact", "cleanup"], executions: dict[int, list[str]] | None = None
    ) -> list[Any]:
        verified = executions or {}
        jobs = [
            ShardJob(
                step,
                s,
                plan,
                started,
                use_lease=use_lease,
                commit_chunk=commit_chunk,
                now=now,
                executions=tuple(verified.get(s, ())),
            )
            for s in plan.shards
        ]
        if pool is None:
            return [run_shard_job(store, job, fault) for job in jobs]
        settings = repeat(store.conn.settings)
        return list(
            pool.map(_shard_step, settings, repeat(store.family), repeat(store.layout), jobs)
        )

    try:
        say(f"compacting {len(plan.shards)} shard(s){' (sweep)' if plan.sweep else ''}")
        with phases.timed("compact", store):
            reports: list[ShardReport] = each_shard("compact")
        for report in reports:
            peak = max(peak, report.peak_rss_mib)
            tally = tally.merge(report.tally)
            phases = phases.merge(
                Phases({f"compact.{k}": v for k, v in report.phases.seconds.items()})
            )
            if pool is not None:
                _merge_requests(requests, report.requests)
        if dry_run:
            return finish("dry-run", dry_run_message(tally))
        with phases.timed("verify", store):
            verification = verify_run(reports)
        checks = list(verification.outcomes)
        if not verification.passed:
            raise ChecksFailed(verification.failure_message(store.family.name, run_id), checks)
        say("cleaning up")
        with phases.timed("cleanup", store):
            cleanups: list[CleanupReport] = each_shard("cleanup", verification.executions)
        for cleanup in cleanups:
            peak = max(peak, cleanup.peak_rss_mib)
            tally.rows_deleted += cleanup.rows_deleted
            if pool is not None:
                _merge_requests(requests, cleanup.requests)
        after = verify_cleanup(cleanups)
        checks.append(after)
        if not after.success:
            raise ChecksFailed(cleanup_failure_message(store.family.name, run_id, after), checks)
        with phases.timed("finish", store):
            ended = conclude_run(store, plan, tally, checks)
            prune_archive(store.family)
        fault("finish")
    except (EngineError, DriverException) as exc:
        try:  # a driver error (timeout, tombstone overload) still leaves its audit row
            finish(
                "failed",
                f"{type(exc).__name__}: {exc}" if isinstance(exc, DriverException) else str(exc),
            )
        except DriverException:
            log.warning("could not write the audit row of run %s", run_id, exc_info=True)
        raise
    finally:
        if pool is not None:
            pool.shutdown()
    checks = ended.checks
    summary = finish(ended.outcome, ended.message)
    if ended.outcome != "success":
        raise ChecksFailed(ended.message, checks)
    return summary
