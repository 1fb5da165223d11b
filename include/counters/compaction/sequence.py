"""One sequencer of a run's steps, for ``counterctl compact`` and the DAG alike.

A run: plan -> compact the shards -> verify the family (the engine's checks, then the GX suite)
-> clean up the shards -> check the cleanup -> conclude. Each step does its check and, where
the run ends there (noop, idle, dry-run, a failed check, partial), writes the run's one audit
row before it raises (``RunStopped``, ``RunFailed``): so both callers end a run at the same
step, with the same checks, conclusion and audit row.

``pool.run_family`` (``counterctl compact``) plans and then runs every other step in order
(``run_steps``, its shards in a process pool); the DAG's ``run`` task plans and runs a small run
with the same ``run_steps``; a larger run's mapped tasks each call one step of ``RunSteps``,
passing what the steps return across XCom in their one encoding (``core.codec``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from cassandra import DriverException

from ..audit import Provenance
from ..core import CheckOutcome, Evidence, Tally, run_figures
from ..core.codec import fields_unchanged, versioned
from ..errors import ChecksFailed, EngineError
from ..store import COMMIT_CHUNK, Store
from .cleanup import (
    CleanupReport,
    cleanup_failure_message,
    cleanup_shard,
    stamped_ahead_check,
    verify_cleanup,
)
from .common import Fault, Phases, ShardReport, no_fault
from .conclude import (
    AuditHook,
    conclude_run,
    dry_run_message,
    finish_run,
    prune_archive,
    write_audit,
)
from .outcome import RunOutcome
from .plan import RunPlan, plan_run
from .shard import compact_shard
from .verify import verify_run

log = logging.getLogger(__name__)

IDLE_MESSAGE = "nothing touched since the last run, no sweep due"

# --- what the steps pass on ------------------------------------------------------------------


@versioned(1, fields_unchanged("VerifiedRun"))  # as a previous release returned it to XCom
@dataclass(frozen=True)
class VerifiedRun:
    """What ``verify`` found, as the cleanup and the conclusion receive it: the run's tally and
    phase times so far, the compact attempts whose reports passed, per shard (the only commits
    a cleanup deletes the rows of), every check's outcome, and the GX suite's fingerprint and
    stored result. Across XCom: ``core.codec``."""

    tally: Tally
    seconds: Mapping[str, float]
    executions: Mapping[int, tuple[str, ...]]
    checks: tuple[CheckOutcome, ...]
    gx_suite: str | None = None
    gx_result: str | None = None

    @property
    def gx(self) -> dict[str, Any]:
        return {"gx_suite": self.gx_suite, "gx_result": self.gx_result}


@dataclass(frozen=True)
class CleanedRun:
    """What the cleanup check found: its outcome, the rows deleted, the cleanup's time."""

    check: CheckOutcome
    rows_deleted: int
    seconds: Mapping[str, float]
    warnings: tuple[CheckOutcome, ...] = ()
    """Checks that failed without failing the run (``no_row_stamped_ahead``)."""


class RunStopped(Exception):
    """The run ended at a step without failing (``noop``, ``idle``, ``dry-run``); that step
    wrote its audit row (``ended``). Not an ``EngineError``: nothing went wrong."""

    def __init__(self, ended: RunOutcome):
        super().__init__(f"{ended.outcome}: {ended.message}")
        self.ended = ended


class RunFailed(ChecksFailed):
    """A step's check failed (``failed``), or counters were quarantined (``partial``): the step
    wrote the run's audit row; nothing its checks did not pass was deleted. ``failed`` names
    the failed checks (GX's without their ``gx:``), ``counters`` the counters to name."""

    def __init__(
        self,
        message: str,
        outcomes: Sequence[CheckOutcome],
        *,
        failed: Sequence[str],
        counters: Sequence[str] = (),
        outcome: str = "failed",
    ):
        super().__init__(message, outcomes)
        self.failed = tuple(failed)
        self.counters = tuple(counters)
        self.outcome = outcome


# --- the steps -------------------------------------------------------------------------------


def plan_step(
    store: Store,
    run_id: str,
    epoch: datetime,
    now: datetime | None = None,
    *,
    dry_run: bool = False,
    scheduled: datetime | None = None,
    provenance: Provenance | None = None,
    started_at: datetime | None = None,
    phases: Phases | None = None,
    on_audit: AuditHook | None = None,
) -> RunPlan:
    """Plan the run; one with nothing to do (``noop``: epoch not newer; ``idle``: nothing
    touched, no sweep due) writes its audit row and raises ``RunStopped``. ``started_at``: the
    audit row's key (default the plan's start); ``phases`` gets the plan's time."""
    phases = phases if phases is not None else Phases()
    with phases.timed("plan", store):
        plan = plan_run(
            store,
            run_id,
            epoch,
            now,
            dry_run=dry_run,
            scheduled=scheduled,
            provenance=provenance,
        )
        if plan.idle and not plan.dry_run:  # its only step: the family's epoch moves on
            finish_run(store, plan)
    if plan.noop or plan.idle:
        outcome = "noop" if plan.noop else "idle"
        reason = plan.noop_reason or IDLE_MESSAGE
        ended = write_audit(
            store,
            plan,
            outcome,
            started_at=started_at or plan.started_at or datetime.now(UTC),
            tally=Tally(),
            phases=phases,
            message=reason,
            on_audit=on_audit,
        )
        raise RunStopped(ended)
    return plan


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


ShardRunner = Callable[[Sequence[ShardJob]], list[Any]]
"""Runs shard jobs elsewhere (``pool.py``: worker processes) and returns their reports in
order; without one, ``RunSteps`` runs them one after the other on its own store."""


@dataclass(frozen=True)
class SuiteResult:
    """The GX suite over the run's evidence: its outcomes (named ``gx:<check>``), whether every
    critical one passed, its fingerprint and where its result is stored."""

    outcomes: tuple[CheckOutcome, ...]
    success: bool
    fingerprint: str
    stored: str
    statistics: Mapping[str, Any]

    @property
    def gx(self) -> dict[str, Any]:
        return {"gx_suite": self.fingerprint, "gx_result": self.stored}


def validate_with_suite(family: str, run_id: str, evidence: Sequence[Evidence]) -> SuiteResult:
    """Validate the evidence with the family's GX suite and store the result (``counters.gx``;
    GX itself is imported on the first validation in the process)."""
    from ..gx import checks
    from ..gx import evidence as results

    suite = checks.validate_evidence(family, run_id, evidence)
    stored = results.keep(family, run_id, suite)
    log.info(
        "Great Expectations: %s expectation(s) passed of %s; result stored at %s",
        suite.statistics.get("successful_expectations"),
        suite.statistics.get("evaluated_expectations"),
        stored,
    )
    return SuiteResult(
        tuple(
            CheckOutcome(f"gx:{o.name}", o.success, o.critical, o.detail, o.counters)
            for o in suite.outcomes
        ),
        suite.success,
        suite.fingerprint,
        stored,
        dict(suite.statistics),
    )


def gx_failure_note(family: str, stored: str) -> str:
    """Where a failed run's GX result is, for its message and alert."""
    from ..gx.evidence import RESULT_FILE

    return (
        f". Full GX result: {stored}/{RESULT_FILE} (its Data Docs page: Browse > Counter "
        f"families > {family})"
    )


@dataclass
class RunSteps:
    """The steps of one planned run on ``store``; each writes the run's audit row where the
    run ends (``RunStopped``, ``RunFailed``). ``started_at`` keys the audit row; ``runner``
    works the shards elsewhere; ``on_audit`` is called with the audit row (metrics)."""

    store: Store
    plan: RunPlan
    started_at: datetime
    fault: Fault = no_fault
    on_audit: AuditHook | None = None
    runner: ShardRunner | None = None
    use_lease: bool = True
    commit_chunk: int = COMMIT_CHUNK
    now: datetime | None = None
    concluded: str | None = None
    """The outcome ``conclude`` reached, once the epoch was advanced: an error after it (the
    audit row's own write timing out) must not audit the run as ``failed``."""

    @property
    def family(self) -> str:
        return self.store.family.name

    def audit(
        self,
        outcome: str,
        *,
        tally: Tally,
        phases: Phases,
        checks: Sequence[CheckOutcome] = (),
        message: str = "",
        gx: Mapping[str, Any] | None = None,
        durable: bool = False,
    ) -> RunOutcome:
        """Write the run's audit row, its committed figures those of every commit of the run
        that applied (``run_tally``; ``durable``: ``tally`` has them already)."""
        return write_audit(
            self.store,
            self.plan,
            outcome,
            started_at=self.started_at,
            tally=tally if durable else self.run_tally(tally),
            phases=phases,
            checks=checks,
            message=message,
            gx=gx,
            on_audit=self.on_audit,
        )

    def run_tally(self, tally: Tally) -> Tally:
        """``tally`` with its committed figures (rows and sums folded, counters, late rows,
        counted rows carried) from the run log: every commit of the run that applied, by
        whichever attempt of its compact steps, not only the attempts whose reports reached
        the step that audits (a retried task's earlier attempt committed too); and its rows
        deleted, by every cleanup of the run (that of a cleared compact step's earlier pass
        too). The rest stays as reported. Best effort: the reported tally when the run log
        cannot be read (a failing run's audit row must still be written)."""
        if self.plan.dry_run:
            return tally
        try:
            found = self.store.runs.run_figures(self.plan.run_id, self.plan.shards)
        except DriverException:
            log.warning(
                "run %s: its commits' figures could not be read; its audit row has the "
                "reported ones",
                self.plan.run_id,
                exc_info=True,
            )
            return tally
        return run_figures(tally, found.commits, found.deleted)

    def _jobs(
        self,
        step: Literal["compact", "cleanup"],
        shards: Sequence[int],
        executions: Mapping[int, Sequence[str]] | None = None,
    ) -> list[Any]:
        jobs = [
            ShardJob(
                step,
                s,
                self.plan,
                self.started_at,
                use_lease=self.use_lease,
                commit_chunk=self.commit_chunk,
                now=self.now,
                executions=tuple((executions or {}).get(s, ())),
            )
            for s in shards
        ]
        if self.runner is not None:
            return self.runner(jobs)
        return [run_shard_job(self.store, job, self.fault) for job in jobs]

    def compact(self, shards: Sequence[int]) -> list[ShardReport]:
        """Fold, commit, copy and verify the shards; a counter that fails its checks is
        quarantined there, before anything is deleted."""
        reports: list[ShardReport] = self._jobs("compact", shards)
        return reports

    def verify(self, reports: Sequence[ShardReport], phases: Phases | None = None) -> VerifiedRun:
        """The family-level conservation checks over the shards' evidence: the engine's rules,
        then the GX suite (its result stored). A dry run stops here (``dry-run`` audit row); a
        failed check fails the run here (``failed`` audit row), before anything is deleted."""
        phases = phases if phases is not None else Phases()
        for report in reports:
            phases = phases.merge(
                Phases({f"compact.{k}": v for k, v in report.phases.seconds.items()})
            )
        with phases.timed("verify", self.store):
            verification = verify_run(reports)
        tally = verification.tally
        if self.plan.dry_run:
            message = dry_run_message(tally)
            raise RunStopped(self.audit("dry-run", tally=tally, phases=phases, message=message))
        with phases.timed("verify_gx", self.store):
            suite = validate_with_suite(self.family, self.plan.run_id, verification.evidence)
        outcomes = [*verification.outcomes, *suite.outcomes]
        if not (verification.passed and suite.success):
            failed = [o for o in outcomes if o.critical and not o.success]
            message = (
                verification.failure_message(self.family, self.plan.run_id)
                if not verification.passed
                else f"conservation check failed for family {self.family!r} run "
                f"{self.plan.run_id!r}; nothing was deleted: "
                + " | ".join(f"{o.name}: {o.detail} [{'; '.join(o.counters[:5])}]" for o in failed)
            ) + gx_failure_note(self.family, suite.stored)
            self.audit(
                "failed", tally=tally, phases=phases, checks=outcomes, message=message, gx=suite.gx
            )
            raise RunFailed(
                message,
                outcomes,
                failed=list(dict.fromkeys(o.name.removeprefix("gx:") for o in failed)),
                counters=list(dict.fromkeys(c for o in failed for c in o.counters)),
            )
        return VerifiedRun(
            tally,
            dict(phases.seconds),
            {k: tuple(v) for k, v in verification.executions.items()},
            tuple(outcomes),
            suite.fingerprint,
            suite.stored,
        )

    def cleanup(self, verified: VerifiedRun, shards: Sequence[int]) -> list[CleanupReport]:
        """Delete exactly the raw rows counted by the verified compact attempts' commits (a
        shard whose report did not reach ``verify`` deletes nothing), then count what is
        left."""
        reports: list[CleanupReport] = self._jobs("cleanup", shards, verified.executions)
        return reports

    def check_cleanup(self, verified: VerifiedRun, cleanups: Sequence[CleanupReport]) -> CleanedRun:
        """No row the run counted is left at or below its epoch (else the run fails here,
        before the epoch advances); late arrivals are reported."""
        outcome = verify_cleanup(list(cleanups))
        rows_deleted = sum(r.rows_deleted for r in cleanups)
        seconds = {"cleanup": max((r.seconds for r in cleanups), default=0.0)}
        if outcome.critical and not outcome.success:
            message = cleanup_failure_message(self.family, self.plan.run_id, outcome)
            checks = [*verified.checks, outcome]
            self.audit(
                "failed",
                tally=replace(verified.tally, rows_deleted=rows_deleted),
                phases=Phases(dict(verified.seconds)).merge(Phases(seconds)),
                checks=checks,
                message=message,
                gx=verified.gx,
            )
            raise RunFailed(message, checks, failed=[outcome.name], counters=outcome.counters)
        warned = stamped_ahead_check(cleanups)
        if warned is not None:
            log.warning("family %s: %s: %s", self.family, warned.name, warned.detail)
        return CleanedRun(outcome, rows_deleted, seconds, () if warned is None else (warned,))

    def conclude(self, verified: VerifiedRun, cleaned: CleanedRun) -> RunOutcome:
        """Advance the family's compacted epoch, check it moved, and write the run's audit
        row: ``success``, else (``partial``: counters quarantined, the rest compacted; or
        ``failed``) the row, then ``RunFailed``."""
        phases = Phases(dict(verified.seconds)).merge(Phases(dict(cleaned.seconds)))
        tally = self.run_tally(replace(verified.tally, rows_deleted=cleaned.rows_deleted))
        with phases.timed("finish", self.store):
            checks = [*verified.checks, *cleaned.warnings, cleaned.check]
            ended = conclude_run(self.store, self.plan, tally, checks)
            prune_archive(self.store.family)
        self.fault("finish")
        self.concluded = ended.outcome
        audited = self.audit(
            ended.outcome,
            tally=tally,
            phases=phases,
            checks=ended.checks,
            message=ended.message,
            gx=verified.gx,
            durable=True,
        )
        if ended.outcome != "success":
            raise RunFailed(
                ended.message,
                ended.checks,
                failed=ended.failed,
                counters=ended.counters,
                outcome=ended.outcome,
            )
        return audited


def _merge_requests(into: dict[str, int], more: Mapping[str, int]) -> None:
    for name, count in more.items():
        into[name] = into.get(name, 0) + count


def run_steps(
    steps: RunSteps,
    phases: Phases | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    audit_errors: bool = True,
) -> RunOutcome:
    """Every step after the plan, in order: compact every shard, verify, clean up, check the
    cleanup, conclude. A dry run ends after ``verify``, with its summary. A failed check raises
    ``RunFailed`` (audited by its step). ``audit_errors``: any other error before the run
    concluded also leaves a ``failed`` audit row (``counterctl compact``; the DAG's task is
    tried again instead, and its failure callback audits a task that failed for good); an
    error after it (its own audit write) leaves the row the conclusion wrote."""
    store, plan = steps.store, steps.plan
    phases = phases if phases is not None else Phases()
    say = progress or (lambda _m: None)
    remote = steps.runner is not None
    requests: dict[str, int] = {}
    peak = 0.0
    tally = Tally()
    checks: list[CheckOutcome] = []
    try:
        say(f"compacting {len(plan.shards)} shard(s){' (sweep)' if plan.sweep else ''}")
        with phases.timed("compact", store):
            reports = steps.compact(plan.shards)
        for report in reports:
            peak = max(peak, report.peak_rss_mib)
            tally = tally.merge(report.tally)
            if remote:
                _merge_requests(requests, report.requests)
        verified = steps.verify(reports, phases)
        tally, checks = verified.tally, list(verified.checks)
        say("cleaning up")
        with Phases().timed("cleanup", store):  # its time: the shards' (``check_cleanup``)
            cleanups = steps.cleanup(verified, plan.shards)
        for cleanup in cleanups:
            peak = max(peak, cleanup.peak_rss_mib)
            if remote:
                _merge_requests(requests, cleanup.requests)
        cleaned = steps.check_cleanup(verified, cleanups)
        ended = steps.conclude(verified, cleaned)
    except RunStopped as stop:
        ended = stop.ended
    except RunFailed:
        raise
    except Exception as exc:
        if steps.concluded:  # the run finished; only writing its audit row failed
            log.warning(
                "run %s ended %s but its audit row may be missing", plan.run_id, steps.concluded
            )
        elif audit_errors:
            try:  # any error (a timeout, an unwritable GX result store) leaves its audit row
                steps.audit(
                    "failed",
                    tally=tally,
                    phases=phases,
                    checks=checks,
                    message=str(exc)
                    if isinstance(exc, EngineError)
                    else f"{type(exc).__name__}: {exc}",
                )
            except DriverException:
                log.warning("could not write the audit row of run %s", plan.run_id, exc_info=True)
        raise
    _merge_requests(requests, store.statements.requests)
    return replace(ended, requests=requests, peak_rss_mib=peak)
