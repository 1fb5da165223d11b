"""Operations on single counters outside the compaction schedule: reset, reconcile, quarantine.

Every change to a checkpoint goes through the same bucket compare-and-set as a compaction run
(``Store.ledger.commit_bucket``), so a concurrent run can never overwrite a reset or a repair, nor a
reset or repair a run's commit: whichever commits second re-reads and re-plans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .audit import Action, operator_record
from .compaction.common import (
    ARCHIVE_FOLD_KEY_BYTES,
    FOLD_KEY_BYTES,
    MAX_ATTEMPTS,
    MAX_FOLD_ROWS,
    cluster_clock,
    cluster_micros,
    new_run_id,
)
from .compaction.outcome import RunOutcome
from .compaction.plan import RunPlan
from .compaction.shard import commit_folds, committed_checkpoint
from .config import Family
from .core import (
    BUCKETS,
    EMPTY_CHECKPOINT,
    FOLD_CARRIED,
    FOLD_NEW,
    Checkpoint,
    Fold,
    Key,
    Row,
    Tally,
    aware_utc,
    epoch_for,
    fold_recount,
    format_key,
    from_millis,
    legacy_text,
    needs_pending,
    restored_version,
    rows_that_fit,
    table_time,
    to_micros,
    to_millis,
    to_text,
    versioned_by_copy,
)
from .errors import ChecksFailed, EngineError
from .identity import check_family, check_partition
from .kinds import Reconcile
from .store import Quarantined, Store

RESET_REPEAT_WINDOW = timedelta(hours=1)
"""How long after a counter's reset a reset without a point is taken for a repeat of it."""


def _window_ms() -> int:
    return int(RESET_REPEAT_WINDOW.total_seconds() * 1000)


@dataclass(frozen=True)
class ResetResult:
    counter: Key
    reset_id: str
    at: datetime
    value_before: int
    already_done: bool
    rows_deleted: int = 0


def _resettable(family: Family, counter: Key, at: datetime | None, now: datetime) -> datetime:
    """Refuse a reset that cannot be done (a unique counter, a point in the future); now, to
    the millisecond."""
    refusal = family.rules.reset_refusal
    if refusal is not None:
        raise EngineError(f"family {family.name!r}: {refusal}")
    if at is not None:  # a person's point: refused when naive, before anything else
        aware_utc(at, f"family {family.name!r} counter {format_key(counter)}: reset point at=")
    current = table_time(now)
    if at is not None and table_time(at) > current:
        raise EngineError(
            f"family {family.name!r} counter {format_key(counter)}: reset point "
            f"{to_text(at)} is in the future (now {to_text(current)}): readers "
            "would not see the increments before it until a run folds them; choose a point at "
            "or before now"
        )
    return current


@dataclass(frozen=True)
class ResetPoint:
    """What a reset decides: its id, its point, and whether that reset is already done."""

    reset_id: str
    at: datetime
    already_done: bool


def reset_id_of(counter: Key, point: datetime) -> str:
    """The id of a reset given none (``reset:IBM@2026-11-26T12:29:00.000Z``): its counter and
    point, so a repeat of it is found done."""
    return f"reset:{format_key(counter)}@{to_text(point)}"


def legacy_reset_id(counter: Key, point: datetime) -> str:
    """``reset_id_of`` as earlier versions wrote it (``reset:IBM@2026-11-26T12:29:00``): a
    counter whose last commit is such a reset is found done by a repeat after an upgrade."""
    return f"reset:{format_key(counter)}@{legacy_text(point)}"


def decide_reset(
    family: Family,
    counter: Key,
    *,
    at: datetime | None,
    reset_id: str | None,
    current: datetime,
    base: Checkpoint,
    done_at_ms: int | None,
) -> ResetPoint:
    """The reset's decisions, pure (``reset_counter`` and its dry run take them from here):
    a given id found applied (``done_at_ms``, from the run log) decides alone; without a point,
    a reset within ``RESET_REPEAT_WINDOW`` of the counter's last one is a repeat of it; else the
    point is ``at`` or ``default_reset_point``, done if the base already starts there, refused
    if it is before the compacted epoch."""
    if reset_id is not None and done_at_ms is not None:
        return ResetPoint(reset_id, from_millis(done_at_ms), already_done=True)
    if (
        reset_id is None
        and at is None
        and base.origin_ms is not None
        and to_millis(current) - base.origin_ms < _window_ms()
    ):
        point = from_millis(base.origin_ms)
        return ResetPoint(reset_id_of(counter, point), point, True)
    point = default_reset_point(current, family.lag) if at is None else table_time(at)
    point_ms = to_millis(point)
    given_id = reset_id is not None
    reset_id = reset_id or reset_id_of(counter, point)
    done_by = {reset_id} if given_id else {reset_id, legacy_reset_id(counter, point)}
    if base.run_id in done_by or (not given_id and base.origin_ms == point_ms):
        return ResetPoint(reset_id, point, already_done=True)
    if base.epoch_ms is not None and point_ms < base.epoch_ms:
        raise EngineError(
            f"family {family.name!r} counter {format_key(counter)}: reset point "
            f"{to_text(point)} is before its compacted epoch; increments after the reset "
            "point are already folded in, choose a later point"
        )
    if base.high_ms is not None and point_ms < base.high_ms:
        raise EngineError(
            f"family {family.name!r} counter {format_key(counter)}: reset point "
            f"{to_text(point)} is before {to_text(from_millis(base.high_ms))}, the "
            "epoch an earlier commit folded it to (its late backlog is still being folded); "
            "increments after the reset point are already folded in, choose a later point"
        )
    return ResetPoint(reset_id, point, already_done=False)


def plan_reset(
    store: Store,
    counter: Key,
    at: datetime | None = None,
    reset_id: str | None = None,
    now: datetime | None = None,
) -> ResetResult:
    """What ``reset_counter`` would do now, read only (``counterctl reset --dry-run`` and its
    confirmation): the same refusals, the value it would take back to zero, the point, whether
    that reset is already done, and ``rows_deleted``: the raw rows at or before the point (the
    ones it would consume; deleted only by a deleting family). Writes nothing."""
    family = store.family
    # the cluster's time, not this host's: a clock ahead would put the default point, and the
    # check that a point is not in the future, ahead of the writers
    current = _resettable(family, counter, at, now or cluster_clock(store).now())
    check_family(store, record=False)
    compact_value, _epoch, newer = store.reader.read_values([counter])[counter]
    value_before = compact_value + newer
    base = _base(store, counter)[3]
    done_at = _reset_done(store, counter, reset_id) if reset_id is not None else None
    point = decide_reset(
        family, counter, at=at, reset_id=reset_id, current=current, base=base, done_at_ms=done_at
    )
    if point.already_done:
        return ResetResult(counter, point.reset_id, point.at, value_before, already_done=True)
    consumed = 0
    if not family.folds_by_slice:  # past any number of tombstones, as the reset reads them
        rows = store.raw.read_rows_upto(counter, to_millis(point.at))
        _one_commit(family, counter, rows, point.at)
        consumed = len(rows)
    return ResetResult(
        counter, point.reset_id, point.at, value_before, already_done=False, rows_deleted=consumed
    )


def latest_resets(
    family: str,
    resets: Iterable[tuple[str, datetime]],
    parse_key: Callable[[Sequence[str]], Key],
) -> dict[Key, datetime]:
    """Each counter's latest reset point of an earlier version's ``(counter text, point)``
    resets, by the key the text names, not the text: earlier versions wrote a timestamp key in
    more than one text form (with an offset or without), and the older of two resets taken
    as the point would count the rows between them again. Pure."""
    latest: dict[Key, datetime] = {}
    for text, point in resets:
        try:
            counter = parse_key(text.split("/"))
        except ValueError as exc:
            raise EngineError(
                f"family {family!r}: a reset in counters_audit names counter {text!r}, which "
                f"is not a key of the family ({exc}); set its reset point by hand "
                "(docs/operations.md, Upgrading)"
            ) from exc
        latest[counter] = max(point, latest.get(counter, point))
    return latest


def recover_reset_points(store: Store) -> list[Key]:
    """The counters whose reset an earlier version made, given back their reset point
    (``origin_ms``), which those versions did not keep in the ledger: a rows family's sweep
    and ``reconcile`` recount a counter from it, and with none from its first row, which
    would count the rows before the reset again. The point comes from the reset's audit row
    (``counters_audit``, before ``counterctl init`` moves it; the latest reset of each
    counter, whatever text form each reset named it in); set only where the ledger has none,
    and the counter's epoch is at or after it. Run by ``counterctl init`` before it moves the
    audit rows."""
    recovered: list[Key] = []
    latest = latest_resets(store.family.name, store.audit.legacy_resets(), store.keys.parse_key)
    for counter, point in latest.items():
        shard, bucket, _head, base = _base(store, counter)
        point_ms = to_millis(point)
        if base.origin_ms is not None or base.commit_id is None:
            continue
        if base.epoch_ms is None or base.epoch_ms < point_ms:
            continue
        if store.ledger.recover_origin(shard, bucket, counter, base.commit_id, point_ms):
            recovered.append(counter)
    return recovered


def _base(store: Store, counter: Key) -> tuple[int, int, Any, Checkpoint]:
    """(shard, bucket, head, checkpoint) of one counter, read from its ledger partition (a
    counter compacted before the ledger existed: from its compact row, if that names no
    commit; a copy naming a commit the ledger does not hold is refused, as a run quarantines
    it: taken as a base, its rows would be counted again)."""
    shard, bucket = store.keys.bucket(counter)
    ledger = store.ledger.read_ledger(shard, bucket, [counter])
    check_partition(store, shard, bucket, ledger)
    checkpoint = ledger.checkpoints.get(counter)
    copy = store.ledger.read_copies(shard, bucket, [counter]).get(counter)
    if checkpoint is not None and copy is not None and copy.commit_id == checkpoint.commit_id:
        checkpoint = versioned_by_copy(checkpoint, copy.writetime)  # a restored copy
    if checkpoint is None:
        if copy is not None and copy.commit_id is not None:
            raise EngineError(
                f"family {store.family.name!r} counter {format_key(counter)}: its compact row "
                f"names commit {copy.commit_id}, which the ledger does not hold at shard "
                f"{shard} bucket {bucket}; refusing to build on it (its rows would be counted "
                "again). Nothing was changed"
            )
        checkpoint = (
            EMPTY_CHECKPOINT
            if copy is None
            else Checkpoint(copy.value, copy.epoch_ms, None, copy.legacy_pending)
        )
    return shard, bucket, ledger.head, checkpoint


def commit_counter(
    store: Store, shard: int, bucket: int, head: Any, fold: Fold, run_id: str
) -> Checkpoint | None:
    """Commit one counter's new checkpoint and write its copy; None if another commit to the
    bucket came first (the caller re-reads)."""
    done = commit_folds(store, shard, bucket, head, [fold], run_id)
    if done is None:
        return None
    checkpoint = committed_checkpoint(fold, *done, run_id)
    store.ledger.copy_compact([(fold.counter, checkpoint)], run_id, done[1])
    copy = store.ledger.read_copies(shard, bucket, [fold.counter]).get(fold.counter)
    if copy is not None and copy.commit_id == checkpoint.commit_id:  # a copy gone later: tampering
        store.runs.mark_verified(run_id, shard, bucket, [checkpoint.commit_id], run_id)
    return checkpoint


def reset_counter(
    store: Store,
    counter: Key,
    at: datetime | None = None,
    reset_id: str | None = None,
    now: datetime | None = None,
) -> ResetResult:
    """Set a counter back to zero at ``at``: increments after ``at`` count, the ones at or
    before it are consumed (deleted, for a deleting family). Retry-safe: a reset whose point the
    counter was already reset at finds it and does nothing, and so does a reset without ``at``
    and without ``reset_id`` within ``RESET_REPEAT_WINDOW`` of the counter's last reset: an operator
    repeating the command after an unknown outcome resets once. Pass ``at`` or a new
    ``reset_id`` to reset again: a given id decides alone (its reset is found in the run log,
    whatever committed since). Without ``at`` the point is ``default_reset_point``. A point in
    the future is refused: readers would not see the rows before it until a fold.
    """
    family = store.family
    # the cluster's time, not this host's: a clock ahead would put the default point, and the
    # check that a point is not in the future, ahead of the writers
    current = _resettable(family, counter, at, now or cluster_clock(store).now())
    check_family(store, record=True, run_id=reset_id or "reset")
    started_at = datetime.now(UTC)  # the reset's audit row (its archive's manifest goes there)
    compact_value, _epoch, newer = store.reader.read_values([counter])[counter]
    value_before = compact_value + newer
    done_at = _reset_done(store, counter, reset_id) if reset_id is not None else None
    for _attempt in range(MAX_ATTEMPTS):
        shard, bucket, head, base = _base(store, counter)
        point = decide_reset(
            family,
            counter,
            at=at,
            reset_id=reset_id,
            current=current,
            base=base,
            done_at_ms=done_at,
        )
        if point.already_done:
            store.index.mark_touched([counter])  # the next run finishes what the reset left
            return ResetResult(counter, point.reset_id, point.at, value_before, already_done=True)
        at_ms = to_millis(point.at)
        consumed: list[tuple[Any, ...]] = []
        consumed_sum = 0
        values: list[Any] = []
        kinds = bytearray()
        if not family.folds_by_slice:
            # every present row up to the point, read in slices where the counter's folded
            # rows left more tombstones than the node reads at once (a busy counter)
            rows = store.raw.read_rows_upto(counter, at_ms)
            if family.archive is not None and needs_pending(base, rows):
                # which of the rows its last commit counted an archive holds already
                loaded = {counter: base}
                store.runs.load_pending(shard, bucket, loaded, [counter])
                base = loaded[counter]
            rows = [r for r in rows if r[0] <= at_ms]
            _one_commit(family, counter, rows, point.at)
            for _time_ms, key, increment in rows:
                consumed.append(key)
                consumed_sum += increment or 0
                values.append(increment)
                kinds.append(FOLD_CARRIED if key in base.pending else FOLD_NEW)
        fold = Fold(
            counter,
            base,
            at_ms,
            0,
            tuple(consumed),
            consumed_sum,
            0,
            -base.value,
            origin_ms=at_ms,
            values=tuple(values),
            kinds=bytes(kinds),
        )
        committed = commit_counter(store, shard, bucket, head, fold, point.reset_id)
        if committed is not None:
            break
    else:
        raise EngineError(f"counter {format_key(counter)}: reset kept conflicting with runs")
    at, reset_id = point.at, point.reset_id
    copy = store.ledger.read_copies(shard, bucket, [counter]).get(counter)
    if copy is None or copy.value != 0 or copy.epoch_ms != at_ms:
        raise ChecksFailed(f"reset of {format_key(counter)} not visible: {copy}", [])
    deleted = 0
    left = ""
    if committed.pending and family.effective_retention.value == "delete":
        if family.archive is None or _archived(
            store, shard, bucket, reset_id, committed, started_at
        ):
            ts = max(cluster_micros(store), to_micros(current), at_ms * 1000 + 1000)
            deleted = store.raw.delete_rows([(counter, list(committed.pending))], ts)
        else:  # no values of the rows to archive: the next run commits and archives them
            store.index.mark_touched([counter])
            left = "; its consumed rows are left for the next run, which archives them"
    plan = RunPlan(family.name, reset_id, at, None, ())
    record = RunOutcome(
        plan,
        "reset",
        started_at,
        family.kind.value,
        Tally(counters_committed=1, rows_deleted=deleted),
        message=f"counter {format_key(counter)} reset from {value_before} to 0 at "
        f"{to_text(at)} ({deleted} raw row(s) consumed{left})",
    ).audit_row()
    parameters = {"counter": format_key(counter), "at": to_text(at), "reset_id": reset_id}
    store.audit.write({**record, "action": Action.RESET, "parameters": parameters})
    return ResetResult(
        counter, reset_id, at, value_before, already_done=False, rows_deleted=deleted
    )


def _one_commit(family: Family, counter: Key, rows: Sequence[Row], at: datetime) -> None:
    """Refuse a reset whose consumed rows (``rows``, at or before its point) are more than one
    commit carries (``MAX_FOLD_ROWS``, ``FOLD_KEY_BYTES`` of keys): its record of them would be
    a request over the node's limits. Nothing is written; the runs fold such a backlog over
    several runs (and delete it), after which the reset consumes what is left."""
    most_bytes = ARCHIVE_FOLD_KEY_BYTES if family.archive is not None else FOLD_KEY_BYTES
    if rows_that_fit(rows, MAX_FOLD_ROWS, most_bytes) >= len(rows):
        return
    raise EngineError(
        f"family {family.name!r} counter {format_key(counter)}: a reset at {to_text(at)} "
        f"would consume {len(rows)} raw row(s), more than one commit carries ({MAX_FOLD_ROWS} "
        f"rows, {most_bytes // 2**20} MiB of row keys: the node refuses a request over "
        "native_transport_max_message_size, 16 MiB by default). Nothing was changed; let the "
        "runs fold the counter's backlog first (each run folds what one commit carries, and "
        "deletes it), then reset"
    )


def default_reset_point(now: datetime, lag: timedelta) -> datetime:
    """The point of a reset given none: now less the family's lag, truncated to the minute as a
    run's epoch is (``core.epoch_for``). A write in flight just before now has a time after it
    and counts in the new era, and every repeat within the minute computes the same point."""
    return epoch_for(now, lag)


def _reset_done(store: Store, counter: Key, reset_id: str) -> int | None:
    """The point (ms) of this counter's reset by ``reset_id`` if one applied, found in the run
    log (kept 14 days) whatever committed since: a commit its reset verified, or one whose point
    is still the counter's reset point (applied, then a crash before it was verified)."""
    shard, _bucket = store.keys.bucket(counter)
    origin = _base(store, counter)[3].origin_ms
    for entry, epoch_ms, verified in store.runs.run_entries(reset_id, shard):
        if entry == counter and (verified or epoch_ms == origin):
            return epoch_ms
    return None


def _archived(
    store: Store,
    shard: int,
    bucket: int,
    reset_id: str,
    committed: Checkpoint,
    started_at: datetime,
) -> bool:
    """Archive the rows a reset consumes before it deletes them (``archive_commits``: its
    manifest into the reset's audit row); whether its commit's rows are archived. Not when its
    commit was not verified (its copy did not read back as its own) or has no values."""
    from .compaction.archive import archive_commits

    runs = store.runs.read_run_commits(reset_id, shard, [reset_id])
    mine = [r for r in runs.get(bucket, []) if r.commit_id == committed.commit_id]
    if not mine:
        return False
    done = archive_commits(store, shard, reset_id, {bucket: mine}, set(), started_at)
    return committed.commit_id not in done.deferred


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
    * rows: the rows that exist after each counter's reset point and at or below its
      checkpoint vs its count (rows that arrived behind the checkpoint, rows deleted since they
      were counted), for every counter with rows or with a checkpoint (all of its rows may be
      gone). ``repair`` sets the count to the recount with the bucket compare-and-set.
    * increments: the folded rows are deleted, so there is nothing to recount against.
    """
    family = store.family
    if family.rules.reconcile is Reconcile.NOTHING:
        raise EngineError(f"family {family.name!r}: {family.rules.reconcile_refusal()}")
    check_family(store, record=repair, run_id="reconcile")
    found: list[Discrepancy] = []
    for shard in range(family.shards):
        found += RECOUNTS[family.rules.reconcile](store, shard, repair)
    if repair:
        store.audit.write(repair_record(family, found))
    return found


def repair_record(family: Family, found: Sequence[Discrepancy]) -> dict[str, Any]:
    """The audit row of ``reconcile --repair``: what it repaired, counter by counter (the
    first 50 in the message)."""
    repaired = [d for d in found if d.repaired]
    named = "; ".join(
        f"{format_key(d.counter)}: expected {d.expected}, counted {d.counted} ({d.difference:+d})"
        for d in repaired[:50]
    )
    how = (
        "derived rows of the uncounted members rewritten (the next run counts them)"
        if family.rules.members
        else "differences folded in with conditional commits"
    )
    return operator_record(
        family,
        action=Action.RECONCILE_REPAIR,
        outcome="repaired" if repaired else "nothing to repair",
        run_id=new_run_id("reconcile"),
        counters=len(repaired),
        sum_folded=0 if family.rules.members else sum(d.difference for d in repaired),
        message=f"{len(repaired)} counter(s) repaired, {len(found) - len(repaired)} left; "
        f"{how}: {named}"
        if repaired
        else f"every counter matched; {len(found)} difference(s) left",
        parameters={"repair": True},
    )


def _reconcile_unique(store: Store, shard: int, repair: bool) -> list[Discrepancy]:
    from .core import write_timestamp

    found = []
    counters = store.raw.scan_set_counters(shard)
    truth = store.raw.count_members(counters)
    values = store.reader.read_values(counters) if counters else {}
    seen = {c: compact + newer for c, (compact, _epoch, newer) in values.items()}
    for counter in counters:
        if truth[counter] == seen[counter]:
            continue
        if repair:
            missing = [(m, t) for m, t, counted in store.raw.members(counter) if not counted]
            store.index.mark_touched([counter])
            store.raw.insert_raw(
                [(counter, (t, m), 1, write_timestamp(t)) for m, t in missing if t]
            )
        found.append(Discrepancy(counter, truth[counter], seen[counter], repair))
    return found


def _reconcile_rows(store: Store, shard: int, repair: bool) -> list[Discrepancy]:
    found = []
    for counter in _rows_counters(store, shard):
        for _attempt in range(MAX_ATTEMPTS):
            _shard, bucket, head, base = _base(store, counter)
            if base.epoch_ms is None:
                break
            origin = Checkpoint(epoch_ms=base.origin_ms)  # a reset's value counts after it
            rows, _total = store.raw.read_slices([counter], {counter: origin}, base.epoch_ms)[
                counter
            ]
            if rows == base.value:
                break
            repaired = False
            if repair:
                fold = fold_recount(counter, base, 0, rows, base.epoch_ms)
                if commit_counter(store, shard, bucket, head, fold, "reconcile") is None:
                    continue  # a run committed meanwhile: recount against its checkpoint
                repaired = True
            found.append(Discrepancy(counter, rows, base.value, repaired))
            break
    return found


def _rows_counters(store: Store, shard: int) -> list[Key]:
    """A rows family's counters in ``shard``: those with rows, and those with a checkpoint
    whose rows may all have been deleted since (its count is then a difference to report).
    Listed bucket by bucket around the checkpointed ones: a partition the application deleted
    many rows of is refused to a scan, and is read by itself (``read_slices``)."""
    known: dict[Key, None] = {}
    for bucket in range(BUCKETS):
        checkpoints = store.ledger.read_ledger(shard, bucket, None, False).checkpoints
        known.update(dict.fromkeys(checkpoints))
        known.update(
            dict.fromkeys(store.raw.distinct_counters(shard, bucket, around=list(checkpoints)))
        )
    return list(known)


# --- quarantine --------------------------------------------------------------------------


RECOUNTS: dict[Reconcile, Callable[[Store, int, bool], list[Discrepancy]]] = {
    Reconcile.MEMBERS: _reconcile_unique,
    Reconcile.ROWS: _reconcile_rows,
}
"""How reconcile recounts one shard of a family, by what its kind recounts against."""


def quarantined(store: Store) -> list[Quarantined]:
    """Every counter of the family kept out of compaction, with the reason."""
    return [
        q
        for shard in range(store.family.shards)
        for q in store.quarantine.read_quarantine(shard).values()
    ]


def release(store: Store, counter: Key) -> Checkpoint:
    """Let a quarantined counter back into compaction, its readers' copy restored from the
    ledger (the engine's record of every commit). Fix its raw rows first if that was the
    reason (a NULL increment); the next run folds it."""
    cluster_clock(store)  # its copy's version and the entry's delete carry this host's clock
    check_family(store, record=True, run_id="release")
    shard, bucket = store.keys.bucket(counter)
    entry = store.quarantine.read_quarantine(shard).get(counter)
    if entry is None:
        raise EngineError(
            f"family {store.family.name!r}: counter {format_key(counter)} is not quarantined"
        )
    checkpoints = store.ledger.read_ledger(shard, bucket, [counter]).checkpoints
    if store.family.rules.members and counter in checkpoints:  # the copy lists them
        store.runs.load_pending(shard, bucket, checkpoints, [counter])
    checkpoint = checkpoints.get(counter)
    if checkpoint is not None:
        # after the ledger's version and the changed copy's, so the restored copy wins, and
        # the next commit (``versioned_by_copy``) writes after it, whatever the clocks
        copy = store.ledger.read_copies(shard, bucket, [counter]).get(counter)
        version = restored_version(
            checkpoint.version, copy.writetime if copy is not None else None, cluster_micros(store)
        )
        restored = Checkpoint(
            checkpoint.value,
            checkpoint.epoch_ms,
            checkpoint.commit_id,
            checkpoint.pending,
            checkpoint.pending_sum,
            version,
            checkpoint.run_id,
        )
        store.ledger.copy_compact(
            [(counter, restored)], checkpoint.run_id or "release", cluster_micros(store)
        )
    store.quarantine.release(counter)
    restored_text = (
        f"readers' copy restored from the ledger: value {checkpoint.value} at epoch "
        f"{to_text(from_millis(checkpoint.epoch_ms)) if checkpoint.epoch_ms else None}"
        if checkpoint is not None
        else "no ledger checkpoint (never committed)"
    )
    store.audit.write(
        operator_record(
            store.family,
            action=Action.QUARANTINE_RELEASE,
            outcome="released",
            run_id=new_run_id("release"),
            counters=1,
            message=f"counter {format_key(counter)} released from quarantine (it was held for "
            f"{entry.reason}: {entry.detail}, run {entry.run_id}); {restored_text}",
            parameters={"counter": format_key(counter)},
        )
    )
    return checkpoint or EMPTY_CHECKPOINT
