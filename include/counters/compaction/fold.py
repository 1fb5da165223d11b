"""Folding a bucket's rows onto each counter's checkpoint (the bases it starts from, the
counters it must quarantine instead), shared by the shard's fold and the verify's refold."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from ..core import (
    BIGINT_MAX,
    BIGINT_MIN,
    EMPTY_CHECKPOINT,
    Checkpoint,
    Fold,
    Key,
    Row,
    fold_counter,
    fold_recount,
    fold_slice,
    format_key,
    from_millis,
    needs_pending,
    readers_base,
    to_text,
    versioned_by_copy,
)
from ..identity import check_partition
from ..store import Copy, Ledger
from .common import (
    ARCHIVE_FOLD_KEY_BYTES,
    FOLD_KEY_BYTES,
    MAX_FOLD_ROWS,
    MEMBER_INDEX,
    ShardContext,
)
from .reads import read_rows_tolerant

log = logging.getLogger(__name__)


def refusal(fold: Fold) -> str:
    name = format_key(fold.counter)
    if fold.bad_rows:
        keys = ", ".join(str(k) for k in fold.bad_rows[:5])
        return (
            f"{name}: {len(fold.bad_rows)} raw row(s) with a NULL or non-integer increment: {keys}"
        )
    if fold.too_large is not None:
        return too_large_message(fold)
    if not BIGINT_MIN <= fold.value <= BIGINT_MAX:
        return f"{name}: value {fold.value} would overflow a bigint (sum folded {fold.folded_sum})"
    return (
        f"{name}: the sums its checkpoint keeps would overflow a bigint (folded "
        f"{fold.folded_sum}, counted rows not yet deleted {fold.pending_sum}; value {fold.value})"
    )


def refusal_reason(fold: Fold) -> str:
    """The quarantine reason of a refused fold."""
    if fold.bad_rows:
        return "bad_rows"
    return "too_large" if fold.too_large is not None else "overflow"


def too_large_message(fold: Fold) -> str:
    assert fold.too_large is not None
    at_ms, rows = fold.too_large
    at = to_text(from_millis(at_ms))
    return (
        f"{format_key(fold.counter)}: the {rows} row(s) of its millisecond {at} (after its "
        f"epoch) alone are more than one commit carries ({MAX_FOLD_ROWS} rows, "
        f"{FOLD_KEY_BYTES // 2**20} MiB of row keys, half that with an archive): the node "
        "refuses a request over native_transport_max_message_size and a mutation over "
        "max_mutation_size (16 MiB each by default), and a fold cannot end inside a "
        "millisecond. Its rows are kept and the rest of the family goes on; delete or rewrite "
        "rows of that millisecond, then release the counter"
    )


def fold_bases(
    ledger: dict[Key, Checkpoint],
    copies: dict[Key, Copy],
    rows: dict[Key, list[Row]],
    quarantined: set[Key],
) -> tuple[dict[Key, Checkpoint], list[Key], dict[Key, tuple[str, str]]]:
    """Each counter's checkpoint (the ledger's; a compact row that names no commit, from
    before the ledger or written by hand for a new counter, counts as one), the counters whose
    copy is behind their ledger row (a crash between commit and copy), and the suspects with
    their reason: a copy changed by someone else since the last commit (``tampered``; a
    suspect whose ledger row, read again after the copies, holds the copy's commit is not:
    another run committed between the reads, and the fold on the older row loses its
    compare-and-set and is folded again), or a copy naming a commit the ledger does not hold
    at the counter's place (``unknown_commit``: the ledger was truncated, the shard or bucket
    count changed, another family wrote it). A suspect is never a base: adopting an unknown
    commit's copy would count its rows again."""
    bases: dict[Key, Checkpoint] = {}
    recopy: list[Key] = []
    suspects: dict[Key, tuple[str, str]] = {}
    for counter in set(rows) | set(ledger):
        if counter in quarantined:
            continue
        cp = ledger.get(counter)
        copy = copies.get(counter)
        if cp is None:
            if copy is None:
                bases[counter] = EMPTY_CHECKPOINT
            elif copy.commit_id is None:
                bases[counter] = Checkpoint(copy.value, copy.epoch_ms, None, copy.legacy_pending)
            else:
                suspects[counter] = (
                    "unknown_commit",
                    f"{format_key(counter)}: its compact row (value {copy.value}, epoch "
                    f"{copy.epoch_ms}) names commit {copy.commit_id}, which the ledger does not "
                    "hold at its shard and bucket (a truncated ledger, a changed shard or bucket "
                    "count, another family's write): taking it as a base would count its rows "
                    "again. Its rows are kept; find where its commit went, then release it",
                )
            continue
        bases[counter] = cp
        if copy is None or (copy.writetime or 0) < (cp.version or 0):
            recopy.append(counter)
        elif (copy.value, copy.epoch_ms, copy.commit_id) != (cp.value, cp.epoch_ms, cp.commit_id):
            suspects[counter] = (
                "tampered",
                f"{format_key(counter)}: compact value {copy.value} (epoch {copy.epoch_ms}) "
                f"differs from its last commit {cp.value} (epoch {cp.epoch_ms}): changed "
                "outside the engine",
            )
        else:  # a copy restored after the commit (a release): the next copy must be newer
            bases[counter] = versioned_by_copy(cp, copy.writetime)
    return {c: b for c, b in bases.items() if c in rows}, recopy, suspects


def settle(
    ctx: ShardContext,
    bucket: int,
    bases: dict[Key, Checkpoint],
    copies: dict[Key, Copy],
    suspects: dict[Key, tuple[str, str]],
) -> dict[Key, tuple[str, str]]:
    """The suspects that stay suspect once their ledger rows are read again, after the copies:
    another run's commit (or an operator's reset) can land between a fold's ledger read and
    its copies read, and its copy is then newer than the base. Such a counter's base becomes
    the ledger row read again (in ``bases``): its fold builds on what readers have, and the
    bucket's compare-and-set decides whether it commits."""
    if not suspects:
        return suspects
    fresh = ctx.store.ledger.read_ledger(ctx.shard, bucket, list(suspects)).checkpoints
    now, _recopy, still = fold_bases(fresh, copies, {c: [] for c in suspects}, ctx.quarantined)
    for counter in suspects:
        if counter not in still and counter in now and counter in bases:
            bases[counter] = now[counter]
    return still


def load_pending_keys(
    ctx: ShardContext, bucket: int, checkpoints: dict[Key, Checkpoint], rows: dict[Key, list[Row]]
) -> list[tuple[Key, str, str]]:
    """Load the counted keys of the checkpoints whose counters still have rows at or below
    their epoch (only those rows can be counted already); the ones whose record is gone are
    returned for quarantine: counting their rows again could count some twice."""
    need = [
        c for c, found in rows.items() if c in checkpoints and needs_pending(checkpoints[c], found)
    ]
    missing = ctx.store.runs.load_pending(ctx.shard, bucket, checkpoints, need)
    return [(c, "keys_missing", keys_missing_message(c, checkpoints[c])) for c in missing]


def keys_missing_message(counter: Key, cp: Checkpoint) -> str:
    return (
        f"{format_key(counter)}: rows at or below its epoch are present, and the record of "
        f"which {cp.pending_rows} row(s) commit {cp.commit_id} (run {cp.run_id}) counted is "
        "gone (the run log keeps it 14 days): they cannot be told from late rows. Delete the "
        "rows that commit counted (or fold the late ones by hand), then release the counter"
    )


def against_readers(
    ctx: ShardContext,
    bucket: int,
    folds: list[Fold],
    copies: dict[Key, Copy],
    rows: dict[Key, list[Row]],
) -> list[Fold]:
    """The folds that may be committed, each with what readers' copy held before it
    (``core.readers_base``); the rest are quarantined before anything is written. ``copies``
    are the compact rows as read by name or through the bucket's token range, which holds
    every counter of the bucket: a folded counter without one that is not of this bucket (a
    mark filed under another shard count) has its copy read by its key here."""
    here = (ctx.shard, bucket)
    elsewhere = [
        f.counter
        for f in folds
        if f.counter not in copies and ctx.store.keys.bucket(f.counter) != here
    ]
    if elsewhere:
        copies = {**copies, **ctx.store.ledger.read_copies(ctx.shard, bucket, elsewhere)}
    kept: list[Fold] = []
    refused: list[tuple[Key, str, str]] = []
    for fold in folds:
        copy = None if copy_gone(copies.get(fold.counter)) else copies[fold.counter]
        before, problem = readers_base(
            fold,
            None if copy is None else copy.value,
            None if copy is None else copy.epoch_ms,
            None if copy is None else copy.commit_id,
            copy is not None and (copy.writetime or 0) < (fold.base.version or 0),
        )
        if problem is None:  # None stands for the base's value: no copy of the fold per counter
            kept.append(fold if before == fold.base.value else replace(fold, readers_before=before))
        else:
            refused.append((fold.counter, "check_failed", f"{problem}: not committed"))
    quarantine_counters(ctx, refused, rows)
    return kept


def quarantine_counters(
    ctx: ShardContext, entries: list[tuple[Key, str, str]], rows: dict[Key, list[Row]]
) -> None:
    entries = [e for e in entries if e[0] not in ctx.quarantined]
    if not entries:
        return
    if not ctx.dry_run:
        ctx.store.quarantine.add(ctx.run_id, entries)
    for counter, reason, detail in entries:
        ctx.quarantined.add(counter)
        below = sum(1 for r in rows.get(counter, ()) if r[0] <= ctx.epoch_ms)
        ctx.tally.add_quarantined(counter, below)
        ctx.failures.append(detail)
        log.warning("quarantined %s (%s): %s", format_key(counter), reason, detail)


def fold_rows(
    ctx: ShardContext,
    rows: dict[Key, list[Row]],
    bases: dict[Key, Checkpoint],
    windowed: Collection[Key] = (),
) -> list[Fold]:
    """Each counter's fold; a ``windowed`` one (a hot counter read by parts) never has its
    epoch lowered for a late backlog: readers could not read below the window its fold read."""
    store = ctx.store
    if store.family.folds_by_slice:
        counters = [c for c in rows if c in bases and c not in ctx.quarantined]
        slices = store.raw.read_slices(counters, bases, ctx.epoch_ms)
        if not ctx.sweep:
            return [fold_slice(c, bases[c], *slices[c], ctx.epoch_ms) for c in counters]
        # a sweep also recounts what each value counts (after its reset point): rows written
        # behind a checkpoint (a writer's clock behind by more than the lag) are folded now
        origins = {c: Checkpoint(epoch_ms=bases[c].origin_ms) for c in counters}
        full = store.raw.read_slices(counters, origins, ctx.epoch_ms)
        return [fold_recount(c, bases[c], slices[c][0], full[c][0], ctx.epoch_ms) for c in counters]
    folds = []
    unique = store.family.rules.members
    archived = store.family.archive is not None
    key_bytes = ARCHIVE_FOLD_KEY_BYTES if archived else FOLD_KEY_BYTES
    for counter, found in rows.items():
        base = bases.get(counter)
        if base is None or counter in ctx.quarantined:
            continue
        counted: frozenset[Any] = frozenset()
        if unique:
            candidates = [r[1][MEMBER_INDEX] for r in found if r[1] not in base.pending]
            counted = frozenset(store.raw.counted_members(counter, candidates))
        folds.append(
            fold_counter(
                counter,
                base,
                found,
                ctx.epoch_ms,
                member_index=MEMBER_INDEX if unique else None,
                counted_members=counted,
                max_rows=MAX_FOLD_ROWS,
                max_key_bytes=key_bytes,
                lower_epoch=counter not in windowed,
                keep_values=archived,
            )
        )
    return folds


def refold(
    ctx: ShardContext, bucket: int, counters: list[Key], rows: dict[Key, list[Row]]
) -> tuple[list[Fold], Ledger]:
    """Read the bucket's head, then the counters' checkpoints and rows again, and fold."""
    store = ctx.store
    ledger = store.ledger.read_ledger(ctx.shard, bucket, counters)
    check_partition(store, ctx.shard, bucket, ledger)
    copies = store.ledger.read_copies(ctx.shard, bucket, counters)
    fresh, windowed = read_rows_tolerant(store, counters, ledger, copies, deep=ctx.sweep)
    rows.update(fresh)
    bases, _recopy, suspects = fold_bases(ledger.checkpoints, copies, fresh, ctx.quarantined)
    quarantine_counters(
        ctx, list(quarantine_entries(settle(ctx, bucket, bases, copies, suspects))), fresh
    )
    quarantine_counters(ctx, load_pending_keys(ctx, bucket, bases, fresh), fresh)
    folds = [
        replace(f, restore=True) if copy_gone(copies.get(f.counter)) and f.base.commit_id else f
        for f in fold_rows(ctx, fresh, bases, windowed)
    ]
    quarantine_counters(
        ctx, [(f.counter, refusal_reason(f), refusal(f)) for f in folds if f.refused], fresh
    )
    folds = [f for f in folds if f.commit and f.counter not in ctx.quarantined]
    return against_readers(ctx, bucket, folds, copies, fresh), ledger


def quarantine_entries(suspects: dict[Key, tuple[str, str]]) -> list[tuple[Key, str, str]]:
    return [(c, reason, detail) for c, (reason, detail) in suspects.items()]


def copy_gone(copy: Copy | None) -> bool:
    """A copy readers cannot use: no row, or a row whose value expired or was deleted."""
    return copy is None or copy.writetime is None
