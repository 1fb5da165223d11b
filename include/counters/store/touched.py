"""The touched index: which counters have rows to fold, and discovery."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cassandra import (
    ReadFailure,
    ReadTimeout,
)

from ..core import (
    BUCKETS,
    Checkpoint,
    Key,
    bucket_bounds,
    chunks,
    split_refused_range,
)
from ..errors import EngineError

if TYPE_CHECKING:
    pass

from .base import (
    ROWS_PER_BATCH,
    StoreBase,
)
from .records import (
    Touched,
)

log = logging.getLogger(__name__)


class TouchedIndex(StoreBase):
    # --- discovery ------------------------------------------------------------------------

    def touched(self, shard: int) -> dict[int, list[Touched]]:
        """The shard's index marks, by bucket (one index partition each)."""
        statement = self.prepare(
            "index_scan",
            "SELECT {key}, writetime(touched), minutes FROM {index} WHERE shard = ? AND slot = ?",
        )
        width = len(self.layout.key)
        results = self._concurrent(statement, [(shard, bucket) for bucket in range(BUCKETS)])
        return {
            bucket: [
                Touched(tuple(r[:width]), r[width], min(r[width + 1]) if r[width + 1] else None)
                for r in result
            ]
            for bucket, result in enumerate(results)
        }

    def scan_counters(self, shard: int) -> list[Key]:
        """Every counter with live raw rows in the shard's token range (the sweep), read as
        ``SCAN_SPLITS`` finer ranges so no single query walks a whole shard's tombstones."""
        statement = self.prepare(
            "raw_distinct",
            "SELECT DISTINCT {key} FROM {raw} WHERE {token} > ? AND {token} <= ?",
        )
        return self._scan_distinct(statement, shard)

    def touched_count(self, limit: int) -> int:
        """How many counters are marked touched, counted up to ``limit`` per index partition
        (one small read per partition: a scan of the whole index would walk every tombstone
        of the marks forgotten within its ``gc_grace_seconds``)."""
        statement = self.prepare(
            "index_count", "SELECT {key} FROM {index} WHERE shard = ? AND slot = ? LIMIT ?"
        )
        results = self._concurrent(
            statement,
            [
                (shard, bucket, limit)
                for shard in range(self.family.shards)
                for bucket in range(BUCKETS)
            ],
        )
        return sum(len(result.current_rows) for result in results)

    def anything_quarantined(self) -> bool:
        """Whether any counter is quarantined (a quarantined one keeps every run alerting)."""
        statement = self.prepare("quarantine_any", "SELECT shard FROM {quarantine} LIMIT 1")
        self.requests[self.phase] += 1
        return self.session.execute(statement).one() is not None

    def distinct_counters(
        self, shard: int, bucket: int, splits: int = 8, around: Sequence[Key] = ()
    ) -> list[Key]:
        """Every counter with live raw rows in one bucket's token range, read in ``splits``
        finer ranges (the fallback when a bucket's row scan meets too many tombstones; one
        range for a rows family, whose rows are never deleted). A range the server refuses
        (a hot counter's partition of tombstones) is read again around the partitions of
        ``around`` (known counters, which the caller reads by parts), else in halves."""
        statement = self.prepare(
            "raw_distinct",
            "SELECT DISTINCT {key} FROM {raw} WHERE {token} > ? AND {token} <= ?",
        )
        low, high = bucket_bounds(self.family.shards, shard, bucket)
        step = (high - low) // splits or 1
        edges = [low + i * step for i in range(splits)] + [high]
        ranges = [(edges[i], edges[i + 1]) for i in range(splits) if edges[i] < edges[i + 1]]
        known = [self.token(c) for c in around]
        found: dict[Key, None] = {}
        while ranges:
            refused: list[tuple[int, int]] = []
            results = self._run([(statement, r) for r in ranges], raise_first=False)
            for (start, end), result in zip(ranges, results, strict=True):
                try:
                    if isinstance(result, Exception):
                        raise result
                    found.update((tuple(r), None) for r in result)  # later pages may fail too
                except (ReadFailure, ReadTimeout) as error:
                    try:
                        refused += split_refused_range(start, end, known)
                    except ValueError as unsplittable:
                        raise EngineError(
                            f"family {self.family.name!r}: {unsplittable}: it holds too many "
                            f"tombstones ({type(error).__name__}) and is no counter the family "
                            "knows (no ledger row, compact row or mark); wait for its "
                            "tombstones to be purged (gc_grace_seconds) or raise the node's "
                            "tombstone_failure_threshold. Nothing was deleted."
                        ) from error
            ranges = refused
        return list(found)

    def forget_bucket(self, shard: int, bucket: int, before_micros: int) -> None:
        """Delete every mark of one index partition written at or before ``before_micros``: a
        partition tombstone at that time (marks written later, with later server timestamps,
        survive it)."""
        statement = self.prepare(
            "index_forget_bucket",
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ?",
        )
        self.requests[self.phase] += 1
        self.session.execute(statement, (before_micros, shard, bucket))

    def forget_touched(self, entries: Sequence[Touched]) -> None:
        """Delete index entries, each at the write time it was read with: a mark written after
        the read has a later server timestamp and survives. Single-partition batches."""
        statement = self.prepare(
            "index_forget",
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ? AND {key_where}",
        )
        by_partition: dict[tuple[int, int], list[tuple]] = defaultdict(list)
        for entry in entries:
            where = self.bucket(entry.counter)
            by_partition[where].append((entry.writetime, *where, *entry.counter))
        self._run(
            [
                (self._batch(statement, group), None)
                for params in by_partition.values()
                for group in chunks(params, ROWS_PER_BATCH)
            ]
        )

    def read_slices(
        self, counters: Sequence[Key], checkpoints: dict[Key, Checkpoint], epoch_ms: int
    ) -> dict[Key, tuple[int, int]]:
        """Server-side aggregate of each counter's slice (checkpoint, epoch]: (rows, total).
        The total is the row count for a rows family, the sum of increments otherwise;
        counters sharing a checkpoint are aggregated together (``IN`` + ``GROUP BY``)."""
        measure = (
            "count(*)"
            if self.layout.increment is None
            else f"sum(CAST({self._names['increment']} AS varint))"
        )
        upper = self._time_bound(epoch_ms)
        by_base: dict[int | None, list[Key]] = defaultdict(list)
        for counter in counters:
            by_base[checkpoints[counter].epoch_ms].append(counter)
        out: dict[Key, tuple[int, int]] = {}
        for base, group in by_base.items():
            if base is None:
                found = self._rows_by_partition(
                    "raw_slice_all",
                    f"count(*), {measure}",
                    "{raw}",
                    group,
                    where="AND {time} <= ?",
                    params=(upper,),
                    group=True,
                )
            else:
                found = self._rows_by_partition(
                    "raw_slice",
                    f"count(*), {measure}",
                    "{raw}",
                    group,
                    where="AND {time} > ? AND {time} <= ?",
                    params=(self._time_bound(base), upper),
                    group=True,
                )
            for counter, rows in found.items():
                out[counter] = (rows[0][0] or 0, rows[0][1] or 0) if rows else (0, 0)
        return out
