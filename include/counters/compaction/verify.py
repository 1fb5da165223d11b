"""Verifying a bucket's commits: each copy read back and recounted against the rows it
counted, before anything is deleted; the run's conservation checks over the shards' evidence."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..core import (
    CheckOutcome,
    Checkpoint,
    Committed,
    Evidence,
    Fold,
    Key,
    Row,
    Tally,
    check_committed,
    counted_rows_gone,
    evaluate_evidence,
    format_key,
    from_millis,
    lowest_floor,
    minute_ms,
    needs_closer_look,
    shared_floor,
)
from ..store import SCAN_REFUSED_TTL_S, Copy, Store, Touched
from .common import (
    FORGET_MARGIN,
    HOT_LATE_WINDOW,
    SCAN_THRESHOLD,
    ShardContext,
    ShardReport,
)
from .fold import (
    quarantine_counters,
)
from .reads import recount_tolerant

log = logging.getLogger(__name__)


def verify_bucket(
    ctx: ShardContext,
    bucket: int,
    committed: dict[Key, tuple[Fold, Checkpoint]],
    whole: bool,
) -> None:
    """Read back what was committed and recount the raw rows on the server; quarantine the
    counters that do not add up, and record the bucket's evidence."""
    store = ctx.store
    if not committed:
        return
    counters = list(committed)
    wanted = None if whole and len(counters) >= SCAN_THRESHOLD else counters
    with ThreadPoolExecutor(1) as reads:  # the copies' read-back overlaps the recount
        copies_read = reads.submit(
            _in_phase, store, "verify", store.ledger.read_copies, ctx.shard, bucket, wanted
        )
        recount, floors = _recount_committed(ctx, bucket, committed, wanted)
        copies = copies_read.result()
    # the commits applied as one batch each: the ledger holds them unless a later commit came;
    # only a counter that does not add up is read back, to tell the two apart
    ledger = {c: cp for c, (_f, cp) in committed.items()}
    doubtful = [c for c, (f, cp) in committed.items() if _fails(f, cp, copies.get(c), recount[c])]
    if doubtful:
        now = store.ledger.read_ledger(ctx.shard, bucket, doubtful, False).checkpoints
        for counter in doubtful:
            if counter in now:
                ledger[counter] = now[counter]
            else:
                ledger.pop(counter)
    failures: list[tuple[Key, str, str]] = []
    evidence = dict(
        counters=0,
        rows_folded=0,
        sum_folded=0,
        value_delta=0,
        pending_rows=0,
        pending_sum=0,
        recount_rows=0,
        recount_sum=0,
        late_arrivals=0,
        readers_before=0,
        readers_after=0,
    )
    by_slice = store.family.folds_by_slice  # a property over the family's rules: once
    for counter, (fold, cp) in committed.items():
        now_cp = ledger.get(counter)
        copy = copies.get(counter)
        rows, total = recount[counter]
        record = Committed(
            counter=counter,
            commit_id=cp.commit_id,
            base_value=fold.base.value,
            folded_sum=fold.folded_sum,
            value=fold.value,
            epoch_ms=fold.epoch_ms,
            pending_rows=rows if by_slice else len(fold.pending),
            pending_sum=total if by_slice else fold.pending_sum,
            ledger_commit_id=now_cp.commit_id if now_cp else None,
            ledger_value=now_cp.value if now_cp else None,
            ledger_epoch_ms=now_cp.epoch_ms if now_cp else None,
            copy_commit_id=copy.commit_id if copy else None,
            copy_value=copy.value if copy else None,
            copy_epoch_ms=copy.epoch_ms if copy else None,
            recount_rows=rows,
            recount_sum=total,
        )
        problem = check_committed(record)
        late = 0
        kept: tuple[int, int] | None = None
        floor = floors.get(counter)
        if problem is None and needs_closer_look(record):
            problem, late = _look_closer(store, counter, fold, floor)
        elif counted_rows_gone(record):
            problem, kept, late = _look_gone(store, counter, fold, problem, floor)
        if problem is not None:
            failures.append((counter, "check_failed", problem))
            continue
        if record.ledger_commit_id != record.commit_id:
            continue  # superseded by a later commit
        evidence["counters"] += 1
        evidence["rows_folded"] += fold.folded_rows
        evidence["sum_folded"] += fold.folded_sum
        # what readers' copy moved by: read by key before the commit, read back after it
        before = fold.base.value if fold.readers_before is None else fold.readers_before
        after = record.copy_value if record.copy_value is not None else 0
        evidence["readers_before"] += before
        evidence["readers_after"] += after
        evidence["value_delta"] += after - before
        evidence["late_arrivals"] += late
        if kept is not None:  # the counted rows still present, as found row by row
            evidence["pending_rows"] += kept[0]
            evidence["pending_sum"] += kept[1]
            evidence["recount_rows"] += kept[0]
            evidence["recount_sum"] += kept[1]
            continue
        evidence["pending_rows"] += record.pending_rows
        evidence["pending_sum"] += record.pending_sum
        evidence["recount_rows"] += rows - late
        evidence["recount_sum"] += total - (_late_sum(store, counter, fold, floor) if late else 0)
    if failures:  # a rival may have committed on top meanwhile and cleaned the rows up
        again = store.ledger.read_ledger(ctx.shard, bucket, [c for c, _r, _d in failures], False)
        failures = [
            (c, reason, detail)
            for c, reason, detail in failures
            if c not in again.checkpoints
            or again.checkpoints[c].commit_id == committed[c][1].commit_id
        ]
    quarantine_counters(ctx, failures, {})
    ctx.evidence.append(Evidence(ctx.shard, bucket, quarantined=len(failures), **evidence))


def _in_phase(store: Store, phase: str, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` in a helper thread, its requests counted under ``phase``."""
    with store.statements.phase(phase):
        return work(*args)


def _recount_committed(
    ctx: ShardContext,
    bucket: int,
    committed: dict[Key, tuple[Fold, Checkpoint]],
    wanted: Sequence[Key] | None,
) -> tuple[dict[Key, tuple[int, int]], dict[Key, int | None]]:
    """The server's recount of each committed counter, and the floor it was recounted above
    (None: its whole partition). Every row a commit counts lies above the time before its
    earliest one, so the recount reads only that slice, never the tombstones of earlier folds
    behind it: the bucket's counters above one shared floor in one token-range read (or one
    ``IN`` read), the rest by name (``shared_floor``). A bucket whose counters were all new to
    the ledger has no such tombstones and is recounted whole."""
    store = ctx.store
    if store.family.folds_by_slice:
        return {c: (len(cp.pending), cp.pending_sum) for c, (_f, cp) in committed.items()}, {}
    recount: dict[Key, tuple[int, int]] = {}
    used: dict[Key, int | None] = {}
    by_epoch: dict[int, list[Key]] = {}
    for counter, (fold, _cp) in committed.items():
        by_epoch.setdefault(fold.epoch_ms, []).append(counter)
    pending = {c: cp.pending for c, (_f, cp) in committed.items()}
    for epoch_ms, group in by_epoch.items():
        whole = wanted is None and epoch_ms == ctx.epoch_ms
        folds = [committed[c][0] for c in group]
        if all(f.base.epoch_ms is None for f in folds):  # none folded before: no tombstones
            parts: list[tuple[list[Key], int | None, bool]] = [(group, None, whole)]
        else:
            floors = {f.counter: None if f.low_ms is None else f.low_ms - 1 for f in folds}
            floor, inside, outside = shared_floor(floors)
            outside_floor = lowest_floor(floors[c] for c in outside)
            parts = [(inside, floor, whole), (outside, outside_floor, False)]
        for counters, after_ms, in_range in parts:
            if not counters:
                continue
            recount.update(
                recount_tolerant(
                    store, ctx.shard, bucket, counters, epoch_ms, pending, in_range, after_ms
                )
            )
            used.update(dict.fromkeys(counters, after_ms))
    return recount, used


def _fails(fold: Fold, cp: Checkpoint, copy: Copy | None, recount: tuple[int, int]) -> bool:
    """Whether a commit, taken as the ledger holds it, fails ``check_committed`` or needs a
    closer look (then the ledger is read back first)."""
    return (
        copy is None
        or (copy.commit_id, copy.value, copy.epoch_ms) != (cp.commit_id, cp.value, cp.epoch_ms)
        or recount != (len(fold.pending), fold.pending_sum)
    )


def _present_below(store: Store, counter: Key, fold: Fold, after_ms: int | None) -> dict[Any, Row]:
    """The counter's present rows at or below the fold's epoch, and after ``after_ms`` (the
    floor its recount used: the same slice, so the two can be compared)."""
    found = store.raw.read_rows([counter], after_ms)[counter]
    return {r[1]: r for r in found if r[0] <= fold.epoch_ms}


def _look_closer(
    store: Store, counter: Key, fold: Fold, after_ms: int | None
) -> tuple[str | None, int]:
    """The recount found more rows than the commit counted: fine if every counted row is there
    with the counted sum (the others are late rows, folded by the next run)."""
    present = _present_below(store, counter, fold, after_ms)
    counted = [r for r in (present.get(k) for k in fold.pending) if r is not None]
    if len(counted) < len(fold.pending) or sum(r[2] or 0 for r in counted) != fold.pending_sum:
        return (
            f"{format_key(counter)}: the rows its commit counted are not all present as counted",
            0,
        )
    return None, len(present) - len(fold.pending)


def _look_gone(
    store: Store, counter: Key, fold: Fold, problem: str | None, after_ms: int | None
) -> tuple[str | None, tuple[int, int] | None, int]:
    """The recount found fewer rows than the commit counted: fine if every row it folded itself
    is there with the folded sum, and only rows its base had counted are gone (deleted by the
    cleanup of the run that counted them first; its value keeps them). Returns the problem (or
    None), the counted rows still present (rows, sum) and the late rows found."""
    present = _present_below(store, counter, fold, after_ms)
    counted = set(fold.pending)
    new = [k for k in fold.pending if k not in fold.base.pending]
    if (
        any(k not in present for k in new)
        or sum(present[k][2] or 0 for k in new) != fold.pending_sum - fold.counted_sum
    ):
        return problem, None, 0
    kept = [present[k] for k in fold.pending if k in present]
    late = sum(1 for k in present if k not in counted)
    return None, (len(kept), sum(r[2] or 0 for r in kept)), late


def _late_sum(store: Store, counter: Key, fold: Fold, after_ms: int | None) -> int:
    pending = set(fold.pending)
    return sum(
        r[2] or 0
        for k, r in _present_below(store, counter, fold, after_ms).items()
        if k not in pending
    )


def forget_marks(
    ctx: ShardContext,
    bucket: int,
    touched: list[Touched],
    folds: list[Fold],
    rows: dict[Key, list[Row]],
    windowed: dict[Key, int | None],
) -> None:
    """Forget the bucket's marks that were written ``FORGET_MARGIN`` before the run read the
    index (their rows had time to land before this run read the raw rows): one partition
    tombstone at that time, so a mark written since survives. The counters that still need a
    look (rows newer than the epoch, hot, quarantined) are marked again at once."""
    horizon = ctx.index_read_at - int(FORGET_MARGIN.total_seconds() * 1_000_000)
    if not any(t.writetime <= horizon for t in touched):
        return
    busy = {f.counter for f in folds if f.newer_rows}
    busy |= {c for c, found in rows.items() if any(r[0] > ctx.epoch_ms for r in found)}
    busy |= set(windowed) | ctx.quarantined
    keep = [t.counter for t in touched if t.writetime <= horizon and t.counter in busy]
    ctx.store.index.forget_bucket(ctx.shard, bucket, horizon)
    if keep:  # the minute of their rows left unfolded (a hot or quarantined one: none)
        capped = {f.counter: frozenset(f.pending) for f in folds if f.capped}
        newer = {
            c: [r[0] for r in rows.get(c, ()) if r[1] not in capped[c]]
            if c in capped
            else [r[0] for r in rows.get(c, ()) if r[0] > ctx.epoch_ms]
            for c in keep
        }
        minutes = {
            c: {minute_ms(from_millis(min(times)))}
            for c, times in newer.items()
            if times and c not in windowed and c not in ctx.quarantined
        }
        ctx.store.index.mark_touched(keep, minutes)


# --- verify ------------------------------------------------------------------------------


@dataclass
class Verification:
    outcomes: list[CheckOutcome]
    evidence: list[Evidence]
    tally: Tally
    executions: dict[int, list[str]] = field(default_factory=dict)
    """Per shard, the executions whose verified commits the cleanup may delete: the ones
    whose reports these checks passed, nothing else."""

    @property
    def passed(self) -> bool:
        return all(o.success for o in self.outcomes if o.critical)

    def failure_message(self, family: str, run_id: str) -> str:
        failed = [o for o in self.outcomes if o.critical and not o.success]
        parts = [f"{o.name}: {o.detail} [{'; '.join(o.counters[:5])}]" for o in failed]
        return (
            f"conservation check failed for family {family!r} run {run_id!r}; nothing was "
            "deleted: " + " | ".join(parts)
        )


def verify_run(reports: Sequence[ShardReport]) -> Verification:
    """Family-level checks over the shards' evidence (the per-counter checks already ran, and
    quarantined what failed). Pure; the GX suite validates the same evidence."""
    tally = Tally()
    evidence: list[Evidence] = []
    failures: list[str] = []
    executions: dict[int, list[str]] = {}
    for report in reports:
        tally = tally.merge(report.tally)
        evidence.extend(report.evidence)
        failures.extend(report.failures)
        executions.setdefault(report.shard, []).append(report.execution)
    outcomes = evaluate_evidence(evidence)
    outcomes.append(
        CheckOutcome(
            "no_counter_quarantined",
            not tally.counters_quarantined,
            False,
            f"{tally.counters_quarantined} counter(s) quarantined (not folded, not deleted) "
            f"holding {tally.rows_left} row(s) at or below the epoch"
            if tally.counters_quarantined
            else "none",
            tuple(failures[:20]) or tuple(tally.quarantined),
        )
    )
    outcomes += read_warnings(tally)
    return Verification(outcomes, evidence, tally, executions)


def read_warnings(tally: Tally) -> list[CheckOutcome]:
    """Warnings (not failures): the buckets a sweep read counter by counter because the node
    would not scan them whole; the counters folded from a window only."""
    out = []
    if tally.buckets_by_counter:
        detail = (
            f"{tally.buckets_by_counter} bucket(s) held more tombstones than the node reads past "
            "and were read counter by counter (the node refused the scan, in this run or within "
            f"{SCAN_REFUSED_TTL_S // 3600} h); exact, but each refusal is an error in the node's "
            "log: more shards spread the family's deletes, a shorter gc_grace_seconds on the raw "
            "table keeps fewer tombstones"
        )
        out.append(CheckOutcome("buckets_scanned_whole", False, False, detail))
    if tally.windowed_reads:
        detail = (
            f"{tally.windowed_reads} hot counter(s) could not be read whole (tombstone overload) "
            f"and were folded by parts: late rows more than {HOT_LATE_WINDOW} behind their epoch "
            "are kept and counted by the next sweep, which walks the partition in slices"
        )
        out.append(
            CheckOutcome(
                "hot_counters_read_whole", False, False, detail, tuple(tally.windowed_counters)
            )
        )
    return out
