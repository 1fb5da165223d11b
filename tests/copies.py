"""Changing the engine's rows the way a writer outside the engine would, in tests that check
the engine notices."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def after_write(
    session: Any, table: str, column: str, where: str, params: Sequence[Any] = ()
) -> int:
    """A write timestamp (µs) strictly after every write of ``column`` in the rows ``where``
    selects, and not before this host's clock.

    The engine writes at the cluster's time: a ledger commit at its Paxos ballot (the
    coordinator's clock), a copy at its commit's version, tombstones at the cluster's clock as
    this host measured it (within half a round trip). Any of those can sit some milliseconds
    ahead of the timestamp a test's plain UPDATE or DELETE gets from this host, which then
    loses, and the change the test means to make never happens."""
    rows = session.execute(f'SELECT WRITETIME("{column}") FROM {table} WHERE {where}', params)
    return stamp_after(max((r[0] for r in rows if r[0] is not None), default=None))


def stamp_after(written: int | None) -> int:
    """A write timestamp (µs) after ``written`` (a cell's WRITETIME, None for none) and not
    before this host's clock (``after_write``)."""
    return max((written or 0) + 1, time.time_ns() // 1000)


def after_copy(session: Any, table: str, counter: str, column: str = "type") -> int:
    """A write timestamp strictly after every write of ``counter``'s copy in ``table``."""
    return after_write(session, table, "value", f'"{column}" = %s', (counter,))


def change_copy(session: Any, table: str, counter: str, value: int, column: str = "type") -> None:
    """Set ``counter``'s copy in ``table`` to ``value``, strictly after its last write."""
    stamp = after_copy(session, table, counter, column)
    session.execute(
        f'UPDATE {table} USING TIMESTAMP {stamp} SET value = %s WHERE "{column}" = %s',
        (value, counter),
    )
