"""The ledger: checkpoints committed a bucket at a time, and the copies."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    PreparedStatement,
)
from cassandra.util import uuid_from_time

from .. import schema
from ..config import Kind
from ..connection import BULK_PROFILE
from ..core import (
    Checkpoint,
    Fold,
    Key,
    Packed,
    bucket_bounds,
    chunks,
    pack_state,
    state_commit,
    unpack_state,
)

if TYPE_CHECKING:
    pass

from .base import (
    COPY_BATCH_PARTITIONS,
    ROWS_PER_BATCH,
    StoreBase,
    bind,
    consistency_of,
    normal_key,
    serial_consistency_of,
)
from .records import (
    NO_KEYS,
    Copy,
    Ledger,
)

log = logging.getLogger(__name__)


class LedgerRows(StoreBase):
    # --- the ledger: checkpoints committed a bucket at a time -----------------------------

    _LEDGER_COLUMNS = (
        "commit_id, state, value, epoch_ms, run_id, pending, pending_sum, version, pending_rows, "
        "pending_low_ms, origin_ms"
    )
    _LEDGER_VALUES = (
        "commit_id, state, value, epoch_ms, run_id, (text)null, pending_sum, version, "
        "pending_rows, pending_low_ms, origin_ms"
    )
    """The read-back of committed values, without a legacy ``pending`` list."""

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

    def read_ledger(
        self,
        shard: int,
        bucket: int,
        counters: Sequence[Key] | None,
        with_pending: bool = True,
    ) -> Ledger:
        """A bucket's head and the checkpoints of ``counters`` (all counters when None);
        ``with_pending=False`` leaves the pending lists unparsed (a read-back of values)."""
        width = len(self.layout.key)
        columns = self._LEDGER_COLUMNS if with_pending else self._LEDGER_VALUES
        suffix = "" if with_pending else "_values"
        if counters is None:
            statement = self.prepare(
                "ledger_scan" + suffix,
                f"SELECT head, shards, {{key}}, {columns} FROM {{ledger}} "
                "WHERE shard = ? AND bucket = ?",
            )
            self.requests[self.phase] += 1
            rows = list(
                self.session.execute(statement, (shard, bucket), execution_profile=BULK_PROFILE)
            )
            head, shards = (rows[0][0], rows[0][1]) if rows else (None, None)
            checkpoints = {
                tuple(r[2 : 2 + width]): self._checkpoint(r[2 + width :], with_pending)
                for r in rows
                if r[2] is not None
            }
            # its population is counted by the caller, who reads the compact rows too
            return Ledger(head, checkpoints, None, shards)
        head_statement = self._head_statement()
        statement = self.prepare(
            "ledger_read" + suffix,
            f"SELECT {{key}}, {columns} FROM {{ledger}} "
            "WHERE shard = ? AND bucket = ? AND ({key}) IN ?",
        )
        requests: list[tuple[Any, Any]] = [(head_statement, (shard, bucket))]
        requests += [
            (statement, (shard, bucket, [tuple(c) for c in group]))
            for group in chunks(list(counters), ROWS_PER_BATCH)
        ]
        results = self._run(requests)
        head, population, shards = self._head_of(results[0].one())
        asked = {normal_key(c): c for c in counters}  # the caller's key values (a date, not a Date)
        checkpoints = {
            asked.get(normal_key(r[:width]), tuple(r[:width])): self._checkpoint(
                r[width:], with_pending
            )
            for result in results[1:]
            for r in result
        }
        return Ledger(head, checkpoints, population, shards)

    def population(self, shard: int, bucket: int) -> int | None:
        """A bucket's population alone: enough to choose how to read it."""
        self.requests[self.phase] += 1
        return self._head_of(self.session.execute(self._head_statement(), (shard, bucket)).one())[1]

    def bucket_head(self, shard: int, bucket: int) -> Any:
        """A bucket's head alone (the id of its last commit, None if never set)."""
        self.requests[self.phase] += 1
        return self._head_of(self.session.execute(self._head_statement(), (shard, bucket)).one())[0]

    def _head_statement(self) -> PreparedStatement:
        return self.prepare(
            "ledger_head",
            "SELECT head, population, shards FROM {ledger} WHERE shard = ? AND bucket = ? LIMIT 1",
        )

    @staticmethod
    def _head_of(row: Sequence[Any] | None) -> tuple[Any, int | None, int | None]:
        """(head, population, shards) of a head read; None where never set."""
        return (row[0], row[1], row[2]) if row is not None else (None, None, None)

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

        head_cas = self.prepare(
            "ledger_head_cas",
            "UPDATE {ledger} SET head = ?, population = ?, shards = ? "
            "WHERE shard = ? AND bucket = ? IF head = ? AND shards IN (?, null)",
            serial=True,
        )
        # the checkpoint as one cell (``core.pack_state``); the keys are in the run log
        # (``write_commit_keys``), not in this Paxos mutation. The columns older versions
        # wrote are left as they are: ``state`` names the commit it belongs to
        row = self.prepare(
            "ledger_state_write",
            "UPDATE {ledger} SET state = ?, commit_id = ? "
            "WHERE shard = ? AND bucket = ? AND {key_where} IF commit_id = ?",
            serial=True,
        )
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED,
            consistency_level=consistency_of(self.family),
            serial_consistency_level=serial_consistency_of(self.family),
        )
        reset_row = self.prepare(
            "ledger_state_write_origin",
            "UPDATE {ledger} SET state = ?, commit_id = ?, origin_ms = ? "
            "WHERE shard = ? AND bucket = ? AND {key_where} IF commit_id = ?",
            serial=True,
        )
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
        self.requests[self.phase] += 1
        return self.session.execute(batch).was_applied

    def head_serial(self, shard: int, bucket: int) -> Any:
        """A bucket's head read at the serial level. The read is itself a Paxos round: a
        commit still in flight (accepted by some replicas when its coordinator timed out) is
        completed or superseded before it answers, and cannot apply afterwards."""
        bound = self._head_statement().bind((shard, bucket))
        bound.consistency_level = serial_consistency_of(self.family)
        self.requests[self.phase] += 1
        return self._head_of(self.session.execute(bound).one())[0]

    def copy_compact(
        self, commits: Sequence[tuple[Key, Checkpoint]], run_id: str, now_micros: int
    ) -> None:
        """Write the readers' copies of committed checkpoints, each with the write timestamp
        of its commit (``version``): a late copy of an older commit never overwrites a newer
        one. Unlogged batches of many partitions (one bucket's, so one token range)."""
        unique = self.family.kind is Kind.UNIQUE
        pending = ", pending = ?" if unique else ""
        statement = self.prepare(
            "compact_copy",
            "UPDATE {compact} USING TIMESTAMP ? SET {value} = ?, {epoch} = ?, commit_id = ?, "
            f"run_id = ?, updated_at = ?{pending} WHERE {{key_where}}",
        )
        now_ms = now_micros // 1000
        params = []
        for counter, cp in commits:
            values = [
                cp.version,
                cp.value,
                self.epoch_value(cp.epoch_ms),
                cp.commit_id,
                run_id,
                now_ms,
            ]
            if unique:
                values.append(sorted((self._unpack(p) for p in cp.pending), key=repr))
            params.append((1, (*values, *counter)))
        self._write_spread(statement, params, COPY_BATCH_PARTITIONS)

    def read_copies(
        self, shard: int, bucket: int, counters: Sequence[Key] | None
    ) -> dict[Key, Copy]:
        """The compact rows of ``counters`` (all of the bucket's token range when None)."""
        pending = ", pending" if not self.family.folds_by_slice else ""
        epoch = (  # a timestamp as epoch ms from the server: no datetime built and taken apart
            "toUnixTimestamp({epoch})"
            if schema.epoch_type(self.family, self.layout) == "timestamp"
            else "{epoch}"
        )
        columns = f"{{value}}, {epoch}, commit_id, writetime({{value}}){pending}"
        if counters is None:
            statement = self.prepare(
                "compact_scan",
                f"SELECT {{key}}, {columns} FROM {{compact}} "
                "WHERE {token} > ? AND {token} <= ?",
            )
            self.requests[self.phase] += 1
            width = len(self.layout.key)
            rows = self.session.execute(
                statement,
                bucket_bounds(self.family.shards, shard, bucket),
                execution_profile=BULK_PROFILE,
            )
            return {tuple(r[:width]): self._copy(r[width:]) for r in rows}
        found = self._rows_by_partition("compact_read", columns, "{compact}", counters)
        return {c: self._copy(rows[0]) for c, rows in found.items() if rows}

    def _copy(self, row: Sequence[Any]) -> Copy:
        legacy = (
            frozenset(self.pack_clustering(p) for p in row[4])
            if len(row) > 4 and row[4]
            else NO_KEYS
        )
        epoch = row[1]
        epoch_ms = epoch if type(epoch) is int else self.epoch_ms_of(epoch)
        return Copy(row[0] or 0, epoch_ms, row[2], row[3], legacy)

    def committed_by(self, counter: Key) -> str | None:
        """The run (or reset) id of the counter's latest commit."""
        shard, bucket = self.bucket(counter)
        checkpoint = self.read_ledger(shard, bucket, [counter]).checkpoints.get(counter)
        return checkpoint.run_id if checkpoint else None

    @staticmethod
    def new_commit_id() -> Any:
        return uuid_from_time(time.time())

    def ledger_positions(self, limit: int) -> list[tuple[int, int, Key]]:
        """``(shard, bucket, counter)`` of up to ``limit`` ledger rows, the first in token order:
        where the ledger holds some counters, to check it against the shard count."""
        statement = self.prepare(
            "ledger_positions", "SELECT shard, bucket, {key} FROM {ledger} LIMIT ?"
        )
        self.requests[self.phase] += 1
        return [
            (r[0], r[1], tuple(r[2:]))
            for r in self.session.execute(statement, (limit,))
            if all(v is not None for v in r[2:])  # a partition holding only its head
        ]
