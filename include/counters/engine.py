"""The engine's public surface: compaction (``compaction``) and per-counter maintenance
(``maintenance``). The CLI, the Airflow tasks, the tests and the benchmark import from here
(the benchmark's "required work" section also commits folds itself: ``commit_folds``)."""

from .compaction.cleanup import (
    CleanupReport,
    cleanup_failure_message,
    cleanup_shard,
    verify_cleanup,
)
from .compaction.common import (
    ARCHIVE_FAULT_POINTS,
    BUCKET_THREADS,
    FAULT_POINTS,
    FORGET_MARGIN,
    HOT_LATE_WINDOW,
    MAX_FOLD_ROWS,
    Fault,
    Phases,
    ShardReport,
    collector_relaxed,
    new_run_id,
)
from .compaction.conclude import (
    AuditHook,
    Conclusion,
    conclude_run,
    conclusion,
    dry_run_message,
    epoch_advanced,
    prune_archive,
    quarantine_message,
    write_audit,
)
from .compaction.outcome import RunOutcome
from .compaction.plan import RunPlan, decide_plan, plan_run
from .compaction.pool import run_family
from .compaction.sequence import (
    CleanedRun,
    RunFailed,
    RunSteps,
    RunStopped,
    ShardJob,
    VerifiedRun,
    plan_step,
    run_steps,
)
from .compaction.shard import commit_folds, committed_checkpoint, compact_shard
from .compaction.verify import Verification, read_warnings, verify_run
from .errors import (
    ArchiveError,
    ChecksFailed,
    ClockSkew,
    EngineError,
    EpochInFuture,
    LeaseHeld,
)
from .identity import IdentityMismatch, check_family
from .maintenance import (
    Discrepancy,
    ResetResult,
    plan_reset,
    quarantined,
    reconcile,
    recover_reset_points,
    release,
    reset_counter,
)
from .store import COMMIT_CHUNK

__all__ = [
    "ARCHIVE_FAULT_POINTS",
    "BUCKET_THREADS",
    "COMMIT_CHUNK",
    "FAULT_POINTS",
    "FORGET_MARGIN",
    "HOT_LATE_WINDOW",
    "MAX_FOLD_ROWS",
    "ArchiveError",
    "AuditHook",
    "ChecksFailed",
    "CleanedRun",
    "CleanupReport",
    "ClockSkew",
    "Conclusion",
    "Discrepancy",
    "EngineError",
    "EpochInFuture",
    "Fault",
    "IdentityMismatch",
    "LeaseHeld",
    "Phases",
    "ResetResult",
    "RunFailed",
    "RunOutcome",
    "RunPlan",
    "RunSteps",
    "RunStopped",
    "ShardJob",
    "ShardReport",
    "Verification",
    "VerifiedRun",
    "check_family",
    "cleanup_failure_message",
    "cleanup_shard",
    "collector_relaxed",
    "commit_folds",
    "committed_checkpoint",
    "compact_shard",
    "conclude_run",
    "conclusion",
    "decide_plan",
    "dry_run_message",
    "epoch_advanced",
    "new_run_id",
    "plan_reset",
    "plan_run",
    "plan_step",
    "prune_archive",
    "quarantine_message",
    "quarantined",
    "read_warnings",
    "reconcile",
    "recover_reset_points",
    "release",
    "reset_counter",
    "run_family",
    "run_steps",
    "verify_cleanup",
    "verify_run",
    "write_audit",
]
