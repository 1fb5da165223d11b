"""Compaction of a family: plan -> compact shards -> verify -> clean up -> finish.

A run is sequenced once, in ``sequence``: each step does its check and writes the run's audit
row where the run ends. ``run_family`` runs every step for ``counterctl compact`` (shards in
parallel processes); the DAG runs the same ``run_steps`` for a small run, and one step of
``RunSteps`` per task for a larger one (compact and cleanup mapped over shards).

A shard is worked a bucket at a time (a token sub-range: one ledger partition, one index
partition, one raw-table scan), so every step costs requests per bucket, not per counter:

1. read the bucket's ledger (checkpoints) and compact copies, then its raw rows (a token-range
   scan when much of it changed, ``IN`` reads of the touched counters when little did);
2. fold each counter (``core.fold_counter``) and commit the bucket's folds in conditional
   batches on the bucket's head: one Paxos round for up to ``COMMIT_CHUNK`` counters, applied
   only if no other commit touched the bucket since it was read;
3. write the readers' compact copies (each with its commit's write timestamp);
4. verify, before anything is deleted: the ledger and the copies read back, and an independent
   server-side recount (``GROUP BY`` over the token range) of the raw rows each commit counted;
   a counter that fails is quarantined (never folded or deleted again until released), the rest
   proceed;
5. cleanup (after the family-level checks passed) deletes exactly the rows each verified
   commit counted, in multi-partition batches of one token range.

Safety does not depend on the shard lease (it only avoids duplicate work).

One module per step: ``plan``, ``fold``, ``shard`` (fold, commit, copy), ``verify``, ``cleanup``,
``conclude``, ``sequence`` (the steps in order, their checks and audit rows), ``pool`` (a whole
run in worker processes); ``common`` holds what they share."""

from __future__ import annotations

from .cleanup import (
    CleanupReport,
    cleanup_failure_message,
    cleanup_shard,
    verify_cleanup,
)
from .common import (
    ARCHIVE_FAULT_POINTS,
    ARCHIVE_FOLD_KEY_BYTES,
    BUCKET_THREADS,
    CLEANUP_CHECK_SAMPLE,
    COMMIT_KEYS_BYTES,
    FAULT_POINTS,
    FOLD_KEY_BYTES,
    FORGET_MARGIN,
    HOT_LATE_WINDOW,
    LEASE_TTL_S,
    MAX_ATTEMPTS,
    MAX_FOLD_ROWS,
    MEMBER_INDEX,
    SCAN_THRESHOLD,
    SMALL_RUN_COUNTERS,
    STEP_GC_THRESHOLD,
    Fault,
    Phases,
    ShardReport,
    collector_relaxed,
    new_run_id,
    peak_rss_mib,
    read_hot_counter,
    read_rows_tolerant,
)
from .conclude import (
    Conclusion,
    audit_record,
    conclude_run,
    conclusion,
    dry_run_message,
    epoch_advanced,
    prune_archive,
    quarantine_message,
)
from .plan import (
    RunPlan,
    cheap_sweep,
    decide_plan,
    finish_run,
    foreign_rows_bound,
    plan_run,
    sweep_due,
)
from .pool import (
    portable_error,
    run_family,
)
from .sequence import (
    AuditHook,
    CleanedRun,
    RunFailed,
    RunSteps,
    RunStopped,
    RunSummary,
    ShardJob,
    ShardRunner,
    VerifiedRun,
    outcome_dict,
    outcome_from_dict,
    plan_step,
    run_shard_job,
    run_steps,
    write_audit,
)
from .shard import (
    commit_folds,
    committed_checkpoint,
    compact_shard,
)
from .verify import (
    Verification,
    hot_counter_outcomes,
    recount_tolerant,
    verify_run,
)

__all__ = [
    "ARCHIVE_FAULT_POINTS",
    "ARCHIVE_FOLD_KEY_BYTES",
    "BUCKET_THREADS",
    "CLEANUP_CHECK_SAMPLE",
    "COMMIT_KEYS_BYTES",
    "FAULT_POINTS",
    "FOLD_KEY_BYTES",
    "FORGET_MARGIN",
    "HOT_LATE_WINDOW",
    "LEASE_TTL_S",
    "MAX_ATTEMPTS",
    "MAX_FOLD_ROWS",
    "MEMBER_INDEX",
    "SCAN_THRESHOLD",
    "SMALL_RUN_COUNTERS",
    "STEP_GC_THRESHOLD",
    "AuditHook",
    "CleanedRun",
    "CleanupReport",
    "Conclusion",
    "Fault",
    "Phases",
    "RunFailed",
    "RunPlan",
    "RunSteps",
    "RunStopped",
    "RunSummary",
    "ShardJob",
    "ShardReport",
    "ShardRunner",
    "Verification",
    "VerifiedRun",
    "audit_record",
    "cheap_sweep",
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
    "finish_run",
    "foreign_rows_bound",
    "hot_counter_outcomes",
    "new_run_id",
    "outcome_dict",
    "outcome_from_dict",
    "peak_rss_mib",
    "plan_run",
    "plan_step",
    "portable_error",
    "prune_archive",
    "quarantine_message",
    "read_hot_counter",
    "read_rows_tolerant",
    "recount_tolerant",
    "run_family",
    "run_shard_job",
    "run_steps",
    "sweep_due",
    "verify_cleanup",
    "verify_run",
    "write_audit",
]
