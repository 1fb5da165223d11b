"""Small helpers shared by engine tests."""

from __future__ import annotations

from datetime import datetime

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
