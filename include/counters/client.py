"""The client library: record increments (idempotently) and read counters with the seed's rule.

Writing an increment is two steps, in this order: mark the counter in the touched index, then
insert the raw row. A crash between them leaves a harmless mark; the reverse order could leave a
row no run would find. The raw row's write timestamp is derived from its own time, so a retry
writes the very same cell (and is shadowed by the tombstone once the row was folded and deleted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from .config import Discovery, Family
from .connection import Connection
from .core import Key, aware_millis, checked_aware, from_millis, naive_refusal, write_timestamp
from .store import Store


def as_key(counter: str | Sequence[object]) -> Key:
    """A counter key as a tuple (a plain string is a one-column key)."""
    if isinstance(counter, str):
        return (counter,)
    return tuple(counter)


@dataclass(frozen=True)
class Increment:
    """One event: ``time`` is its own tz-aware time (``record`` refuses a naive one), and
    ``identity`` fills the clustering columns after the time column (``(actor, version)`` in the
    default layout) and makes a retry the same row."""

    counter: Key
    increment: int
    time: datetime
    identity: tuple[object, ...]


def event_problem(event: Increment, identity_names: Sequence[str]) -> str | None:
    """What makes an event unfit to record, or None: the rules ``increment`` enforces on its
    arguments, for events given whole. Its own time is required (the row's key is (time,
    identity): a retry is the same row only with the same time), and every part of its
    identity (a missing one would merge two events, or fail the write half way). A naive
    time is refused, as ``increment(at=)`` refuses one: it may be this host's local time."""
    if not isinstance(event.time, datetime):
        return (
            f"counter {event.counter}: time must be the event's own datetime, got "
            f"{event.time!r}: the row's key is (time, identity), and a retry is the same row "
            "only with the same time"
        )
    naive = naive_refusal(event.time, f"counter {event.counter}: time")
    if naive:
        return naive
    if len(event.identity) != len(identity_names):
        return (
            f"counter {event.counter}: identity needs {len(identity_names)} value(s) for "
            f"{list(identity_names)}, got {event.identity!r}"
        )
    missing = [n for n, v in zip(identity_names, event.identity, strict=True) if v is None]
    if missing:
        return (
            f"counter {event.counter}: identity {event.identity!r} has no value for {missing}: "
            "two events told apart by it would be one row"
        )
    return None


@dataclass(frozen=True)
class CounterValue:
    """A counter as read: ``value`` = ``compact_value`` (the copy of its last commit, counting
    its rows up to ``epoch``) + ``newer_sum`` (its rows after ``epoch``).

    ``epoch`` is also the read's horizon for late rows: a row whose time is at or before it
    and that no run had folded when the copy was written (a late row: delivered more than the
    family's ``lag`` after its own time) is not in ``value`` until the next run that reads its
    counter folds it (the next scheduled run for the write API's rows, the next sweep for other
    writers: see ``CounterClient.read``)."""

    counter: Key
    value: int
    compact_value: int
    epoch: datetime | None
    newer_sum: int


class CounterClient:
    def __init__(self, conn: Connection, family: Family, store: Store | None = None):
        self.family = family
        self.store = store or Store(conn, family)

    def increment(
        self,
        counter: str | Sequence[object],
        amount: int,
        *,
        at: datetime | None = None,
        actor: str | None = None,
        version: int | None = None,
        identity: tuple[object, ...] | None = None,
    ) -> Increment:
        """Record one increment; returns what was written.

        Without ``identity`` (or ``actor`` and ``version`` for the seed's layout) each call
        gets a fresh random identity: two increments in the same millisecond are two rows,
        never one, and a retried call is a second increment. A caller that may retry passes
        its event's own time (``at``, tz-aware: a naive one is refused) and identity (order id
        and version): the row's key is
        (time, identity), so every retry writes the very same row, and a retry after the row
        was folded and deleted stays deleted. An identity without ``at`` is refused: the call's
        time would make each retry a row of its own."""
        if identity is None and (actor is not None or version is not None):
            if actor is None or version is None:
                raise ValueError(
                    f"family {self.family.name!r}: pass actor= and version= together (got "
                    f"actor={actor!r}, version={version!r}): two events of one actor at the same "
                    "time are told apart by their version, and a missing one would merge them "
                    "into one row"
                )
            identity = (actor, version)
        if identity is not None and at is None:
            raise ValueError(
                f"family {self.family.name!r}: an increment with identity {identity!r} needs "
                "its event's time too (at=...): the row's key is "
                "(time, identity), and without at= each retry would take the time of its own "
                "call and be counted again"
            )
        event = Increment(
            counter=as_key(counter),
            increment=amount,
            time=from_millis(self._event_millis(at)).replace(tzinfo=UTC),
            identity=identity if identity is not None else self.store.keys.fresh_identity(),
        )
        self.record([event])
        return event

    def _event_millis(self, at: datetime | None) -> int:
        """A write's time in epoch ms, as the table holds it: ``at`` (tz-aware; a naive one is
        refused, it may be this host's local time) or now."""
        if at is None:
            return aware_millis(datetime.now(UTC))
        return aware_millis(checked_aware(at, f"family {self.family.name!r}: at="))

    def record(self, events: Iterable[Increment]) -> None:
        """Record many increments: marks first (one per counter), then the rows. Every event is
        checked before any is written (``event_problem``: a naive time is refused), so a refused
        call writes nothing. Each time is taken to the table's ms once, here."""
        names = [c.name for c in self.store.layout.clustering[1:]]
        rows: list[tuple[Key, tuple[object, ...], int, int]] = []
        minutes: dict[Key, set[int]] = {}
        for event in events:  # every event before any is written
            if isinstance(event.increment, bool) or not isinstance(event.increment, int):
                raise TypeError(
                    f"family {self.family.name!r}: increment must be an integer, "
                    f"got {event.increment!r} for counter {event.counter}"
                )
            problem = event_problem(event, names)
            if problem:
                raise ValueError(f"family {self.family.name!r}: {problem}")
            millis = aware_millis(event.time)
            rows.append(
                (
                    event.counter,
                    (from_millis(millis), *event.identity),
                    event.increment,
                    millis * 1000,
                )
            )
            # the minutes of the rows: a run reads each counter down to them
            minutes.setdefault(event.counter, set()).add(millis // 60_000 * 60_000)
        if self.family.discovery is Discovery.INDEX:
            self.store.index.mark_touched(list(minutes), minutes)
        self.store.raw.insert_raw(rows)

    def add_member(
        self, counter: str | Sequence[object], member: object, *, at: datetime | None = None
    ) -> bool:
        """Add a member to a unique family's set; True if this write was the first.

        Three idempotent writes: the touched mark, the first-write-wins member (seed 000), and
        the derived +1 row keyed by the winner's first-write time. A crash between them is
        healed by a retry (or ``counterctl reconcile --repair``): every retry derives the same
        row, and the fold counts each member once.
        """
        return self.add_members([(counter, member)], at=at)[0]

    def add_members(
        self, items: Iterable[tuple[str | Sequence[object], object]], *, at: datetime | None = None
    ) -> list[bool]:
        """``add_member`` for many ``(counter, member)`` pairs, each step concurrent over all of
        them (marks, then members, then derived rows: the same order, so the same healing)."""
        if not self.family.rules.members:
            raise TypeError(
                f"family {self.family.name!r} is of kind {self.family.kind.value!r}: it counts "
                f"{self.family.rules.counts}, not members; add_member is for a unique family"
            )
        pairs = [(as_key(counter), member) for counter, member in items]
        now = from_millis(self._event_millis(at))
        if self.family.discovery is Discovery.INDEX:
            self.store.index.mark_touched(key for key, _member in pairs)
        outcomes = self.store.raw.add_members(pairs, now)
        self.store.raw.insert_raw(
            [
                (key, (first_seen, member), 1, write_timestamp(first_seen))
                for (key, member), (_first, first_seen) in zip(pairs, outcomes, strict=True)
            ]
        )
        seen: set[tuple[Key, object]] = set()
        firsts = []
        for pair, (first, _first_seen) in zip(pairs, outcomes, strict=True):
            firsts.append(first and pair not in seen)  # a pair repeated in one call: first once
            seen.add(pair)
        return firsts

    def read(self, counter: str | Sequence[object]) -> int:
        """The counter's value: exact at every moment, during runs too, for every row after the
        counter's compacted epoch (``late_horizon``) and every row a run has folded.

        A late row (its time at or before that epoch when it arrives: a delivery delay longer
        than the family's ``lag``) is in the value from the next run that reads its counter,
        not before: for the write API's rows the family's next scheduled run (it marks the
        counter with the row's minute), so a read is behind by at most one schedule interval
        plus a run's duration (a hot counter's rows more than ``engine.HOT_LATE_WINDOW`` behind
        wait until its partition can be read whole); other writers' rows wait for the next
        sweep. Compare an event's time with ``late_horizon`` to know which case it is."""
        return self.read_many([counter])[0].value

    def late_horizon(self, counter: str | Sequence[object]) -> datetime | None:
        """The counter's compacted epoch (one read of its copy; None before its first commit):
        an increment whose time is at or before it and that no run has folded yet (a late row)
        is not in ``read()`` until the next run that reads the counter, as ``read`` says. An
        increment after it is in ``read()`` as soon as it is written."""
        return self.store.reader.read_epochs([as_key(counter)])[as_key(counter)]

    def read_many(self, counters: Sequence[str | Sequence[object]]) -> list[CounterValue]:
        keys = [as_key(c) for c in counters]
        values = self.store.reader.read_values(keys)
        return [
            CounterValue(k, values[k][0] + values[k][2], values[k][0], values[k][1], values[k][2])
            for k in keys
        ]
