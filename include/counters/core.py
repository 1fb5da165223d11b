"""The functional core: epochs, shards and fold plans. No I/O here; everything is unit-tested.

The fold invariant (per counter), which every run preserves:

* the compact row holds ``value`` and ``epoch`` plus ``pending``: the clustering keys of the raw
  rows at or below ``epoch`` that ``value`` already includes and that may not be deleted yet;
* a raw row at or below ``epoch`` whose key is in ``pending`` is counted; one that is not in
  ``pending`` is a late write, not yet counted (readers do not see it until a run folds it);
* readers compute ``value + sum(rows newer than epoch)``.

A run folds every present row at or below its epoch that is not already counted, and commits the
new (value, epoch, pending) with a compare-and-set on the commit id it read, so overlapping runs
can never both build on the same state.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
_RING = 2**64


def utc_naive(moment: datetime) -> datetime:
    """Cassandra timestamps come back naive UTC; compare everything in that form."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def to_millis(moment: datetime) -> int:
    moment = utc_naive(moment)
    return int((moment - datetime(1970, 1, 1)) // timedelta(milliseconds=1))


def from_millis(millis: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(milliseconds=millis)


def truncate_ms(moment: datetime) -> datetime:
    """Cassandra ``timestamp`` has millisecond precision; so do epochs."""
    return from_millis(to_millis(moment))


def epoch_for(scheduled: datetime, lag: timedelta) -> datetime:
    """The epoch of a run: its scheduled time truncated to the minute, minus the family's lag.

    Rows with ``time <= epoch`` are folded in (inclusive, as in the seed's DELETE).
    """
    if lag <= timedelta(0):
        raise ValueError(f"lag must be positive, got {lag}")
    minute = utc_naive(scheduled).replace(second=0, microsecond=0)
    return truncate_ms(minute - lag)


def write_timestamp(moment: datetime) -> int:
    """A write timestamp in microseconds (what ``USING TIMESTAMP`` takes), from a time."""
    return to_millis(moment) * 1000


# --- shards -------------------------------------------------------------------------------


def shard_bounds(shards: int) -> list[tuple[int, int]]:
    """Split the Murmur3 ring into ``shards`` ranges ``(start, end]`` that cover every token."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    edges = [MIN_TOKEN + (i * _RING) // shards for i in range(shards)] + [MAX_TOKEN]
    return [(edges[i], edges[i + 1]) for i in range(shards)]


def shard_of(token: int, shards: int) -> int:
    """The shard whose range ``(start, end]`` holds ``token``."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if token == MIN_TOKEN:  # Murmur3 never yields it for a key; keep the function total anyway
        return 0
    # the i with floor(i*R/n) < t-MIN <= floor((i+1)*R/n), i.e. ceil((t-MIN)*n/R) - 1
    index = ((token - MIN_TOKEN) * shards - 1) // _RING
    return min(index, shards - 1)


# --- fold planning ------------------------------------------------------------------------

Key = tuple[Hashable, ...]


@dataclass(frozen=True)
class RawRow:
    """One raw row of a counter: its clustering key, its time and its increment."""

    clustering: Key
    time: datetime
    increment: int | None


@dataclass(frozen=True)
class Checkpoint:
    """A counter's compact row as the engine reads it."""

    value: int
    epoch: datetime | None
    commit_id: object | None = None
    pending: frozenset[Key] = frozenset()


EMPTY_CHECKPOINT = Checkpoint(value=0, epoch=None)


@dataclass(frozen=True)
class FoldPlan:
    """What one run does to one counter. ``commit`` is False when there is nothing to fold."""

    counter: Key
    base: Checkpoint
    epoch: datetime
    value: int
    pending: tuple[Key, ...]
    folded_rows: int
    folded_sum: int
    late_rows: int = 0
    late_sum: int = 0
    max_lateness_ms: int = 0
    counted_present: int = 0
    newer_rows: int = 0
    bad_rows: tuple[Key, ...] = ()
    duplicates: int = 0

    @property
    def commit(self) -> bool:
        return (self.folded_rows > 0 or self.duplicates > 0) and not self.bad_rows

    @property
    def refused(self) -> bool:
        return bool(self.bad_rows)

    @property
    def needs_cleanup(self) -> bool:
        """Rows already counted are still present: the run's cleanup deletes them."""
        return bool(self.pending) if self.commit else self.counted_present > 0


def plan_fold(
    counter: Key,
    base: Checkpoint,
    rows: Iterable[RawRow],
    epoch: datetime,
    member_index: int | None = None,
    counted_members: frozenset[Hashable] = frozenset(),
) -> FoldPlan:
    """Decide how to fold a counter's present raw rows into its compact row at ``epoch``.

    ``rows`` must be every row of the counter present when read (read after ``base``). The new
    epoch never moves backwards: a run with an older epoch still folds late rows, at the
    counter's own epoch.

    For a unique family (``member_index`` = the member's position in the clustering key), a
    member counts once: a row whose member is already counted (listed in ``pending``, marked in
    ``counted_members``, or seen earlier in this fold) is a duplicate, deleted but not summed.
    """
    epoch = utc_naive(epoch)
    new_epoch = max(epoch, base.epoch) if base.epoch is not None else epoch
    folded_rows = folded_sum = late_rows = late_sum = lateness = counted = newer = dups = 0
    pending: list[Key] = []
    bad: list[Key] = []
    seen: set[Hashable] = set(counted_members)
    if member_index is not None:
        seen.update(key[member_index] for key in base.pending)
    for row in rows:
        time = utc_naive(row.time)
        if time > new_epoch:
            newer += 1
            continue
        pending.append(row.clustering)
        if row.clustering in base.pending:
            counted += 1
            continue
        if member_index is not None:
            member = row.clustering[member_index]
            if member in seen:
                dups += 1
                continue
            seen.add(member)
        if row.increment is None or isinstance(row.increment, bool):
            bad.append(row.clustering)
            continue
        folded_rows += 1
        folded_sum += row.increment
        if base.epoch is not None and time <= base.epoch:
            late_rows += 1
            late_sum += row.increment
            lateness = max(lateness, to_millis(base.epoch) - to_millis(time))
    return FoldPlan(
        counter=counter,
        base=base,
        epoch=new_epoch,
        value=base.value + folded_sum,
        pending=tuple(pending),
        folded_rows=folded_rows,
        folded_sum=folded_sum,
        late_rows=late_rows,
        late_sum=late_sum,
        max_lateness_ms=lateness,
        counted_present=counted,
        newer_rows=newer,
        bad_rows=tuple(bad),
        duplicates=dups,
    )


def plan_slice(counter: Key, base: Checkpoint, rows: int, total: int, epoch: datetime) -> FoldPlan:
    """Fold a counter whose rows are kept: add the slice (checkpoint, epoch] aggregated by the
    server (``rows`` rows whose increments, or count, add up to ``total``)."""
    epoch = utc_naive(epoch)
    new_epoch = max(epoch, base.epoch) if base.epoch is not None else epoch
    return FoldPlan(
        counter=counter,
        base=base,
        epoch=new_epoch,
        value=base.value + total,
        pending=(),
        folded_rows=rows,
        folded_sum=total,
    )


# --- run summaries and checks --------------------------------------------------------------


@dataclass
class Tally:
    """Totals of a run (or a shard of it); adds up across shards."""

    counters_seen: int = 0
    counters_committed: int = 0
    counters_refused: int = 0
    conflicts: int = 0
    rows_folded: int = 0
    sum_folded: int = 0
    late_rows: int = 0
    late_sum: int = 0
    max_lateness_ms: int = 0
    rows_deleted: int = 0
    refused_counters: list[str] = field(default_factory=list)
    windowed_counters: list[str] = field(default_factory=list)
    """Hot counters whose whole partition could not be read (tombstone overload) and that were
    folded from a recent window only (see ``engine.HOT_LATE_WINDOW``); at most 20 named."""
    windowed_reads: int = 0

    def add_plan(self, plan: FoldPlan) -> None:
        self.counters_seen += 1
        if plan.refused:
            self.counters_refused += 1
            if len(self.refused_counters) < 20:
                self.refused_counters.append(format_key(plan.counter))
            return
        if plan.commit:
            self.counters_committed += 1
            self.rows_folded += plan.folded_rows
            self.sum_folded += plan.folded_sum
            self.late_rows += plan.late_rows
            self.late_sum += plan.late_sum
            self.max_lateness_ms = max(self.max_lateness_ms, plan.max_lateness_ms)

    def merge(self, other: Tally) -> Tally:
        merged = Tally()
        for name in (
            "counters_seen",
            "counters_committed",
            "counters_refused",
            "conflicts",
            "rows_folded",
            "sum_folded",
            "late_rows",
            "late_sum",
            "rows_deleted",
            "windowed_reads",
        ):
            setattr(merged, name, getattr(self, name) + getattr(other, name))
        merged.max_lateness_ms = max(self.max_lateness_ms, other.max_lateness_ms)
        merged.refused_counters = (self.refused_counters + other.refused_counters)[:20]
        merged.windowed_counters = (self.windowed_counters + other.windowed_counters)[:20]
        return merged

    def keep_compaction_counts(self, compacted: Tally) -> Tally:
        """The verified tally (rebuilt from the run log) plus what only compaction knows."""
        self.conflicts = compacted.conflicts
        self.windowed_reads = compacted.windowed_reads
        self.windowed_counters = list(compacted.windowed_counters)
        return self

    def add_windowed(self, counters: Sequence[Key]) -> None:
        self.windowed_reads += len(counters)
        room = 20 - len(self.windowed_counters)
        self.windowed_counters.extend(format_key(c) for c in counters[: max(room, 0)])

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Tally:
        tally = cls()
        for name, value in data.items():
            if hasattr(tally, name):
                setattr(tally, name, value)
        return tally


def format_key(key: Sequence[object]) -> str:
    return "/".join(str(part) for part in key)


@dataclass(frozen=True)
class CommitRecord:
    """What a run logged for one counter it committed, and what the compact row holds now."""

    counter: Key
    commit_id: object
    base_value: int
    folded_sum: int
    new_value: int
    new_epoch: datetime
    current_commit_id: object | None
    current_value: int | None
    current_epoch: datetime | None


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    success: bool
    critical: bool
    detail: str
    counters: tuple[str, ...] = ()


def evaluate_commit_checks(records: Sequence[CommitRecord]) -> list[CheckOutcome]:
    """Conservation checks over the counters a run committed (pure; GX runs the same rules)."""
    value_mismatch: list[str] = []
    arithmetic: list[str] = []
    regressed: list[str] = []
    missing: list[str] = []
    for record in records:
        name = format_key(record.counter)
        if record.base_value + record.folded_sum != record.new_value:
            arithmetic.append(
                f"{name}: {record.base_value}+{record.folded_sum}!={record.new_value}"
            )
        if record.current_commit_id is None:
            missing.append(name)
            continue
        if record.current_commit_id == record.commit_id:
            if record.current_value != record.new_value or utc_naive(
                record.current_epoch
            ) != utc_naive(record.new_epoch):
                value_mismatch.append(
                    f"{name}: compact value {record.current_value} (expected {record.new_value} "
                    f"= {record.base_value} + {record.folded_sum})"
                )
        elif record.current_epoch is None or utc_naive(record.current_epoch) < utc_naive(
            record.new_epoch
        ):
            regressed.append(f"{name}: epoch {record.current_epoch} < {record.new_epoch}")
    return [
        CheckOutcome(
            "compact_value_equals_before_plus_folded",
            not value_mismatch,
            True,
            f"{len(value_mismatch)} counter(s) differ" if value_mismatch else "all equal",
            tuple(value_mismatch[:50]),
        ),
        CheckOutcome(
            "logged_arithmetic_is_consistent",
            not arithmetic,
            True,
            f"{len(arithmetic)} record(s) inconsistent" if arithmetic else "consistent",
            tuple(arithmetic[:50]),
        ),
        CheckOutcome(
            "epoch_never_regresses",
            not regressed,
            True,
            f"{len(regressed)} counter(s) regressed" if regressed else "no regression",
            tuple(regressed[:50]),
        ),
        CheckOutcome(
            "compact_row_present",
            not missing,
            True,
            f"{len(missing)} compact row(s) missing" if missing else "all present",
            tuple(missing[:50]),
        ),
    ]
