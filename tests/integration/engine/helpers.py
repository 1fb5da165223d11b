"""Small helpers shared by engine tests."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import time_machine
from cassandra import ReadFailure, ReadTimeout
from cassandra.query import ValueSequence
from counters.config import Family
from counters.core import LEDGER_STATE, STATE_FIELDS, utc_aware
from counters.schema import TABLES_TABLE
from counters.store import Store

from tests.copies import stamp_after

aware = utc_aware
"""A test's time (naive UTC, as the tables hold it) as the write API takes it: tz-aware UTC
(``CounterClient`` and a reset refuse a naive one)."""


def real_now() -> datetime:
    """The real time now, naive UTC, as the tables hold times."""
    return datetime.now(UTC).replace(tzinfo=None)


def skewed(by: timedelta) -> time_machine.travel:
    """This process's clock, ``by`` off the real one (and the node's), ticking: a skewed
    host's, the driver's threads included."""
    return time_machine.travel(datetime.now(UTC) + by, tick=True)


def plain_insert(
    store: Store, counter: str, at: datetime, actor: str, amount: int, stamp_us: int
) -> None:
    """A writer outside the write API: a plain INSERT stamped ``stamp_us``, no index mark (the
    test families' default columns)."""
    f = store.family
    store.statements.session.execute(
        f"INSERT INTO {f.keyspace}.{f.raw_table} (type, modify_time, actor, version, increment) "
        f"VALUES (%s, %s, %s, 1, %s) USING TIMESTAMP {stamp_us}",
        (counter, at, actor, amount),
    )


def forget_marks(store: Store, shard: int = 0) -> None:
    """Forget the shard's index marks as a run minutes later finds them: each at the server
    write time it is read with, so a mark written since (a strictly later server timestamp)
    survives. A tombstone at this host's clock would not do: server timestamps are whole
    milliseconds, so a mark written in the same millisecond after it would be shadowed."""
    store.index.forget_touched([t for marks in store.index.touched(shard).values() for t in marks])


class TombstoneTrace:
    """The tombstones each statement's reads walk, by the node's own trace ("Read N live rows
    and M tombstone cells"): inside ``with``, every request the store's session sends while
    ``on`` is traced.
    ``walked()`` is, per statement text, the most one of its reads walked."""

    WALKED = re.compile(r"Read (\d+) live rows and (\d+) tombstone cells")

    def __init__(self, store: Store):
        self.on = False
        self.refused: list[str] = []
        """The statements of the reads the node refused (too many tombstones), since ``walked``."""
        self._futures: list[tuple[str, Any]] = []
        self._session = store.statements.session

    def __enter__(self) -> TombstoneTrace:
        send = self._session.execute_async

        def traced(query: Any, parameters: Any = None, trace: bool = False, *a: Any, **kw: Any):
            future = send(query, parameters, trace or self.on, *a, **kw)
            if self.on:
                prepared = getattr(query, "prepared_statement", None)
                text = getattr(prepared or query, "query_string", repr(query))
                self._futures.append((text, future))
            return future

        self._session.execute_async = traced  # the session is the test session's, shared
        return self

    def __exit__(self, *exc: object) -> None:
        del self._session.execute_async

    def walked(self) -> dict[str, int]:
        found: dict[str, int] = {}
        self.refused = []
        for text, future in self._futures:
            try:
                future.result()
            except (ReadFailure, ReadTimeout):  # the node's refusal: no trace of its count
                self.refused.append(text)
                continue
            for trace in future.get_all_query_traces(max_wait_per=30):
                for event in trace.events:
                    match = self.WALKED.search(event.description)
                    if match:
                        found[text] = max(found.get(text, 0), int(match.group(2)))
        self._futures = []
        return found


def raw_rows(store: Store, counter: tuple) -> list[tuple]:
    f = store.family
    cols = f.columns
    rows = store.statements.session.execute(
        f'SELECT "{cols.time}", "{cols.increment}" FROM {f.keyspace}.{f.raw_table} '
        f'WHERE "{cols.key[0]}" = %s',
        (counter[0],),
    )
    return [tuple(r) for r in rows]


def rows_at_or_below(store: Store, counter: tuple, epoch: datetime) -> int:
    return sum(1 for t, _ in raw_rows(store, counter) if t <= epoch)


def compact_row(store: Store, counter: tuple):
    f = store.family
    return store.statements.session.execute(
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
    rows = list(
        store.statements.session.execute(
            f"SELECT shard, bucket, {key_list}, state, WRITETIME(state) FROM {table}"
        )
    )
    for row in rows:
        state, written = row[-2], row[-1]
        if state is None:
            continue
        cp = state_fields(state)
        stamp = stamp_after(written)  # after the commit's Paxos ballot
        store.statements.session.execute(
            f"UPDATE {table} USING TIMESTAMP {stamp} SET value = %s, epoch_ms = %s, run_id = %s, "
            "pending = '', pending_sum = %s, pending_rows = %s, pending_low_ms = %s, "
            "base_value = %s, folded_sum = %s, version = %s, updated_at = %s, state = %s "
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
                *row[2:-2],
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


class StalledRun:
    """A run in its own thread that stalls the first time it reaches ``point`` (a fault point,
    ``engine.FAULT_POINTS``) until the test releases it: what an overlap test needs to prove
    that it overlapped. It records whether the run reached the point (only the stall sets
    that, never the run's end), whether the test released it (not its wait's bound running
    out while the rival ran), and how the run ended (its summary or its exception), so a test
    can assert on each instead of passing when the run never stalled.

    ``run(fault)`` starts the run with ``fault`` as its fault hook and returns its summary."""

    def __init__(
        self, point: str, run: Callable[[Callable[[str], None]], Any], bound_s: float = 300.0
    ) -> None:
        self.point = point
        self.bound_s = bound_s
        self.reached = threading.Event()
        self.ended = threading.Event()
        self.released: bool | None = None
        """True: let go by :meth:`release`; False: the bound ran out first; None: not stalled."""
        self.summary: Any = None
        self.error: BaseException | None = None
        self._run = run
        self._resume = threading.Event()
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._body, name=f"stalled-at-{point}")

    def _stall(self, point: str) -> None:
        if point != self.point:
            return
        with self._lock:  # buckets run in threads: only the first to arrive stalls
            if self.reached.is_set():
                return
            self.reached.set()
        self._changed.set()
        self.released = self._resume.wait(self.bound_s)

    def _body(self) -> None:
        try:
            self.summary = self._run(self._stall)
        except BaseException as exc:  # kept for the test to assert on
            self.error = exc
        finally:
            self.ended.set()
            self._changed.set()

    def start(self, within_s: float = 120.0) -> bool:
        """Start the run and wait until it stalls at its point: True; False if it ended
        without reaching the point."""
        self._thread.start()
        assert self._changed.wait(within_s), f"the run neither stalled nor ended in {within_s} s"
        return self.reached.is_set()

    @property
    def waiting(self) -> bool:
        """Stalled at its point right now (reached, not let go, not ended)."""
        return self.reached.is_set() and self.released is None and not self.ended.is_set()

    def release(self, within_s: float = 120.0) -> None:
        """Let the run go on and wait for its end (an error if it is still running after)."""
        self._resume.set()
        self._thread.join(within_s)
        assert not self._thread.is_alive(), f"the run stalled at {self.point} did not end"

    def __enter__(self) -> StalledRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Whatever failed meanwhile, the run is let go and its thread waited for."""
        self._resume.set()
        if self._thread.is_alive():
            self._thread.join(self.bound_s)

    @property
    def overlapped(self) -> bool:
        """It stalled at its point and stayed there until the test let it go."""
        return self.reached.is_set() and self.released is True

    def outcome(self) -> str:
        """How the run ended, for messages: its outcome and tally, or its exception."""
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.summary is None:
            return "not ended"
        return f"{self.summary.outcome} {self.summary.tally}"


def forget_table_owners(store: Store) -> None:
    """Forget which family owns the family's tables, as if they were new: tests that give
    many short-lived families one set of tables (a new set each would exhaust the node's
    heap)."""
    f = store.family
    store.statements.session.execute(
        f"DELETE FROM {f.keyspace}.{TABLES_TABLE} WHERE table_name IN %s",
        (ValueSequence(f.tables),),
    )


def sha256_of_configuration(family: Family) -> str:
    """The documented configuration hash, computed here (not by ``audit.config_fingerprint``):
    sha256 of the family as loaded (every field, defaults included) as JSON, keys sorted."""
    fields = family.model_dump(mode="json")
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
