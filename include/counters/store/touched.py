"""The index table: which counters have rows to fold (the touched marks)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ..core import (
    BUCKETS,
    Key,
)
from .keys import Keys
from .records import (
    Touched,
)
from .statements import Cql, Statements, declare

log = logging.getLogger(__name__)


class IndexTable:
    """The index table (``{index}``): the touched marks, which counters have rows to fold,
    written by the write API and forgotten by a run's cleanup, over the statements core.
    ``Store`` makes one as ``store.index``."""

    STATEMENTS = declare(
        index_scan=Cql(
            "SELECT {key}, writetime(touched), minutes FROM {index} WHERE shard = ? AND slot = ?"
        ),
        index_count=Cql("SELECT {key} FROM {index} WHERE shard = ? AND slot = ? LIMIT ?"),
        index_forget_bucket=Cql(
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ?"
        ),
        index_forget=Cql(
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ? AND {key_where}"
        ),
        index_mark=Cql(
            "UPDATE {index} SET touched = true WHERE shard = ? AND slot = ? AND {key_where}"
        ),
        index_mark_minutes=Cql(
            "UPDATE {index} SET touched = true, minutes = minutes + ? WHERE shard = ? AND slot = "
            "? AND {key_where}"
        ),
        index_all=Cql(
            "SELECT {key}, minutes, writetime(touched) FROM {index} WHERE shard = ? AND slot = ?"
        ),
        index_move=Cql(
            "UPDATE {index} USING TIMESTAMP ? SET touched = true, minutes = minutes + ? WHERE "
            "shard = ? AND slot = ? AND {key_where}"
        ),
        index_delete=Cql("DELETE FROM {index} WHERE shard = ? AND slot = ? AND {key_where}"),
    )

    def __init__(self, statements: Statements, keys: Keys):
        self.statements = statements
        self.family = statements.family
        self.keys = keys

    # --- discovery ------------------------------------------------------------------------

    def touched(self, shard: int) -> dict[int, list[Touched]]:
        """The shard's index marks, by bucket (one index partition each)."""
        statement = self.statements.prepared(self, "index_scan")
        width = len(self.statements.layout.key)
        results = self.statements.concurrent(
            statement, [(shard, bucket) for bucket in range(BUCKETS)]
        )
        return {
            bucket: [
                Touched(tuple(r[:width]), r[width], min(r[width + 1]) if r[width + 1] else None)
                for r in result
            ]
            for bucket, result in enumerate(results)
        }

    def touched_count(self, limit: int) -> int:
        """How many counters are marked touched, counted up to ``limit`` per index partition
        (one small read per partition: a scan of the whole index would walk every tombstone
        of the marks forgotten within its ``gc_grace_seconds``)."""
        statement = self.statements.prepared(self, "index_count")
        results = self.statements.concurrent(
            statement,
            [
                (shard, bucket, limit)
                for shard in range(self.family.shards)
                for bucket in range(BUCKETS)
            ],
        )
        return sum(len(result.current_rows) for result in results)

    def forget_bucket(self, shard: int, bucket: int, before_micros: int) -> None:
        """Delete every mark of one index partition written at or before ``before_micros``: a
        partition tombstone at that time (marks written later, with later server timestamps,
        survive it)."""
        statement = self.statements.prepared(self, "index_forget_bucket")
        self.statements.execute(statement, (before_micros, shard, bucket))

    def forget_touched(self, entries: Sequence[Touched]) -> None:
        """Delete index entries, each at the write time it was read with: a mark written after
        the read has a later server timestamp and survives. Single-partition batches."""
        statement = self.statements.prepared(self, "index_forget")
        by_partition: dict[tuple[int, int], list[tuple]] = defaultdict(list)
        for entry in entries:
            where = self.keys.bucket(entry.counter)
            by_partition[where].append((entry.writetime, *where, *entry.counter))
        self.statements.batches(statement, by_partition.values())

    def mark_touched(
        self, counters: Iterable[Key], minutes: dict[Key, set[int]] | None = None
    ) -> None:
        """Mark counters as having rows to fold (server timestamps; before the raw write), with
        the minutes (ms) of the rows to come where known: a run reads a marked counter's past
        only down to them. A mark without minutes makes the run read the counter whole."""
        plain = self.statements.prepared(self, "index_mark")
        timed = self.statements.prepared(self, "index_mark_minutes")
        minutes = minutes or {}
        requests: list[tuple[Any, tuple[Any, ...]]] = [
            (timed, (minutes[c], *self.keys.bucket(c), *c))
            if minutes.get(c)
            else (plain, (*self.keys.bucket(c), *c))
            for c in set(counters)
        ]
        self.statements.run(requests, session=self.statements.conn.server_timestamp_session)

    def refile_marks(self, shard: int, marks: Sequence[tuple[int, Touched]]) -> None:
        """Move marks filed in another bucket than their counter's (``(bucket, mark)``, all of
        ``shard``'s index): a writer with an older shard count files them by that count. Each is
        marked again where the family's shard count puts it, with its earliest minute, then
        deleted here as of its own write time (a newer mark stays and is moved by the next run)."""
        self.mark_touched(
            [t.counter for _b, t in marks],
            {t.counter: {t.earliest_ms} for _b, t in marks if t.earliest_ms is not None},
        )
        unmark = self.statements.prepared(self, "index_forget")
        self.statements.concurrent(unmark, [(t.writetime, shard, b, *t.counter) for b, t in marks])

    def marks_to_move(self, shard: int, bucket: int) -> list[tuple[Key, set[int], int]]:
        """One index partition's marks as stored: ``(counter, minutes, server write time)``
        (what a reshard moves)."""
        statement = self.statements.prepared(self, "index_all")
        width = len(self.statements.layout.key)
        return [
            (tuple(r[:width]), r[width] or set(), r[width + 1])
            for r in self.statements.execute(statement, (shard, bucket))
        ]

    def move_mark(
        self,
        counter: Key,
        minutes: set[int],
        written: int,
        old: tuple[int, int],
        new: tuple[int, int],
    ) -> None:
        """A mark moved from partition ``old`` to ``new`` with its server write time (the
        forget horizon compares it), in one logged batch."""
        insert = self.statements.prepared(self, "index_move")
        delete = self.statements.prepared(self, "index_delete")
        self.statements.move(insert, (written, minutes, *new, *counter), delete, (*old, *counter))
