"""Control state: quarantine, leases, the family's state and its audit."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from ..connection import BULK_PROFILE
from ..core import (
    Key,
    quarantine_shards,
)

if TYPE_CHECKING:
    from .auditlog import AuditLog

from .base import (
    StoreBase,
)
from .records import (
    FamilyState,
    Quarantined,
    TableOwner,
)

log = logging.getLogger(__name__)


class ControlState(StoreBase):
    # --- quarantine -----------------------------------------------------------------------

    def quarantine(self, run_id: str, entries: Sequence[tuple[Key, str, str]]) -> None:
        """Keep counters out of every run (no fold, no delete) until an operator releases
        them: ``(counter, reason, detail)``."""
        statement = self.prepare(
            "quarantine_put",
            "INSERT INTO {quarantine} (shard, {key}, reason, detail, run_id, at) "
            "VALUES (?, {key_marks}, ?, ?, ?, toTimestamp(now()))",
        )
        self._concurrent(
            statement,
            [
                (self.bucket(c)[0], *c, reason, detail[:2000], run_id)
                for c, reason, detail in entries
            ],
        )

    def read_quarantine(self, shard: int) -> dict[Key, Quarantined]:
        statement = self.prepare(
            "quarantine_read",
            "SELECT {key}, reason, run_id, detail FROM {quarantine} WHERE shard = ?",
        )
        width = len(self.layout.key)
        self.requests[self.phase] += 1
        return {
            tuple(r[:width]): Quarantined(tuple(r[:width]), *r[width:])
            for r in self.session.execute(statement, (shard,), execution_profile=BULK_PROFILE)
        }

    def shard_counts(self) -> set[int]:
        """Every shard count the family's entries may be numbered by: the YAML's, the one its
        state and tables record, and both ends of a reshard under way."""
        counts = {self.family.shards}
        recorded = self.family_state().shards
        if recorded:
            counts.add(recorded)
        for owner in self.table_owners().values():
            identity = json.loads(owner.identity or "{}")
            moving = identity.get("resharding") or {}
            counts.update(
                int(n) for n in (identity.get("shards"), moving.get("from"), moving.get("to")) if n
            )
        return counts

    def read_quarantine_anywhere(self, shard: int) -> dict[Key, Quarantined]:
        """The quarantine entries of every partition that can hold one of a counter the run
        knew in ``shard`` (``core.quarantine_shards``), whatever the shard count is now: a
        cleanup keeps the rows of a counter quarantined before a reshard moved its entry."""
        found: dict[Key, Quarantined] = {}
        for place in quarantine_shards(shard, self.shard_counts()):
            found.update(self.read_quarantine(place))
        return found

    def count_quarantined(self) -> int:
        """How many counters are quarantined now: one count per shard partition (the
        quarantine metric is a gauge of this, so a counter that stays quarantined counts once)."""
        statement = self.prepare(
            "quarantine_count", "SELECT COUNT(*) FROM {quarantine} WHERE shard = ?"
        )
        total = 0
        for shard in range(self.family.shards):
            self.requests[self.phase] += 1
            total += int(self.session.execute(statement, (shard,)).one()[0])
        return total

    def release(self, counter: Key) -> None:
        statement = self.prepare(
            "quarantine_release", "DELETE FROM {quarantine} WHERE shard = ? AND {key_where}"
        )
        self.session.execute(statement, (self.bucket(counter)[0], *counter))

    # --- lease ----------------------------------------------------------------------------

    def acquire_lease(self, shard: int, owner: str, ttl_s: int) -> str | None:
        """Take the shard's lease (or keep it, for a retry of the same run).

        Returns None on success, else the current holder."""
        take = self.prepare(
            "lease_take",
            "UPDATE {lease} USING TTL ? SET owner = ?, acquired_at = toTimestamp(now()) "
            "WHERE family = ? AND shard = ? IF owner = null",
            serial=True,
        )
        keep = self.prepare(
            "lease_keep",
            "UPDATE {lease} USING TTL ? SET owner = ? WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        )
        result = self.session.execute(take, (ttl_s, owner, self.family.name, shard))
        if result.was_applied:
            return None
        holder = result.one().owner
        if holder == owner:
            again = self.session.execute(keep, (ttl_s, owner, self.family.name, shard, owner))
            if again.was_applied:
                return None
            holder = again.one().owner
        return holder or "(unknown)"

    def renew_lease(self, shard: int, owner: str, ttl_s: int) -> bool:
        keep = self.prepare(
            "lease_keep",
            "UPDATE {lease} USING TTL ? SET owner = ? WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        )
        return self.session.execute(
            keep, (ttl_s, owner, self.family.name, shard, owner)
        ).was_applied

    def release_lease(self, shard: int, owner: str) -> None:
        statement = self.prepare(
            "lease_release",
            "DELETE FROM {lease} WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        )
        self.session.execute(statement, (self.family.name, shard, owner))

    # --- family state and audit -----------------------------------------------------------

    def family_state(self) -> FamilyState:
        """The family's compacted epoch, when its last sweep (a full scan) started, and the
        shard count its ledger was written with."""
        statement = self.prepare(
            "state_read",
            "SELECT epoch, last_sweep, shards, last_sweep_size FROM {state} WHERE family = ?",
        )
        row = self.session.execute(statement, (self.family.name,)).one()
        return FamilyState(*row) if row else FamilyState(None, None, None)

    def table_owners(self) -> dict[str, TableOwner]:
        """The recorded owner of each of the family's tables (``schema.TABLES_TABLE``)."""
        statement = self.prepare(
            "tables_read",
            "SELECT table_name, family, identity, recorded_at, recorded_by FROM {tables} "
            "WHERE table_name IN ?",
        )
        self.requests[self.phase] += 1
        rows = self.session.execute(statement, (list(self.family.tables),))
        return {r[0]: TableOwner(*r[1:]) for r in rows}

    def claim_table(self, table: str, identity: str, run_id: str) -> TableOwner | None:
        """Record the family as ``table``'s owner with its identity, unless an owner is recorded
        (a lightweight transaction: of two first commits, one records). None when this call
        recorded it, else the owner that is recorded."""
        statement = self.prepare(
            "tables_claim",
            "INSERT INTO {tables} (table_name, family, identity, recorded_at, recorded_by) "
            "VALUES (?, ?, ?, toTimestamp(now()), ?) IF NOT EXISTS",
            serial=True,
        )
        self.requests[self.phase] += 1
        result = self.session.execute(statement, (table, self.family.name, identity, run_id))
        if result.was_applied:
            return None
        row = result.one()
        return TableOwner(row.family, row.identity, row.recorded_at, row.recorded_by)

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

    @cached_property
    def audit_log(self) -> AuditLog:
        """The family's audit trail (month partitions; ``auditlog``)."""
        from .auditlog import AuditLog

        return AuditLog(self)
