"""Changing a readers' copy the way a writer outside the engine would, in tests that check the
engine notices."""

from __future__ import annotations

import time
from typing import Any


def after_copy(session: Any, table: str, counter: str, column: str = "type") -> int:
    """A write timestamp (µs) strictly after every write of ``counter``'s row in ``table``.

    The engine writes a copy at its commit's version, taken from the cluster's clock as this
    host measured it (within half a round trip), so it can sit some milliseconds ahead of this
    host's clock; a plain UPDATE or DELETE issued right after the copy can then carry an older
    timestamp and lose to it, and the change the test means to make never happens."""
    row = session.execute(
        f'SELECT WRITETIME(value) FROM {table} WHERE "{column}" = %s', (counter,)
    ).one()
    written = row[0] if row is not None and row[0] is not None else 0
    return max(written + 1, time.time_ns() // 1000)


def change_copy(session: Any, table: str, counter: str, value: int, column: str = "type") -> None:
    """Set ``counter``'s copy in ``table`` to ``value``, strictly after its last write."""
    stamp = after_copy(session, table, counter, column)
    session.execute(
        f'UPDATE {table} USING TIMESTAMP {stamp} SET value = %s WHERE "{column}" = %s',
        (value, counter),
    )
