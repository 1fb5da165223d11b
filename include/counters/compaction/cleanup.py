"""Cleaning up: delete exactly the rows the verified commits counted, then check what is left."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cassandra import ReadFailure, ReadTimeout

from ..core import (
    CheckOutcome,
    Key,
    format_key,
    lowest_floor,
    to_micros,
)
from ..core.codec import fields_added, versioned
from ..rowkeys import CountedKeys
from ..store import Store
from .common import (
    CLEANUP_CHECK_SAMPLE,
    MEMBER_INDEX,
    Fault,
    cluster_clock,
    cluster_micros,
    collector_relaxed,
    no_fault,
    peak_rss_mib,
)
from .reads import each_bucket, recount_tolerant

if TYPE_CHECKING:  # imported where it runs: it brings the archive's file libraries
    from .archive import Archived

log = logging.getLogger(__name__)


# --- cleanup -----------------------------------------------------------------------------


@versioned(2, fields_added("CleanupReport", 2, stamped_ahead=[]))  # older ones: XCom
@dataclass(frozen=True, slots=True)
class CleanupReport:
    """One shard's cleanup: rows deleted, and what an independent count found left after
    (across XCom: ``core.codec``)."""

    shard: int
    rows_deleted: int = 0
    leftovers: tuple[str, ...] = ()
    late_rows: int = 0
    late_sum: int = 0
    windowed: int = 0
    counters_cleaned: int = 0
    counters_checked: int = 0
    seconds: float = 0.0
    requests: Mapping[str, int] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    archived_rows: int = 0
    archived_sum: int = 0
    archive_files: tuple[str, ...] = ()
    """The archive files this cleanup wrote (their manifests are in the run's audit row)."""
    archive_deferred: int = 0
    """Commits recorded before the family had an archive: their rows were left in place, for
    the next fold of their counters (which archives them before deleting them)."""
    archive_seconds: float = 0.0
    stamped_ahead: tuple[str, ...] = ()
    """Counted rows a writer stamped ahead of the run's tombstones (its clock ahead of the
    cluster's), found by the check and deleted again at their own write time: ``counter @
    time ms, N s ahead``."""


@dataclass(slots=True)
class CleanedBucket:
    """What one bucket's cleanup counts as it goes; the shard's ``CleanupReport`` sums them
    once, at the end."""

    rows_deleted: int = 0
    leftovers: list[str] = field(default_factory=list)
    late_rows: int = 0
    late_sum: int = 0
    windowed: int = 0
    counters_cleaned: int = 0
    counters_checked: int = 0
    stamped_ahead: list[str] = field(default_factory=list)


@collector_relaxed()
def cleanup_shard(
    store: Store,
    shard: int,
    run_id: str,
    executions: Sequence[str],
    *,
    now: datetime | None = None,
    fault: Fault = no_fault,
    started_at: datetime | None = None,
) -> CleanupReport:
    """Delete the raw rows counted by the run's commits that ``executions`` verified (the
    attempts whose reports passed the family's checks), exactly those (keys read from the run
    log, not the ledger); quarantined counters keep their rows. Then count, on the server, what
    is left at or below each epoch of a sample: a counted row still there is a failure, any
    other row a late write (folded by the next run).

    A family with an ``archive`` first writes every row it is about to delete to the archive
    (``compaction.archive.archive_commits``; ``started_at``: the run's start, its audit row's
    key); a failure there deletes nothing."""
    with store.statements.phase("cleanup"):
        return _cleanup_shard(store, shard, run_id, executions, now, fault, started_at)


def _cleanup_shard(
    store: Store,
    shard: int,
    run_id: str,
    executions: Sequence[str],
    now: datetime | None,
    fault: Fault,
    started_at: datetime | None,
) -> CleanupReport:
    started = time.perf_counter()
    cluster_clock(store)  # a host whose clock is off writes no archive and no tombstone
    runs = store.runs.read_run_commits(run_id, shard, executions)
    fault("cleanup_read_log")
    if store.family.folds_by_slice or not runs:  # a kept family's runs delete nothing
        return CleanupReport(shard, seconds=time.perf_counter() - started)
    quarantined = set(
        store.quarantine.read_quarantine_anywhere(shard)
    )  # wherever a reshard moved it
    deferred: set[Any] = set()
    left_out: dict[Any, set[Key]] = {}
    archived: Archived | None = None
    if store.family.archive is not None:
        from .archive import archive_commits

        with store.statements.phase("archive"):
            archived = archive_commits(
                store, shard, run_id, runs, quarantined, started_at, fault=fault
            )
        deferred, left_out = archived.deferred, archived.left_out
        _log_left_out(store, left_out, quarantined)
    # tombstones newer than any write so far (the cluster's clock, whatever ``now`` the run
    # was planned with) and than the epoch: retries of the deleted rows stay deleted
    now_us = cluster_micros(store) if now is None else max(cluster_micros(store), to_micros(now))

    deleted_by_commit: list[tuple[int, Any, int]] = []  # (bucket, commit id, rows deleted)

    def one(bucket: int) -> CleanedBucket:
        with store.statements.phase("cleanup"):  # this thread's requests
            part, mine, tombstone_ts = delete(bucket)
        if mine:
            with store.statements.phase("verify_cleanup"):
                _check_left(store, shard, bucket, mine, part, tombstone_ts)
        return part

    def delete(bucket: int) -> tuple[CleanedBucket, dict[Key, tuple[int, CountedKeys]], int]:
        part = CleanedBucket()
        # every verified commit's keys are counted for good (a later commit builds on it, a
        # reset consumes them): deleting them is safe whatever committed since
        mine: dict[Key, tuple[int, CountedKeys]] = {}
        shares: dict[Any, int] = {}  # per commit, the rows it lists that no earlier one did
        for record in runs[bucket]:
            if record.commit_id in deferred:  # no values to archive: the next fold's
                continue
            unarchived = left_out.get(record.commit_id, ())
            for counter, epoch_ms, keys in record.entries:
                if counter in quarantined or counter in unarchived:
                    continue
                if counter in mine:  # a retry of the run committed it again
                    epoch_before, keys_before = mine[counter]
                    merged = dict.fromkeys([*keys_before.keys, *keys.keys])
                    added = len(merged) - len(keys_before)
                    keys = CountedKeys.of(store.keys.key_codec, list(merged))
                    mine[counter] = (max(epoch_ms, epoch_before), keys)
                else:
                    added = len(keys)
                    mine[counter] = (epoch_ms, keys)
                shares[record.commit_id] = shares.get(record.commit_id, 0) + added
        tombstone_ts = now_us
        if not mine:
            return part, mine, tombstone_ts
        deletions = [(c, keys) for c, (_epoch, keys) in mine.items() if len(keys)]
        if deletions:
            newest = max(mine[c][0] for c, _keys in deletions)
            tombstone_ts = max(now_us, newest * 1000 + 1000)
            if store.family.rules.members:
                # members first: once their derived rows are gone, the mark is what keeps a
                # duplicate row (a clock-behind writer's) from counting the member again
                store.raw.mark_counted(
                    [(c, [k[MEMBER_INDEX] for k in keys.keys]) for c, keys in deletions]
                )
                fault("cleanup_mark")
            part.rows_deleted += store.raw.delete_rows(deletions, tombstone_ts)
            deleted_by_commit.extend((bucket, c, rows) for c, rows in shares.items() if rows)
        return part, mine, tombstone_ts

    parts = list(each_bucket(one, sorted(runs)))
    fault("cleanup_delete")
    store.runs.mark_deleted(run_id, shard, deleted_by_commit)  # what the run's audit row sums
    return CleanupReport(
        shard,
        rows_deleted=sum(p.rows_deleted for p in parts),
        leftovers=tuple(x for p in parts for x in p.leftovers),
        late_rows=sum(p.late_rows for p in parts),
        late_sum=sum(p.late_sum for p in parts),
        windowed=sum(p.windowed for p in parts),
        counters_cleaned=sum(p.counters_cleaned for p in parts),
        counters_checked=sum(p.counters_checked for p in parts),
        stamped_ahead=tuple(x for p in parts for x in p.stamped_ahead),
        seconds=time.perf_counter() - started,
        requests=dict(store.statements.requests),
        peak_rss_mib=peak_rss_mib(),
        **({} if archived is None else _archive_figures(archived)),
    )


def _archive_figures(archived: Archived) -> dict[str, Any]:
    """A cleanup report's archive fields, from what its archive wrote."""
    return {
        "archived_rows": archived.rows,
        "archived_sum": archived.sum,
        "archive_files": tuple(m.url for m in archived.manifests),
        "archive_deferred": len(archived.deferred),
        "archive_seconds": archived.seconds,
    }


def _log_left_out(store: Store, left_out: dict[Any, set[Key]], quarantined: set[Key]) -> None:
    """Name the counters whose rows a commit's archive left out (quarantined when it was
    written) and that are not quarantined now (released since): their rows stay, counted,
    until the next fold of the counter (its mark is kept while it is quarantined; a sweep
    reads it anyway) carries, archives and deletes them. Readers are exact meanwhile."""
    released = sorted({c for held in left_out.values() for c in held} - quarantined, key=repr)
    if released:
        log.warning(
            "family %s: %d counter(s) released since their commit's archive left them out keep "
            "their rows for the next run, which archives them first: %s",
            store.family.name,
            len(released),
            ", ".join(format_key(c) for c in released[:5]),
        )


def _check_left(
    store: Store,
    shard: int,
    bucket: int,
    mine: dict[Key, tuple[int, CountedKeys]],
    report: CleanedBucket,
    tombstone_ts: int,
) -> None:
    """Count, on the server, what is left at or below the epoch of a sample of the bucket's
    cleaned counters (all of them up to ``CLEANUP_CHECK_SAMPLE``). A whole-bucket count would
    read every tombstone just written; a systematic failure (a wrong key, a tombstone older than
    the row) shows in any sample, and every counted row left anywhere is counted again by the
    next run that reads its counter (``counted_present``), deleted and reported. A counted row
    a writer stamped ahead of the tombstones is deleted again at its own write time
    (``_delete_stamped_ahead``); when the sample finds one, the rest of the bucket's counters
    are checked too (the same writer's other rows are likely ahead as well)."""
    report.counters_cleaned += len(mine)
    chosen = list(mine)
    rest: list[Key] = []
    if len(chosen) > CLEANUP_CHECK_SAMPLE:
        chosen = random.Random(f"{shard}:{bucket}").sample(
            sorted(chosen, key=repr), CLEANUP_CHECK_SAMPLE
        )
        sampled = set(chosen)
        rest = [c for c in mine if c not in sampled]
    ahead_before = len(report.stamped_ahead)
    _check_counters(store, shard, bucket, mine, chosen, report, tombstone_ts)
    if rest and len(report.stamped_ahead) > ahead_before:
        _check_counters(store, shard, bucket, mine, rest, report, tombstone_ts)


def _check_counters(
    store: Store,
    shard: int,
    bucket: int,
    mine: dict[Key, tuple[int, CountedKeys]],
    chosen: Sequence[Key],
    report: CleanedBucket,
    tombstone_ts: int,
) -> None:
    """``_check_left`` over the ``chosen`` counters."""
    report.counters_checked += len(chosen)
    counted = {c: frozenset(mine[c][1].keys) for c in chosen}
    by_epoch: dict[int, list[Key]] = {}
    for counter in chosen:
        by_epoch.setdefault(mine[counter][0], []).append(counter)
    for epoch_ms, group in by_epoch.items():
        # above the earliest counted row: the tombstones of earlier folds stay unread (late rows
        # below it are not reported here; the next run that reads the counter folds them)
        after_ms = lowest_floor(_key_floor(mine[c][1].keys) for c in group)
        left = recount_tolerant(store, shard, bucket, group, epoch_ms, counted, False, after_ms)
        for counter in group:
            if not left.get(counter, (0, 0))[0]:
                continue
            try:
                present = store.raw.read_rows([counter])[counter]
            except (ReadFailure, ReadTimeout):  # a hot counter: its counted rows only
                present = store.raw.read_rows_at(counter, list(counted[counter]))
                report.windowed += 1
            stuck: list[tuple[int, Any]] = []
            for time_ms, key, increment in present:
                if time_ms > epoch_ms:
                    continue
                if key in counted[counter]:
                    stuck.append((time_ms, key))
                else:
                    report.late_rows += 1
                    report.late_sum += increment or 0
            if stuck:
                _delete_stamped_ahead(store, counter, stuck, tombstone_ts, report)


LATEST_TIMESTAMP = 2**63 - 1
"""The largest write timestamp Cassandra takes (a tombstone there still wins a tie)."""


def _delete_stamped_ahead(
    store: Store,
    counter: Key,
    stuck: Sequence[tuple[int, Any]],
    tombstone_ts: int,
    report: CleanedBucket,
) -> None:
    """Counted rows still present after their delete: those whose own columns were written at
    or after the tombstone's timestamp (a writer's clock ahead of the cluster's, an explicit
    ``USING TIMESTAMP``) outlived it; delete them again with a tombstone just after their
    newest write time (it also shadows a retry of the same rows stamped no later) and report
    them. Any other, one whose write time CQL cannot read, or one that survives that too, is
    a leftover: the check fails naming it."""
    written = store.raw.written_at(counter, [key for _t, key in stuck])
    if written is None:  # no column to read a write time from: each is a leftover
        written = dict.fromkeys((key for _t, key in stuck), None)
    ahead = {key: ts for key, ts in written.items() if ts is not None and ts >= tombstone_ts}
    still: set[Any] = set()
    if ahead:
        stamp = min(max(ahead.values()) + 1, LATEST_TIMESTAMP)
        store.raw.delete_rows([(counter, list(ahead))], stamp)
        still = {key for _t, key, _i in store.raw.read_rows_at(counter, list(ahead))}
    for time_ms, key in stuck:
        if key not in written:  # gone since it was read
            continue
        if key in ahead and key not in still:
            seconds = (ahead[key] - tombstone_ts) / 1e6
            report.stamped_ahead.append(f"{format_key(counter)} @ {time_ms}, {seconds:.0f} s ahead")
        else:
            report.leftovers.append(f"{format_key(counter)} @ {time_ms}")


def _key_floor(keys: Sequence[Any]) -> int | None:
    """The time before the earliest of these counted keys, when their time is packed as epoch
    ms (a ``timestamp`` time column); None otherwise."""
    times = [k[0] for k in keys]
    if not times or not all(type(t) is int for t in times):
        return None
    return min(times) - 1


def verify_cleanup(reports: Sequence[CleanupReport]) -> CheckOutcome:
    """After cleanup: no row the run counted remains (pure, over the shards' reports).

    Rows at or below the epoch that the ledger does not list are late writes that arrived
    after the fold; they are reported (and folded by the next run), not failures.
    """
    leftovers = [x for r in reports for x in r.leftovers]
    late_rows = sum(r.late_rows for r in reports)
    late_sum = sum(r.late_sum for r in reports)
    windowed = sum(r.windowed for r in reports)
    cleaned = sum(r.counters_cleaned for r in reports)
    checked = sum(r.counters_checked for r in reports)
    detail = (
        (f"{len(leftovers)} counted row(s) still present" if leftovers else "all counted rows gone")
        + f" in {checked} of {cleaned} cleaned counter(s) counted again"
        + f"; {late_rows} uncounted row(s) at or below the epoch (sum {late_sum}): late rows "
        "that arrived after the fold, or more than one commit carries, left for the next runs"
    )
    if windowed:
        detail += f"; {windowed} hot counter(s) checked by parts (late rows: recent ones only)"
    return CheckOutcome(
        "no_counted_rows_remain_after_cleanup",
        not leftovers,
        True,
        detail,
        tuple(leftovers[:50]),
    )


def stamped_ahead_check(reports: Sequence[CleanupReport]) -> CheckOutcome | None:
    """A warning, not a failure (pure): counted rows a writer stamped ahead of the run's
    tombstones, which the check deleted again at their own write time. The run succeeds; the
    check fails, not critical, so its audit row and its checks name the rows and the cause (a
    writer's clock to fix). None when there were none."""
    ahead = [x for r in reports for x in r.stamped_ahead]
    if not ahead:
        return None
    return CheckOutcome(
        "no_row_stamped_ahead",
        False,
        False,
        f"{len(ahead)} counted row(s) were stamped ahead of the run's tombstones (a writer's "
        "clock ahead of the cluster's, or USING TIMESTAMP): deleted again at their own write "
        f"time: {'; '.join(ahead[:5])}",
        tuple(ahead[:50]),
    )


def cleanup_failure_message(family: str, run_id: str, outcome: CheckOutcome) -> str:
    return (
        f"cleanup check failed for family {family!r} run {run_id!r}: "
        f"{outcome.detail} [{'; '.join(outcome.counters[:5])}]"
    )
