"""Compacting a shard: a bucket at a time, fold the rows up to the epoch onto each counter's
checkpoint, commit them to the ledger, copy them to the compact table."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from cassandra import InvalidRequest, OperationTimedOut, ReadFailure, ReadTimeout, WriteTimeout

from ..core import (
    BUCKETS,
    WHOLE_BUCKET_SHARE,
    Checkpoint,
    Evidence,
    Fold,
    Key,
    Row,
    RunningTally,
    chunks,
    commit_figures,
    format_key,
    from_millis,
    grown_population,
    next_version,
    read_floor,
    shared_floor,
    to_millis,
    to_text,
    whole_bucket,
)
from ..errors import EngineError, LeaseHeld
from ..identity import check_family, check_partition
from ..store import (
    COMMIT_CHUNK,
    NODE_REQUEST_BYTES,
    REQUEST_BYTES,
    SCAN_REFUSED_TTL_S,
    Copy,
    Ledger,
    Store,
    Touched,
    fits_one_request,
    outcome_unknown,
    request_too_large,
    value_bytes,
)
from .common import (
    COMMIT_KEYS_BYTES,
    LEASE_TTL_S,
    MAX_ATTEMPTS,
    SCAN_THRESHOLD,
    Fault,
    Phases,
    ShardContext,
    ShardReport,
    cluster_clock,
    cluster_micros,
    collector_relaxed,
    new_execution,
    no_fault,
    peak_rss_mib,
)
from .fold import (
    against_readers,
    copy_gone,
    fold_bases,
    fold_rows,
    keys_missing_message,
    load_pending_keys,
    quarantine_counters,
    quarantine_entries,
    refold,
    refusal,
    refusal_reason,
    settle,
)
from .reads import each_bucket, read_rows_tolerant
from .verify import (
    forget_marks,
    verify_bucket,
)

log = logging.getLogger(__name__)


@collector_relaxed()
def compact_shard(
    store: Store,
    shard: int,
    epoch: datetime,
    run_id: str,
    *,
    sweep: bool = False,
    dry_run: bool = False,
    use_lease: bool = True,
    commit_chunk: int = COMMIT_CHUNK,
    fault: Fault = no_fault,
) -> ShardReport:
    """Fold, commit, copy and verify every counter of the shard with rows at or below
    ``epoch``: the touched counters, or every counter when the run sweeps."""
    epoch_ms = to_millis(epoch)
    execution = new_execution()
    phases = Phases()
    cluster_clock(store)  # a host whose clock is off is refused before any write
    check_family(  # before any write
        store, record=not dry_run, run_id=run_id, once_per_run=True
    )
    holding = False
    if use_lease and not dry_run:
        holder = store.lease.acquire_lease(shard, run_id, LEASE_TTL_S)
        if holder is not None:
            raise LeaseHeld(f"family {store.family.name!r} shard {shard} is held by run {holder!r}")
        holding = True
        fault("lease")
    try:
        with phases.timed("discover", store):
            quarantine = store.quarantine.read_quarantine(shard)
            index_read_at = cluster_micros(store)
            marks = _placed(store, shard, store.index.touched(shard), dry_run)
        fault("discover")
        ctx = ShardContext(
            store,
            shard,
            epoch_ms,
            run_id,
            dry_run,
            fault,
            RunningTally(),
            phases,
            set(quarantine),
            commit_chunk=commit_chunk,
            index_read_at=index_read_at,
            sweep=sweep,
            execution=execution,
        )
        for counter in quarantine:
            ctx.tally.add_quarantined(counter)
        tally = ctx.tally.tally()
        evidence: list[Evidence] = []
        failures: list[str] = []
        work = [b for b in range(BUCKETS) if sweep or marks.get(b)]

        def one(bucket: int) -> ShardContext:
            local = replace(ctx, tally=RunningTally(), phases=Phases(), evidence=[], failures=[])
            touched = marks.get(bucket, [])
            scan = sweep or len(touched) >= SCAN_THRESHOLD
            _compact_bucket(local, bucket, touched, sweep=sweep, scan=scan)
            return local

        last_renewal = time.monotonic()
        for local in each_bucket(one, work):
            tally = tally.merge(local.tally.tally())
            phases = phases.merge(local.phases)
            evidence.extend(local.evidence)
            failures.extend(local.failures)
            if holding and time.monotonic() - last_renewal > LEASE_TTL_S / 3:
                if not store.lease.renew_lease(shard, run_id, LEASE_TTL_S):
                    raise LeaseHeld(f"lost the lease of shard {shard} to another run")
                last_renewal = time.monotonic()
    except BaseException:
        if holding:
            _release_quietly(store, shard, run_id)
        raise
    if holding:
        store.lease.release_lease(shard, run_id)
    return ShardReport(
        shard,
        tally,
        phases,
        tuple(evidence),
        tuple(failures),
        dict(store.statements.requests),
        dry_run,
        peak_rss_mib(),
        execution,
    )


def _placed(
    store: Store, shard: int, marks: dict[int, list[Touched]], dry_run: bool
) -> dict[int, list[Touched]]:
    """Each bucket's marks of the counters that belong to it (by their token under the
    family's shard count). A writer still configured with an older shard count (after a
    reshard) files its marks by that count: such a mark is moved to the counter's own bucket
    (``Store.index.refile_marks``) and never folded here, where its checkpoint is not (a fold here
    would start it from zero)."""
    placed: dict[int, list[Touched]] = {}
    strays: list[tuple[int, Touched]] = []
    for bucket, found in marks.items():
        here = placed[bucket] = []
        for mark in found:
            if store.keys.bucket(mark.counter) == (shard, bucket):
                here.append(mark)
            else:
                strays.append((bucket, mark))
    if strays:
        log.warning(
            "family %s shard %s: %d mark(s) filed under another shard count (a writer with an "
            "old configuration?) moved to their counters' buckets: %s",
            store.family.name,
            shard,
            len(strays),
            ", ".join(format_key(t.counter) for _b, t in strays[:5]),
        )
        if not dry_run:
            store.index.refile_marks(shard, strays)
    return placed


def _remember_refused_scan(ctx: ShardContext, bucket: int) -> None:
    """The node refused a whole scan of the bucket: its partitions hold more tombstones
    together than it reads past. Each refusal is a read of that many tombstones and an error in
    the node's log, so the ledger keeps it for a while and the sweeps meanwhile read the bucket
    counter by counter without asking again (``LedgerTable.remember_scan_refused``)."""
    log.warning(
        "family %s shard %s bucket %s: the node refused a whole scan of the bucket (too many "
        "tombstones); it is read counter by counter%s",
        ctx.store.family.name,
        ctx.shard,
        bucket,
        " (a dry run: not remembered)"
        if ctx.dry_run
        else f", and so for the next {SCAN_REFUSED_TTL_S // 3600} h",
    )
    if not ctx.dry_run:
        ctx.store.ledger.remember_scan_refused(ctx.shard, bucket, ctx.index_read_at // 1000)


def _release_quietly(store: Store, shard: int, run_id: str) -> None:
    try:
        store.lease.release_lease(shard, run_id)
    except Exception:  # the lease expires by itself; the original error matters more
        log.warning("could not release the lease of shard %s", shard, exc_info=True)


def _compact_bucket(
    ctx: ShardContext, bucket: int, touched: list[Touched], *, sweep: bool, scan: bool
) -> None:
    """One bucket: its checkpoints (all of them in a sweep, else the touched counters'), then
    its raw rows (a token-range scan, or ``IN`` reads when few counters were touched), fold,
    commit, copy, verify, forget marks. Outside a sweep only touched counters are folded: a
    counter whose checkpoint was not read cannot be folded. When the touched counters are a
    large share of the bucket's population, its ledger and compact rows are read whole too
    (cheaper for the node than by name) and kept to the touched counters."""
    store, phases = ctx.store, ctx.phases
    marked = [t.counter for t in touched]
    whole = sweep
    with phases.timed("read_compact", store):
        if scan and not sweep:
            whole = whole_bucket(len(marked), store.ledger.population(ctx.shard, bucket))
        ledger = store.ledger.read_ledger(ctx.shard, bucket, None if whole else marked)
        check_partition(store, ctx.shard, bucket, ledger)
        _applied_before(ctx, bucket, ledger)
        copies = store.ledger.read_copies(ctx.shard, bucket, None if whole else marked)
    if whole:  # every counter of the bucket read: count them
        ledger = replace(ledger, population=len(set(ledger.checkpoints) | set(copies)))
        if not sweep:
            ledger, copies = _only(ledger, copies, marked)
    ctx.fault("read_compact")
    windowed: dict[Key, int | None] = {}  # hot counters read by parts
    with phases.timed("read_raw", store):
        if store.family.folds_by_slice:  # counted by the server: only the counters are needed
            around = [*marked, *ledger.checkpoints, *copies]  # a refused range is listed round them
            found = (
                store.raw.distinct_counters(ctx.shard, bucket, splits=1, around=around)
                if scan
                else marked
            )
            if sweep:  # a counter whose rows were all deleted has none left: recount it too
                found = [*found, *_checkpointed(ledger, copies)]
            rows: dict[Key, list[Row]] = {c: [] for c in found}
        elif scan:
            floor, apart = (None, []) if sweep else _slice(ctx, touched, ledger)
            scanned = None
            if floor is not None or ledger.scan_refused_ms is None:
                try:
                    scanned = store.raw.scan_rows(ctx.shard, bucket, floor)
                except (ReadFailure, ReadTimeout):
                    if floor is None:
                        _remember_refused_scan(ctx, bucket)
            if scanned is None:  # tombstone overload, now or lately: read counter by counter
                ctx.tally.buckets_by_counter += floor is None
                known = set(marked) | set(ledger.checkpoints) | set(copies)
                known |= set(store.raw.distinct_counters(ctx.shard, bucket, around=list(known)))
                rows, windowed = read_rows_tolerant(
                    store, sorted(known, key=repr), ledger, copies, deep=ctx.sweep
                )
                apart = []
            else:
                rows = scanned
            if apart:  # their past reaches below the slice: read whole, by name
                whole_rows, more = read_rows_tolerant(store, apart, ledger, copies, deep=ctx.sweep)
                rows.update(whole_rows)
                windowed.update(more)
        else:
            floor, apart = _slice(ctx, touched, ledger)
            whole_read = set(apart)
            sliced = [] if floor is None else [c for c in marked if c not in whole_read]
            rows = {}
            if sliced:
                try:
                    rows = store.raw.read_rows(sliced, floor)
                except (ReadFailure, ReadTimeout):  # read them as a hot counter is read
                    rows = {}
            rest = [c for c in marked if c not in rows]  # whole, or by parts if it must
            whole_rows, windowed = read_rows_tolerant(store, rest, ledger, copies, deep=ctx.sweep)
            rows.update(whole_rows)
        if not sweep:
            rows = {c: rows.get(c, []) for c in marked}
    ctx.fault("read_raw")
    ctx.tally.rows_read += sum(map(len, rows.values()))
    if any(floor is not None for floor in windowed.values()):  # late rows left out
        ctx.tally.add_windowed([c for c, floor in windowed.items() if floor is not None])
    checkpoints, recopy, suspects = fold_bases(ledger.checkpoints, copies, rows, ctx.quarantined)
    with phases.timed("read_compact", store):
        suspects = settle(ctx, bucket, checkpoints, copies, suspects)
    quarantine_counters(ctx, quarantine_entries(suspects), rows)
    recopy = _own(ctx, bucket, recopy)
    missing = [c for c in recopy if copy_gone(copies.get(c))]
    recopy = [c for c in recopy if not copy_gone(copies.get(c))]  # behind: copied again as it is
    removed: list[Key] = []
    if missing and not ctx.dry_run:
        for counter in missing:  # restored by a commit (below), whatever rows it has
            rows.setdefault(counter, [])
            checkpoints[counter] = ledger.checkpoints[counter]
        with phases.timed("read_compact", store):
            removed = [c for c in missing if _copy_was_verified(ctx, bucket, c, ledger)]
    with phases.timed("read_compact", store):
        lost = load_pending_keys(ctx, bucket, checkpoints, rows)
    quarantine_counters(ctx, lost, rows)
    with phases.timed("plan", store):
        folds = fold_rows(ctx, rows, checkpoints, windowed)
    if missing:  # a dry run too: it tells what the run would do
        restore = set(missing)
        folds = [replace(f, restore=True) if f.counter in restore else f for f in folds]
    bad = [(f.counter, refusal_reason(f), refusal(f)) for f in folds if f.refused]
    quarantine_counters(ctx, bad, rows)
    folds = [f for f in folds if f.commit and f.counter not in ctx.quarantined]
    folds = against_readers(ctx, bucket, folds, copies, rows)
    if ctx.dry_run:
        for fold in folds:
            ctx.tally.add_fold(fold)
        return
    committed = _commit(ctx, bucket, ledger, folds, rows)
    if store.family.rules.members and recopy:  # a unique copy lists the counted keys
        for counter in store.runs.load_pending(ctx.shard, bucket, ledger.checkpoints, recopy):
            quarantine_counters(
                ctx,
                [
                    (
                        counter,
                        "keys_missing",
                        keys_missing_message(counter, ledger.checkpoints[counter]),
                    )
                ],
                rows,
            )
        recopy = [c for c in recopy if c not in ctx.quarantined]
    with phases.timed("copy", store):
        copies_to_write = [(f.counter, cp) for f, cp in committed.values()]
        copies_to_write += [(c, ledger.checkpoints[c]) for c in recopy]
        store.ledger.copy_compact(copies_to_write, ctx.run_id, cluster_micros(store))
    ctx.fault("copy")
    with phases.timed("verify", store):
        verify_bucket(ctx, bucket, committed, whole)
    with phases.timed("log", store):  # what this execution's cleanup deletes
        commit_ids = list(dict.fromkeys(cp.commit_id for _f, cp in committed.values()))
        store.runs.mark_verified(ctx.run_id, ctx.shard, bucket, commit_ids, ctx.execution)
    quarantine_counters(
        ctx, [(c, "copy_missing", _copy_missing(c, committed)) for c in removed], rows
    )
    ctx.fault("verify")
    with phases.timed("forget", store):
        forget_marks(ctx, bucket, touched, folds, rows, windowed)
    ctx.fault("forget")


def _applied_before(ctx: ShardContext, bucket: int, ledger: Ledger) -> None:
    """Mark applied the commits of this run that the ledger holds: an earlier attempt of the
    run committed them and failed before it verified them (this attempt carries their rows, and
    the run's audit row counts their figures). Only a retried run meets its own commits."""
    if ctx.dry_run:
        return
    own = {
        cp.commit_id
        for cp in ledger.checkpoints.values()
        if cp.run_id == ctx.run_id and cp.commit_id is not None
    }
    if own:
        ctx.store.runs.mark_applied(ctx.run_id, ctx.shard, bucket, sorted(own, key=str))


def _own(ctx: ShardContext, bucket: int, counters: list[Key]) -> list[Key]:
    """The counters whose checkpoint belongs to this bucket. A ledger row of another bucket's
    counter (filed here by a run before marks were placed by token, ``_placed``) is never
    copied to readers: its copy is read through the bucket's token range, where it is not, and
    restoring it would overwrite the counter's real copy with a stray value."""
    here = (ctx.shard, bucket)
    strays = [c for c in counters if ctx.store.keys.bucket(c) != here]
    if not strays:
        return counters
    log.warning(
        "family %s shard %s bucket %s: ledger rows of %d counter(s) that belong to other "
        "buckets are left alone (never copied to readers): %s",
        ctx.store.family.name,
        ctx.shard,
        bucket,
        len(strays),
        ", ".join(format_key(c) for c in strays[:5]),
    )
    gone = set(strays)
    return [c for c in counters if c not in gone]


def _checkpointed(ledger: Ledger, copies: dict[Key, Copy]) -> list[Key]:
    """The counters a bucket holds a checkpoint of: its ledger rows, and compact rows that
    name no commit (from before the ledger: a base of their own)."""
    legacy = [c for c, copy in copies.items() if copy.commit_id is None]
    return list(dict.fromkeys([*ledger.checkpoints, *legacy]))


def _copy_was_verified(ctx: ShardContext, bucket: int, counter: Key, ledger: Ledger) -> bool:
    """Whether a counter's missing copy had been written and is still gone: its commit was
    verified (its copy read back), so someone deleted it or let it expire. Otherwise a crash
    came between the commit and its copy, and restoring it is the run's ordinary work. The
    copy is read again after the verified mark: the run that made the commit may have copied
    and verified it after this run read the ledger and the copies (an overlapping run), and
    it marks a commit verified only after its copy read back, so a copy removed by no one is
    found now."""
    cp = ledger.checkpoints[counter]
    if not ctx.store.runs.commit_verified(cp.run_id, ctx.shard, bucket, cp.commit_id):
        return False
    return copy_gone(ctx.store.ledger.read_copies(ctx.shard, bucket, [counter]).get(counter))


def _copy_missing(counter: Key, committed: dict[Key, tuple[Fold, Checkpoint]]) -> str:
    restored = committed.get(counter)
    how = (
        f"restored from the ledger by commit {restored[1].commit_id} (value {restored[1].value})"
        if restored
        else "not restored yet (its commit did not apply: the next run restores it)"
    )
    return (
        f"{format_key(counter)}: its compact row was gone (deleted, or expired by a TTL) while "
        f"the ledger holds its last commit: readers read it as 0 plus the newer rows. It was "
        f"{how}; find who removed it, then release the counter"
    )


def _slice(
    ctx: ShardContext, touched: list[Touched], ledger: Ledger
) -> tuple[int | None, list[Key]]:
    """How a run that is no sweep reads a bucket's marked counters: the time after which it
    reads their rows, by token range or by name (None: whole), and the counters whose past
    reaches below it (read whole, by name). Each counter's own floor is ``core.read_floor``; they
    share one as the recount does (``core.shared_floor``). Whole when more than a quarter of the
    counters would be apart."""
    if not ctx.store.family.rules.reads_from_floor:
        return None, []
    floors = {
        t.counter: read_floor(ledger.checkpoints.get(t.counter), t.earliest_ms)
        for t in touched
        if t.counter not in ctx.quarantined
    }
    floor, _inside, apart = shared_floor(floors)
    if floor is None or len(apart) * WHOLE_BUCKET_SHARE > len(floors):
        return None, []
    return floor, apart


def _only(ledger: Ledger, copies: dict[Key, Copy], counters: list[Key]) -> tuple[Ledger, dict]:
    """A whole bucket's ledger and copies kept to ``counters``, as if read by name."""
    wanted = set(counters)
    kept = {c: cp for c, cp in ledger.checkpoints.items() if c in wanted}
    return replace(ledger, checkpoints=kept), {c: v for c, v in copies.items() if c in wanted}


def _commit(
    ctx: ShardContext,
    bucket: int,
    ledger: Ledger,
    folds: list[Fold],
    rows: dict[Key, list[Row]],
) -> dict[Key, tuple[Fold, Checkpoint]]:
    """Commit the folds a chunk at a time, each chunk conditional on the bucket's head. A
    chunk that loses (another run committed to the bucket) is re-read and re-folded."""
    store = ctx.store
    head, population = ledger.head, ledger.population
    committed: dict[Key, tuple[Fold, Checkpoint]] = {}
    todo = folds
    for attempt in range(MAX_ATTEMPTS):
        lost: list[Fold] = []
        stack = list(reversed(chunks(todo, ctx.commit_chunk)))
        while stack:
            chunk = stack.pop()
            with ctx.phases.timed("commit", store):
                keys = store.runs.commit_keys(chunk)
                archive_rows = store.runs.archive_rows(chunk)
            refused = chunk_over_limits(chunk, keys, archive_rows)
            done = None
            grown = grown_population(population, chunk)
            if refused is None:
                try:
                    with ctx.phases.timed("commit", store):
                        done = commit_folds(
                            store,
                            ctx.shard,
                            bucket,
                            head,
                            chunk,
                            ctx.run_id,
                            ctx.fault,
                            grown,
                            keys,
                            archive_rows,
                            commit_figures(chunk, ctx.run_id),
                        )
                except InvalidRequest as exc:  # nothing of it applied
                    if not request_too_large(exc):
                        raise
                    refused = (
                        "the node refused its commit as too large (over its "
                        "native_transport_max_message_size or max_mutation_size, or a cluster "
                        f"with lower limits than the 16 MiB defaults): {exc}. Its rows are kept "
                        "and the rest of the family goes on"
                    )
                else:
                    if done is None:
                        lost.extend(chunk)
                        continue
            if refused is not None or done is None:
                if len(chunk) > 1:  # in halves, until each fits or is one counter
                    half = len(chunk) // 2
                    stack += [chunk[half:], chunk[:half]]
                else:
                    name = format_key(chunk[0].counter)
                    entry = (chunk[0].counter, "too_large", f"{name}: {refused}")
                    quarantine_counters(ctx, [entry], rows)
                continue
            head, population = done[0], grown
            for f in chunk:
                ctx.tally.add_fold(f)
                committed[f.counter] = (f, committed_checkpoint(f, *done, ctx.run_id))
        ctx.fault("commit")
        if not lost:
            return committed
        ctx.tally.conflicts += len(lost)
        log.info(
            "shard %s bucket %s: %d conflict(s), attempt %d",
            ctx.shard,
            bucket,
            len(lost),
            attempt + 1,
        )
        todo, fresh = refold(ctx, bucket, [f.counter for f in lost], rows)
        head, population = fresh.head, fresh.population
    raise EngineError(
        f"family {store.family.name!r} shard {ctx.shard} bucket {bucket}: commits kept "
        f"conflicting with other runs after {MAX_ATTEMPTS} attempts"
    )


COMMIT_ROW_BYTES = 256
"""About the bytes a counter's row takes in a commit's conditional batch besides its key (its
``state`` cell, two commit ids, the run id)."""


def chunk_over_limits(chunk: Sequence[Fold], keys: bytes, archive_rows: bytes | None) -> str | None:
    """Why a chunk of folds is not committed as one (None: it is): its record of counted keys
    (``Store.runs.commit_keys``, and ``archive_rows`` for a family with an archive) over
    ``COMMIT_KEYS_BYTES``, or its conditional batch over ``REQUEST_BYTES``; the caller halves
    such a chunk. One fold alone is committed up to the node's own limits (a fold keeps its
    keys under ``FOLD_KEY_BYTES``), and refused past them: its counter is quarantined."""
    record = len(keys) + len(archive_rows or b"")
    batch = sum(COMMIT_ROW_BYTES + value_bytes(f.counter) for f in chunk)
    if len(chunk) > 1:
        if record > COMMIT_KEYS_BYTES or batch > REQUEST_BYTES:
            return f"{len(chunk)} counters' record of counted keys takes {record} bytes"
        return None
    if fits_one_request(record) and fits_one_request(batch):
        return None
    fold = chunk[0]
    return (
        f"the record of the {len(fold.pending)} row keys its commit counts takes {record} bytes "
        "(compressed), over the node's limits on a request (native_transport_max_message_size) "
        f"and on a mutation (max_mutation_size), {NODE_REQUEST_BYTES} bytes each by default. "
        "Its rows are kept and the rest of the family goes on; delete or rewrite some of its "
        f"rows at or below {to_text(from_millis(fold.epoch_ms))}, then release the counter"
    )


def commit_folds(
    store: Store,
    shard: int,
    bucket: int,
    head: Any,
    folds: Sequence[Fold],
    run_id: str,
    fault: Fault = no_fault,
    population: int | None = None,
    keys: bytes | None = None,
    archive_rows: bytes | None = None,
    figures: dict[str, int] | None = None,
) -> tuple[Any, int] | None:
    """Commit folds of one bucket: first the record of the rows they count (the run log),
    then one conditional batch on the bucket's head. Returns (commit id, commit time in µs),
    or None if another commit reached the bucket first (nothing applied; the record is never
    used, since nothing refers to its commit id). ``population``: the bucket's count once the
    commit applies (None: unknown, left as it is). ``keys``: the folds' record, if packed
    already (``Store.runs.commit_keys``); ``archive_rows``: their archive record
    (``Store.runs.archive_rows``: packed here when the family has an archive and it is not
    given); ``figures``: what the commit adds to its run's audit row (``core.commit_figures``),
    kept with the record."""
    commit_id = store.ledger.new_commit_id()
    now = cluster_micros(store)
    store.runs.write_commit_keys(
        run_id, shard, bucket, commit_id, folds, keys, archive_rows, figures
    )
    fault("keys")
    try:
        applied = store.ledger.commit_bucket(
            shard, bucket, head, folds, commit_id, run_id, now, population
        )
    except Exception as exc:
        if not outcome_unknown(exc):
            raise
        applied = _commit_applied(store, shard, bucket, commit_id, exc)
    return (commit_id, now) if applied else None


def _commit_applied(store: Store, shard: int, bucket: int, commit_id: Any, exc: Exception) -> bool:
    """Settle a commit whose outcome its error left open, by reading the bucket's head at the
    serial level (a Paxos round: a proposal accepted by some replicas is completed or
    superseded first). Applied only on proof: the head is this commit; it is then marked, and
    cleanup deletes its rows. Otherwise the run folds again on the ledger as it is. A wrong
    "not applied" is safe, whether the commit applied before a later one moved the head or a
    request the client gave up on lands later: every commit is conditioned on the head it was
    planned on, so the fold again and the lost commit cannot both apply, and a commit that
    applied unmarked is the crash-after-commit case (its rows are its checkpoints' pending,
    never counted twice, and a later run deletes them)."""
    log.warning(
        "family %s shard %s bucket %s: commit %s outcome unknown (%s); reading the head serially",
        store.family.name,
        shard,
        bucket,
        commit_id,
        exc,
    )
    for attempt in range(1, MAX_ATTEMPTS):
        try:
            return store.ledger.head_serial(shard, bucket) == commit_id
        except (ReadTimeout, WriteTimeout, OperationTimedOut):  # contended: back off, again
            time.sleep(random.uniform(0.05, 0.2) * attempt)
    return store.ledger.head_serial(shard, bucket) == commit_id


def committed_checkpoint(fold: Fold, commit_id: Any, now_micros: int, run_id: str) -> Checkpoint:
    """The checkpoint a fold became when its commit applied."""
    return Checkpoint(
        fold.value,
        fold.epoch_ms,
        commit_id,
        frozenset(fold.pending),
        fold.pending_sum,
        next_version(now_micros, fold.base.version),
        run_id,
        pending_rows=len(fold.pending),
        low_ms=fold.low_ms,
        origin_ms=fold.base.origin_ms if fold.origin_ms is None else fold.origin_ms,
    )
