"""A reshard's moves of the rows that depend on the shard count."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Self

from ..core import (
    BUCKETS,
    Key,
    bucket_of,
    shard_of,
    write_timestamp,
)
from .auditlog import AuditLog
from .base import (
    StoreBase,
)
from .control import ControlTable
from .ledger import LedgerTable
from .records import (
    pack_commit_keys,
    unpack_commit_keys,
)

log = logging.getLogger(__name__)


class ReshardMoves(StoreBase):
    ledger: LedgerTable
    """The ledger and the readers' copies (``store.ledger``), made by ``Store``."""
    control: ControlTable
    """The control tables (``store.control``), made by ``Store``."""
    audit: AuditLog
    """The audit trail (``store.audit``), made by ``Store``."""

    # --- reshard: moving the rows that depend on the shard count --------------------------

    def with_shards(self, shards: int) -> Self:
        """This store for the same family at another shard count (a reshard's old count)."""
        family = self.family.model_copy(update={"shards": shards})
        return type(self)(self.conn, family, self._layout, self.concurrency)

    def replace_identity(self, table: str, expected: str, identity: str) -> bool:
        """Replace ``table``'s recorded identity (encoded by ``identity.encode``, as for
        ``claim_table``) if it is still ``expected`` (a lightweight transaction); whether it
        was."""
        statement = self.prepare(
            "tables_replace",
            "UPDATE {tables} SET identity = ? WHERE table_name = ? IF identity = ?",
            serial=True,
        )
        result = self.session.execute(statement, (identity, table, expected))
        return result.was_applied or identity == result.one().identity

    def copy_commit_record(
        self, row: dict[str, Any], counter: Key, old: tuple[int, int], new: tuple[int, int]
    ) -> bool:
        """Copy the counter's entry of its last commit's record of counted keys to the
        record at its new place (merged with the entries already copied there): a later fold
        reads it there. False when there is none to copy (nothing counted is pending, or the
        record expired)."""
        cp = self.ledger.row_checkpoint(row)
        if cp.commit_id is None or not cp.pending_rows or cp.pending_loaded:
            return False
        archived = self.family.archive is not None
        read = self.prepare(
            "runs_record_read" if archived else "runs_keys_read",
            "SELECT keys"
            + (", archive_rows, archived" if archived else "")
            + " FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ? AND commit_id = ?",
        )
        run_id = cp.run_id or ""
        found = self.session.execute(read, (run_id, *old, cp.commit_id)).one()
        if found is None or found[0] is None:
            return False
        encode, _decode = self._key_codec()
        wanted = encode(counter)
        entry = [e for e in unpack_commit_keys(found[0], self.key_codec) if e[0] == wanted]
        if not entry:
            return False
        there = self.session.execute(read, (run_id, *new, cp.commit_id)).one()
        entries = [
            e
            for e in (unpack_commit_keys(there[0], self.key_codec) if there and there[0] else [])
            if e[0] != wanted
        ]
        blob = pack_commit_keys([*entries, *entry], self.key_codec)
        if not archived or found[1] is None:
            write = self.prepare(
                "runs_keys",
                "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys) "
                "VALUES (?, ?, ?, ?, ?)",
            )
            self.session.execute(write, (run_id, *new, cp.commit_id, blob))
            return True
        # the counter's part of the commit's archive record goes with its keys, in their order
        from ..archive import join_records, record_part, unpack_record

        mine = tuple(wanted)
        parts = []
        if there is not None and there[1] is not None:
            parts.append(record_part(unpack_record(there[1]), lambda c: c != mine))
        parts.append(record_part(unpack_record(found[1]), lambda c: c == mine))
        write = self.prepare(
            "runs_keys_archive_moved",
            "INSERT INTO {runs} (run_id, shard, bucket, commit_id, keys, archive_rows, archived) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        self.session.execute(
            write, (run_id, *new, cp.commit_id, blob, join_records(parts), found[2])
        )
        return True

    def move_quarantine(self, before: int, shards: int) -> int:
        """Move quarantine entries to their shard under ``shards``; how many moved."""
        read = self.prepare(
            "quarantine_all",
            "SELECT {key}, reason, detail, run_id, at FROM {quarantine} WHERE shard = ?",
        )
        insert = self.prepare(
            "quarantine_move",
            "INSERT INTO {quarantine} (shard, {key}, reason, detail, run_id, at) "
            "VALUES (?, {key_marks}, ?, ?, ?, ?)",
        )
        delete = self.prepare(
            "quarantine_release", "DELETE FROM {quarantine} WHERE shard = ? AND {key_where}"
        )
        width = len(self.layout.key)
        moved = 0
        for shard in range(before):
            for r in list(self.session.execute(read, (shard,))):
                counter = tuple(r[:width])
                to = shard_of(self.token(counter), shards)
                if to == shard:
                    continue
                self._move(insert, (to, *counter, *r[width:]), delete, (shard, *counter))
                moved += 1
        return moved

    def move_marks(self, before: int, shards: int) -> int:
        """Move the touched index's marks to their partition under ``shards``, each with its
        server write time (the forget horizon compares it); how many moved."""
        read = self.prepare(
            "index_all",
            "SELECT {key}, minutes, writetime(touched) FROM {index} WHERE shard = ? AND slot = ?",
        )
        insert = self.prepare(
            "index_move",
            "UPDATE {index} USING TIMESTAMP ? SET touched = true, minutes = minutes + ? "
            "WHERE shard = ? AND slot = ? AND {key_where}",
        )
        delete = self.prepare(
            "index_delete", "DELETE FROM {index} WHERE shard = ? AND slot = ? AND {key_where}"
        )
        width = len(self.layout.key)
        moved = 0
        for shard in range(before):
            for slot in range(BUCKETS):
                for r in list(self.session.execute(read, (shard, slot))):
                    counter = tuple(r[:width])
                    to = bucket_of(self.token(counter), shards)
                    if to == (shard, slot):
                        continue
                    minutes, written = r[width] or set(), r[width + 1]
                    self._move(
                        insert, (written, minutes, *to, *counter), delete, (shard, slot, *counter)
                    )
                    moved += 1
        return moved

    def record_shards(self, shards: int) -> None:
        """The family state's shard count after a reshard."""
        statement = self.prepare("state_shards", "UPDATE {state} SET shards = ? WHERE family = ?")
        self.session.execute(statement, (shards, self.family.name))

    def family_epoch(self) -> datetime | None:
        return self.control.family_state().epoch

    def advance_family_epoch(
        self,
        epoch: datetime,
        run_id: str,
        swept_at: datetime | None = None,
        sweep_size: int | None = None,
    ) -> None:
        """Record the family's compacted epoch; the write timestamp is the epoch itself, so the
        newest epoch wins whatever order overlapping runs finish in. A sweep run also records
        when it started and how much it read."""
        statement = self.prepare(
            "state_write",
            "UPDATE {state} USING TIMESTAMP ? SET epoch = ?, run_id = ?, shards = ?, "
            "updated_at = toTimestamp(now()) WHERE family = ?",
        )
        self.session.execute(
            statement,
            (write_timestamp(epoch), epoch, run_id, self.family.shards, self.family.name),
        )
        if swept_at is not None:
            sweep = self.prepare(
                "state_sweep",
                "UPDATE {state} SET last_sweep = ?, last_sweep_size = ? WHERE family = ?",
            )
            self.session.execute(sweep, (swept_at, sweep_size, self.family.name))

    def write_audit(self, record: dict[str, Any]) -> None:
        """One audit row, stamped with ``provenance`` (who started the change)."""
        self.audit.write(record)

    def read_audit(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` audit rows, across month partitions."""
        return self.audit.page(limit)
