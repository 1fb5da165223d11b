"""The control tables, one class each: quarantine, leases, the family's state and the tables'
owners."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cassandra import InvalidRequest

from ..connection import BULK_PROFILE, Connection
from ..core import (
    Key,
    quarantine_shards,
    write_timestamp,
)
from .keys import Keys
from .records import (
    FamilyState,
    KnownFamily,
    Quarantined,
    TableOwner,
)
from .statements import Cql, Statements, declare

log = logging.getLogger(__name__)


class StateTable:
    """The family state table (``{state}``): the compacted epoch, the last sweep, the shard
    count and a retirement. ``Store`` makes one as ``store.state``."""

    STATEMENTS = declare(
        state_read=Cql(
            "SELECT epoch, last_sweep, shards, last_sweep_size FROM {state} WHERE family = ?"
        ),
        state_write=Cql(
            "UPDATE {state} USING TIMESTAMP ? SET epoch = ?, run_id = ?, shards = ?, updated_at = "
            "toTimestamp(now()) WHERE family = ?"
        ),
        state_shards=Cql("UPDATE {state} SET shards = ? WHERE family = ?"),
        state_retire=Cql("UPDATE {state} SET retired_at = ?, retired_by = ? WHERE family = ?"),
        state_sweep=Cql("UPDATE {state} SET last_sweep = ?, last_sweep_size = ? WHERE family = ?"),
    )

    def __init__(self, statements: Statements):
        self.statements = statements
        self.family = statements.family

    def family_state(self) -> FamilyState:
        """The family's compacted epoch, when its last sweep (a full scan) started, and the
        shard count its ledger was written with."""
        statement = self.statements.prepared(self, "state_read")
        row = self.statements.execute(statement, (self.family.name,)).one()
        return FamilyState(*row) if row else FamilyState(None, None, None)

    def family_epoch(self) -> datetime | None:
        return self.family_state().epoch

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
        statement = self.statements.prepared(self, "state_write")
        self.statements.execute(
            statement,
            (
                write_timestamp(epoch),
                epoch,
                run_id,
                self.family.shards,
                self.family.name,
            ),
        )
        if swept_at is not None:
            sweep = self.statements.prepared(self, "state_sweep")
            self.statements.execute(sweep, (swept_at, sweep_size, self.family.name))

    def record_shards(self, shards: int) -> None:
        """The family state's shard count after a reshard."""
        statement = self.statements.prepared(self, "state_shards")
        self.statements.execute(statement, (shards, self.family.name))

    def retire(self, by: str | None) -> None:
        """Record the family as retired (``by``: who), or no longer retired (None): a retired
        family absent from the YAML is not alerted on by the freshness check."""
        statement = self.statements.prepared(self, "state_retire")
        at = None if by is None else datetime.now(UTC)
        self.statements.execute(statement, (at, by, self.family.name))


class OwnersTable:
    """The tables' owners table (``{tables}``): which family owns each table, with its
    identity, and the run whose family checks passed on this store. ``Store`` makes one as
    ``store.owners``."""

    STATEMENTS = declare(
        tables_read=Cql(
            "SELECT table_name, family, identity, recorded_at, recorded_by FROM {tables} WHERE "
            "table_name IN ?"
        ),
        tables_claim=Cql(
            "INSERT INTO {tables} (table_name, family, identity, recorded_at, recorded_by) VALUES "
            "(?, ?, ?, toTimestamp(now()), ?) IF NOT EXISTS",
            serial=True,
        ),
        tables_replace=Cql(
            "UPDATE {tables} SET identity = ? WHERE table_name = ? IF identity = ?", serial=True
        ),
    )

    def __init__(self, statements: Statements):
        self.statements = statements
        self.family = statements.family
        self.checked_run: tuple[str, bool] | None = None
        """The run whose family checks passed on this store, and whether they cover a step
        that may record the identity (``identity.check_family(once_per_run=True)``)."""

    def table_owners(self) -> dict[str, TableOwner]:
        """The recorded owner of each of the family's tables (``schema.TABLES_TABLE``)."""
        statement = self.statements.prepared(self, "tables_read")
        rows = self.statements.execute(statement, (list(self.family.tables),))
        return {r[0]: TableOwner(*r[1:]) for r in rows}

    def claim_table(self, table: str, identity: str, run_id: str) -> TableOwner | None:
        """Record the family as ``table``'s owner with its identity, unless an owner is recorded
        (a lightweight transaction: of two first commits, one records). None when this call
        recorded it, else the owner that is recorded."""
        statement = self.statements.prepared(self, "tables_claim")
        result = self.statements.execute(statement, (table, self.family.name, identity, run_id))
        if result.was_applied:
            return None
        row = result.one()
        return TableOwner(row.family, row.identity, row.recorded_at, row.recorded_by)

    def replace_identity(self, table: str, expected: str, identity: str) -> bool:
        """Replace ``table``'s recorded identity (encoded by ``identity.encode``, as for
        ``claim_table``) if it is still ``expected`` (a lightweight transaction); whether it
        was."""
        statement = self.statements.prepared(self, "tables_replace")
        result = self.statements.execute(statement, (identity, table, expected))
        return result.was_applied or identity == result.one().identity


class LeaseTable:
    """The lease table (``{lease}``): which run holds each shard of the family. ``Store``
    makes one as ``store.lease``."""

    STATEMENTS = declare(
        lease_take=Cql(
            "UPDATE {lease} USING TTL ? SET owner = ?, acquired_at = toTimestamp(now()) WHERE "
            "family = ? AND shard = ? IF owner = null",
            serial=True,
        ),
        lease_keep=Cql(
            "UPDATE {lease} USING TTL ? SET owner = ? WHERE family = ? AND shard = ? IF owner = ?",
            serial=True,
        ),
        lease_release=Cql(
            "DELETE FROM {lease} WHERE family = ? AND shard = ? IF owner = ?", serial=True
        ),
    )

    def __init__(self, statements: Statements):
        self.statements = statements
        self.family = statements.family

    def acquire_lease(self, shard: int, owner: str, ttl_s: int) -> str | None:
        """Take the shard's lease (or keep it, for a retry of the same run).

        Returns None on success, else the current holder."""
        take = self.statements.prepared(self, "lease_take")
        keep = self.statements.prepared(self, "lease_keep")
        result = self.statements.execute(take, (ttl_s, owner, self.family.name, shard))
        if result.was_applied:
            return None
        holder = result.one().owner
        if holder == owner:
            again = self.statements.execute(keep, (ttl_s, owner, self.family.name, shard, owner))
            if again.was_applied:
                return None
            holder = again.one().owner
        return holder or "(unknown)"

    def renew_lease(self, shard: int, owner: str, ttl_s: int) -> bool:
        keep = self.statements.prepared(self, "lease_keep")
        return self.statements.execute(
            keep, (ttl_s, owner, self.family.name, shard, owner)
        ).was_applied

    def release_lease(self, shard: int, owner: str) -> None:
        statement = self.statements.prepared(self, "lease_release")
        self.statements.execute(statement, (self.family.name, shard, owner))


class QuarantineTable:
    """The quarantine table (``{quarantine}``): counters kept out of every run until an
    operator releases them, and a reshard's moves of their entries. ``Store`` makes one as
    ``store.quarantine``; it reads the family's state and owners for the shard counts an entry
    may be numbered by."""

    STATEMENTS = declare(
        quarantine_put=Cql(
            "INSERT INTO {quarantine} (shard, {key}, reason, detail, run_id, at) VALUES (?, "
            "{key_marks}, ?, ?, ?, toTimestamp(now()))"
        ),
        quarantine_read=Cql(
            "SELECT {key}, reason, run_id, detail FROM {quarantine} WHERE shard = ?"
        ),
        quarantine_count=Cql("SELECT COUNT(*) FROM {quarantine} WHERE shard = ?"),
        quarantine_release=Cql("DELETE FROM {quarantine} WHERE shard = ? AND {key_where}"),
        quarantine_any=Cql("SELECT shard FROM {quarantine} LIMIT 1"),
        quarantine_sample=Cql("SELECT {key}, reason, run_id, detail FROM {quarantine} LIMIT ?"),
        quarantine_one=Cql(
            "SELECT reason, run_id, detail FROM {quarantine} WHERE shard = ? AND {key_where}"
        ),
        quarantine_all=Cql(
            "SELECT {key}, reason, detail, run_id, at FROM {quarantine} WHERE shard = ?"
        ),
        quarantine_move=Cql(
            "INSERT INTO {quarantine} (shard, {key}, reason, detail, run_id, at) VALUES (?, "
            "{key_marks}, ?, ?, ?, ?)"
        ),
    )

    def __init__(self, statements: Statements, keys: Keys, state: StateTable, owners: OwnersTable):
        self.statements = statements
        self.family = statements.family
        self.keys = keys
        self.state = state
        self.owners = owners

    def add(self, run_id: str, entries: Sequence[tuple[Key, str, str]]) -> None:
        """Keep counters out of every run (no fold, no delete) until an operator releases
        them: ``(counter, reason, detail)``."""
        statement = self.statements.prepared(self, "quarantine_put")
        self.statements.concurrent(
            statement,
            [
                (self.keys.bucket(c)[0], *c, reason, detail[:2000], run_id)
                for c, reason, detail in entries
            ],
        )

    def read_quarantine(self, shard: int) -> dict[Key, Quarantined]:
        statement = self.statements.prepared(self, "quarantine_read")
        width = len(self.statements.layout.key)
        return {
            tuple(r[:width]): Quarantined(tuple(r[:width]), *r[width:])
            for r in self.statements.execute(statement, (shard,), profile=BULK_PROFILE)
        }

    def shard_counts(self) -> set[int]:
        """Every shard count the family's entries may be numbered by: the YAML's, the one its
        state and tables record, and both ends of a reshard under way."""
        counts = {self.family.shards}
        recorded = self.state.family_state().shards
        if recorded:
            counts.add(recorded)
        for owner in self.owners.table_owners().values():
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
        statement = self.statements.prepared(self, "quarantine_count")
        total = 0
        for shard in range(self.family.shards):
            total += int(self.statements.execute(statement, (shard,)).one()[0])
        return total

    def release(self, counter: Key) -> None:
        statement = self.statements.prepared(self, "quarantine_release")
        self.statements.execute(statement, (self.keys.bucket(counter)[0], *counter))

    def anything_quarantined(self) -> bool:
        """Whether any counter is quarantined (a quarantined one keeps every run alerting)."""
        statement = self.statements.prepared(self, "quarantine_any")
        return self.statements.execute(statement).one() is not None

    def read_quarantine_sample(self, limit: int) -> list[Quarantined]:
        """Up to ``limit`` quarantined counters of the whole family in one bounded read (the
        table is small; a count beyond ``limit`` is not needed to see that something is)."""
        statement = self.statements.prepared(self, "quarantine_sample")
        width = len(self.statements.layout.key)
        return [
            Quarantined(tuple(r[:width]), *r[width:])
            for r in self.statements.execute(statement, (limit,), profile=BULK_PROFILE)
        ]

    def quarantined_entry(self, counter: Key) -> Quarantined | None:
        """The counter's quarantine entry, if it is quarantined (one point read)."""
        statement = self.statements.prepared(self, "quarantine_one")
        row = self.statements.execute(
            statement, (self.keys.bucket(counter)[0], *counter), profile=BULK_PROFILE
        ).one()
        return Quarantined(counter, *row) if row else None

    def quarantine_entries(self, shard: int) -> list[tuple[Key, tuple[Any, ...]]]:
        """A shard's quarantine entries as stored: ``(counter, (reason, detail, run_id, at))``
        (what a reshard moves)."""
        statement = self.statements.prepared(self, "quarantine_all")
        width = len(self.statements.layout.key)
        return [
            (tuple(r[:width]), tuple(r[width:]))
            for r in self.statements.execute(statement, (shard,))
        ]

    def move_quarantine_entry(
        self, counter: Key, entry: tuple[Any, ...], old: int, new: int
    ) -> None:
        """A quarantine entry (as ``quarantine_entries`` read it) moved from shard ``old`` to
        shard ``new``, in one logged batch."""
        insert = self.statements.prepared(self, "quarantine_move")
        delete = self.statements.prepared(self, "quarantine_release")
        self.statements.move(insert, (new, *counter, *entry), delete, (old, *counter))


def known_families(conn: Connection, keyspace: str) -> list[KnownFamily]:
    """Every family the cluster knows in ``keyspace``: the names in its family state table
    (with the compacted epoch and any retirement) and in its tables' owners table. Two small
    whole-table reads (a row per family, a row per table); ``SELECT *``, so a state table
    from before retirements were kept is read too. None of the keyspace's tables: none."""
    from ..schema import STATE_TABLE, TABLES_TABLE, q

    session = conn.session
    found: dict[str, KnownFamily] = {}
    try:
        state = session.execute(f"SELECT * FROM {q(keyspace)}.{STATE_TABLE}")
    except InvalidRequest:  # the keyspace or its table does not exist (yet)
        return []
    columns = list(state.column_names or ())
    for row in state:
        values = dict(zip(columns, row, strict=True))
        name = values["family"]
        found[name] = KnownFamily(
            name, keyspace, values.get("epoch"), values.get("retired_at"), values.get("retired_by")
        )
    try:
        owners = session.execute(f"SELECT family FROM {q(keyspace)}.{TABLES_TABLE}")
    except InvalidRequest:
        owners = []
    for (name,) in owners:
        if name and name not in found:
            found[name] = KnownFamily(name, keyspace, None)
    return sorted(found.values())
