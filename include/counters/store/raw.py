"""Raw rows: the write API's writes, reads of a counter's rows, their deletes."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..connection import BULK_PROFILE
from ..core import (
    Key,
    Packed,
    Row,
    bucket_bounds,
    chunks,
    write_timestamp,
)
from ..rowkeys import CountedKeys

if TYPE_CHECKING:
    pass

from .base import (
    DELETE_BATCH_ROWS,
    FIRST_WRITE_WINS,
    ROWS_PER_BATCH,
    StoreBase,
)
from .records import (
    Touched,
)

log = logging.getLogger(__name__)


class RawRows(StoreBase):
    # --- write API ------------------------------------------------------------------------

    def mark_touched(
        self, counters: Iterable[Key], minutes: dict[Key, set[int]] | None = None
    ) -> None:
        """Mark counters as having rows to fold (server timestamps; before the raw write), with
        the minutes (ms) of the rows to come where known: a run reads a marked counter's past
        only down to them. A mark without minutes makes the run read the counter whole."""
        plain = self.prepare(
            "index_mark",
            "UPDATE {index} SET touched = true WHERE shard = ? AND slot = ? AND {key_where}",
        )
        timed = self.prepare(
            "index_mark_minutes",
            "UPDATE {index} SET touched = true, minutes = minutes + ? "
            "WHERE shard = ? AND slot = ? AND {key_where}",
        )
        minutes = minutes or {}
        requests: list[tuple[Any, tuple[Any, ...]]] = [
            (timed, (minutes[c], *self.bucket(c), *c))
            if minutes.get(c)
            else (plain, (*self.bucket(c), *c))
            for c in set(counters)
        ]
        self._run(requests, session=self.conn.server_timestamp_session)

    def refile_marks(self, shard: int, marks: Sequence[tuple[int, Touched]]) -> None:
        """Move marks filed in another bucket than their counter's (``(bucket, mark)``, all of
        ``shard``'s index): a writer with an older shard count files them by that count. Each is
        marked again where the family's shard count puts it, with its earliest minute, then
        deleted here as of its own write time (a newer mark stays and is moved by the next run)."""
        self.mark_touched(
            [t.counter for _b, t in marks],
            {t.counter: {t.earliest_ms} for _b, t in marks if t.earliest_ms is not None},
        )
        unmark = self.prepare(
            "index_unmark",
            "DELETE FROM {index} USING TIMESTAMP ? WHERE shard = ? AND slot = ? AND {key_where}",
        )
        self._concurrent(unmark, [(t.writetime, shard, b, *t.counter) for b, t in marks])

    def insert_raw(self, rows: Sequence[tuple[Key, Key, int, int]]) -> None:
        """Insert raw rows ``(counter, clustering, increment, write_ts_micros)``, batched per
        counter (one mutation per partition)."""
        cols = ", ".join([self._names["key"], self._names["clustering"], self._names["increment"]])
        marks = ", ".join(
            "?" for _ in range(len(self.layout.key) + len(self.layout.clustering) + 1)
        )
        statement = self.prepare(
            "raw_insert", f"INSERT INTO {{raw}} ({cols}) VALUES ({marks}) USING TIMESTAMP ?"
        )
        by_counter: dict[Key, list[tuple]] = defaultdict(list)
        for counter, clustering, increment, ts in rows:
            by_counter[counter].append((*counter, *clustering, increment, ts))
        self._run(
            [
                (self._batch(statement, group), None)
                for values in by_counter.values()
                for group in chunks(values, ROWS_PER_BATCH)
            ]
        )

    def add_member(self, counter: Key, member: Any, now: datetime) -> tuple[bool, datetime]:
        """One pair of :meth:`add_members` (what a writer that crashes before its derived row
        leaves behind)."""
        return self.add_members([(counter, member)], now)[0]

    def add_members(
        self, items: Sequence[tuple[Key, Any]], now: datetime
    ) -> list[tuple[bool, datetime]]:
        """Seed 000's first-write-wins insert, then its WRITETIME check, for many
        ``(counter, member)`` pairs at once; returns per pair (whether this write was the first,
        the winning first-write time). Every insert lands before any check is read."""
        ts = FIRST_WRITE_WINS - write_timestamp(now)
        insert = self.prepare(
            "set_insert",
            "INSERT INTO {set} ({key}, {member}, first_seen) VALUES ({key_marks}, ?, ?) "
            "USING TIMESTAMP ?",
        )
        check = self.prepare(
            "set_check",
            "SELECT first_seen, writetime(first_seen) FROM {set} WHERE {key_where} "
            "AND {member} = ?",
        )
        self._concurrent(insert, [(*counter, member, now, ts) for counter, member in items])
        checks = self._concurrent(check, [(*counter, member) for counter, member in items])
        return [(winner == ts, first_seen) for first_seen, winner in (r.one() for r in checks)]

    def counted_members(self, counter: Key, members: Sequence[Any]) -> set[Any]:
        """Members of a unique family already marked counted by an earlier cleanup."""
        if not members:
            return set()
        statement = self.prepare(
            "set_counted",
            "SELECT {member}, counted FROM {set} WHERE {key_where} AND {member} IN ?",
        )
        rows = self.session.execute(statement, (*counter, list(set(members))))
        return {member for member, counted in rows if counted}

    def mark_counted(self, items: Sequence[tuple[Key, Sequence[Any]]]) -> None:
        statement = self.prepare(
            "set_mark",
            "UPDATE {set} SET counted = true WHERE {key_where} AND {member} = ?",
        )
        self._run(
            [
                (self._batch(statement, [(*counter, m) for m in group]), None)
                for counter, members in items
                for group in chunks(members, ROWS_PER_BATCH)
            ]
        )

    def members(self, counter: Key) -> list[tuple[Any, datetime | None, bool]]:
        """Every member of a unique counter with its first-write time and counted mark."""
        statement = self.prepare(
            "set_members",
            "SELECT {member}, first_seen, counted FROM {set} WHERE {key_where}",
        )
        rows = self.session.execute(statement, counter, execution_profile=BULK_PROFILE)
        return [(m, first_seen, bool(counted)) for m, first_seen, counted in rows]

    def scan_set_counters(self, shard: int) -> list[Key]:
        """Every counter of a unique family's set table in the shard's token range."""
        statement = self.prepare(
            "set_distinct", "SELECT DISTINCT {key} FROM {set} WHERE {token} > ? AND {token} <= ?"
        )
        return self._scan_distinct(statement, shard)

    def count_members(self, counters: Sequence[Key]) -> dict[Key, int]:
        """Recount a unique family's set (reconciliation)."""
        statement = self.prepare("set_count", "SELECT count(*) FROM {set} WHERE {key_where}")
        results = self._concurrent(statement, counters)
        return {c: r.one()[0] for c, r in zip(counters, results, strict=True)}

    # --- reading raw rows -----------------------------------------------------------------

    def scan_rows(
        self, shard: int, bucket: int, after_ms: int | None = None
    ) -> dict[Key, list[Row]]:
        """Every raw row of one bucket's token range, grouped by counter (one paged query); only
        those after ``after_ms`` if given (a clustering slice: the node never reaches the
        tombstones of earlier folds behind it)."""
        select = f"SELECT {{key}}, {self._row_columns()} FROM {{raw}} "
        params: tuple[Any, ...] = bucket_bounds(self.family.shards, shard, bucket)
        if after_ms is None:
            statement = self.prepare("raw_scan", select + "WHERE {token} > ? AND {token} <= ?")
        else:
            statement = self.prepare(
                "raw_scan_after",
                select + "WHERE {token} > ? AND {token} <= ? AND {time} > ? ALLOW FILTERING",
            )
            params = (*params, self._time_bound(after_ms))
        self.requests[self.phase] += 1
        result = self.session.execute(statement, params, execution_profile=BULK_PROFILE)
        return self._parse_rows(result, len(self.layout.key))

    def read_rows(
        self, counters: Sequence[Key], after_ms: int | None = None
    ) -> dict[Key, list[Row]]:
        """Every raw row of the given counters (``IN`` reads); only those after ``after_ms`` if
        given (a clustering slice, as ``scan_rows``: past a hot counter's epoch it meets no
        tombstone of ours, every folded row being at or before the epoch it was folded at)."""
        if after_ms is None:
            found = self._rows_by_partition("raw_read", self._row_columns(), "{raw}", counters)
        else:
            found = self._rows_by_partition(
                "raw_read_after_all",
                self._row_columns(),
                "{raw}",
                counters,
                where="AND {time} > ?",
                params=(self._time_bound(after_ms),),
            )
        out: dict[Key, list[Row]] = {}
        for counter in counters:
            out[counter] = self._parse_rows(found[counter], 0).get((), [])
        return out

    def _read_counter_rows(self, name: str, where: str, params: Sequence[Any]) -> list[Row]:
        statement = self.prepare(
            name, f"SELECT {self._row_columns()} FROM {{raw}} WHERE {{key_where}} {where}"
        )
        self.requests[self.phase] += 1
        rows = self.session.execute(statement, params, execution_profile=BULK_PROFILE)
        return self._parse_rows(rows, 0).get((), [])

    def read_rows_between(self, counter: Key, low_ms: int, high_ms: int) -> list[Row]:
        """A counter's rows in ``[low_ms, high_ms]`` (a hot counter's recent past)."""
        low = self._time_bound(low_ms - 1)
        return self._read_counter_rows(
            "raw_read_between",
            "AND {time} > ? AND {time} <= ?",
            (*counter, low, self._time_bound(high_ms)),
        )

    def read_rows_at(self, counter: Key, keys: Sequence[Packed]) -> list[Row]:
        """Those of the given rows of a counter that are present: point reads, no range."""
        relation, bind = self._rows_in()
        statement = self.prepare(
            "raw_read_at",
            f"SELECT {self._row_columns()} FROM {{raw}} WHERE {{key_where}} AND {relation}",
        )
        params = [(*counter, bind(group)) for group in chunks(list(keys), ROWS_PER_BATCH)]
        results = self._concurrent(statement, params)
        return self._parse_rows((r for result in results for r in result), 0).get((), [])

    def _rows_in(self) -> tuple[str, Callable[[Sequence[Packed]], list[Any]]]:
        """The relation naming many rows of one partition by their clustering keys, and how to
        bind packed keys to it (a one-column clustering key is not a tuple)."""
        if len(self.layout.clustering) == 1:
            decode = self._packing[1][0]
            return "{time} IN ?", lambda keys: [decode(k[0]) for k in keys]
        if self._packing[2]:  # packed keys bind as they are (times as epoch ms)
            return "({clustering}) IN ?", list
        return "({clustering}) IN ?", lambda keys: [self._unpack(k) for k in keys]

    def recount(
        self,
        shard: int,
        bucket: int,
        counters: Sequence[Key] | None,
        epoch_ms: int,
        after_ms: int | None = None,
    ) -> dict[Key, tuple[int, int]]:
        """An independent recount by the server: per counter, the number and the sum of its
        present raw rows at or below ``epoch_ms`` and after ``after_ms`` if given (``GROUP BY``
        over the bucket's token range, or over the given counters). The lower bound is a
        clustering slice: the node never reaches the tombstones behind it. Summed as varint: an
        int column cannot wrap."""
        measure = f"count(*), sum(CAST({self._names['increment']} AS varint))"
        bound = self._time_bound(epoch_ms)
        params: tuple[Any, ...]
        where, params, name = "AND {time} <= ?", (bound,), "raw_recount_below"
        if after_ms is not None:
            where = "AND {time} > ? AND {time} <= ?"
            params, name = (self._time_bound(after_ms), bound), "raw_recount_between"
        if counters is None:
            statement = self.prepare(
                f"{name}_range",
                f"SELECT {{key}}, {measure} FROM {{raw}} WHERE {{token}} > ? AND {{token}} <= ? "
                f"{where} GROUP BY {{key}} ALLOW FILTERING",
            )
            self.requests[self.phase] += 1
            rows = self.session.execute(
                statement,
                (*bucket_bounds(self.family.shards, shard, bucket), *params),
                execution_profile=BULK_PROFILE,
            )
            width = len(self.layout.key)
            return {tuple(r[:width]): (r[width], r[width + 1] or 0) for r in rows}
        found = self._rows_by_partition(
            name, measure, "{raw}", counters, where=where, params=params, group=True
        )
        return {c: (rows[0][0], rows[0][1] or 0) if rows else (0, 0) for c, rows in found.items()}

    # --- deletes --------------------------------------------------------------------------

    def delete_rows(
        self, deletions: Sequence[tuple[Key, Sequence[Packed] | CountedKeys]], ts: int
    ) -> int:
        """Delete exactly these rows (never a range: a late row next to them must survive),
        with a tombstone timestamp that also shadows later retries of the same rows. One
        ``IN`` delete per counter, in unlogged batches of up to ``DELETE_BATCH_ROWS`` rows of
        many counters (the caller passes one bucket: one token range). Keys from the run log
        are bound as the bytes they are stored in."""
        relation = self._rows_in()[0]
        statement = self.prepare(
            "raw_delete_in",
            f"DELETE FROM {{raw}} USING TIMESTAMP ? WHERE {{key_where}} AND {relation}",
        )
        entries: list[tuple[int, tuple]] = []
        deleted = 0
        for counter, keys in deletions:
            if not isinstance(keys, CountedKeys):
                keys = CountedKeys.of(self.key_codec, keys)
            deleted += len(keys)
            entries += [
                (n, (ts, *counter, value)) for n, value in keys.in_values(DELETE_BATCH_ROWS)
            ]
        self._write_spread(statement, entries, DELETE_BATCH_ROWS)
        return deleted
