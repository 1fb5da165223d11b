"""Small helpers shared by engine tests."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from cassandra.query import ValueSequence
from counters.core import LEDGER_STATE, STATE_FIELDS
from counters.schema import TABLES_TABLE
from counters.store import Store


def raw_rows(store: Store, counter: tuple) -> list[tuple]:
    f = store.family
    cols = f.columns
    rows = store.session.execute(
        f'SELECT "{cols.time}", "{cols.increment}" FROM {f.keyspace}.{f.raw_table} '
        f'WHERE "{cols.key[0]}" = %s',
        (counter[0],),
    )
    return [tuple(r) for r in rows]


def rows_at_or_below(store: Store, counter: tuple, epoch: datetime) -> int:
    return sum(1 for t, _ in raw_rows(store, counter) if t <= epoch)


def compact_row(store: Store, counter: tuple):
    f = store.family
    return store.session.execute(
        f'SELECT * FROM {f.keyspace}.{f.compact_table} WHERE "{f.columns.key[0]}" = %s',
        (counter[0],),
    ).one()


def ledger_as_older_versions_wrote_it(
    store: Store, with_low: bool = True, stale_state: bool = False
) -> int:
    """Rewrite every ledger row as a version before the ``state`` cell committed it: the
    checkpoint in separate columns (``pending_low_ms`` only ``with_low``), and no ``state``
    cell, or (``stale_state``) one left by another commit, with a value 1,000,000 off, as a
    row has after an older version committed over a newer one's. Returns the rows rewritten."""
    from counters.schema import ledger_table

    f = store.family
    table = f'{f.keyspace}."{ledger_table(f)}"'
    keys = [c.name for c in store.layout.key]
    key_list = ", ".join(f'"{k}"' for k in keys)
    key_where = " AND ".join(f'"{k}" = %s' for k in keys)
    rows = list(store.session.execute(f"SELECT shard, bucket, {key_list}, state FROM {table}"))
    for row in rows:
        state = row[-1]
        if state is None:
            continue
        cp = state_fields(state)
        store.session.execute(
            f"UPDATE {table} SET value = %s, epoch_ms = %s, run_id = %s, pending = '', "
            "pending_sum = %s, pending_rows = %s, pending_low_ms = %s, base_value = %s, "
            "folded_sum = %s, version = %s, updated_at = %s, state = %s "
            f"WHERE shard = %s AND bucket = %s AND {key_where}",
            (
                cp["value"],
                cp["epoch_ms"],
                cp["run_id"],
                cp["pending_sum"],
                cp["pending_rows"],
                cp["low_ms"] if cp["flags"] & 1 and with_low else None,
                cp["base_value"],
                cp["folded_sum"],
                cp["version"],
                cp["updated_ms"],
                state_with(state, commit=uuid.uuid1().bytes, value=cp["value"] + 1_000_000)
                if stale_state
                else None,
                row[0],
                row[1],
                *row[2:-1],
            ),
        )
    return len(rows)


def state_fields(state: bytes) -> dict[str, Any]:
    """A ledger ``state`` cell's fields by name (``core.STATE_FIELDS``), and its ``run_id``."""
    fields = dict(zip(STATE_FIELDS, LEDGER_STATE.unpack_from(state), strict=True))
    return {**fields, "run_id": state[LEDGER_STATE.size :].decode()}


def state_with(state: bytes, **changes: Any) -> bytes:
    """A ledger ``state`` cell with some fields changed, as a hand edit would leave it."""
    fields = state_fields(state) | changes
    run_id = fields.pop("run_id")
    return LEDGER_STATE.pack(*fields.values()) + run_id.encode()


def forget_table_owners(store: Store) -> None:
    """Forget which family owns the family's tables, as if they were new: tests that give
    many short-lived families one set of tables (a new set each would exhaust the node's
    heap)."""
    f = store.family
    store.session.execute(
        f"DELETE FROM {f.keyspace}.{TABLES_TABLE} WHERE table_name IN %s",
        (ValueSequence(f.tables),),
    )
