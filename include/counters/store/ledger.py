"""The ledger: checkpoints committed a bucket at a time, the readers' copies, and a
reshard's fences and moves of them."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    PreparedStatement,
)
from cassandra.util import uuid_from_time

from .. import schema
from ..connection import BULK_PROFILE
from ..core import (
    Checkpoint,
    Fold,
    Key,
    Packed,
    bucket_bounds,
    high_water,
    pack_state,
    state_commit,
    unpack_state,
)
from ..errors import EngineError
from ..schema import q
from .keys import Keys, normal_key
from .records import (
    EMPTY_READ_BASE,
    MOVING,
    NO_KEYS,
    Copy,
    Ledger,
    ReadBase,
)
from .statements import (
    COPY_BATCH_PARTITIONS,
    ROWS_PER_BATCH,
    Cql,
    Statements,
    bind,
    bounded,
    consistency_of,
    declare,
    serial_consistency_of,
)

log = logging.getLogger(__name__)

LEDGER_COLUMNS = (
    "commit_id, state, value, epoch_ms, run_id, pending, pending_sum, version, pending_rows, "
    "pending_low_ms, origin_ms"
)
LEDGER_VALUES = (
    "commit_id, state, value, epoch_ms, run_id, (text)null, pending_sum, version, "
    "pending_rows, pending_low_ms, origin_ms"
)
"""The read-back of committed values, without a legacy ``pending`` list."""

SCAN_REFUSED_TTL_S = 10_800
"""How long a bucket's refused whole scan is remembered: the raw table's ``gc_grace_seconds``
(3 h), the least time its tombstones stay; a bucket still past the limit then is refused once
more and remembered again."""


class LedgerTable:
    """The ledger (``{ledger}``: each bucket's head and its counters' checkpoints) and the
    readers' compact copies (``{compact}``): every statement on them, a reshard's fences and
    moves included, over the statements core. ``Store`` makes one as ``store.ledger``."""

    STATEMENTS = declare(
        ledger_scan=Cql(
            f"SELECT head, shards, scan_refused_ms, {{key}}, {LEDGER_COLUMNS} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ?"
        ),
        ledger_scan_values=Cql(
            f"SELECT head, shards, scan_refused_ms, {{key}}, {LEDGER_VALUES} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ?"
        ),
        ledger_read=Cql(
            f"SELECT {{key}}, {LEDGER_COLUMNS} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ? AND ({key}) IN ?"
        ),
        ledger_read_values=Cql(
            f"SELECT {{key}}, {LEDGER_VALUES} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ? AND ({key}) IN ?"
        ),
        compact_copy=Cql(
            "UPDATE {compact} USING TIMESTAMP ? SET {value} = ?, {epoch} = ?, commit_id = ?, "
            "run_id = ?, updated_at = ?{pending} WHERE {key_where}"
        ),
        compact_scan=Cql(
            "SELECT {key}, {copy_columns} FROM {compact} WHERE {token} > ? AND {token} <= ?"
        ),
        compact_read=Cql(
            "SELECT {copy_columns} FROM {compact} WHERE {key_where} ", by_partition=True
        ),
        ledger_rows=Cql("SELECT {key}, {row_columns} FROM {ledger} WHERE shard = ? AND bucket = ?"),
        ledger_row_insert=Cql(
            "INSERT INTO {ledger} (shard, bucket, {key}, {row_columns}) "
            "VALUES (?, ?, {key_marks}, {row_marks})"
        ),
        ledger_head=Cql(
            "SELECT head, population, shards, scan_refused_ms FROM {ledger} WHERE shard = ? AND "
            "bucket = ? LIMIT 1"
        ),
        ledger_scan_refused=Cql(
            "UPDATE {ledger} USING TTL ? SET scan_refused_ms = ? WHERE shard = ? AND bucket = ?"
        ),
        ledger_head_cas=Cql(
            "UPDATE {ledger} SET head = ?, population = ?, shards = ? WHERE shard = ? AND bucket "
            "= ? IF head = ? AND shards IN (?, null)",
            serial=True,
        ),
        ledger_state_write=Cql(
            "UPDATE {ledger} SET state = ?, commit_id = ? WHERE shard = ? AND bucket = ? AND "
            "{key_where} IF commit_id = ?",
            serial=True,
        ),
        ledger_state_write_origin=Cql(
            "UPDATE {ledger} SET state = ?, commit_id = ?, origin_ms = ? WHERE shard = ? AND "
            "bucket = ? AND {key_where} IF commit_id = ?",
            serial=True,
        ),
        ledger_positions=Cql("SELECT shard, bucket, {key} FROM {ledger} LIMIT ?"),
        ledger_fence=Cql(
            "UPDATE {ledger} SET shards = ? WHERE shard = ? AND bucket = ? IF head = ?", serial=True
        ),
        ledger_open=Cql(
            "UPDATE {ledger} SET shards = ?, head = ?, population = null WHERE shard = ? AND "
            "bucket = ?"
        ),
        ledger_drop=Cql("DELETE FROM {ledger} WHERE shard = ? AND bucket = ?"),
        ledger_row_delete=Cql(
            "DELETE FROM {ledger} WHERE shard = ? AND bucket = ? AND {key_where}"
        ),
        ledger_origin_recover=Cql(
            "UPDATE {ledger} SET origin_ms = ? WHERE shard = ? AND bucket = ? AND {key_where} IF "
            "commit_id = ? AND origin_ms = null",
            serial=True,
        ),
        compact_value_commit_pending=Cql(
            "SELECT {value}, {epoch}, commit_id, pending FROM {compact} WHERE {key_where}"
        ),
        compact_value_commit=Cql(
            "SELECT {value}, {epoch}, commit_id FROM {compact} WHERE {key_where}"
        ),
    )

    def __init__(self, statements: Statements, keys: Keys):
        self.statements = statements
        self.family = statements.family
        self.keys = keys

    @cached_property
    def statement_parts(self) -> dict[str, str]:
        """The family's parts of its statements' texts, computed once (``Statements.prepared``
        fills them): a unique family's copy also lists the counted keys (``pending``); a
        copy's columns as read (a timestamp epoch as epoch ms from the server: no datetime
        built and taken apart)."""
        pending = ", pending" if not self.family.folds_by_slice else ""
        epoch = (
            "toUnixTimestamp({epoch})"
            if schema.epoch_type(self.family, self.statements.layout) == "timestamp"
            else "{epoch}"
        )
        return {
            "pending": ", pending = ?" if self.family.rules.members else "",
            "copy_columns": f"{{value}}, {epoch}, commit_id, writetime({{value}}){pending}",
        }

    # --- the ledger: checkpoints committed a bucket at a time -----------------------------

    def _checkpoint(self, row: Sequence[Any], with_pending: bool = True) -> Checkpoint:
        """A ledger row as a checkpoint: its ``state`` cell (``core.pack_state``) when that
        was written by the row's last commit, else the separate columns older versions wrote.
        Its pending keys are in the run log (``keys`` of the commit's record), loaded only when
        needed (``load_pending``); a row written before that (``pending`` as a JSON list in the
        ledger itself) carries them inline."""
        commit_id, state, origin_ms = row[0], row[1], row[-1]
        if commit_id is not None and state_commit(state) == commit_id.bytes:
            checkpoint = unpack_state(state, commit_id)
            return checkpoint if origin_ms is None else replace(checkpoint, origin_ms=origin_ms)
        (value, epoch_ms, run_id, pending, pending_sum, version, pending_rows, low_ms) = row[2:-1]
        inline = bool(pending) and with_pending
        keys: frozenset[Packed] = (
            frozenset(map(tuple, json.loads(pending))) if inline else frozenset()
        )
        count = pending_rows if pending_rows is not None else len(keys)
        return Checkpoint(
            value=value or 0,
            epoch_ms=epoch_ms,
            commit_id=commit_id,
            pending=keys,
            pending_sum=pending_sum or 0,
            version=version,
            run_id=run_id,
            pending_rows=count or 0,
            low_ms=low_ms,
            pending_loaded=inline or not count,
            origin_ms=origin_ms,
        )

    def row_checkpoint(self, row: dict[str, Any]) -> Checkpoint:
        """A checkpoint row as ``ledger_rows`` returns it (its columns by name), as a
        checkpoint: a reshard reads the pending keys of the commit it names."""
        return self._checkpoint([row.get(c) for c in LEDGER_COLUMNS.split(", ")])

    def read_ledger(
        self,
        shard: int,
        bucket: int,
        counters: Sequence[Key] | None,
        with_pending: bool = True,
    ) -> Ledger:
        """A bucket's head and the checkpoints of ``counters`` (all counters when None);
        ``with_pending=False`` leaves the pending lists unparsed (a read-back of values)."""
        width = len(self.statements.layout.key)
        suffix = "" if with_pending else "_values"
        if counters is None:
            statement = self.statements.prepared(self, "ledger_scan" + suffix)
            rows = list(self.statements.execute(statement, (shard, bucket), profile=BULK_PROFILE))
            head, shards, refused = (rows[0][0], rows[0][1], rows[0][2]) if rows else (None,) * 3
            checkpoints = {
                tuple(r[3 : 3 + width]): self._checkpoint(r[3 + width :], with_pending)
                for r in rows
                if r[3] is not None
            }
            # its population is counted by the caller, who reads the compact rows too
            return Ledger(head, checkpoints, None, shards, refused)
        head_statement = self._head_statement()
        statement = self.statements.prepared(self, "ledger_read" + suffix)
        requests: list[tuple[Any, Any]] = [(head_statement, (shard, bucket))]
        requests += [
            (statement, (shard, bucket, [tuple(c) for c in group]))
            for group in bounded(counters, ROWS_PER_BATCH)
        ]
        results = self.statements.run(requests)
        head, population, shards, refused = self._head_of(results[0].one())
        asked = {normal_key(c): c for c in counters}  # the caller's key values (a date, not a Date)
        checkpoints = {
            asked.get(normal_key(r[:width]), tuple(r[:width])): self._checkpoint(
                r[width:], with_pending
            )
            for result in results[1:]
            for r in result
        }
        return Ledger(head, checkpoints, population, shards, refused)

    def population(self, shard: int, bucket: int) -> int | None:
        """A bucket's population alone: enough to choose how to read it."""
        return self._head_of(
            self.statements.execute(self._head_statement(), (shard, bucket)).one()
        )[1]

    def bucket_head(self, shard: int, bucket: int) -> Any:
        """A bucket's head alone (the id of its last commit, None if never set)."""
        return self._head_of(
            self.statements.execute(self._head_statement(), (shard, bucket)).one()
        )[0]

    def _head_statement(self) -> PreparedStatement:
        return self.statements.prepared(self, "ledger_head")

    @staticmethod
    def _head_of(row: Sequence[Any] | None) -> tuple[Any, int | None, int | None, int | None]:
        """(head, population, shards, scan_refused_ms) of a head read; None where never set."""
        return (row[0], row[1], row[2], row[3]) if row is not None else (None, None, None, None)

    def remember_scan_refused(self, shard: int, bucket: int, at_ms: int) -> None:
        """Note that the node refused a whole scan of the bucket (more tombstones than its
        ``tombstone_failure_threshold``): for ``SCAN_REFUSED_TTL_S`` the cell lives, and the
        sweeps read the bucket counter by counter without asking the node for that scan again
        (each refusal is an error in the node's log and a read of as many tombstones)."""
        statement = self.statements.prepared(self, "ledger_scan_refused")
        self.statements.execute(statement, (SCAN_REFUSED_TTL_S, at_ms, shard, bucket))

    def commit_bucket(
        self,
        shard: int,
        bucket: int,
        head: Any,
        folds: Sequence[Fold],
        commit_id: Any,
        run_id: str,
        now_micros: int,
        population: int | None = None,
    ) -> bool:
        """Commit many counters of one bucket in one conditional batch: one Paxos round,
        applied only if the bucket's head is still the one the folds were planned on (every
        commit to the bucket changes the head, so two runs can never both build on one state)
        and every counter's ledger row still holds the commit its fold was built on. The head
        and the rows are read in separate requests at a quorum, not serially: a read can meet
        a commit that is still landing on the replicas and see its head but not yet its rows,
        and only the rows' own conditions keep a fold on such a stale base out (it would set
        the counter back one commit). And only if the partition belongs to the family's shard
        count (its ``shards`` static, written by every commit): a worker whose YAML says another
        count, or a run that started before a reshard fenced the partition, commits nothing
        (``MOVING`` matches no count). All or nothing. ``population`` is the bucket's count
        once this commit applies (``core.grown_population``); None leaves it as it is."""
        from ..core import next_version

        head_cas = self.statements.prepared(self, "ledger_head_cas")
        # the checkpoint as one cell (``core.pack_state``); the keys are in the run log
        # (``write_commit_keys``), not in this Paxos mutation. The columns older versions
        # wrote are left as they are: ``state`` names the commit it belongs to
        row = self.statements.prepared(self, "ledger_state_write")
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED,
            consistency_level=consistency_of(self.family),
            serial_consistency_level=serial_consistency_of(self.family),
        )
        reset_row = self.statements.prepared(self, "ledger_state_write_origin")
        batch.add(
            bind(
                head_cas,
                (
                    commit_id,
                    UNSET_VALUE if population is None else population,
                    self.family.shards,
                    shard,
                    bucket,
                    head,
                    self.family.shards,
                ),
            )
        )
        now_ms = now_micros // 1000
        commit = commit_id.bytes
        for f in folds:
            state = pack_state(
                commit,
                f.value,
                f.epoch_ms,
                f.pending_sum,
                len(f.pending),
                f.low_ms,
                f.base.value,
                f.folded_sum,
                next_version(now_micros, f.base.version),
                now_ms,
                run_id,
                high_water(f.base, f.epoch_ms),
            )
            if f.origin_ms is None:
                params = (state, commit_id, shard, bucket, *f.counter, f.base.commit_id)
                batch.add(bind(row, params))
            else:  # a reset: the point its value counts from
                params = (
                    state,
                    commit_id,
                    f.origin_ms,
                    shard,
                    bucket,
                    *f.counter,
                    f.base.commit_id,
                )
                batch.add(bind(reset_row, params))
        return self.statements.execute(batch).was_applied

    def head_serial(self, shard: int, bucket: int) -> Any:
        """A bucket's head read at the serial level. The read is itself a Paxos round: a
        commit still in flight (accepted by some replicas when its coordinator timed out) is
        completed or superseded before it answers, and cannot apply afterwards."""
        bound = self._head_statement().bind((shard, bucket))
        bound.consistency_level = serial_consistency_of(self.family)
        return self._head_of(self.statements.execute(bound).one())[0]

    def copy_compact(
        self, commits: Sequence[tuple[Key, Checkpoint]], run_id: str, now_micros: int
    ) -> None:
        """Write the readers' copies of committed checkpoints, each with the write timestamp
        of its commit (``version``): a late copy of an older commit never overwrites a newer
        one. Unlogged batches of many partitions (one bucket's, so one token range)."""
        unique = self.family.rules.members
        statement = self.statements.prepared(self, "compact_copy")
        now_ms = now_micros // 1000
        params = []
        for counter, cp in commits:
            values = [
                cp.version,
                cp.value,
                self.keys.epoch_value(cp.epoch_ms),
                cp.commit_id,
                run_id,
                now_ms,
            ]
            if unique:
                values.append(sorted((self.keys.unpack(p) for p in cp.pending), key=repr))
            params.append((1, (*values, *counter)))
        self.statements.write_spread(statement, params, COPY_BATCH_PARTITIONS)

    def read_copies(
        self, shard: int, bucket: int, counters: Sequence[Key] | None
    ) -> dict[Key, Copy]:
        """The compact rows of ``counters`` (all of the bucket's token range when None)."""
        if counters is None:
            statement = self.statements.prepared(self, "compact_scan")
            width = len(self.statements.layout.key)
            rows = self.statements.execute(
                statement,
                bucket_bounds(self.family.shards, shard, bucket),
                profile=BULK_PROFILE,
            )
            return {tuple(r[:width]): self._copy(r[width:]) for r in rows}
        found = self.statements.rows_by_partition(self, "compact_read", counters)
        return {c: self._copy(rows[0]) for c, rows in found.items() if rows}

    def _copy(self, row: Sequence[Any]) -> Copy:
        legacy = (
            frozenset(self.keys.pack_clustering(p) for p in row[4])
            if len(row) > 4 and row[4]
            else NO_KEYS
        )
        epoch = row[1]
        epoch_ms = epoch if type(epoch) is int else self.keys.epoch_ms_of(epoch)
        return Copy(row[0] or 0, epoch_ms, row[2], row[3], legacy)

    def committed_by(self, counter: Key) -> str | None:
        """The run (or reset) id of the counter's latest commit."""
        shard, bucket = self.keys.bucket(counter)
        checkpoint = self.read_ledger(shard, bucket, [counter]).checkpoints.get(counter)
        return checkpoint.run_id if checkpoint else None

    @staticmethod
    def new_commit_id() -> Any:
        return uuid_from_time(time.time())

    def ledger_positions(self, limit: int) -> list[tuple[int, int, Key]]:
        """``(shard, bucket, counter)`` of up to ``limit`` ledger rows, the first in token order:
        where the ledger holds some counters, to check it against the shard count."""
        statement = self.statements.prepared(self, "ledger_positions")
        return [
            (r[0], r[1], tuple(r[2:]))
            for r in self.statements.execute(statement, (limit,))
            if all(v is not None for v in r[2:])  # a partition holding only its head
        ]

    def fence_bucket(self, shard: int, bucket: int) -> None:
        """Set a ledger partition's ``shards`` to ``MOVING`` under its head's compare-and-set:
        from then on no commit applies to it, whoever planned it."""
        statement = self.statements.prepared(self, "ledger_fence")
        for _attempt in range(16):
            head = self.head_serial(shard, bucket)
            if self.statements.execute(statement, (MOVING, shard, bucket, head)).was_applied:
                return
        raise EngineError(
            f"family {self.family.name!r}: ledger partition {shard}/{bucket} kept changing "
            "while a reshard fenced it; stop the family's runs (pause its DAG) and run it again"
        )

    def open_bucket(self, shard: int, bucket: int, shards: int) -> None:
        """A ledger partition of the new shard count: its ``shards`` set, a fresh head (a
        reader of the old one commits nothing), its population to be counted again."""
        statement = self.statements.prepared(self, "ledger_open")
        self.statements.execute(statement, (shards, self.new_commit_id(), shard, bucket))

    def drop_bucket(self, shard: int, bucket: int) -> None:
        """Delete a ledger partition a smaller shard count no longer has (its rows moved)."""
        statement = self.statements.prepared(self, "ledger_drop")
        self.statements.execute(statement, (shard, bucket))

    @cached_property
    def _ledger_row_columns(self) -> list[str]:
        """The ledger's columns a checkpoint's row holds (not its key, not the statics)."""
        table = schema.table_metadata(
            self.statements.session,
            self.family.keyspace,
            schema.ledger_table(self.family),
        )
        fixed = {c.name for c in (*table.partition_key, *table.clustering_key)}
        return [
            name
            for name, column in table.columns.items()
            if name not in fixed and not column.is_static
        ]

    def ledger_rows(self, shard: int, bucket: int) -> list[tuple[Key, dict[str, Any]]]:
        """Every checkpoint row of a ledger partition, its columns as stored."""
        columns = self._ledger_row_columns
        statement = self.statements.prepared(
            self, "ledger_rows", row_columns=", ".join(q(c) for c in columns)
        )
        width = len(self.statements.layout.key)
        rows = self.statements.execute(statement, (shard, bucket), profile=BULK_PROFILE)
        return [
            (tuple(r[:width]), dict(zip(columns, r[width:], strict=True)))
            for r in rows
            if r[0] is not None
        ]

    def move_ledger_row(
        self, counter: Key, row: dict[str, Any], old: tuple[int, int], new: tuple[int, int]
    ) -> None:
        """A checkpoint row at its new place and its deletion at the old one, in one logged
        batch (both or neither, eventually)."""
        columns = list(row)
        insert = self.statements.prepared(
            self,
            "ledger_row_insert",
            row_columns=", ".join(q(c) for c in columns),
            row_marks=", ".join("?" for _ in columns),
        )
        delete = self.statements.prepared(self, "ledger_row_delete")
        self.statements.move(insert, (*new, *counter, *row.values()), delete, (*old, *counter))

    def recover_origin(
        self, shard: int, bucket: int, counter: Key, commit_id: Any, at_ms: int
    ) -> bool:
        """Set a counter's reset point where its ledger row has none and is still at
        ``commit_id`` (a conditional write, so never over a run's commit or a reset's): what
        an earlier version's reset left only in its audit row. Whether it was set."""
        statement = self.statements.prepared(self, "ledger_origin_recover")
        done = self.statements.execute(statement, (at_ms, shard, bucket, *counter, commit_id))
        return bool(done.was_applied)

    def read_bases(self, counters: Sequence[Key]) -> dict[Key, ReadBase]:
        """Each counter's compact row as a reader's base (value, stored epoch, and for a unique
        family the members it already counts); an empty base where there is none."""
        unique = self.family.rules.members
        if unique:
            statement = self.statements.prepared(self, "compact_value_commit_pending")
        else:
            statement = self.statements.prepared(self, "compact_value_commit")
        out: dict[Key, ReadBase] = {}
        for counter, result in zip(
            counters, self.statements.concurrent(statement, counters), strict=True
        ):
            row = result.one()
            if row is None:
                out[counter] = EMPTY_READ_BASE
                continue
            members = frozenset(key[1] for key in (row[3] or ())) if unique else frozenset()
            out[counter] = ReadBase(row[0] or 0, row[1], members, row[2])  # (first_time, member)
        return out
