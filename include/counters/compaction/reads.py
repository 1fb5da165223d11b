"""The engine's reads that tolerate what a long-lived family's partitions hold, and its walk over
buckets: shared by the steps (compact, verify, cleanup), so no step imports another for them.

A hot counter's partition may hold more tombstones than the node reads in one request; these
reads fall back to reading it in parts (its rows after the epoch, its pending rows by point
reads, its late rows of a window) instead of failing the run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from cassandra import ReadFailure, ReadTimeout

from ..core import EMPTY_CHECKPOINT, Checkpoint, Key, Row, format_key, from_millis, to_text
from ..errors import EngineError
from ..store import Copy, Store
from .common import BUCKET_THREADS, HOT_LATE_WINDOW

log = logging.getLogger(__name__)


def each_bucket(work: Callable[[int], Any], buckets: Sequence[int]) -> Iterator[Any]:
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


def read_rows_tolerant(
    store: Store,
    counters: Sequence[Key],
    ledger: Any,
    copies: dict[Key, Copy],
    *,
    deep: bool = False,
) -> tuple[dict[Key, list[Row]], dict[Key, int | None]]:
    """Every row of each counter; a counter whose partition cannot be read whole (a hot counter
    over the tombstone failure threshold) is read in parts instead (``read_hot_counter``; all
    of its past when ``deep``, a sweep's). Returns the rows, and per hot counter the time (ms)
    before which late rows were not read (None: its whole past was walked). Either way its
    epoch is never lowered (``fold_rows``): readers could not read below it."""
    if not counters:
        return {}, {}
    try:
        return store.raw.read_rows(counters), {}
    except (ReadFailure, ReadTimeout):
        pass
    rows: dict[Key, list[Row]] = {}
    floors: dict[Key, int | None] = {}
    for counter in counters:  # one at a time, to find the counter(s) that cannot be read
        try:
            rows.update(store.raw.read_rows([counter]))
        except (ReadFailure, ReadTimeout) as exc:
            base = ledger.checkpoints.get(counter)
            if base is not None and not base.pending_loaded:  # its counted rows: point reads
                store.runs.load_pending(*store.keys.bucket(counter), ledger.checkpoints, [counter])
                base = ledger.checkpoints[counter]
            if base is None and counter in copies:
                copy = copies[counter]
                base = Checkpoint(copy.value, copy.epoch_ms, None, copy.legacy_pending)
            found, floor = read_hot_counter(store, counter, base or EMPTY_CHECKPOINT, exc, deep)
            rows[counter], floors[counter] = found, floor
    return rows, floors


def read_hot_counter(
    store: Store, counter: Key, checkpoint: Checkpoint, error: Exception, deep: bool = False
) -> tuple[list[Row], int | None]:
    """The rows a fold must see, read without crossing the tombstones of folded rows: every row
    after the counter's epoch (no tombstone of ours lies there), every row its checkpoint lists
    as pending that is still present (point reads: keeping them in ``pending`` is what stops a
    later run from counting them twice), and late rows: when ``deep`` (a sweep), every one,
    its whole past walked in slices the node does not refuse (``RawTable.read_rows_upto``);
    else, or where even a slice of one millisecond is refused, those of the last
    ``HOT_LATE_WINDOW`` if that range can be read. Returns the rows and the time before which
    late rows were not read (None: none were left out). A minute's run reads the window only:
    walking the whole past of a hot counter every minute would cost the node every tombstone in
    it each time; a sweep folds the older late rows within ``sweep_interval``."""
    if checkpoint.epoch_ms is None:  # never folded: no tombstones of ours to work around
        raise error
    epoch = checkpoint.epoch_ms
    found = {r[1]: r for r in store.raw.read_rows([counter], epoch)[counter]}
    found.update((r[1], r) for r in store.raw.read_rows_at(counter, list(checkpoint.pending)))
    floor: int | None = epoch - int(HOT_LATE_WINDOW.total_seconds() * 1000)
    if deep:
        try:
            found.update((r[1], r) for r in store.raw.read_rows_upto(counter, epoch, sliced=True))
            floor = None
        except EngineError:  # a millisecond of it holds more tombstones than the node reads
            pass
    if floor is not None:
        try:
            found.update((r[1], r) for r in store.raw.read_rows_between(counter, floor, epoch))
        except (ReadFailure, ReadTimeout):
            floor = epoch
    log.warning(
        "family %r counter %s: whole-partition read failed (%s); read its rows after %s, its "
        "pending rows, and late rows %s",
        store.family.name,
        format_key(counter),
        type(error).__name__,
        to_text(from_millis(epoch)),
        "of its whole past, in slices" if floor is None else f"since {to_text(from_millis(floor))}",
    )
    return sorted(found.values(), key=lambda r: r[0]), floor


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
        found = store.raw.recount(
            shard, bucket, None if whole_bucket else counters, epoch_ms, after_ms
        )
        return {c: found.get(c, (0, 0)) for c in counters}
    except (ReadFailure, ReadTimeout):
        if len(counters) == 1 and not whole_bucket:
            counter = counters[0]
            present = store.raw.read_rows_at(counter, list(pending.get(counter, ())))
            return {counter: (len(present), sum(r[2] or 0 for r in present))}
    out: dict[Key, tuple[int, int]] = {}
    for counter in counters:
        out.update(
            recount_tolerant(store, shard, bucket, [counter], epoch_ms, pending, False, after_ms)
        )
    return out
