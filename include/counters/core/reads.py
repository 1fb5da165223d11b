"""How a bucket is read: whole or by key, and the floors below which rows need no read."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .folds import EMPTY_CHECKPOINT, Checkpoint, Fold, Key

WHOLE_BUCKET_SHARE = 4
"""A bucket is read whole (one token-range read of its ledger partition, compact rows and raw
rows) instead of by name (``IN``) once its touched counters are at least 1/4 of its population:
the node reads a row of a range for about a fifteenth of what a partition read by name costs
(docs/benchmarks.md), and the range also reads every idle counter's rows."""


def whole_bucket(touched: int, population: int | None) -> bool:
    """Whether reading the whole bucket costs less than reading ``touched`` counters by name;
    never when the population is unknown (no run has counted the bucket since it got the
    column: a sweep does)."""
    return population is not None and touched * WHOLE_BUCKET_SHARE >= population


def grown_population(population: int | None, folds: Iterable[Fold]) -> int | None:
    """A bucket's population once ``folds`` commit: plus the counters new to it (a fold on the
    empty checkpoint; one on a compact row from before the ledger was counted with the compact
    rows); unknown stays unknown."""
    if population is None:
        return None
    return population + sum(1 for f in folds if f.base == EMPTY_CHECKPOINT)


RECOUNT_WINDOW_MS = 10 * 60_000
"""How far below the bucket's typical floor a counter's floor may lie and still be recounted by
the shared token-range read (it then reads that much more of the partition's past)."""


def shared_floor(
    floors: dict[Key, int | None], window_ms: int = RECOUNT_WINDOW_MS
) -> tuple[int | None, list[Key], list[Key]]:
    """Pure: how a bucket's commits are recounted without reading the tombstones of earlier
    folds. A counter's floor is the time before its earliest counted row (``Fold.low_ms - 1``,
    None if unknown): its recount need not read at or below it. Returns the floor of the shared
    token-range recount (the lowest floor within ``window_ms`` of the median: every counter of
    the bucket has the same one after a steady run), the counters it covers, and the others
    (recounted by name: new floors far below the rest, or unknown ones)."""
    known = sorted(f for f in floors.values() if f is not None)
    if not known:
        return None, [], list(floors)
    median = known[len(known) // 2]
    floor = next(f for f in known if f >= median - window_ms)
    inside = [c for c, f in floors.items() if f is not None and f >= floor]
    outside = [c for c, f in floors.items() if f is None or f < floor]
    return floor, inside, outside


def read_floor(checkpoint: Checkpoint | None, earliest_ms: int | None) -> int | None:
    """Pure: the time after which a fold must read a marked counter's rows, or None (all of
    them). It must see every row after the checkpoint's epoch, every counted row still present
    (none lies before the checkpoint's ``low_ms``: a fold that read them carried them in its
    ``pending``), and the rows its writers announced (the mark's earliest minute). Below that
    lie the tombstones of earlier folds, and rows of other writers later than every mark, which
    the next sweep reads. Unknown where the counter was never folded, the commit did not record
    ``low_ms``, or the mark did not say."""
    if checkpoint is None or checkpoint.epoch_ms is None or earliest_ms is None:
        return None
    floor = min(checkpoint.epoch_ms, earliest_ms - 1)
    if checkpoint.pending_rows or checkpoint.pending:
        if checkpoint.low_ms is None:
            return None
        floor = min(floor, checkpoint.low_ms - 1)
    return floor


def lowest_floor(floors: Iterable[int | None]) -> int | None:
    """The floor under all of ``floors`` (None if any is unknown, or there are none)."""
    values = list(floors)
    if not values or any(f is None for f in values):
        return None
    return min(f for f in values if f is not None)


FIRST_SLICE_MS = 60_000
"""The width of the first slice a refused read of a counter's rows is taken in (then doubled
after each slice read, halved after each one refused)."""


@dataclass(frozen=True)
class SliceWalk:
    """Pure: a read of one counter's rows in ``(low, high]`` (``low`` None: from its partition's
    start) that gets past any number of tombstones. The node refuses a read that meets more than
    its ``tombstone_failure_threshold``; a read of a clustering slice meets only the tombstones
    inside it. So the range is read whole first, and once refused, in slices from the top down:
    ``(start, top]``, twice as wide after a slice was read (empty stretches cost a few reads),
    half as wide after one was refused, and as wide as the last one read after a refusal (dense
    stretches are crossed in slices under the threshold, few of them refused). Below 1970
    (``low`` None) the last slice is open."""

    low: int | None
    top: int
    width: int | None = None
    """None: ``(low, top]`` whole."""
    grow: bool = True
    """Whether the next slice may be wider than this one (not right after a refusal)."""

    @property
    def start(self) -> int | None:
        """The slice's exclusive lower bound (None: the partition's start)."""
        if self.width is None:
            return self.low
        start = self.top - self.width
        if self.low is not None:
            return max(start, self.low)
        return start if start > 0 else None

    def read(self) -> SliceWalk | None:
        """The next slice once this one was read: twice as wide, or as wide when this one
        was narrowed by a refusal; None when it was the last."""
        start = self.start
        if start is None or start == self.low:
            return None
        width = self.width or FIRST_SLICE_MS
        return SliceWalk(self.low, start, 2 * width if self.grow else width)

    def refused(self) -> SliceWalk:
        """The slice to read instead of this one, which the node refused: half as wide (the
        first after the whole range: ``FIRST_SLICE_MS``, or half the range if narrower).
        ``ValueError`` when it cannot be narrower (one ms, or an open slice before 1970)."""
        if self.width is None:
            span = None if self.low is None else self.top - self.low
            width = FIRST_SLICE_MS if span is None else min(FIRST_SLICE_MS, span // 2)
        else:
            width = self.width // 2
        if width < 1 or (self.low is None and self.top - width <= 0):
            raise ValueError(
                f"the rows in ({self.start}, {self.top}] (epoch ms) hold more tombstones than "
                "the node reads in one request"
            )
        return SliceWalk(self.low, self.top, width, grow=False)
