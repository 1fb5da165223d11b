"""The raw table: the write API's writes, reads of a counter's rows, their deletes, and a
unique family's set table."""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar

from cassandra import (
    ReadFailure,
    ReadTimeout,
)

from ..connection import BULK_PROFILE
from ..core import (
    Checkpoint,
    Key,
    Packed,
    Row,
    SliceWalk,
    bucket_bounds,
    split_refused_range,
    write_timestamp,
)
from ..errors import EngineError
from ..rowkeys import CountedKeys
from ..schema import q
from .keys import Keys
from .statements import (
    DELETE_BATCH_ROWS,
    FIRST_WRITE_WINS,
    REQUEST_BYTES,
    ROWS_PER_BATCH,
    Cql,
    Statements,
    bounded,
    declare,
)

log = logging.getLogger(__name__)

Part = TypeVar("Part")


class RawTable:
    """The raw table (``{raw}``) and a unique family's set table: the write API's writes, reads
    of a counter's rows, the server's recounts and the deletes, over the statements core.
    ``Store`` makes one as ``store.raw``."""

    STATEMENTS = declare(
        set_insert=Cql(
            "INSERT INTO {set} ({key}, {member}, first_seen) VALUES ({key_marks}, ?, ?) USING "
            "TIMESTAMP ?"
        ),
        set_check=Cql(
            "SELECT first_seen, writetime(first_seen) FROM {set} WHERE {key_where} AND {member} = ?"
        ),
        set_mark=Cql("UPDATE {set} SET counted = true WHERE {key_where} AND {member} = ?"),
        set_members=Cql("SELECT {member}, first_seen, counted FROM {set} WHERE {key_where}"),
        set_distinct=Cql("SELECT DISTINCT {key} FROM {set} WHERE {token} > ? AND {token} <= ?"),
        set_count=Cql("SELECT count(*) FROM {set} WHERE {key_where}"),
        raw_distinct=Cql("SELECT DISTINCT {key} FROM {raw} WHERE {token} > ? AND {token} <= ?"),
        set_counted=Cql("SELECT {member}, counted FROM {set} WHERE {key_where} AND {member} IN ?"),
        raw_insert=Cql(
            "INSERT INTO {raw} ({key}, {clustering}, {increment}) VALUES ({marks}) "
            "USING TIMESTAMP ?"
        ),
        raw_scan=Cql("SELECT {key}, {row_columns} FROM {raw} WHERE {token} > ? AND {token} <= ?"),
        raw_scan_after=Cql(
            "SELECT {key}, {row_columns} FROM {raw} "
            "WHERE {token} > ? AND {token} <= ? AND {time} > ? ALLOW FILTERING"
        ),
        raw_read=Cql("SELECT {row_columns} FROM {raw} WHERE {key_where} ", by_partition=True),
        raw_read_after_all=Cql(
            "SELECT {row_columns} FROM {raw} WHERE {key_where} AND {time} > ?", by_partition=True
        ),
        raw_read_upto=Cql("SELECT {row_columns} FROM {raw} WHERE {key_where} AND {time} <= ?"),
        raw_read_slice=Cql(
            "SELECT {row_columns} FROM {raw} WHERE {key_where} AND {time} > ? AND {time} <= ?"
        ),
        raw_read_at=Cql("SELECT {row_columns} FROM {raw} WHERE {key_where} AND {relation}"),
        raw_written_at=Cql(
            "SELECT {row_columns}, {write_times} FROM {raw} WHERE {key_where} AND {relation}"
        ),
        raw_recount_below=Cql(
            "SELECT count(*), sum(CAST({increment} AS varint)) FROM {raw} "
            "WHERE {key_where} AND {time} <= ?",
            by_partition=True,
        ),
        raw_recount_below_range=Cql(
            "SELECT {key}, count(*), sum(CAST({increment} AS varint)) FROM {raw} "
            "WHERE {token} > ? AND {token} <= ? AND {time} <= ? GROUP BY {key} ALLOW FILTERING"
        ),
        raw_recount_between=Cql(
            "SELECT count(*), sum(CAST({increment} AS varint)) FROM {raw} "
            "WHERE {key_where} AND {time} > ? AND {time} <= ?",
            by_partition=True,
        ),
        raw_recount_between_range=Cql(
            "SELECT {key}, count(*), sum(CAST({increment} AS varint)) FROM {raw} "
            "WHERE {token} > ? AND {token} <= ? AND {time} > ? AND {time} <= ? GROUP BY {key} "
            "ALLOW FILTERING"
        ),
        raw_delete_in=Cql("DELETE FROM {raw} USING TIMESTAMP ? WHERE {key_where} AND {relation}"),
        raw_slice_all=Cql(
            "SELECT count(*), {measure} FROM {raw} WHERE {key_where} AND {time} <= ?",
            by_partition=True,
        ),
        raw_slice=Cql(
            "SELECT count(*), {measure} FROM {raw} "
            "WHERE {key_where} AND {time} > ? AND {time} <= ?",
            by_partition=True,
        ),
        raw_newer=Cql("SELECT {newer} FROM {raw} WHERE {key_where} AND {time} > ?"),
        raw_all=Cql("SELECT {newer} FROM {raw} WHERE {key_where}"),
    )

    def __init__(self, statements: Statements, keys: Keys):
        self.statements = statements
        self.family = statements.family
        self.keys = keys

    @cached_property
    def statement_parts(self) -> dict[str, str]:
        """The family's parts of its statements' texts, computed once (``Statements.prepared``
        fills them): the select list of raw rows, an insert's bind markers, the relation naming
        rows by their clustering keys, what a counter's rows add up to, and what its newer
        rows add (a unique family's members, counted distinct: a clock-behind winner leaves
        two rows)."""
        lay = self.statements.layout
        measure = self._measure()
        return {
            "row_columns": self.keys.row_columns(),
            "marks": ", ".join("?" for _ in range(len(lay.key) + len(lay.clustering) + 1)),
            "relation": self._rows_in()[0],
            "measure": measure,
            "newer": "{member}" if self.family.rules.members else measure,
            "write_times": ", ".join(f"WRITETIME({q(c)})" for c in lay.written),
        }

    # --- write API ------------------------------------------------------------------------

    def insert_raw(self, rows: Sequence[tuple[Key, Key, int, int]]) -> None:
        """Insert raw rows ``(counter, clustering, increment, write_ts_micros)``, batched per
        counter (one mutation per partition)."""
        statement = self.statements.prepared(self, "raw_insert")
        by_counter: dict[Key, list[tuple]] = defaultdict(list)
        for counter, clustering, increment, ts in rows:
            by_counter[counter].append((*counter, *clustering, increment, ts))
        self.statements.batches(statement, by_counter.values())

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
        insert = self.statements.prepared(self, "set_insert")
        check = self.statements.prepared(self, "set_check")
        self.statements.concurrent(
            insert, [(*counter, member, now, ts) for counter, member in items]
        )
        checks = self.statements.concurrent(
            check, [(*counter, member) for counter, member in items]
        )
        return [(winner == ts, first_seen) for first_seen, winner in (r.one() for r in checks)]

    def counted_members(self, counter: Key, members: Sequence[Any]) -> set[Any]:
        """Members of a unique family already marked counted by an earlier cleanup."""
        return set(self.read_marked({counter: set(members)}).get(counter, ()))

    def mark_counted(self, items: Sequence[tuple[Key, Sequence[Any]]]) -> None:
        statement = self.statements.prepared(self, "set_mark")
        self.statements.batches(
            statement, ([(*counter, m) for m in members] for counter, members in items)
        )

    def members(self, counter: Key) -> list[tuple[Any, datetime | None, bool]]:
        """Every member of a unique counter with its first-write time and counted mark."""
        statement = self.statements.prepared(self, "set_members")
        rows = self.statements.execute(statement, counter, profile=BULK_PROFILE)
        return [(m, first_seen, bool(counted)) for m, first_seen, counted in rows]

    def scan_set_counters(self, shard: int) -> list[Key]:
        """Every counter of a unique family's set table in the shard's token range."""
        statement = self.statements.prepared(self, "set_distinct")
        return self.statements.scan_distinct(statement, shard)

    def count_members(self, counters: Sequence[Key]) -> dict[Key, int]:
        """Recount a unique family's set (reconciliation)."""
        statement = self.statements.prepared(self, "set_count")
        results = self.statements.concurrent(statement, counters)
        return {c: r.one()[0] for c, r in zip(counters, results, strict=True)}

    # --- reading raw rows -----------------------------------------------------------------

    def scan_rows(
        self, shard: int, bucket: int, after_ms: int | None = None
    ) -> dict[Key, list[Row]]:
        """Every raw row of one bucket's token range, grouped by counter (one paged query); only
        those after ``after_ms`` if given (a clustering slice: the node never reaches the
        tombstones of earlier folds behind it)."""
        params: tuple[Any, ...] = bucket_bounds(self.family.shards, shard, bucket)
        if after_ms is None:
            statement = self.statements.prepared(self, "raw_scan")
        else:
            statement = self.statements.prepared(self, "raw_scan_after")
            params = (*params, self.keys.time_bound(after_ms))
        result = self.statements.execute(statement, params, profile=BULK_PROFILE)
        return self.keys.parse_rows(result, len(self.statements.layout.key))

    def read_rows(
        self, counters: Sequence[Key], after_ms: int | None = None
    ) -> dict[Key, list[Row]]:
        """Every raw row of the given counters (``IN`` reads); only those after ``after_ms`` if
        given (a clustering slice, as ``scan_rows``: past a hot counter's epoch it meets no
        tombstone of ours, every folded row being at or before the epoch it was folded at)."""
        if after_ms is None:
            found = self.statements.rows_by_partition(self, "raw_read", counters)
        else:
            found = self.statements.rows_by_partition(
                self,
                "raw_read_after_all",
                counters,
                params=(self.keys.time_bound(after_ms),),
            )
        out: dict[Key, list[Row]] = {}
        for counter in counters:
            out[counter] = self.keys.parse_rows(found[counter], 0).get((), [])
        return out

    def _read_counter_rows(self, name: str, params: Sequence[Any]) -> list[Row]:
        statement = self.statements.prepared(self, name)
        rows = self.statements.execute(statement, params, profile=BULK_PROFILE)
        return self.keys.parse_rows(rows, 0).get((), [])

    def read_rows_between(self, counter: Key, low_ms: int, high_ms: int) -> list[Row]:
        """A counter's rows in ``[low_ms, high_ms]`` (a hot counter's recent past)."""
        low = self.keys.time_bound(low_ms - 1)
        return self._read_counter_rows(
            "raw_read_slice", (*counter, low, self.keys.time_bound(high_ms))
        )

    def read_rows_upto(
        self, counter: Key, high_ms: int, low_ms: int | None = None, *, sliced: bool = False
    ) -> list[Row]:
        """Every present row of ``counter`` in ``(low_ms, high_ms]`` (from its partition's
        start when ``low_ms`` is None), however many tombstones lie among them: in slices the
        node does not refuse (``walk_slices``). What an operator's command reads of a busy
        counter's past (a reset's consumed rows), and a sweep of a hot counter's late rows.
        ``sliced``: the node just refused the range whole; start with a slice."""
        parts = self.walk_slices(counter, high_ms, low_ms, self._rows_in_slice, sliced=sliced)
        return sorted((r for part in parts for r in part), key=lambda r: r[0])

    def count_upto(self, counter: Key, high_ms: int, low_ms: int | None = None) -> tuple[int, int]:
        """The number of ``counter``'s present rows in ``(low_ms, high_ms]`` and their total
        (``read_slices``'s measure: the sum of increments, the count for a rows family),
        aggregated by the server in slices it does not refuse (``walk_slices``)."""
        parts = self.walk_slices(counter, high_ms, low_ms, self._count_in_slice)
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def walk_slices(
        self,
        counter: Key,
        high_ms: int,
        low_ms: int | None,
        read: Callable[[Key, int | None, int], Part],
        *,
        sliced: bool = False,
    ) -> list[Part]:
        """``read(counter, start, top)`` over ``(low_ms, high_ms]``: whole, else, once the node
        refuses it (more tombstones than its ``tombstone_failure_threshold``, or a timeout),
        slice by slice from the top down, each slice sized by the last ones
        (``core.SliceWalk``). Past a slice of one millisecond it gives up, naming the
        counter; nothing was written."""
        whole = SliceWalk(low_ms, high_ms)
        walk: SliceWalk | None = whole
        if sliced:  # refused whole a moment ago: asking again costs the node as many tombstones
            with contextlib.suppress(ValueError):  # a range too narrow to slice is read whole
                walk = whole.refused()
        parts: list[Part] = []
        refusals = 0
        while walk is not None:
            try:
                parts.append(read(counter, walk.start, walk.top))
            except (ReadFailure, ReadTimeout) as exc:
                refusals += 1
                try:
                    walk = walk.refused()
                except ValueError as narrowest:
                    raise EngineError(
                        f"family {self.family.name!r} counter {list(counter)}: {narrowest} "
                        f"({type(exc).__name__}); wait for its tombstones to be purged "
                        "(gc_grace_seconds) or raise the node's tombstone_failure_threshold. "
                        "Nothing was written"
                    ) from exc
                continue
            walk = walk.read()
        if refusals:
            log.info(
                "family %r counter %s: read in %d slices past its tombstones (%d refused)",
                self.family.name,
                list(counter),
                len(parts),
                refusals,
            )
        return parts

    def _slice_bounds(self, start: int | None, top: int) -> tuple[Any, ...]:
        if start is None:
            return (self.keys.time_bound(top),)
        return self.keys.time_bound(start), self.keys.time_bound(top)

    def _measure(self) -> str:
        """What a counter's rows add up to: their sum (varint: an int column cannot wrap), their
        count for a rows family."""
        if self.statements.layout.increment is None:
            return "count(*)"
        return "sum(CAST({increment} AS varint))"

    def _rows_in_slice(self, counter: Key, start: int | None, top: int) -> list[Row]:
        name = "raw_read_upto" if start is None else "raw_read_slice"
        return self._read_counter_rows(name, (*counter, *self._slice_bounds(start, top)))

    def _count_in_slice(self, counter: Key, start: int | None, top: int) -> tuple[int, int]:
        bounds = self._slice_bounds(start, top)
        statement = self.statements.prepared(
            self, "raw_slice_all" if start is None else "raw_slice"
        )
        row = self.statements.execute(statement, (*counter, *bounds), profile=BULK_PROFILE).one()
        return (row[0] or 0, row[1] or 0) if row else (0, 0)

    def read_rows_at(self, counter: Key, keys: Sequence[Packed]) -> list[Row]:
        """Those of the given rows of a counter that are present: point reads, no range."""
        found = self._read_at("raw_read_at", counter, keys)
        return self.keys.parse_rows(found, 0).get((), [])

    def _read_at(self, name: str, counter: Key, keys: Sequence[Packed]) -> list[tuple[Any, ...]]:
        """Statement ``name`` over the given rows of a counter, ``ROWS_PER_BATCH`` a request."""
        bind = self._rows_in()[1]
        statement = self.statements.prepared(self, name)
        params = [(*counter, bind(group)) for group in bounded(keys, ROWS_PER_BATCH)]
        return [r for result in self.statements.concurrent(statement, params) for r in result]

    def written_at(self, counter: Key, keys: Sequence[Packed]) -> dict[Packed, int | None] | None:
        """When each of the given rows of a counter that are present was last written (µs):
        the newest ``WRITETIME`` of its own columns (point reads), None when none of them
        holds a value (what keeps the row is its key's own timestamp, which CQL does not
        read). None for a table with no such column."""
        width = len(self.statements.layout.written)
        if not width:
            return None
        if not keys:
            return {}
        found = self._read_at("raw_written_at", counter, keys)
        rows = self.keys.parse_rows((r[:-width] for r in found), 0).get((), [])
        return {
            key: max((t for t in r[-width:] if t is not None), default=None)
            for (_t, key, _i), r in zip(rows, found, strict=True)
        }

    def _rows_in(self) -> tuple[str, Callable[[Sequence[Packed]], list[Any]]]:
        """The relation naming many rows of one partition by their clustering keys, and how to
        bind packed keys to it (a one-column clustering key is not a tuple)."""
        if len(self.statements.layout.clustering) == 1:
            decode = self.keys.packing[1][0]
            return "{time} IN ?", lambda keys: [decode(k[0]) for k in keys]
        if self.keys.packing[2]:  # packed keys bind as they are (times as epoch ms)
            return "({clustering}) IN ?", list
        return "({clustering}) IN ?", lambda keys: [self.keys.unpack(k) for k in keys]

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
        bound = self.keys.time_bound(epoch_ms)
        params: tuple[Any, ...]
        params, name = (bound,), "raw_recount_below"
        if after_ms is not None:
            params, name = (self.keys.time_bound(after_ms), bound), "raw_recount_between"
        if counters is None:
            statement = self.statements.prepared(self, f"{name}_range")
            rows = self.statements.execute(
                statement,
                (*bucket_bounds(self.family.shards, shard, bucket), *params),
                profile=BULK_PROFILE,
            )
            width = len(self.statements.layout.key)
            return {tuple(r[:width]): (r[width], r[width + 1] or 0) for r in rows}
        found = self.statements.rows_by_partition(self, name, counters, params=params)
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
        statement = self.statements.prepared(self, "raw_delete_in")
        entries: list[tuple[int, tuple]] = []
        deleted = 0
        for counter, keys in deletions:
            if not isinstance(keys, CountedKeys):
                keys = CountedKeys.of(self.keys.key_codec, keys)
            deleted += len(keys)
            entries += [
                (n, (ts, *counter, value))
                for n, value in keys.in_values(DELETE_BATCH_ROWS, REQUEST_BYTES)
            ]
        self.statements.write_spread(statement, entries, DELETE_BATCH_ROWS)
        return deleted

    def scan_counters(self, shard: int) -> list[Key]:
        """Every counter with live raw rows in the shard's token range (the sweep), read as
        ``SCAN_SPLITS`` finer ranges so no single query walks a whole shard's tombstones."""
        statement = self.statements.prepared(self, "raw_distinct")
        return self.statements.scan_distinct(statement, shard)

    def distinct_counters(
        self, shard: int, bucket: int, splits: int = 8, around: Sequence[Key] = ()
    ) -> list[Key]:
        """Every counter with live raw rows in one bucket's token range, read in ``splits``
        finer ranges (the fallback when a bucket's row scan meets too many tombstones; one
        range for a rows family, whose rows are never deleted). A range the server refuses
        (a hot counter's partition of tombstones) is read again around the partitions of
        ``around`` (known counters, which the caller reads by parts), else in halves."""
        statement = self.statements.prepared(self, "raw_distinct")
        low, high = bucket_bounds(self.family.shards, shard, bucket)
        step = (high - low) // splits or 1
        edges = [low + i * step for i in range(splits)] + [high]
        ranges = [(edges[i], edges[i + 1]) for i in range(splits) if edges[i] < edges[i + 1]]
        known = [self.keys.token(c) for c in around]
        found: dict[Key, None] = {}
        while ranges:
            refused: list[tuple[int, int]] = []
            results = self.statements.run([(statement, r) for r in ranges], raise_first=False)
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

    def read_slices(
        self, counters: Sequence[Key], checkpoints: dict[Key, Checkpoint], epoch_ms: int
    ) -> dict[Key, tuple[int, int]]:
        """Server-side aggregate of each counter's slice (checkpoint, epoch]: (rows, total).
        The total is the row count for a rows family, the sum of increments otherwise;
        counters sharing a checkpoint are aggregated together (``IN`` + ``GROUP BY``)."""
        upper = self.keys.time_bound(epoch_ms)
        by_base: dict[int | None, list[Key]] = defaultdict(list)
        for counter in counters:
            by_base[checkpoints[counter].epoch_ms].append(counter)
        out: dict[Key, tuple[int, int]] = {}
        for base, group in by_base.items():
            try:
                if base is None:
                    found = self.statements.rows_by_partition(
                        self, "raw_slice_all", group, params=(upper,)
                    )
                else:
                    found = self.statements.rows_by_partition(
                        self,
                        "raw_slice",
                        group,
                        params=(self.keys.time_bound(base), upper),
                    )
            except (ReadFailure, ReadTimeout):  # a partition of tombstones (a rows family's
                # deleted business rows): each counter by itself, in slices the node reads
                for counter in group:
                    out[counter] = self.count_upto(counter, epoch_ms, base)
                continue
            for counter, rows in found.items():
                out[counter] = (rows[0][0] or 0, rows[0][1] or 0) if rows else (0, 0)
        return out

    def read_marked(self, newer: dict[Key, Any]) -> dict[Key, frozenset[Any]]:
        """A unique family's newer members that an earlier cleanup marked counted, per counter
        (concurrent requests, each of at most ``ROWS_PER_BATCH`` members and ``REQUEST_BYTES``:
        a counter's backlog of members never makes one request over the node's limits);
        nothing for other kinds."""
        wanted = [
            (c, group)
            for c, m in newer.items()
            if isinstance(m, set) and m
            for group in bounded(sorted(m, key=repr), ROWS_PER_BATCH)
        ]
        if not wanted:
            return {}
        statement = self.statements.prepared(self, "set_counted")
        results = self.statements.concurrent(statement, [(*c, members) for c, members in wanted])
        marked: dict[Key, set[Any]] = {c: set() for c, _members in wanted}
        for (c, _members), result in zip(wanted, results, strict=True):
            marked[c].update(member for member, counted in result if counted)
        return {c: frozenset(found) for c, found in marked.items()}

    def read_newer(self, counters: Sequence[Key], bounds: dict[Key, Any]) -> dict[Key, Any]:
        """What each counter's rows after its base's epoch add: their sum (varint: an int column
        cannot wrap), their count for a rows family, their members for a unique family."""
        unique = self.family.rules.members
        newer = self.statements.prepared(self, "raw_newer")
        everything = self.statements.prepared(self, "raw_all")
        requests = [
            (newer, (*c, bounds[c])) if bounds[c] is not None else (everything, c) for c in counters
        ]
        out: dict[Key, Any] = {}
        for counter, result in zip(counters, self.statements.run(requests), strict=True):
            out[counter] = {r[0] for r in result} if unique else result.one()[0] or 0
        return out
