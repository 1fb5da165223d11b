"""The compaction engine: plan -> compact shards -> verify -> clean up -> record.

The DAG runs each phase as its own task (compact mapped over shards); ``run_family`` runs them
in one process for ``counterctl compact``. Both call exactly these functions.

Safety, in one place:

* commits are compare-and-set on the compact row's ``commit_id`` (a lightweight transaction),
  so overlapping runs, retries and stale lease holders can never both build on one state;
* a shard lease (LWT with TTL) keeps two runs from doing the same work, but correctness does not
  depend on it;
* raw rows are deleted only by ``cleanup_shard``, only after ``verify_run`` passed, and only the
  exact rows the committed compact row lists as counted (``pending``), never a range: a late row
  written next to them survives and is folded by a later run;
* the run log is written after each commit; whatever a crash leaves behind (committed but not
  logged, logged but not cleaned) is found again by the next run through the touched index and
  the compact row's ``pending`` list.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra import DriverException, ReadFailure, ReadTimeout

from .config import Discovery, Family, Kind
from .core import (
    CheckOutcome,
    Checkpoint,
    CommitRecord,
    FoldPlan,
    Key,
    RawRow,
    Tally,
    evaluate_commit_checks,
    format_key,
    plan_fold,
    plan_slice,
    to_millis,
    truncate_ms,
    utc_naive,
    write_timestamp,
)
from .errors import (
    ChecksFailed,
    EngineError,
    EpochInFuture,
    EpochNotNewer,  # noqa: F401 (re-exported: the CLI maps it to exit code 0)
    LeaseHeld,
    RowsRefused,
)
from .store import LogEntry, Store, Touched

log = logging.getLogger(__name__)

Fault = Callable[[str], None]
"""Called between statements with the name of the point reached; tests raise there to crash."""

FAULT_POINTS = (
    "lease",
    "discover",
    "read_compact",
    "read_raw",
    "commit",
    "log",
    "verify",
    "cleanup_read_log",
    "cleanup_mark",
    "cleanup_delete",
    "cleanup_forget",
    "finish",
)
"""Every point ``fault`` is called at, in run order (``cleanup_mark``: unique families only)."""

LEASE_TTL_S = 120
FORGET_MARGIN = timedelta(minutes=2)
HOT_LATE_WINDOW = timedelta(minutes=10)
"""How far behind its epoch a hot counter is read when its whole partition cannot be (every
folded row leaves a tombstone for ``gc_grace_seconds``; past ``tombstone_failure_threshold``,
100,000 by default, Cassandra refuses the read). Its rows older than this are not read by the
run: a late row there stays, uncounted but never lost, until the partition can be read whole."""
"""Index marks younger than this are kept: a writer marks first and writes its row just after."""


def _no_fault(point: str) -> None:
    del point


def new_run_id(prefix: str = "cli") -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


@dataclass
class Phases:
    """Wall time per phase, in seconds."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def merge(self, other: Phases) -> Phases:
        out = Phases(dict(self.seconds))
        for name, value in other.seconds.items():
            out.seconds[name] = out.seconds.get(name, 0.0) + value
        return out


@dataclass
class ShardReport:
    shard: int
    tally: Tally
    phases: Phases
    dry_run: bool = False


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# --- plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    family: str
    run_id: str
    epoch: datetime
    epoch_before: datetime | None
    shards: tuple[int, ...]
    noop_reason: str | None = None

    @property
    def noop(self) -> bool:
        return self.noop_reason is not None


def decide_plan(
    family: Family,
    run_id: str,
    epoch: datetime,
    epoch_before: datetime | None,
    now: datetime | None = None,
) -> RunPlan:
    """Pure: whether a run at ``epoch`` has anything to do, given the family's compacted epoch.

    An epoch later than ``now - lag`` is refused: writers are still writing rows at those
    times, and every one of them would become a late write.
    """
    epoch = truncate_ms(epoch)
    if now is not None and epoch > utc_naive(now) - family.lag:
        raise EpochInFuture(
            f"family {family.name!r}: epoch {epoch.isoformat()} is later than now - lag "
            f"({(utc_naive(now) - family.lag).isoformat()}); refusing to fold rows that "
            "writers may still be writing"
        )
    reason = None
    if epoch_before is not None and epoch <= utc_naive(epoch_before):
        reason = (
            f"epoch {epoch.isoformat()} is not newer than the compacted epoch "
            f"{utc_naive(epoch_before).isoformat()}: nothing to do"
        )
    return RunPlan(family.name, run_id, epoch, epoch_before, tuple(range(family.shards)), reason)


def plan_run(store: Store, run_id: str, epoch: datetime, now: datetime | None = None) -> RunPlan:
    return decide_plan(store.family, run_id, epoch, store.family_epoch(), now or datetime.now(UTC))


# --- compact -----------------------------------------------------------------------------


def compact_shard(
    store: Store,
    shard: int,
    epoch: datetime,
    run_id: str,
    *,
    dry_run: bool = False,
    use_lease: bool = True,
    chunk_size: int = 500,
    max_attempts: int = 4,
    fault: Fault = _no_fault,
) -> ShardReport:
    """Fold every counter of the shard with rows at or below ``epoch``; commit each with CAS."""
    phases = Phases()
    tally = Tally()
    epoch = truncate_ms(epoch)
    holding = False
    if use_lease and not dry_run:
        holder = store.acquire_lease(shard, run_id, LEASE_TTL_S)
        if holder is not None:
            raise LeaseHeld(f"family {store.family.name!r} shard {shard} is held by run {holder!r}")
        holding = True
        fault("lease")
    try:
        with phases.timed("discover"):
            marks = _discover(store, shard)
        fault("discover")
        already_logged = (
            {e.counter for e in store.read_log(run_id, shard)} if not dry_run else set()
        )
        last_renewal = time.monotonic()
        for chunk in chunks(list(marks), chunk_size):
            todo: list[Key] = list(chunk)
            for attempt in range(max_attempts):
                plans = _plan_chunk(store, todo, epoch, phases, fault, tally)
                if dry_run:
                    for plan in plans:
                        tally.add_plan(plan)
                    break
                todo = _commit_chunk(
                    store, shard, run_id, plans, marks, already_logged, tally, phases, fault
                )
                if not todo:
                    break
                tally.conflicts += len(todo)
                log.info("shard %s: %d conflict(s), attempt %d", shard, len(todo), attempt + 1)
            if holding and time.monotonic() - last_renewal > LEASE_TTL_S / 3:
                if not store.renew_lease(shard, run_id, LEASE_TTL_S):
                    raise LeaseHeld(f"lost the lease of shard {shard} to another run")
                last_renewal = time.monotonic()
    except Exception:
        if holding:
            _release_quietly(store, shard, run_id)
        raise
    if holding:
        store.release_lease(shard, run_id)
    if tally.counters_refused:
        raise RowsRefused(
            f"family {store.family.name!r} shard {shard}: {tally.counters_refused} counter(s) "
            f"have raw rows with a NULL or non-integer increment, not folded: "
            f"{', '.join(tally.refused_counters)}"
        )
    return ShardReport(shard, tally, phases, dry_run)


def _release_quietly(store: Store, shard: int, run_id: str) -> None:
    try:
        store.release_lease(shard, run_id)
    except Exception:  # the lease expires by itself; the original error matters more
        log.warning("could not release the lease of shard %s", shard, exc_info=True)


def _discover(store: Store, shard: int) -> dict[Key, int | None]:
    """Counters that may have rows to fold, with the write time of their index mark."""
    if store.family.discovery is Discovery.SCAN:
        return {counter: None for counter in store.scan_counters(shard)}
    return {t.counter: t.writetime for t in store.touched(shard)}


def _plan_chunk(
    store: Store,
    counters: Sequence[Key],
    epoch: datetime,
    phases: Phases,
    fault: Fault,
    tally: Tally | None = None,
) -> list[FoldPlan]:
    # Order matters: the compact row is read before the raw rows, so a row deleted by another
    # run's cleanup is either counted in the pending list we read or already gone.
    with phases.timed("read_compact"):
        checkpoints = store.read_checkpoints(counters)
    fault("read_compact")
    if store.family.folds_by_slice:
        with phases.timed("read_raw"):
            slices = store.read_slices(counters, checkpoints, epoch)
        fault("read_raw")
        return [plan_slice(c, checkpoints[c], *slices[c], epoch) for c in counters]
    with phases.timed("read_raw"):
        rows, windowed = read_rows_tolerant(store, counters, checkpoints)
    if tally is not None and windowed:
        tally.add_windowed(list(windowed))
    fault("read_raw")
    if store.family.kind is Kind.UNIQUE:
        with phases.timed("read_members"):
            counted = {c: _counted_members(store, c, checkpoints[c], rows[c]) for c in counters}
        return [
            plan_fold(c, checkpoints[c], rows[c], epoch, MEMBER_INDEX, frozenset(counted[c]))
            for c in counters
        ]
    with phases.timed("plan"):
        return [plan_fold(c, checkpoints[c], rows[c], epoch) for c in counters]


def read_rows_tolerant(
    store: Store, counters: Sequence[Key], checkpoints: dict[Key, Checkpoint]
) -> tuple[dict[Key, list[RawRow]], dict[Key, datetime]]:
    """Every row of each counter; a counter whose partition cannot be read whole (a hot counter
    over the tombstone failure threshold) is read in parts instead (``read_hot_counter``).
    Returns the rows, and per hot counter the time before which its late rows were not read."""
    try:
        return store.read_rows(counters), {}
    except (ReadFailure, ReadTimeout) as exc:
        if len(counters) == 1:
            return read_hot_counter(store, counters[0], checkpoints[counters[0]], exc)
    rows: dict[Key, list[RawRow]] = {}
    floors: dict[Key, datetime] = {}
    for counter in counters:  # one at a time, to find the counter(s) that cannot be read
        try:
            rows.update(store.read_rows([counter]))
        except (ReadFailure, ReadTimeout) as exc:
            found, floor = read_hot_counter(store, counter, checkpoints[counter], exc)
            rows.update(found)
            floors.update(floor)
    return rows, floors


def read_hot_counter(
    store: Store, counter: Key, checkpoint: Checkpoint, error: Exception
) -> tuple[dict[Key, list[RawRow]], dict[Key, datetime]]:
    """The rows a fold must see, read without crossing the tombstones of folded rows: every row
    after the counter's epoch (no tombstone of ours lies there), every row its compact row lists
    as pending that is still present (point reads: keeping them in ``pending`` is what stops a
    later run from counting them twice), and, if that range can be read, late rows of the last
    ``HOT_LATE_WINDOW``. Older late rows stay in the table, uncounted but never lost, until the
    partition can be read whole again."""
    if checkpoint.epoch is None:  # never folded: no tombstones of ours, not ours to work around
        raise error
    epoch = utc_naive(checkpoint.epoch)
    rows = {r.clustering: r for r in store.read_rows_after(counter, epoch)}
    rows.update((r.clustering, r) for r in store.read_rows_at(counter, list(checkpoint.pending)))
    floor = epoch - HOT_LATE_WINDOW
    try:
        rows.update((r.clustering, r) for r in store.read_rows_between(counter, floor, epoch))
    except (ReadFailure, ReadTimeout):
        floor = epoch
    log.warning(
        "family %r counter %s: whole-partition read failed (%s); read its rows after %s, its "
        "pending rows, and late rows since %s",
        store.family.name,
        format_key(counter),
        type(error).__name__,
        epoch.isoformat(),
        floor.isoformat(),
    )
    return {counter: sorted(rows.values(), key=lambda r: utc_naive(r.time))}, {counter: floor}


MEMBER_INDEX = 1
"""A unique family's derived rows are clustered by (first_time, member)."""


def _counted_members(store: Store, counter: Key, base: Any, rows: Sequence[Any]) -> set[Any]:
    candidates = [r.clustering[MEMBER_INDEX] for r in rows if r.clustering not in base.pending]
    return store.counted_members(counter, candidates)


def _commit_chunk(
    store: Store,
    shard: int,
    run_id: str,
    plans: Sequence[FoldPlan],
    marks: dict[Key, int | None],
    already_logged: set[Key],
    tally: Tally,
    phases: Phases,
    fault: Fault,
) -> list[Key]:
    """Commit the plans that fold something, log what happened; return conflicting counters."""
    committing = [p for p in plans if p.commit]
    commit_ids = [store.new_commit_id() for _ in committing]
    with phases.timed("commit"):
        applied = store.commit(committing, commit_ids, run_id)
    fault("commit")
    conflicts: list[Key] = []
    entries: list[LogEntry] = []
    for plan, commit_id, ok in zip(committing, commit_ids, applied, strict=True):
        if ok:
            tally.add_plan(plan)
            entries.append(_entry(plan, commit_id, "commit", marks.get(plan.counter)))
        else:
            conflicts.append(plan.counter)
    for plan in plans:
        if plan.commit:
            continue
        tally.add_plan(plan)
        if plan.refused or plan.counter in already_logged:
            continue
        action = "cleanup" if plan.counted_present else "idle"
        entries.append(_entry(plan, plan.base.commit_id, action, marks.get(plan.counter)))
    with phases.timed("log"):
        store.write_log(run_id, shard, entries)
    fault("log")
    return conflicts


def _entry(plan: FoldPlan, commit_id: Any, action: str, writetime: int | None) -> LogEntry:
    committed = action == "commit"
    return LogEntry(
        counter=plan.counter,
        commit_id=commit_id,
        action=action,
        base_value=plan.base.value,
        base_epoch=plan.base.epoch,
        folded_rows=plan.folded_rows if committed else 0,
        folded_sum=plan.folded_sum if committed else 0,
        late_rows=plan.late_rows if committed else 0,
        late_sum=plan.late_sum if committed else 0,
        max_lateness_ms=plan.max_lateness_ms if committed else 0,
        new_value=plan.value if committed else plan.base.value,
        new_epoch=plan.epoch if committed else (plan.base.epoch or plan.epoch),
        touched_writetime=writetime,
        newer_rows=plan.newer_rows,
    )


# --- verify ------------------------------------------------------------------------------


@dataclass
class Verification:
    outcomes: list[CheckOutcome]
    records: list[CommitRecord]
    tally: Tally

    @property
    def passed(self) -> bool:
        return all(o.success for o in self.outcomes if o.critical)

    def failure_message(self, family: str, run_id: str) -> str:
        failed = [o for o in self.outcomes if o.critical and not o.success]
        parts = [f"{o.name}: {o.detail} [{'; '.join(o.counters[:5])}]" for o in failed]
        return f"conservation check failed for family {family!r} run {run_id!r}: " + " | ".join(
            parts
        )


def collect_records(
    store: Store, run_id: str, shards: Sequence[int]
) -> tuple[list[CommitRecord], Tally]:
    """Join the run's log with the compact rows as they are now."""
    records: list[CommitRecord] = []
    tally = Tally()
    for shard in shards:
        entries = [e for e in store.read_log(run_id, shard) if e.action in ("commit", "cleanup")]
        current = store.read_checkpoints([e.counter for e in entries])
        for entry in entries:
            checkpoint = current[entry.counter]
            records.append(
                CommitRecord(
                    counter=entry.counter,
                    commit_id=entry.commit_id,
                    base_value=entry.base_value,
                    folded_sum=entry.folded_sum,
                    new_value=entry.new_value,
                    new_epoch=entry.new_epoch,
                    current_commit_id=checkpoint.commit_id,
                    current_value=checkpoint.value if checkpoint.commit_id else None,
                    current_epoch=checkpoint.epoch,
                )
            )
            if entry.action == "commit":
                tally.counters_committed += 1
                tally.rows_folded += entry.folded_rows
                tally.sum_folded += entry.folded_sum
                tally.late_rows += entry.late_rows
                tally.late_sum += entry.late_sum
                tally.max_lateness_ms = max(tally.max_lateness_ms, entry.max_lateness_ms)
    return records, tally


def hot_counter_outcomes(tally: Tally) -> list[CheckOutcome]:
    """A warning (not a failure) naming the counters folded from a window only."""
    if not tally.windowed_reads:
        return []
    detail = (
        f"{tally.windowed_reads} hot counter(s) could not be read whole (tombstone overload) and "
        f"were folded by parts: late rows more than {HOT_LATE_WINDOW} behind their epoch are "
        "kept and counted once the partition can be read whole again"
    )
    return [
        CheckOutcome(
            "hot_counters_read_whole", False, False, detail, tuple(tally.windowed_counters)
        )
    ]


def verify_run(store: Store, run_id: str, shards: Sequence[int]) -> Verification:
    records, tally = collect_records(store, run_id, shards)
    return Verification(evaluate_commit_checks(records), records, tally)


# --- cleanup -----------------------------------------------------------------------------


def cleanup_shard(
    store: Store,
    shard: int,
    run_id: str,
    *,
    now: datetime | None = None,
    fault: Fault = _no_fault,
) -> int:
    """Delete the raw rows the run's verified commits counted; forget idle index marks.

    Only rows listed in the compact row's ``pending`` are deleted, and only while the compact
    row still carries the commit this run logged (a later commit lists them itself).
    """
    entries = store.read_log(run_id, shard)
    fault("cleanup_read_log")
    kept = store.family.folds_by_slice  # a kept family's runs delete nothing
    deleting = [] if kept else [e for e in entries if e.action != "idle"]
    current = store.read_checkpoints([e.counter for e in deleting])
    deletions = [
        (e.counter, sorted(current[e.counter].pending, key=repr))
        for e in deleting
        if current[e.counter].commit_id == e.commit_id and current[e.counter].pending
    ]
    now = now or datetime.now(UTC)
    tombstone_ts = max(
        write_timestamp(now), max((write_timestamp(e.new_epoch) + 1000 for e in entries), default=0)
    )
    if deletions and store.family.kind is Kind.UNIQUE:
        # members first: once their derived rows are gone, the mark is what keeps a duplicate
        # row (a clock-behind writer's) from counting the member again
        store.mark_counted([(c, [k[MEMBER_INDEX] for k in keys]) for c, keys in deletions])
        fault("cleanup_mark")
    deleted = store.delete_rows(deletions, tombstone_ts) if deletions else 0
    fault("cleanup_delete")
    horizon = (to_millis(now) - int(FORGET_MARGIN.total_seconds() * 1000)) * 1000
    forgettable = [
        Touched(e.counter, e.touched_writetime)
        for e in entries
        if e.touched_writetime is not None and e.newer_rows == 0 and e.touched_writetime < horizon
    ]
    if forgettable:
        store.forget_touched(shard, forgettable)
    fault("cleanup_forget")
    return deleted


def verify_cleanup(store: Store, run_id: str, shards: Sequence[int]) -> CheckOutcome:
    """After cleanup: no row the run counted remains at or below the counter's epoch.

    Rows at or below the epoch that the compact row does not list are late writes that arrived
    after the fold; they are reported (and folded by the next run), not failures.
    """
    if store.family.folds_by_slice:
        return CheckOutcome(
            "no_counted_rows_remain_after_cleanup", True, False, "retention keep: nothing deleted"
        )
    leftovers: list[str] = []
    late_rows = late_sum = windowed = 0
    for shard in shards:
        entries = [e for e in store.read_log(run_id, shard) if e.action != "idle"]
        current = store.read_checkpoints([e.counter for e in entries])
        mine = [e.counter for e in entries if current[e.counter].commit_id == e.commit_id]
        found, floors = read_rows_tolerant(store, mine, current)
        windowed += len(floors)
        for counter, rows in found.items():
            checkpoint = current[counter]
            for row in rows:
                if checkpoint.epoch is None or utc_naive(row.time) > utc_naive(checkpoint.epoch):
                    continue
                if row.clustering in checkpoint.pending:
                    leftovers.append(f"{format_key(counter)} @ {row.time.isoformat()}")
                else:
                    late_rows += 1
                    late_sum += row.increment or 0
    detail = (
        f"{len(leftovers)} counted row(s) still present" if leftovers else "all counted rows gone"
    ) + f"; {late_rows} late row(s) arrived after the fold (sum {late_sum}), left for next run"
    if windowed:
        detail += f"; {windowed} hot counter(s) checked by parts (late rows: recent ones only)"
    return CheckOutcome(
        "no_counted_rows_remain_after_cleanup", not leftovers, True, detail, tuple(leftovers[:50])
    )


# --- reset -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetResult:
    counter: Key
    reset_id: str
    at: datetime
    value_before: int
    already_done: bool
    rows_deleted: int = 0


def reset_counter(
    store: Store,
    counter: Key,
    at: datetime,
    reset_id: str | None = None,
    now: datetime | None = None,
) -> ResetResult:
    """Set a counter back to zero at ``at``: increments after ``at`` count, the ones at or
    before it are consumed (deleted, for a deleting family). A retry with the same reset id
    (default: derived from counter and time) finds its own commit and does nothing.
    """
    family = store.family
    if family.kind is Kind.UNIQUE:
        raise EngineError(
            f"family {family.name!r}: a unique counter cannot be reset: its set rows are written "
            "with timestamps near Long.MAX (first write wins), so no delete can remove them "
            "without also shadowing every later write of the same member"
        )
    at = truncate_ms(utc_naive(at))
    reset_id = reset_id or f"reset:{format_key(counter)}@{at.isoformat()}"
    compact_value, _epoch, newer = store.read_values([counter])[counter]
    value_before = compact_value + newer
    for _attempt in range(4):
        if store.committed_by(counter) == reset_id:
            return ResetResult(counter, reset_id, at, value_before, already_done=True)
        base = store.read_checkpoints([counter])[counter]
        if base.epoch is not None and at < utc_naive(base.epoch):
            raise EngineError(
                f"family {family.name!r} counter {format_key(counter)}: reset point "
                f"{at.isoformat()} is before its compacted epoch {base.epoch.isoformat()}; "
                "increments after the reset point are already folded in, choose a later point"
            )
        consumed: tuple[Key, ...] = ()
        if not family.folds_by_slice:
            rows = store.read_rows([counter])[counter]
            consumed = tuple(r.clustering for r in rows if utc_naive(r.time) <= at)
        plan = FoldPlan(counter, base, at, 0, consumed, 0, -base.value)
        if store.commit([plan], [store.new_commit_id()], reset_id)[0]:
            break
    else:
        raise EngineError(f"counter {format_key(counter)}: reset kept conflicting with runs")
    after = store.read_checkpoints([counter])[counter]
    if after.value != 0 or utc_naive(after.epoch) != at:
        raise ChecksFailed(
            f"reset of {format_key(counter)} not visible: value {after.value} @ {after.epoch}",
            [],
        )
    deleted = 0
    if after.pending and family.effective_retention.value == "delete":
        ts = max(write_timestamp(now or datetime.now(UTC)), write_timestamp(at) + 1000)
        deleted = store.delete_rows([(counter, sorted(after.pending, key=repr))], ts)
    tally = Tally(counters_committed=1, rows_deleted=deleted)
    plan_record = RunPlan(family.name, reset_id, at, base.epoch, ())
    store.write_audit(
        audit_record(
            family,
            plan_record,
            outcome="reset",
            tally=tally,
            phases=Phases(),
            message=f"counter {format_key(counter)} reset from {value_before} to 0 at "
            f"{at.isoformat()} ({deleted} raw row(s) consumed)",
        )
    )
    return ResetResult(
        counter, reset_id, at, value_before, already_done=False, rows_deleted=deleted
    )


# --- reconcile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Discrepancy:
    counter: Key
    expected: int
    counted: int
    repaired: bool = False

    @property
    def difference(self) -> int:
        return self.expected - self.counted


def reconcile(store: Store, *, repair: bool = False) -> list[Discrepancy]:
    """Recount from the source of truth and compare with what readers see.

    * unique: the number of distinct members vs the counter's value. ``repair`` rewrites the
      derived row of every member not yet counted (idempotent; the fold counts a member once),
      which heals writers that crashed between the member and its row; run a compaction after.
    * rows: the rows at or below each checkpoint vs its count (rows that arrived behind the
      checkpoint). ``repair`` folds the difference in with the same conditional commit.
    * increments: the folded rows are deleted, so there is nothing to recount against.
    """
    family = store.family
    if family.kind is Kind.INCREMENTS:
        raise EngineError(
            f"family {family.name!r}: reconcile recounts a unique family's set or a rows "
            "family's rows; an increments family's folded rows are deleted (late rows are "
            "reported by every compaction instead)"
        )
    found: list[Discrepancy] = []
    for shard in range(family.shards):
        if family.kind is Kind.UNIQUE:
            counters = store.scan_set_counters(shard)
            truth = store.count_members(counters)
            values = store.read_values(counters) if counters else {}
            seen = {c: compact + newer for c, (compact, _epoch, newer) in values.items()}
            for counter in counters:
                if truth[counter] == seen[counter]:
                    continue
                if repair:
                    missing = [(m, t) for m, t, counted in store.members(counter) if not counted]
                    store.mark_touched([counter])
                    store.insert_raw(
                        [(counter, (t, m), 1, write_timestamp(t)) for m, t in missing if t]
                    )
                found.append(Discrepancy(counter, truth[counter], seen[counter], repair))
        else:
            counters = store.scan_counters(shard)
            checkpoints = store.read_checkpoints(counters)
            known = [c for c in counters if checkpoints[c].epoch is not None]
            truth = store.recount_slices(known, checkpoints)
            for counter in known:
                base = checkpoints[counter]
                if truth[counter] == base.value:
                    continue
                repaired = False
                if repair:
                    plan = FoldPlan(
                        counter,
                        base,
                        base.epoch,
                        truth[counter],
                        (),
                        truth[counter] - base.value,
                        truth[counter] - base.value,
                        late_rows=truth[counter] - base.value,
                        late_sum=truth[counter] - base.value,
                    )
                    repaired = store.commit([plan], [store.new_commit_id()], "reconcile")[0]
                found.append(Discrepancy(counter, truth[counter], base.value, repaired))
    return found


# --- finish ------------------------------------------------------------------------------


def finish_run(store: Store, plan: RunPlan) -> None:
    """The whole run succeeded: the family's compacted epoch becomes the run's epoch."""
    store.advance_family_epoch(plan.epoch, plan.run_id)


def audit_record(
    family: Family,
    plan: RunPlan,
    *,
    outcome: str,
    tally: Tally,
    phases: Phases,
    checks: Sequence[CheckOutcome] = (),
    dry_run: bool = False,
    message: str = "",
    started_at: datetime | None = None,
) -> dict[str, Any]:
    return {
        "family": family.name,
        "started_at": started_at or datetime.now(UTC),
        "run_id": plan.run_id,
        "kind": family.kind.value,
        "outcome": outcome,
        "dry_run": dry_run,
        "epoch_before": plan.epoch_before,
        "epoch_after": plan.epoch
        if outcome in ("success", "reset") and not dry_run
        else plan.epoch_before,
        "counters": tally.counters_committed,
        "rows_folded": tally.rows_folded,
        "sum_folded": tally.sum_folded,
        "late_rows": tally.late_rows,
        "late_sum": tally.late_sum,
        "max_lateness_ms": tally.max_lateness_ms,
        "conflicts": tally.conflicts,
        "rows_deleted": tally.rows_deleted,
        "checks": {o.name: ("pass" if o.success else f"FAIL: {o.detail}") for o in checks},
        "durations": {k: round(v, 3) for k, v in phases.seconds.items()},
        "message": message[:2000],
    }


@dataclass
class RunSummary:
    plan: RunPlan
    outcome: str
    tally: Tally
    phases: Phases
    checks: list[CheckOutcome]
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "family": self.plan.family,
            "run_id": self.plan.run_id,
            "outcome": self.outcome,
            "epoch_before": self.plan.epoch_before.isoformat() if self.plan.epoch_before else None,
            "epoch": self.plan.epoch.isoformat(),
            "message": self.message,
            **{k: v for k, v in self.tally.as_dict().items() if k != "refused_counters"},
            "refused_counters": self.tally.refused_counters,
            "checks": {o.name: o.success for o in self.checks},
            "durations_s": {k: round(v, 3) for k, v in self.phases.seconds.items()},
        }


def run_family(
    store: Store,
    epoch: datetime,
    run_id: str | None = None,
    *,
    dry_run: bool = False,
    use_lease: bool = True,
    chunk_size: int = 500,
    fault: Fault = _no_fault,
    progress: Callable[[str], None] | None = None,
    now: datetime | None = None,
) -> RunSummary:
    """Every phase of a run in this process (what ``counterctl compact`` does)."""
    run_id = run_id or new_run_id()
    started = datetime.now(UTC)
    phases = Phases()
    with phases.timed("plan"):
        plan = plan_run(store, run_id, epoch, now)
    tally = Tally()
    checks: list[CheckOutcome] = []
    say = progress or (lambda _m: None)

    def finish(outcome: str, message: str = "") -> RunSummary:
        """Every run leaves one audit row, whatever its outcome."""
        store.write_audit(
            audit_record(
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
        )
        return RunSummary(plan, outcome, tally, phases, checks, message)

    if plan.noop:
        return finish("noop", plan.noop_reason or "")
    try:
        for shard in plan.shards:
            say(f"compacting shard {shard + 1}/{len(plan.shards)}")
            report = compact_shard(
                store,
                shard,
                plan.epoch,
                run_id,
                dry_run=dry_run,
                use_lease=use_lease,
                chunk_size=chunk_size,
                fault=fault,
            )
            tally = tally.merge(report.tally)
            phases = phases.merge(report.phases)
        if dry_run:
            return finish("dry-run", "dry run: nothing written")
        say("verifying")
        with phases.timed("verify"):
            verification = verify_run(store, run_id, plan.shards)
        checks = verification.outcomes + hot_counter_outcomes(tally)
        tally = verification.tally.keep_compaction_counts(tally)
        fault("verify")
        if not verification.passed:
            raise ChecksFailed(verification.failure_message(store.family.name, run_id), checks)
        say("cleaning up")
        with phases.timed("cleanup"):
            for shard in plan.shards:
                tally.rows_deleted += cleanup_shard(store, shard, run_id, now=now, fault=fault)
        with phases.timed("verify_cleanup"):
            after = verify_cleanup(store, run_id, plan.shards)
        checks.append(after)
        if not after.success:
            raise ChecksFailed(
                f"cleanup check failed for family {store.family.name!r} run {run_id!r}: "
                f"{after.detail} [{'; '.join(after.counters[:5])}]",
                checks,
            )
        with phases.timed("finish"):
            finish_run(store, plan)
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
    return finish("success")


def format_counter(counter: Key) -> str:
    return format_key(counter)
