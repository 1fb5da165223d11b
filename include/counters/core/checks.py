"""Run summaries and the checks on them: tallies, committed records, evidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .codec import fields_added, versioned
from .folds import Fold, Key, format_key
from .shards import BIGINT_MAX, BIGINT_MIN

_TALLY_SUMS = (
    "rows_read",
    "counters_seen",
    "counters_committed",
    "counters_refused",
    "counters_quarantined",
    "conflicts",
    "rows_folded",
    "sum_folded",
    "late_rows",
    "late_sum",
    "rows_deleted",
    "windowed_reads",
    "capped_counters",
    "buckets_by_counter",
    "rows_left",
    "counted_present",
    "rows_gone",
)
NAMED_MAX = 20


@versioned(2, fields_added("Tally", 2, buckets_by_counter=0))  # older ones: XCom
@dataclass(frozen=True, slots=True)
class Tally:
    """Totals of a run (or a shard of it); adds up across shards (``merge``). Built once from a
    ``RunningTally`` where a step counts as it goes."""

    rows_read: int = 0
    """Raw rows the run read (a sweep's size, with ``counters_seen``)."""
    counters_seen: int = 0
    counters_committed: int = 0
    counters_refused: int = 0
    counters_quarantined: int = 0
    conflicts: int = 0
    rows_folded: int = 0
    sum_folded: int = 0
    late_rows: int = 0
    late_sum: int = 0
    max_lateness_ms: int = 0
    rows_deleted: int = 0
    windowed_reads: int = 0
    capped_counters: int = 0
    buckets_by_counter: int = 0
    """Buckets a scan with no floor (a sweep's) read counter by counter: the node refused the
    scan, in this run or one within ``SCAN_REFUSED_TTL_S``, their partitions together holding
    more tombstones than it reads past."""
    rows_left: int = 0
    """Rows at or below the epoch that the run saw and did not fold (quarantined counters)."""
    counted_present: int = 0
    """Rows an earlier commit counted that were still present when this run read (that run's
    cleanup had not run yet, failed, or missed them): not counted again, deleted by this run's
    cleanup. Cleanup's own check reads back a sample; this is the full count, a run later."""
    rows_gone: int = 0
    """A rows family's sweep: business rows it had counted that were deleted since (their
    counters' values lowered by them; net of late rows in the same counters, see
    ``fold_recount``)."""
    quarantined: tuple[str, ...] = ()
    """Counters kept out of the run (bad rows, failed checks, tampered copies); at most 20."""
    windowed_counters: tuple[str, ...] = ()
    """Hot counters whose whole partition could not be read (tombstone overload), folded from
    a recent window only; at most 20 named."""

    def merge(self, other: Tally) -> Tally:
        sums = {name: getattr(self, name) + getattr(other, name) for name in _TALLY_SUMS}
        return Tally(
            **sums,
            max_lateness_ms=max(self.max_lateness_ms, other.max_lateness_ms),
            quarantined=(self.quarantined + other.quarantined)[:NAMED_MAX],
            windowed_counters=(self.windowed_counters + other.windowed_counters)[:NAMED_MAX],
        )

    __add__ = merge

    def as_dict(self) -> dict[str, object]:
        """Its figures by name (the run's JSON spreads them; its names as lists, as JSON has
        them)."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in fields(self)
        }


@dataclass(slots=True)
class RunningTally:
    """A ``Tally`` being counted: a step adds each fold, quarantined counter and windowed read
    to it as it goes (one attribute add each, on the run's hot path), then takes its ``Tally``
    once (``tally()``). Its fields are ``Tally``'s (a unit test holds them equal)."""

    rows_read: int = 0
    counters_seen: int = 0
    counters_committed: int = 0
    counters_refused: int = 0
    counters_quarantined: int = 0
    conflicts: int = 0
    rows_folded: int = 0
    sum_folded: int = 0
    late_rows: int = 0
    late_sum: int = 0
    max_lateness_ms: int = 0
    rows_deleted: int = 0
    windowed_reads: int = 0
    capped_counters: int = 0
    buckets_by_counter: int = 0
    rows_left: int = 0
    counted_present: int = 0
    rows_gone: int = 0
    quarantined: list[str] = field(default_factory=list)
    windowed_counters: list[str] = field(default_factory=list)

    def add_fold(self, fold: Fold) -> None:
        self.counters_seen += 1
        if fold.commit:
            self.counters_committed += 1
            self.rows_folded += fold.folded_rows
            self.sum_folded += fold.folded_sum
            self.late_rows += fold.late_rows
            self.late_sum += fold.late_sum
            self.max_lateness_ms = max(self.max_lateness_ms, fold.max_lateness_ms)
            self.capped_counters += int(fold.capped)
            self.counted_present += fold.counted_present
            self.rows_gone += fold.gone_rows

    def add_quarantined(self, counter: Key, rows_left: int = 0) -> None:
        self.counters_quarantined += 1
        self.rows_left += rows_left
        if len(self.quarantined) < NAMED_MAX:
            self.quarantined.append(format_key(counter))

    def add_windowed(self, counters: Sequence[Key]) -> None:
        self.windowed_reads += len(counters)
        room = NAMED_MAX - len(self.windowed_counters)
        self.windowed_counters.extend(format_key(c) for c in counters[: max(room, 0)])

    def tally(self) -> Tally:
        """What it counted, frozen."""
        return Tally(
            **{name: getattr(self, name) for name in _TALLY_SUMS},
            max_lateness_ms=self.max_lateness_ms,
            quarantined=tuple(self.quarantined),
            windowed_counters=tuple(self.windowed_counters),
        )


COMMITTED_FIGURES = (
    "counters_committed",
    "rows_folded",
    "sum_folded",
    "late_rows",
    "late_sum",
    "max_lateness_ms",
    "capped_counters",
    "counted_present",
    "rows_gone",
)
"""The figures of a run's audit row that say what its commits did: kept with each commit's
record in the run log (``commit_figures``), so the run's row adds up every commit of every
attempt (``run_figures``), not only what the attempts that reported remembered."""


def commit_figures(folds: Sequence[Fold], run_id: str) -> dict[str, int]:
    """What one commit of ``run_id`` adds to the run's figures (pure): its folds' rows and sums;
    a counter, and the rows it carries, only when its base is another run's commit. A retry's
    fold on a commit of its own run (the earlier attempt committed, then failed) carries that
    commit's rows: they were folded once, by that commit, and are counted there."""
    tally = RunningTally()
    for fold in folds:
        own = fold.base.run_id == run_id and fold.base.commit_id is not None
        tally.add_fold(fold)
        if own:
            tally.counters_committed -= 1
            tally.counted_present -= fold.counted_present
    return {name: getattr(tally, name) for name in COMMITTED_FIGURES}


def run_figures(
    memory: Tally, commits: Sequence[dict[str, int] | None], deleted: int | None = None
) -> Tally:
    """The run's tally with its committed figures from its applied commits' records and its
    rows deleted from what its cleanups recorded (pure): ``commits`` holds each applied
    commit's ``commit_figures`` (None: a record from before they were kept, then the
    reported figures are kept); ``deleted`` the rows every cleanup of the run recorded (None:
    none did, then the reported count is kept). The rest (conflicts, quarantined, ...) stays
    what the steps reported."""
    durable = memory if deleted is None else replace(memory, rows_deleted=deleted)
    if not commits or any(c is None for c in commits):
        return durable
    figures: dict[str, Any] = {}
    for name in COMMITTED_FIGURES:
        values = [int((c or {}).get(name, 0)) for c in commits]
        figures[name] = max(values) if name == "max_lateness_ms" else sum(values)
    return replace(durable, **figures)


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    success: bool
    critical: bool
    detail: str
    counters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Committed:
    """A counter as this run committed it (from the fold), and as Cassandra holds it after the
    commit: the ledger row, the readers' compact copy, and an independent server-side recount
    of its present raw rows at or below the new epoch."""

    counter: Key
    commit_id: Any
    base_value: int
    folded_sum: int
    value: int
    epoch_ms: int
    pending_rows: int
    pending_sum: int
    ledger_commit_id: Any
    ledger_value: int | None
    ledger_epoch_ms: int | None
    copy_commit_id: Any
    copy_value: int | None
    copy_epoch_ms: int | None
    recount_rows: int
    recount_sum: int


def check_committed(record: Committed) -> str | None:
    """Why a counter's commit is not conserved, or None. Pure: the same rules feed the GX suite.

    * the ledger holds what the run committed (unless a later run committed over it);
    * the compact copy readers see equals the ledger;
    * ``value = value before + folded sum``, and fits a bigint;
    * the independent recount of the present rows at or below the epoch equals the rows the
      commit says it counted (``pending``): the same number of rows with the same sum. More rows
      than that may be late rows that arrived after the fold (the caller looks closer).
    """
    name = format_key(record.counter)
    if record.ledger_commit_id != record.commit_id:
        return None  # superseded by a later commit, which verifies itself
    if record.base_value + record.folded_sum != record.value or record.ledger_value != record.value:
        return (
            f"{name}: ledger value {record.ledger_value} (expected {record.value} = "
            f"{record.base_value} + {record.folded_sum})"
        )
    if not (BIGINT_MIN <= record.value <= BIGINT_MAX):
        return f"{name}: value {record.value} overflows a bigint"
    if record.copy_commit_id != record.commit_id or (
        record.copy_value,
        record.copy_epoch_ms,
    ) != (record.value, record.epoch_ms):
        return (
            f"{name}: compact value {record.copy_value} (expected {record.value} = "
            f"{record.base_value} + {record.folded_sum})"
        )
    if record.recount_rows < record.pending_rows or (
        record.recount_rows == record.pending_rows and record.recount_sum != record.pending_sum
    ):
        return (
            f"{name}: recount of the raw rows at or below the epoch found {record.recount_rows} "
            f"row(s) summing to {record.recount_sum}; the commit counted {record.pending_rows} "
            f"summing to {record.pending_sum}"
        )
    return None


def readers_base(
    fold: Fold,
    copy_value: int | None,
    copy_epoch_ms: int | None,
    copy_commit_id: Any,
    copy_behind: bool,
) -> tuple[int, str | None]:
    """What readers' copy of a counter held before this run's commit, and why the fold may not
    be committed (None: it may). The copy is read from the compact table by the counter's key,
    not through the ledger partition the fold's base came from, so a fold that starts from a
    wrong base (zero, a stale commit, another bucket's checkpoint) shows here before anything
    is written: its new value must be the copy readers saw plus the rows it counts. Pure.

    Two cases take the ledger's last commit as what readers have: a copy that is missing
    and being restored by this commit (``fold.restore``: the run also quarantines it when its
    copy had been verified, so someone removed it), and a copy behind the ledger (a crash
    between a commit and its copy, ``copy_behind``: its rows are not deleted, readers count
    them as newer rows)."""
    base = fold.base
    name = format_key(fold.counter)
    if copy_value is None:
        before = 0
        if fold.restore and base.commit_id is not None:
            before = base.value
        elif base.commit_id is not None or base.value != 0:
            return 0, (
                f"{name}: readers have no compact row (value 0), but the fold starts from "
                f"value {base.value} (commit {base.commit_id})"
            )
    elif copy_commit_id == base.commit_id:
        before = copy_value
        if (copy_value, copy_epoch_ms) != (base.value, base.epoch_ms):
            return before, (
                f"{name}: readers' copy of commit {copy_commit_id} holds value {copy_value} "
                f"(epoch {copy_epoch_ms}), the fold starts from {base.value} "
                f"(epoch {base.epoch_ms})"
            )
    elif copy_behind and base.commit_id is not None:
        before = base.value
    else:
        return copy_value, (
            f"{name}: readers' copy holds value {copy_value} of commit {copy_commit_id}, the "
            f"fold starts from value {base.value} of commit {base.commit_id}"
        )
    if fold.value != before + fold.folded_sum:
        return before, (
            f"{name}: the new value {fold.value} is not what readers had ({before}) plus the "
            f"rows counted ({fold.folded_sum})"
        )
    return before, None


def counted_rows_gone(record: Committed) -> bool:
    """The commit holds, adds up, and only the recount falls short of the rows it counted. Rows
    the commit it built on had counted may be gone: that commit's run deletes them in its
    cleanup while this one runs (overlapping runs). Only a row-level read tells whether the
    missing rows are those (fine: they stay counted) or rows this commit folded (a loss)."""
    return check_committed(record) is not None and (
        check_committed(
            replace(record, recount_rows=record.pending_rows, recount_sum=record.pending_sum)
        )
        is None
    )


def needs_closer_look(record: Committed) -> bool:
    """More rows present than the commit counted: late rows arrived since the fold read, or the
    fold missed rows. Only a row-level read tells which."""
    return record.ledger_commit_id == record.commit_id and record.recount_rows > record.pending_rows


@dataclass(frozen=True)
class Evidence:
    """One bucket's conservation evidence: what the run's commits claim against what Cassandra
    recounted. The GX suite validates these rows; the audit row keeps their totals."""

    shard: int
    bucket: int
    counters: int
    rows_folded: int
    sum_folded: int
    value_delta: int
    pending_rows: int
    pending_sum: int
    recount_rows: int
    recount_sum: int
    late_arrivals: int
    quarantined: int
    readers_before: int = 0
    """The readers' copies of the bucket's committed counters before the commit (read by key)."""
    readers_after: int = 0
    """The same copies read back after it: ``value_delta`` is ``readers_after - readers_before``."""

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def evaluate_evidence(rows: Sequence[Evidence]) -> list[CheckOutcome]:
    """Family-level conservation over every bucket the run committed (pure). ``value_delta``
    is what the readers' copies moved by (read by key before the commit and read back after
    it), so a fold built on a wrong base fails here even if every per-counter check missed it."""
    delta = [e for e in rows if e.value_delta != e.sum_folded]
    recount = [
        e for e in rows if (e.recount_rows, e.recount_sum) != (e.pending_rows, e.pending_sum)
    ]

    def where(items: Sequence[Evidence]) -> tuple[str, ...]:
        return tuple(f"shard {e.shard} bucket {e.bucket}" for e in items[:NAMED_MAX])

    total_folded = sum(e.sum_folded for e in rows)
    total_delta = sum(e.value_delta for e in rows)
    return [
        CheckOutcome(
            "family_total_conserved",
            total_delta == total_folded,
            True,
            f"sum of value changes {total_delta}, sum folded {total_folded}",
        ),
        CheckOutcome(
            "value_change_equals_folded_sum",
            not delta,
            True,
            f"{len(delta)} bucket(s) differ" if delta else "equal in every bucket",
            where(delta),
        ),
        CheckOutcome(
            "recount_equals_counted_rows",
            not recount,
            True,
            f"{len(recount)} bucket(s) differ" if recount else "equal in every bucket",
            where(recount),
        ),
    ]
