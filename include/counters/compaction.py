"""Compaction of a family: plan -> compact shards -> verify -> clean up -> finish.

``run_family`` runs every step for ``counterctl compact`` (shards in parallel processes); the
Airflow tasks call the same step functions, one task per step (compact and cleanup mapped over
shards). The engine is the only place that sequences a run.

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
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import random
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from typing import Any

from cassandra import DriverException, OperationTimedOut, ReadFailure, ReadTimeout, WriteTimeout

from .config import Discovery, Family, Kind
from .core import (
    BIGINT_MAX,
    BIGINT_MIN,
    BUCKETS,
    EMPTY_CHECKPOINT,
    WHOLE_BUCKET_SHARE,
    CheckOutcome,
    Checkpoint,
    Committed,
    Evidence,
    Fold,
    Key,
    Row,
    Tally,
    check_committed,
    chunks,
    counted_rows_gone,
    evaluate_evidence,
    fold_counter,
    fold_recount,
    fold_row_limit,
    fold_slice,
    format_key,
    from_millis,
    grown_population,
    lowest_floor,
    minute_ms,
    needs_closer_look,
    needs_pending,
    next_version,
    read_floor,
    shared_floor,
    to_millis,
    truncate_ms,
    utc_naive,
    whole_bucket,
)
from .errors import ArchiveError, ChecksFailed, EngineError, EpochInFuture, LeaseHeld
from .identity import check_family, check_partition
from .rowkeys import CountedKeys
from .store import COMMIT_CHUNK, Copy, Ledger, Store, Touched, outcome_unknown

log = logging.getLogger(__name__)

Fault = Callable[[str], None]
"""Called between statements with the name of the point reached; tests raise there to crash."""

FAULT_POINTS = (
    "lease",
    "discover",
    "read_compact",
    "read_raw",
    "keys",
    "commit",
    "copy",
    "verify",
    "forget",
    "cleanup_read_log",
    "cleanup_mark",
    "cleanup_delete",
    "finish",
)
"""Every point ``fault`` is called at, in run order (``keys``: after a chunk's keys are recorded,
before its commit; ``cleanup_mark``: unique families only)."""
ARCHIVE_FAULT_POINTS = ("cleanup_archive_file", "cleanup_archive")
"""The points a family with an archive reaches too, between ``cleanup_read_log`` and the first
delete: ``cleanup_archive_file`` after the file is written, before its manifest is recorded;
``cleanup_archive`` after the manifest and the commits' marks, before any row is deleted."""

LEASE_TTL_S = 120
FORGET_MARGIN = timedelta(minutes=2)
"""A mark is forgotten only if it was written this long before the fold read the rows: a
writer marks first and writes its row just after."""
HOT_LATE_WINDOW = timedelta(minutes=10)
"""How far behind its epoch a hot counter is read when its whole partition cannot be (every
folded row leaves a tombstone for ``gc_grace_seconds``; past ``tombstone_failure_threshold``,
100,000 by default, Cassandra refuses the read). Its older late rows wait, uncounted but never
lost, until the partition can be read whole; its mark is kept so every run looks again."""
SMALL_RUN_COUNTERS = 2_000
"""Touched counters below which a run's shards go to one task: spreading them costs more in
task processes than it saves."""
BUCKET_THREADS = 4
"""Buckets of a shard worked at once in one process."""
SCAN_THRESHOLD = 32
"""Touched counters in a bucket from which one token-range scan replaces their ``IN`` reads."""
CLEANUP_CHECK_SAMPLE = 32
"""Counters per bucket whose leftovers cleanup counts on the server (see ``_check_left``)."""
MAX_FOLD_ROWS = 200_000
"""Rows one commit of one counter may carry; a larger backlog is folded over several runs,
each moving the counter's own epoch as far as the rows that fit."""
FOLD_KEY_BYTES = 8 * 2**20
"""Bytes of row keys one commit of one counter may carry, before compression (fewer rows than
``MAX_FOLD_ROWS`` when the keys are long): a commit records every key it counts in one cell of
the run log, and Cassandra refuses a request over 16 MiB (``native_transport_max_message_size``)
and a mutation over 16 MiB (half its commit log segment)."""
COMMIT_KEYS_BYTES = 8 * 2**20
"""Most bytes of one commit's record of counted keys, compressed: a chunk of counters over it
is committed in halves."""
ARCHIVE_FOLD_KEY_BYTES = FOLD_KEY_BYTES // 2
"""``FOLD_KEY_BYTES`` of a family with an archive: its commit's record holds each row twice
(the key the cleanup binds, and the row with its increment and flags for the archive, 9 bytes
more: at most ~1.7 MiB for ``MAX_FOLD_ROWS``), so a fold carries half the keys' bytes."""
MAX_ATTEMPTS = 4
MEMBER_INDEX = 1
"""A unique family's derived rows are clustered by (first_time, member)."""


def _no_fault(point: str) -> None:
    del point


def new_run_id(prefix: str = "cli") -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


def _micros(moment: datetime | None = None) -> int:
    return int((moment or datetime.now(UTC)).timestamp() * 1_000_000)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


@dataclass
class Phases:
    """Wall time per phase, in seconds."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str, store: Store | None = None) -> Iterator[None]:
        start = time.perf_counter()
        if store is not None:
            store.phase = name
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
    evidence: list[Evidence] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    peak_rss_mib: float = 0.0
    execution: str = field(default_factory=lambda: secrets.token_hex(8))
    """This attempt of the shard's compact step: its cleanup deletes only the commits it
    verified, never another attempt's (a zombie, a reused run id, a task marked successful)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "execution": self.execution,
            "peak_rss_mib": self.peak_rss_mib,
            "shard": self.shard,
            "tally": self.tally.as_dict(),
            "seconds": dict(self.phases.seconds),
            "evidence": [e.as_dict() for e in self.evidence],
            "failures": list(self.failures),
            "requests": dict(self.requests),
            "dry_run": self.dry_run,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardReport:
        return cls(
            data["shard"],
            Tally.from_dict(dict(data["tally"])),
            Phases(dict(data["seconds"])),
            [Evidence(**e) for e in data.get("evidence", [])],
            list(data.get("failures", [])),
            dict(data.get("requests", {})),
            bool(data.get("dry_run")),
            float(data.get("peak_rss_mib", 0.0)),
            str(data.get("execution", "")),
        )


# --- plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    family: str
    run_id: str
    epoch: datetime
    epoch_before: datetime | None
    shards: tuple[int, ...]
    sweep: bool = False
    noop_reason: str | None = None
    started_at: datetime | None = None
    idle: bool = False
    """Nothing was touched since the last run, no counter is quarantined and no sweep is due:
    the run only advances the family's epoch (``idle`` audit row), one cheap step."""
    small: bool = False
    """Few counters touched and no sweep: one task (one process) can do every shard."""

    @property
    def shard_groups(self) -> list[tuple[int, ...]]:
        """How the shards are spread over tasks: all in one for a small run, else one each."""
        return [self.shards] if self.small else [(s,) for s in self.shards]

    @property
    def noop(self) -> bool:
        return self.noop_reason is not None

    @property
    def epoch_ms(self) -> int:
        return to_millis(self.epoch)


def decide_plan(
    family: Family,
    run_id: str,
    epoch: datetime,
    epoch_before: datetime | None,
    now: datetime | None = None,
    last_sweep: datetime | None = None,
    anything_touched: bool = True,
    touched: int | None = None,
    last_sweep_size: int | None = None,
) -> RunPlan:
    """Pure: whether a run at ``epoch`` has anything to do, and whether it sweeps.

    An epoch later than ``now - lag`` is refused: writers are still writing rows at those
    times, and every one of them would become a late write. A run sweeps (scans the whole raw
    table, finding rows of every writer) with ``discovery: scan``, or when the family's last
    sweep is older than its ``sweep_interval``.
    """
    epoch = truncate_ms(utc_naive(epoch))
    now = utc_naive(now or datetime.now(UTC))
    if epoch > now - family.lag:
        raise EpochInFuture(
            f"family {family.name!r}: epoch {epoch.isoformat()} is later than now - lag "
            f"({(now - family.lag).isoformat()}); refusing to fold rows that "
            "writers may still be writing"
        )
    reason = None
    if epoch_before is not None and epoch <= utc_naive(epoch_before):
        reason = (
            f"epoch {epoch.isoformat()} is not newer than the compacted epoch "
            f"{utc_naive(epoch_before).isoformat()}: nothing to do"
        )
    sweep = family.discovery is Discovery.SCAN or sweep_due(
        family, now, last_sweep, last_sweep_size
    )
    idle = reason is None and not sweep and not anything_touched
    small = (
        (not sweep or cheap_sweep(family, last_sweep_size))
        and touched is not None
        and touched < SMALL_RUN_COUNTERS
    )
    return RunPlan(
        family.name,
        run_id,
        epoch,
        epoch_before,
        tuple(range(family.shards)),
        sweep,
        reason,
        now,
        idle,
        small,
    )


def sweep_due(
    family: Family, now: datetime, last_sweep: datetime | None, last_size: int | None = None
) -> bool:
    """Whether a run at ``now`` sweeps: on the family's first run; on every run while its last
    sweep was small (``cheap_sweep``: rows of any writer are then folded within a run); else
    once per ``sweep_interval`` at the family's own phase (the first run after each point
    ``k * sweep_interval + family.sweep_phase``). Two sweeps are never more than an interval (and a
    run) apart, so rows of writers outside the API are folded within the bound; and families
    deployed together do not all sweep in the same minute (50 of them did: a burst of 400
    task instances every 15 minutes that the machine could not absorb)."""
    if last_sweep is None or cheap_sweep(family, last_size):
        return True
    interval = family.sweep_interval
    since_point = (utc_naive(now) - _EPOCH0 - family.sweep_phase) % interval
    return utc_naive(last_sweep) < utc_naive(now) - since_point


_EPOCH0 = datetime(1970, 1, 1)


def cheap_sweep(family: Family, last_size: int | None) -> bool:
    """Whether the family's last sweep was small enough to sweep every run."""
    return last_size is not None and last_size < family.sweep_every_run_below


def foreign_rows_bound(family: Family, last_size: int | None) -> timedelta:
    """How long after it is written a row of a writer outside the write API (plain CQL, no
    mark) is folded at the latest: a run (its schedule's period and the lag) when the family
    sweeps every run, else ``sweep_interval`` more."""
    from croniter import croniter

    ticks = croniter(family.schedule, datetime(2001, 1, 1))
    first = ticks.get_next(datetime)
    period = ticks.get_next(datetime) - first
    if family.discovery is Discovery.SCAN or cheap_sweep(family, last_size):
        return family.lag + period
    return family.lag + period + family.sweep_interval


def plan_run(store: Store, run_id: str, epoch: datetime, now: datetime | None = None) -> RunPlan:
    """Decide the run; an idle run's epoch is recorded here (it has no other step)."""
    check_family(store, record=False, run_id=run_id)
    state = store.family_state()
    touched = store.touched_count(SMALL_RUN_COUNTERS)
    plan = decide_plan(
        store.family,
        run_id,
        epoch,
        state.epoch,
        now,
        state.last_sweep,
        touched > 0 or store.anything_quarantined(),
        touched,
        state.last_sweep_size,
    )
    if plan.idle:
        finish_run(store, plan)
    return plan


# --- compact -----------------------------------------------------------------------------


@dataclass
class _Context:
    store: Store
    shard: int
    epoch_ms: int
    run_id: str
    dry_run: bool
    fault: Fault
    tally: Tally
    phases: Phases
    quarantined: set[Key]
    report: ShardReport
    commit_chunk: int = COMMIT_CHUNK
    index_read_at: int = 0
    """When the shard's index marks were read (µs): the base of the forget horizon."""
    sweep: bool = False
    execution: str = ""
    """This attempt of the shard's compact step: the commits it verified are what its
    cleanup deletes (``ShardReport.execution``)."""


STEP_GC_THRESHOLD = 100_000
"""New containers between two young collections of Python's cyclic collector while a shard's
step runs (Python's default: 700)."""
_collector_steps = 0
_collector_thresholds: tuple[int, ...] = ()
_collector_lock = threading.Lock()


@contextmanager
def collector_relaxed() -> Iterator[None]:
    """Python's cyclic collector runs ~140x less often while a shard's step runs; its
    thresholds are back as they were after the last concurrent step. A step allocates millions
    of short-lived tuples and bound statements: with the default threshold many are still
    alive when the collector walks them, and move on to be walked again by the older
    generations. A probe writing 100,000 compact copies took 3.5-4.2 client CPU-s with the
    default, 2.7-3.0 at this threshold, 2.5-2.7 with the collector off. Not off: the driver's
    futures are cycles that hold their result pages, which only the collector frees (a run of
    100,000 rows with it off left 318,000 such objects)."""
    global _collector_steps, _collector_thresholds
    with _collector_lock:
        if _collector_steps == 0:
            _collector_thresholds = gc.get_threshold()
            gc.set_threshold(STEP_GC_THRESHOLD, *_collector_thresholds[1:])
        _collector_steps += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_steps -= 1
            if _collector_steps == 0:
                gc.set_threshold(*_collector_thresholds)


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
    fault: Fault = _no_fault,
) -> ShardReport:
    """Fold, commit, copy and verify every counter of the shard with rows at or below
    ``epoch``: the touched counters, or every counter when the run sweeps."""
    epoch_ms = to_millis(truncate_ms(utc_naive(epoch)))
    report = ShardReport(shard, Tally(), Phases(), dry_run=dry_run)
    check_family(store, record=not dry_run, run_id=run_id)  # before any write
    holding = False
    if use_lease and not dry_run:
        holder = store.acquire_lease(shard, run_id, LEASE_TTL_S)
        if holder is not None:
            raise LeaseHeld(f"family {store.family.name!r} shard {shard} is held by run {holder!r}")
        holding = True
        fault("lease")
    try:
        with report.phases.timed("discover", store):
            quarantine = store.read_quarantine(shard)
            index_read_at = _micros()
            marks = store.touched(shard)
        fault("discover")
        ctx = _Context(
            store,
            shard,
            epoch_ms,
            run_id,
            dry_run,
            fault,
            report.tally,
            report.phases,
            set(quarantine),
            report,
            commit_chunk,
            index_read_at=index_read_at,
            sweep=sweep,
            execution=report.execution,
        )
        for counter in quarantine:
            ctx.tally.add_quarantined(counter)
        work = [b for b in range(BUCKETS) if sweep or marks.get(b)]

        def one(bucket: int) -> _Context:
            local = replace(
                ctx,
                tally=Tally(),
                phases=Phases(),
                report=ShardReport(shard, Tally(), Phases()),
            )
            touched = marks.get(bucket, [])
            scan = sweep or len(touched) >= SCAN_THRESHOLD
            _compact_bucket(local, bucket, touched, sweep=sweep, scan=scan)
            return local

        last_renewal = time.monotonic()
        for local in _each_bucket(one, work):
            report.tally = ctx.tally = report.tally.merge(local.tally)
            report.phases = ctx.phases = report.phases.merge(local.phases)
            report.evidence.extend(local.report.evidence)
            report.failures.extend(local.report.failures)
            if holding and time.monotonic() - last_renewal > LEASE_TTL_S / 3:
                if not store.renew_lease(shard, run_id, LEASE_TTL_S):
                    raise LeaseHeld(f"lost the lease of shard {shard} to another run")
                last_renewal = time.monotonic()
    except BaseException:
        if holding:
            _release_quietly(store, shard, run_id)
        raise
    if holding:
        store.release_lease(shard, run_id)
    report.requests = dict(store.requests)
    report.peak_rss_mib = peak_rss_mib()
    return report


def _each_bucket(work: Callable[[int], Any], buckets: Sequence[int]) -> Iterator[Any]:
    """``work(bucket)`` for every bucket, ``BUCKET_THREADS`` at a time (one bucket's requests
    wait on the server while another's rows are folded), results as they finish. The first
    failure stops the buckets not yet started and is raised."""
    with ThreadPoolExecutor(BUCKET_THREADS) as pool:
        futures = [pool.submit(work, b) for b in buckets]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``), in MiB; 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _release_quietly(store: Store, shard: int, run_id: str) -> None:
    try:
        store.release_lease(shard, run_id)
    except Exception:  # the lease expires by itself; the original error matters more
        log.warning("could not release the lease of shard %s", shard, exc_info=True)


def _compact_bucket(
    ctx: _Context, bucket: int, touched: list[Touched], *, sweep: bool, scan: bool
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
            whole = whole_bucket(len(marked), store.population(ctx.shard, bucket))
        ledger = store.read_ledger(ctx.shard, bucket, None if whole else marked)
        check_partition(store, ctx.shard, bucket, ledger)
        copies = store.read_copies(ctx.shard, bucket, None if whole else marked)
    if whole:  # every counter of the bucket read: count them
        ledger = replace(ledger, population=len(set(ledger.checkpoints) | set(copies)))
        if not sweep:
            ledger, copies = _only(ledger, copies, marked)
    ctx.fault("read_compact")
    windowed: dict[Key, int] = {}
    with phases.timed("read_raw", store):
        if store.family.folds_by_slice:  # counted by the server: only the counters are needed
            found = store.distinct_counters(ctx.shard, bucket, splits=1) if scan else marked
            rows: dict[Key, list[Row]] = {c: [] for c in found}
        elif scan:
            floor, apart = (None, []) if sweep else _slice(ctx, touched, ledger)
            try:
                rows = store.scan_rows(ctx.shard, bucket, floor)
            except (ReadFailure, ReadTimeout):  # tombstone overload: read counter by counter
                known = set(marked) | set(ledger.checkpoints) | set(copies)
                known |= set(store.distinct_counters(ctx.shard, bucket, around=list(known)))
                rows, windowed = read_rows_tolerant(store, sorted(known, key=repr), ledger, copies)
                apart = []
            if apart:  # their past reaches below the slice: read whole, by name
                whole_rows, more = read_rows_tolerant(store, apart, ledger, copies)
                rows.update(whole_rows)
                windowed.update(more)
        else:
            floor, apart = _slice(ctx, touched, ledger)
            whole_read = set(apart)
            sliced = [] if floor is None else [c for c in marked if c not in whole_read]
            rows = {}
            if sliced:
                try:
                    rows = store.read_rows(sliced, floor)
                except (ReadFailure, ReadTimeout):  # read them as a hot counter is read
                    rows = {}
            rest = [c for c in marked if c not in rows]  # whole, or by parts if it must
            whole_rows, windowed = read_rows_tolerant(store, rest, ledger, copies)
            rows.update(whole_rows)
        if not sweep:
            rows = {c: rows.get(c, []) for c in marked}
    ctx.fault("read_raw")
    ctx.tally.rows_read += sum(map(len, rows.values()))
    if windowed:
        ctx.tally.add_windowed(list(windowed))
    checkpoints, recopy, suspects = _bases(ledger.checkpoints, copies, rows, ctx.quarantined)
    if suspects:  # another run's commit and copy can land between the two reads: look again
        with phases.timed("read_compact", store):
            fresh = store.read_ledger(ctx.shard, bucket, list(suspects)).checkpoints
        suspects = _bases(fresh, copies, {c: [] for c in suspects}, ctx.quarantined)[2]
    _quarantine(ctx, [(c, reason, d) for c, (reason, d) in suspects.items()], rows)
    missing = [c for c in recopy if _absent(copies.get(c))]
    recopy = [c for c in recopy if not _absent(copies.get(c))]  # behind: copied again as it is
    removed: list[Key] = []
    if missing and not ctx.dry_run:
        for counter in missing:  # restored by a commit (below), whatever rows it has
            rows.setdefault(counter, [])
            checkpoints[counter] = ledger.checkpoints[counter]
        with phases.timed("read_compact", store):
            removed = [c for c in missing if _copy_was_verified(ctx, bucket, c, ledger)]
    with phases.timed("read_compact", store):
        lost = _load_pending(ctx, bucket, checkpoints, rows)
    _quarantine(ctx, lost, rows)
    with phases.timed("plan", store):
        folds = _fold(ctx, rows, checkpoints)
    if missing and not ctx.dry_run:
        restore = set(missing)
        folds = [replace(f, restore=True) if f.counter in restore else f for f in folds]
    bad = [
        (f.counter, "bad_rows" if f.bad_rows else "overflow", _refusal(f))
        for f in folds
        if f.refused
    ]
    _quarantine(ctx, bad, rows)
    folds = [f for f in folds if f.commit and f.counter not in ctx.quarantined]
    if ctx.dry_run:
        for fold in folds:
            ctx.tally.add_fold(fold)
        return
    committed = _commit(ctx, bucket, ledger, folds, rows)
    if store.family.kind is Kind.UNIQUE and recopy:  # a unique copy lists the counted keys
        for counter in store.load_pending(ctx.shard, bucket, ledger.checkpoints, recopy):
            _quarantine(
                ctx,
                [(counter, "keys_missing", _keys_missing(counter, ledger.checkpoints[counter]))],
                rows,
            )
        recopy = [c for c in recopy if c not in ctx.quarantined]
    with phases.timed("copy", store):
        copies_to_write = [(f.counter, cp) for f, cp in committed.values()]
        copies_to_write += [(c, ledger.checkpoints[c]) for c in recopy]
        store.copy_compact(copies_to_write, ctx.run_id, _micros())
    ctx.fault("copy")
    with phases.timed("verify", store):
        _verify_bucket(ctx, bucket, committed, whole)
    with phases.timed("log", store):  # what this execution's cleanup deletes
        commit_ids = list(dict.fromkeys(cp.commit_id for _f, cp in committed.values()))
        store.mark_verified(ctx.run_id, ctx.shard, bucket, commit_ids, ctx.execution)
    _quarantine(ctx, [(c, "copy_missing", _copy_missing(c, committed)) for c in removed], rows)
    ctx.fault("verify")
    with phases.timed("forget", store):
        _forget(ctx, bucket, touched, folds, rows, windowed)
    ctx.fault("forget")


def _absent(copy: Copy | None) -> bool:
    """A copy readers cannot use: no row, or a row whose value expired (a TTL) or was deleted."""
    return copy is None or copy.writetime is None


def _copy_was_verified(ctx: _Context, bucket: int, counter: Key, ledger: Ledger) -> bool:
    """Whether a counter's missing copy had been written: its commit was verified (its copy
    read back), so someone deleted it or let it expire. Otherwise a crash came between the
    commit and its copy, and restoring it is the run's ordinary work."""
    cp = ledger.checkpoints[counter]
    return ctx.store.commit_verified(cp.run_id, ctx.shard, bucket, cp.commit_id)


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


def _slice(ctx: _Context, touched: list[Touched], ledger: Ledger) -> tuple[int | None, list[Key]]:
    """How a run that is no sweep reads a bucket's marked counters: the time after which it
    reads their rows, by token range or by name (None: whole), and the counters whose past
    reaches below it (read whole, by name). Each counter's own floor is ``core.read_floor``; they
    share one as the recount does (``core.shared_floor``). Whole when more than a quarter of the
    counters would be apart."""
    if ctx.store.family.kind is not Kind.INCREMENTS:
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


def _refusal(fold: Fold) -> str:
    name = format_key(fold.counter)
    if fold.bad_rows:
        keys = ", ".join(str(k) for k in fold.bad_rows[:5])
        return (
            f"{name}: {len(fold.bad_rows)} raw row(s) with a NULL or non-integer increment: {keys}"
        )
    if not BIGINT_MIN <= fold.value <= BIGINT_MAX:
        return f"{name}: value {fold.value} would overflow a bigint (sum folded {fold.folded_sum})"
    return (
        f"{name}: the sums its checkpoint keeps would overflow a bigint (folded "
        f"{fold.folded_sum}, counted rows not yet deleted {fold.pending_sum}; value {fold.value})"
    )


def _bases(
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
    return {c: b for c, b in bases.items() if c in rows}, recopy, suspects


def _load_pending(
    ctx: _Context, bucket: int, checkpoints: dict[Key, Checkpoint], rows: dict[Key, list[Row]]
) -> list[tuple[Key, str, str]]:
    """Load the counted keys of the checkpoints whose counters still have rows at or below
    their epoch (only those rows can be counted already); the ones whose record is gone are
    returned for quarantine: counting their rows again could count some twice."""
    need = [
        c for c, found in rows.items() if c in checkpoints and needs_pending(checkpoints[c], found)
    ]
    missing = ctx.store.load_pending(ctx.shard, bucket, checkpoints, need)
    return [(c, "keys_missing", _keys_missing(c, checkpoints[c])) for c in missing]


def _keys_missing(counter: Key, cp: Checkpoint) -> str:
    return (
        f"{format_key(counter)}: rows at or below its epoch are present, and the record of "
        f"which {cp.pending_rows} row(s) commit {cp.commit_id} (run {cp.run_id}) counted is "
        "gone (the run log keeps it 14 days): they cannot be told from late rows. Delete the "
        "rows that commit counted (or fold the late ones by hand), then release the counter"
    )


def _quarantine(
    ctx: _Context, entries: list[tuple[Key, str, str]], rows: dict[Key, list[Row]]
) -> None:
    entries = [e for e in entries if e[0] not in ctx.quarantined]
    if not entries:
        return
    if not ctx.dry_run:
        ctx.store.quarantine(ctx.run_id, entries)
    for counter, reason, detail in entries:
        ctx.quarantined.add(counter)
        below = sum(1 for r in rows.get(counter, ()) if r[0] <= ctx.epoch_ms)
        ctx.tally.add_quarantined(counter, below)
        ctx.report.failures.append(detail)
        log.warning("quarantined %s (%s): %s", format_key(counter), reason, detail)


def _fold(ctx: _Context, rows: dict[Key, list[Row]], bases: dict[Key, Checkpoint]) -> list[Fold]:
    store = ctx.store
    if store.family.folds_by_slice:
        counters = [c for c in rows if c in bases and c not in ctx.quarantined]
        slices = store.read_slices(counters, bases, ctx.epoch_ms)
        if not ctx.sweep:
            return [fold_slice(c, bases[c], *slices[c], ctx.epoch_ms) for c in counters]
        # a sweep also recounts what each value counts (after its reset point): rows written
        # behind a checkpoint (a writer's clock behind by more than the lag) are folded now
        origins = {c: Checkpoint(epoch_ms=bases[c].origin_ms) for c in counters}
        full = store.read_slices(counters, origins, ctx.epoch_ms)
        return [fold_recount(c, bases[c], slices[c][0], full[c][0], ctx.epoch_ms) for c in counters]
    folds = []
    unique = store.family.kind is Kind.UNIQUE
    archived = store.family.archive is not None
    key_bytes = ARCHIVE_FOLD_KEY_BYTES if archived else FOLD_KEY_BYTES
    for counter, found in rows.items():
        base = bases.get(counter)
        if base is None or counter in ctx.quarantined:
            continue
        counted: frozenset[Any] = frozenset()
        if unique:
            candidates = [r[1][MEMBER_INDEX] for r in found if r[1] not in base.pending]
            counted = frozenset(store.counted_members(counter, candidates))
        folds.append(
            fold_counter(
                counter,
                base,
                found,
                ctx.epoch_ms,
                member_index=MEMBER_INDEX if unique else None,
                counted_members=counted,
                max_rows=fold_row_limit(found, MAX_FOLD_ROWS, key_bytes),
                keep_values=archived,
            )
        )
    return folds


def _commit(
    ctx: _Context,
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
        for chunk, keys, archive_rows in _keyed_chunks(ctx, todo):
            grown = grown_population(population, chunk)
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
                )
            if done is None:
                lost.extend(chunk)
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
        todo, fresh = _refold(ctx, bucket, [f.counter for f in lost], rows)
        head, population = fresh.head, fresh.population
    raise EngineError(
        f"family {store.family.name!r} shard {ctx.shard} bucket {bucket}: commits kept "
        f"conflicting with other runs after {MAX_ATTEMPTS} attempts"
    )


def _keyed_chunks(
    ctx: _Context, folds: Sequence[Fold]
) -> Iterator[tuple[Sequence[Fold], bytes, bytes | None]]:
    """The folds in order, in chunks of at most ``commit_chunk`` whose record of counted keys
    (``Store.commit_keys``, and for a family with an archive ``Store.archive_rows``) is at most
    ``COMMIT_KEYS_BYTES``, with that record: a chunk over it is halved (a single fold is kept
    under it by ``FOLD_KEY_BYTES``)."""
    todo = list(reversed(chunks(folds, ctx.commit_chunk)))
    while todo:
        chunk = todo.pop()
        with ctx.phases.timed("commit", ctx.store):
            keys = ctx.store.commit_keys(chunk)
            rows = ctx.store.archive_rows(chunk)
        if len(keys) + len(rows or b"") > COMMIT_KEYS_BYTES and len(chunk) > 1:
            half = len(chunk) // 2
            todo += [chunk[half:], chunk[:half]]
            continue
        yield chunk, keys, rows


def commit_folds(
    store: Store,
    shard: int,
    bucket: int,
    head: Any,
    folds: Sequence[Fold],
    run_id: str,
    fault: Fault = _no_fault,
    population: int | None = None,
    keys: bytes | None = None,
    archive_rows: bytes | None = None,
) -> tuple[Any, int] | None:
    """Commit folds of one bucket: first the record of the rows they count (the run log),
    then one conditional batch on the bucket's head. Returns (commit id, commit time in µs),
    or None if another commit reached the bucket first (nothing applied; the record is never
    used, since nothing refers to its commit id). ``population``: the bucket's count once the
    commit applies (None: unknown, left as it is). ``keys``: the folds' record, if packed
    already (``Store.commit_keys``); ``archive_rows``: their archive record (``Store.archive_rows``:
    packed here when the family has an archive and it is not given)."""
    commit_id = store.new_commit_id()
    now = _micros()
    store.write_commit_keys(run_id, shard, bucket, commit_id, folds, keys, archive_rows)
    fault("keys")
    try:
        applied = store.commit_bucket(
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
            return store.head_serial(shard, bucket) == commit_id
        except (ReadTimeout, WriteTimeout, OperationTimedOut):  # contended: back off, again
            time.sleep(random.uniform(0.05, 0.2) * attempt)
    return store.head_serial(shard, bucket) == commit_id


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


def _refold(
    ctx: _Context, bucket: int, counters: list[Key], rows: dict[Key, list[Row]]
) -> tuple[list[Fold], Ledger]:
    """Read the bucket's head, then the counters' checkpoints and rows again, and fold."""
    store = ctx.store
    ledger = store.read_ledger(ctx.shard, bucket, counters)
    check_partition(store, ctx.shard, bucket, ledger)
    copies = store.read_copies(ctx.shard, bucket, counters)
    fresh, _windowed = read_rows_tolerant(store, counters, ledger, copies)
    rows.update(fresh)
    bases, _recopy, _tampered = _bases(ledger.checkpoints, copies, fresh, ctx.quarantined)
    _quarantine(ctx, _load_pending(ctx, bucket, bases, fresh), fresh)
    folds = [f for f in _fold(ctx, fresh, bases) if f.commit and f.counter not in ctx.quarantined]
    return folds, ledger


def _verify_bucket(
    ctx: _Context,
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
            _in_phase, store, "verify", store.read_copies, ctx.shard, bucket, wanted
        )
        recount, floors = _recount_committed(ctx, bucket, committed, wanted)
        copies = copies_read.result()
    # the commits applied as one batch each: the ledger holds them unless a later commit came;
    # only a counter that does not add up is read back, to tell the two apart
    ledger = {c: cp for c, (_f, cp) in committed.items()}
    doubtful = [c for c, (f, cp) in committed.items() if _fails(f, cp, copies.get(c), recount[c])]
    if doubtful:
        now = store.read_ledger(ctx.shard, bucket, doubtful, False).checkpoints
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
    )
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
            pending_rows=len(fold.pending) if not store.family.folds_by_slice else rows,
            pending_sum=fold.pending_sum if not store.family.folds_by_slice else total,
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
        evidence["value_delta"] += fold.value - fold.base.value
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
        again = store.read_ledger(ctx.shard, bucket, [c for c, _r, _d in failures], False)
        failures = [
            (c, reason, detail)
            for c, reason, detail in failures
            if c not in again.checkpoints
            or again.checkpoints[c].commit_id == committed[c][1].commit_id
        ]
    _quarantine(ctx, failures, {})
    ctx.report.evidence.append(Evidence(ctx.shard, bucket, quarantined=len(failures), **evidence))


def _in_phase(store: Store, phase: str, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` in a helper thread, its requests counted under ``phase``."""
    store.phase = phase
    return work(*args)


def _recount_committed(
    ctx: _Context,
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


def recount_tolerant(
    store: Store,
    shard: int,
    bucket: int,
    counters: Sequence[Key],
    epoch_ms: int,
    pending: dict[Key, frozenset[Any]],
    whole_bucket: bool = False,
    after_ms: int | None = None,
) -> dict[Key, tuple[int, int]]:
    """The server's recount of each counter's present rows at or below ``epoch_ms`` (and after
    ``after_ms``, if given). A counter whose partition holds too many tombstones to aggregate (a
    hot counter) is recounted by point reads of the rows its commit counted: late rows beyond
    those are not seen there."""
    try:
        found = store.recount(shard, bucket, None if whole_bucket else counters, epoch_ms, after_ms)
        return {c: found.get(c, (0, 0)) for c in counters}
    except (ReadFailure, ReadTimeout):
        if len(counters) == 1 and not whole_bucket:
            counter = counters[0]
            present = store.read_rows_at(counter, list(pending.get(counter, ())))
            return {counter: (len(present), sum(r[2] or 0 for r in present))}
    out: dict[Key, tuple[int, int]] = {}
    for counter in counters:
        out.update(
            recount_tolerant(store, shard, bucket, [counter], epoch_ms, pending, False, after_ms)
        )
    return out


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
    found = store.read_rows([counter], after_ms)[counter]
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


def _forget(
    ctx: _Context,
    bucket: int,
    touched: list[Touched],
    folds: list[Fold],
    rows: dict[Key, list[Row]],
    windowed: dict[Key, int],
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
    ctx.store.forget_bucket(ctx.shard, bucket, horizon)
    if keep:  # the minute of their rows after the epoch (a hot or quarantined one: none)
        newer = {c: [r[0] for r in rows.get(c, ()) if r[0] > ctx.epoch_ms] for c in keep}
        minutes = {
            c: {minute_ms(from_millis(min(times)))}
            for c, times in newer.items()
            if times and c not in windowed and c not in ctx.quarantined
        }
        ctx.store.mark_touched(keep, minutes)


def read_rows_tolerant(
    store: Store, counters: Sequence[Key], ledger: Any, copies: dict[Key, Copy]
) -> tuple[dict[Key, list[Row]], dict[Key, int]]:
    """Every row of each counter; a counter whose partition cannot be read whole (a hot counter
    over the tombstone failure threshold) is read in parts instead (``read_hot_counter``).
    Returns the rows, and per hot counter the time (ms) before which late rows were not read."""
    if not counters:
        return {}, {}
    try:
        return store.read_rows(counters), {}
    except (ReadFailure, ReadTimeout):
        pass
    rows: dict[Key, list[Row]] = {}
    floors: dict[Key, int] = {}
    for counter in counters:  # one at a time, to find the counter(s) that cannot be read
        try:
            rows.update(store.read_rows([counter]))
        except (ReadFailure, ReadTimeout) as exc:
            base = ledger.checkpoints.get(counter)
            if base is not None and not base.pending_loaded:  # its counted rows: point reads
                store.load_pending(*store.bucket(counter), ledger.checkpoints, [counter])
                base = ledger.checkpoints[counter]
            if base is None and counter in copies:
                copy = copies[counter]
                base = Checkpoint(copy.value, copy.epoch_ms, None, copy.legacy_pending)
            found, floor = read_hot_counter(store, counter, base or EMPTY_CHECKPOINT, exc)
            rows[counter] = found
            floors[counter] = floor
    return rows, floors


def read_hot_counter(
    store: Store, counter: Key, checkpoint: Checkpoint, error: Exception
) -> tuple[list[Row], int]:
    """The rows a fold must see, read without crossing the tombstones of folded rows: every row
    after the counter's epoch (no tombstone of ours lies there), every row its checkpoint lists
    as pending that is still present (point reads: keeping them in ``pending`` is what stops a
    later run from counting them twice), and, if that range can be read, late rows of the last
    ``HOT_LATE_WINDOW``."""
    if checkpoint.epoch_ms is None:  # never folded: no tombstones of ours to work around
        raise error
    epoch = checkpoint.epoch_ms
    found = {r[1]: r for r in store.read_rows([counter], epoch)[counter]}
    found.update((r[1], r) for r in store.read_rows_at(counter, list(checkpoint.pending)))
    floor = epoch - int(HOT_LATE_WINDOW.total_seconds() * 1000)
    try:
        found.update((r[1], r) for r in store.read_rows_between(counter, floor, epoch))
    except (ReadFailure, ReadTimeout):
        floor = epoch
    log.warning(
        "family %r counter %s: whole-partition read failed (%s); read its rows after %s, its "
        "pending rows, and late rows since %s",
        store.family.name,
        format_key(counter),
        type(error).__name__,
        from_millis(epoch).isoformat(),
        from_millis(floor).isoformat(),
    )
    return sorted(found.values(), key=lambda r: r[0]), floor


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
    outcomes += hot_counter_outcomes(tally)
    return Verification(outcomes, evidence, tally, executions)


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


# --- cleanup -----------------------------------------------------------------------------


@dataclass
class CleanupReport:
    """One shard's cleanup: rows deleted, and what an independent count found left after."""

    shard: int
    rows_deleted: int = 0
    leftovers: list[str] = field(default_factory=list)
    late_rows: int = 0
    late_sum: int = 0
    windowed: int = 0
    counters_cleaned: int = 0
    counters_checked: int = 0
    seconds: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    archived_rows: int = 0
    archived_sum: int = 0
    archive_files: list[str] = field(default_factory=list)
    """The archive files this cleanup wrote (their manifests are in the run's audit row)."""
    archive_deferred: int = 0
    """Commits recorded before the family had an archive: their rows were left in place, for
    the next fold of their counters (which archives them before deleting them)."""
    archive_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CleanupReport:
        return cls(**data)


@collector_relaxed()
def cleanup_shard(
    store: Store,
    shard: int,
    run_id: str,
    executions: Sequence[str],
    *,
    now: datetime | None = None,
    fault: Fault = _no_fault,
    started_at: datetime | None = None,
) -> CleanupReport:
    """Delete the raw rows counted by the run's commits that ``executions`` verified (the
    attempts whose reports passed the family's checks), exactly those (keys read from the run
    log, not the ledger); quarantined counters keep their rows. Then count, on the server, what
    is left at or below each epoch of a sample: a counted row still there is a failure, any
    other row a late write (folded by the next run).

    A family with an ``archive`` first writes every row it is about to delete to the archive
    (``archiving.archive_commits``; ``started_at``: the run's start, its audit row's key); a
    failure there deletes nothing."""
    started = time.perf_counter()
    report = CleanupReport(shard)
    store.phase = "cleanup"
    runs = store.read_run_commits(run_id, shard, executions)
    fault("cleanup_read_log")
    if store.family.folds_by_slice or not runs:  # a kept family's runs delete nothing
        report.seconds = time.perf_counter() - started
        return report
    quarantined = set(store.read_quarantine(shard))
    deferred: set[Any] = set()
    if store.family.archive is not None:
        from .archiving import archive_commits

        store.phase = "archive"
        archived = archive_commits(store, shard, run_id, runs, quarantined, started_at, fault=fault)
        store.phase = "cleanup"
        deferred = archived.deferred
        report.archived_rows, report.archived_sum = archived.rows, archived.sum
        report.archive_files = [m.url for m in archived.manifests]
        report.archive_deferred = len(deferred)
        report.archive_seconds = archived.seconds
    # tombstones newer than any write so far (the wall clock, whatever ``now`` the run was
    # planned with) and than the epoch: retries of the deleted rows stay deleted
    now_us = max(_micros(), _micros(now))

    def one(bucket: int) -> CleanupReport:
        store.phase = "cleanup"  # this thread's requests
        part = CleanupReport(shard)
        # every verified commit's keys are counted for good (a later commit builds on it, a
        # reset consumes them): deleting them is safe whatever committed since
        mine: dict[Key, tuple[int, CountedKeys]] = {}
        for record in runs[bucket]:
            if record.commit_id in deferred:  # no values to archive: the next fold's
                continue
            for counter, epoch_ms, keys in record.entries:
                if counter in quarantined:
                    continue
                if counter in mine:  # a retry of the run committed it again
                    epoch_before, keys_before = mine[counter]
                    merged = dict.fromkeys([*keys_before.keys, *keys.keys])
                    keys = CountedKeys.of(store.key_codec, list(merged))
                    mine[counter] = (max(epoch_ms, epoch_before), keys)
                else:
                    mine[counter] = (epoch_ms, keys)
        if not mine:
            return part
        deletions = [(c, keys) for c, (_epoch, keys) in mine.items() if len(keys)]
        if deletions:
            newest = max(mine[c][0] for c, _keys in deletions)
            tombstone_ts = max(now_us, newest * 1000 + 1000)
            if store.family.kind is Kind.UNIQUE:
                # members first: once their derived rows are gone, the mark is what keeps a
                # duplicate row (a clock-behind writer's) from counting the member again
                store.mark_counted(
                    [(c, [k[MEMBER_INDEX] for k in keys.keys]) for c, keys in deletions]
                )
                fault("cleanup_mark")
            part.rows_deleted += store.delete_rows(deletions, tombstone_ts)
        store.phase = "verify_cleanup"
        _check_left(store, shard, bucket, mine, part)
        return part

    for part in _each_bucket(one, sorted(runs)):
        report.rows_deleted += part.rows_deleted
        report.leftovers += part.leftovers
        report.late_rows += part.late_rows
        report.late_sum += part.late_sum
        report.windowed += part.windowed
        report.counters_cleaned += part.counters_cleaned
        report.counters_checked += part.counters_checked
    fault("cleanup_delete")
    report.requests = dict(store.requests)
    report.seconds = time.perf_counter() - started
    report.peak_rss_mib = peak_rss_mib()
    return report


def _check_left(
    store: Store,
    shard: int,
    bucket: int,
    mine: dict[Key, tuple[int, CountedKeys]],
    report: CleanupReport,
) -> None:
    """Count, on the server, what is left at or below the epoch of a sample of the bucket's
    cleaned counters (all of them up to ``CLEANUP_CHECK_SAMPLE``). A whole-bucket count would
    read every tombstone just written; a systematic failure (a wrong key, a tombstone older than
    the row) shows in any sample, and every counted row left anywhere is counted again by the
    next run that reads its counter (``counted_present``), deleted and reported."""
    report.counters_cleaned += len(mine)
    chosen = list(mine)
    if len(chosen) > CLEANUP_CHECK_SAMPLE:
        chosen = random.Random(f"{shard}:{bucket}").sample(
            sorted(chosen, key=repr), CLEANUP_CHECK_SAMPLE
        )
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
                present = store.read_rows([counter])[counter]
            except (ReadFailure, ReadTimeout):  # a hot counter: its counted rows only
                present = store.read_rows_at(counter, list(counted[counter]))
                report.windowed += 1
            for time_ms, key, increment in present:
                if time_ms > epoch_ms:
                    continue
                if key in counted[counter]:
                    report.leftovers.append(f"{format_key(counter)} @ {time_ms}")
                else:
                    report.late_rows += 1
                    report.late_sum += increment or 0


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
        + f"; {late_rows} late row(s) arrived after the fold (sum {late_sum}), left for next run"
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


def cleanup_failure_message(family: str, run_id: str, outcome: CheckOutcome) -> str:
    return (
        f"cleanup check failed for family {family!r} run {run_id!r}: "
        f"{outcome.detail} [{'; '.join(outcome.counters[:5])}]"
    )


# --- finish ------------------------------------------------------------------------------


def finish_run(store: Store, plan: RunPlan, tally: Tally | None = None) -> None:
    """The run succeeded: the family's compacted epoch becomes the run's epoch (and a sweep
    run records when it started and how much it read: ``tally``'s rows and counters)."""
    size = None if tally is None else min(tally.rows_read + tally.counters_seen, 2**31 - 1)
    store.advance_family_epoch(
        plan.epoch,
        plan.run_id,
        plan.started_at if plan.sweep else None,
        size if plan.sweep else None,
    )


def prune_archive(family: Family, now: datetime | None = None) -> int:
    """Delete the family's archive day folders older than its ``archive_retention`` (each run
    does, when it finishes); how many. A store that cannot be pruned now is logged, not a
    failed run: the rows are archived and deleted, and the next run prunes."""
    if family.archive is None or family.archive_retention is None:
        return 0
    from .archive_files import prune

    try:
        removed = prune(family, now or datetime.now(UTC))
    except ArchiveError as exc:
        log.warning("%s", exc)
        return 0
    if removed:
        log.info(
            "family %s: %d archive day folder(s) past its retention removed", family.name, removed
        )
    return removed


def epoch_advanced(plan: RunPlan, family_epoch: datetime | None) -> CheckOutcome:
    """The family's compacted epoch, read back after ``finish_run``, is at least the run's."""
    advanced = family_epoch is not None and utc_naive(family_epoch) >= plan.epoch
    return CheckOutcome(
        "family_epoch_advanced",
        advanced,
        True,
        f"compacted epoch {_iso(plan.epoch_before)} -> {_iso(family_epoch)} "
        f"(run epoch {_iso(plan.epoch)})"
        if advanced
        else f"the compacted epoch is {_iso(family_epoch)} after finishing, expected at least "
        f"{_iso(plan.epoch)}",
    )


@dataclass(frozen=True)
class Conclusion:
    """How a run that got past its cleanup ends: its outcome, the message its audit row and
    its alert carry, and, when it did not succeed, the checks and counters to name."""

    outcome: str
    message: str
    checks: list[CheckOutcome]
    failed: list[str] = field(default_factory=list)
    counters: list[str] = field(default_factory=list)


def conclusion(
    family: str, plan: RunPlan, tally: Tally, checks: Sequence[CheckOutcome]
) -> Conclusion:
    """The one rule that ends a run, for ``counterctl compact`` and the DAG alike (``checks``
    ends with ``epoch_advanced``): a failed critical check fails it, a quarantined counter
    makes it ``partial`` (the rest of the family was compacted), else ``success``."""
    checks = list(checks)
    failed = [o for o in checks if o.critical and not o.success]
    if failed:
        message = f"family {family!r} run {plan.run_id!r}: " + " | ".join(
            f"{o.name}: {o.detail}" for o in failed
        )
        return Conclusion(
            "failed",
            message,
            checks,
            [o.name for o in failed],
            list(dict.fromkeys(c for o in failed for c in o.counters)),
        )
    if tally.counters_quarantined:
        named = next((o.counters for o in checks if o.name == "no_counter_quarantined"), ())
        return Conclusion(
            "partial",
            quarantine_message(family, plan.run_id, tally, checks),
            checks,
            ["no_counter_quarantined"],
            list(named or tally.quarantined),
        )
    return Conclusion("success", "", checks)


def conclude_run(
    store: Store, plan: RunPlan, tally: Tally, checks: Sequence[CheckOutcome]
) -> Conclusion:
    """Advance the family's compacted epoch, read it back, and decide how the run ends."""
    finish_run(store, plan, tally)
    moved = epoch_advanced(plan, store.family_epoch())
    return conclusion(store.family.name, plan, tally, [*checks, moved])


def dry_run_message(tally: Tally) -> str:
    return (
        f"dry run: {tally.counters_committed} counter(s) would fold {tally.rows_folded} "
        f"row(s) (sum {tally.sum_folded}); nothing written, verified or deleted"
    )


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
    gx_suite: str | None = None,
    gx_result: str | None = None,
) -> dict[str, Any]:
    """A run's audit row (``Store.write_audit`` adds who ran it, the code version and the
    configuration hash); ``gx_suite`` is the fingerprint of the GX suite that validated the
    run's evidence and ``gx_result`` where its result is stored (None: GX did not validate)."""
    return {
        "family": family.name,
        "started_at": started_at or datetime.now(UTC),
        "run_id": plan.run_id,
        "kind": family.kind.value,
        "outcome": outcome,
        "dry_run": dry_run,
        "sweep": plan.sweep,
        "gx_suite": gx_suite,
        "gx_result": gx_result,
        "epoch_before": plan.epoch_before,
        "epoch_after": plan.epoch
        if outcome in ("success", "partial", "reset", "idle") and not dry_run
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
    requests: dict[str, int] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    """The largest peak resident memory of the processes that worked the shards."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "family": self.plan.family,
            "run_id": self.plan.run_id,
            "outcome": self.outcome,
            "epoch_before": self.plan.epoch_before.isoformat() if self.plan.epoch_before else None,
            "epoch": self.plan.epoch.isoformat(),
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


def _shard_step(args: tuple[Any, ...]) -> Any:
    """One shard's compact or cleanup in a worker process (its own connection)."""
    from .connection import Connection

    (step, settings, family, layout, shard, run_id, epoch, sweep, dry_run, use_lease, now) = args[
        :11
    ]
    started_at = args[12] if len(args) > 12 else None
    try:
        with Connection(settings) as conn:
            store = Store(conn, family, layout)
            if step == "compact":
                return compact_shard(
                    store, shard, epoch, run_id, sweep=sweep, dry_run=dry_run, use_lease=use_lease
                )
            return cleanup_shard(store, shard, run_id, args[11], now=now, started_at=started_at)
    except BaseException as exc:
        portable = portable_error(exc, f"family {family.name!r} shard {shard} {step}")
        if portable is exc:
            raise
        log.error("shard %s %s failed", shard, step, exc_info=exc)  # the whole traceback
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
    fault: Fault = _no_fault,
    progress: Callable[[str], None] | None = None,
    now: datetime | None = None,
    on_audit: Callable[[dict[str, Any], Tally], None] | None = None,
) -> RunSummary:
    """Every step of a run (what ``counterctl compact`` does); ``workers`` > 1 runs the shards
    in that many processes (both cores: the client's CPU is the bound, not Cassandra's).
    ``on_audit(record, tally)`` is called with the run's audit row once written (metrics)."""
    run_id = run_id or new_run_id()
    started = datetime.now(UTC)
    store.requests.clear()
    peak = 0.0
    phases = Phases()
    with phases.timed("plan", store):
        plan = plan_run(store, run_id, epoch, now)
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
        store.write_audit(record)
        if on_audit is not None:
            on_audit(record, tally)
        _merge_requests(requests, store.requests)
        return RunSummary(plan, outcome, tally, phases, checks, message, requests, peak)

    if plan.noop:
        return finish("noop", plan.noop_reason or "")
    if plan.idle:
        return finish("idle", "nothing touched since the last run, no sweep due")
    parallel = workers > 1 and fault is _no_fault and len(plan.shards) > 1
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

    def each_shard(step: str, executions: dict[int, list[str]] | None = None) -> list[Any]:
        verified = executions or {}
        if pool is None:
            if step == "compact":
                return [
                    compact_shard(
                        store,
                        s,
                        plan.epoch,
                        run_id,
                        sweep=plan.sweep,
                        dry_run=dry_run,
                        use_lease=use_lease,
                        commit_chunk=commit_chunk,
                        fault=fault,
                    )
                    for s in plan.shards
                ]
            return [
                cleanup_shard(
                    store,
                    s,
                    run_id,
                    verified.get(s, []),
                    now=now,
                    fault=fault,
                    started_at=started,
                )
                for s in plan.shards
            ]
        args = [
            (
                step,
                store.conn.settings,
                store.family,
                store.layout,
                s,
                run_id,
                plan.epoch,
                plan.sweep,
                dry_run,
                use_lease,
                now,
                verified.get(s, []),
                started,
            )
            for s in plan.shards
        ]
        return list(pool.map(_shard_step, args))

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


def quarantine_message(
    family: str, run_id: str, tally: Tally, checks: Sequence[CheckOutcome]
) -> str:
    detail = next((o for o in checks if o.name == "no_counter_quarantined"), None)
    named = "; ".join((detail.counters if detail else ())[:5]) or ", ".join(tally.quarantined)
    left = (
        f", {tally.rows_left} row(s) at or below the epoch left unfolded" if tally.rows_left else ""
    )
    return (
        f"family {family!r} run {run_id!r}: {tally.counters_quarantined} counter(s) quarantined "
        f"(kept out of compaction, none of their rows deleted{left}; the rest of the family was "
        f"compacted): {named}. Inspect with `counterctl quarantine --family {family}`, release "
        "with --release once fixed"
    )
