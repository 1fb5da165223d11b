"""The recount of a counter from its archived commits and the rows still present (pure)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ArchivedSegment:
    """One archived commit of one counter, as the recount reads it from the files."""

    commit_id: str
    commit_time_ms: int
    run_id: str
    value: int
    base_value: int
    base_commit: str | None
    origin_ms: int | None
    reset: bool
    rows: int
    counted_rows: int
    counted_sum: int
    file: str
    from_zero: bool = False


@dataclass(frozen=True)
class Present:
    """What the recount found of a counter in Cassandra: its checkpoint (the ledger), its
    compact copy, and the counted rows still present that no archive holds yet."""

    value: int | None
    """The ledger's value (None: no checkpoint)."""
    commit_id: str | None = None
    origin_ms: int | None = None
    epoch_ms: int | None = None
    first: bool = False
    """The ledger's commit is the counter's first (its record says so): its value rests on its
    own rows alone."""
    extra_rows: int = 0
    extra_sum: int = 0
    """The counted rows of the ledger's commit still present that no archive holds."""
    unknown: str | None = None
    """Why the rows still present could not be told counted or not (a record expired)."""
    cannot_rebuild: str | None = None
    """Why the recount cannot rebuild the value of the ledger's commit: the evidence of its
    counted rows is not where the recount may read it (an archive file the retention removed,
    with or without its run-log record; a file of a run before ``--from``). Not a difference:
    nothing says the value is wrong."""
    copy_value: int | None = None
    copy_commit: str | None = None
    copy_epoch_ms: int | None = None
    copy_behind: bool = False
    """The copy was written before the ledger's commit (its write time is older than the
    commit's version): a crash between a commit and its copy. Its epoch may be later than the
    commit's, which lowered it to fold a late backlog."""


@dataclass
class Recount:
    """A counter rebuilt from its archive and its rows still present, against the compact
    table: ``opening`` + the counted sum of every archived commit of its current era in the
    window + the counted rows still present = ``rebuilt``, to equal ``expected`` (the value of
    the counter's last commit, which its compact row holds)."""

    counter: tuple[Any, ...]
    opening: int | None
    from_start: bool
    archived_commits: int
    archived_rows: int
    archived_sum: int
    present_rows: int
    present_sum: int
    rebuilt: int | None
    expected: int | None
    problems: list[str] = field(default_factory=list)
    first_commit: str | None = None
    last_commit: str | None = None
    notes: list[str] = field(default_factory=list)
    """What is worth knowing and is no difference (a compact copy behind its ledger)."""
    cannot_rebuild: str | None = None
    """Why its value cannot be rebuilt (``Present.cannot_rebuild``): its evidence expired or
    lies outside the window. Not a difference."""

    @property
    def difference(self) -> int | None:
        if self.rebuilt is None or self.expected is None:
            return None
        return self.rebuilt - self.expected

    @property
    def equal(self) -> bool:
        return not self.problems and self.difference == 0

    @property
    def status(self) -> str:
        """``equal``; ``cannot_rebuild`` (its evidence expired: not a difference, nothing is
        known wrong); or ``different`` (a difference or a problem: something is wrong)."""
        if self.equal:
            return "equal"
        if self.cannot_rebuild is not None and not self.problems:
            return "cannot_rebuild"
        return "different"

    def as_dict(self) -> dict[str, Any]:
        return {
            "counter": list(self.counter),
            "opening": self.opening,
            "from_start": self.from_start,
            "archived_commits": self.archived_commits,
            "archived_rows": self.archived_rows,
            "archived_sum": self.archived_sum,
            "present_rows": self.present_rows,
            "present_sum": self.present_sum,
            "rebuilt": self.rebuilt,
            "expected": self.expected,
            "difference": self.difference,
            "equal": self.equal,
            "status": self.status,
            "cannot_rebuild": self.cannot_rebuild,
            "first_commit": self.first_commit,
            "last_commit": self.last_commit,
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


def _chain(in_era: Sequence[ArchivedSegment], problems: list[str]) -> tuple[int, bool, int]:
    """(opening, from_start, last value) of a counter's archived commits of one era, in commit
    order; each broken link is a problem."""
    first = in_era[0]
    opening = first.value - first.counted_sum
    from_start = first.reset or first.from_zero
    if from_start and opening != 0:
        problems.append(
            f"commit {first.commit_id} (run {first.run_id}, {first.file}) is the counter's "
            f"{'reset' if first.reset else 'first commit'}, but its value {first.value} is not "
            f"the sum of its counted rows ({first.counted_sum})"
        )
    for before, after in itertools.pairwise(in_era):
        if not after.reset and after.value != before.value + after.counted_sum:
            problems.append(
                f"commit {after.commit_id} (run {after.run_id}, {after.file}) took the value "
                f"from {before.value} to {after.value}, but its archived counted rows add "
                f"{after.counted_sum}: rows counted between them are missing from the archive"
            )
    return opening, from_start, in_era[-1].value


def recount_counter(
    counter: tuple[Any, ...],
    segments: Iterable[ArchivedSegment],
    present: Present | None,
) -> Recount:
    """Rebuild one counter's value (pure). ``segments``: its archived commits in the window.

    The commits of its current era (the ledger's reset point; without ``present``, the era of
    its last archived commit) are taken in commit order. The first one's value less its counted
    rows is the *opening*: 0 when that commit is the counter's first or a reset (its value is
    then rebuilt from rows alone, and any other opening is a difference); each next commit must
    add exactly its counted rows to the one before (a commit whose rows the archive lacks breaks
    that chain). With ``present`` (a window up to now), the last archived value plus the
    counted rows still present must be the ledger's value, which the compact copy of that
    commit must hold; without it (``--to`` in the past), the last archived commit's value is
    the one rebuilt. A ledger's commit whose counted rows are archived where the recount may not
    read them (``Present.cannot_rebuild``) is not rebuilt at all: its status says so, no
    difference is made up."""
    problems: list[str] = []
    notes: list[str] = []
    ordered = sorted(segments, key=lambda s: (s.commit_time_ms, s.commit_id))
    last_era = ordered[-1].origin_ms if ordered else None
    era = present.origin_ms if present is not None else last_era
    in_era = [s for s in ordered if s.origin_ms == era]
    opening: int | None = None
    from_start = False
    rebuilt: int | None = None
    if in_era:
        opening, from_start, rebuilt = _chain(in_era, problems)
    present_rows = present_sum = 0
    cannot_rebuild: str | None = None
    if present is None:
        expected = rebuilt
        if not in_era:
            problems.append("no archived commit of the counter in the window")
    else:
        expected = 0 if present.value is None else present.value
        if present.unknown:
            problems.append(present.unknown)
        archived_last = bool(in_era) and in_era[-1].commit_id == present.commit_id
        if not archived_last and present.cannot_rebuild is not None:
            # the ledger's commit's rows are archived where the recount may not read them
            cannot_rebuild, opening, from_start, rebuilt = present.cannot_rebuild, None, False, None
        elif not archived_last:  # the ledger's commit: its counted rows not archived yet
            present_rows, present_sum = present.extra_rows, present.extra_sum
            if rebuilt is None and (present.value is None or present.first):
                opening, from_start, rebuilt = 0, present.value is not None, 0
            elif rebuilt is None:
                problems.append(
                    "no archived commit of its current era in the window, and its value rests "
                    "on earlier commits: not covered by the archive (widen --from; or its "
                    "history predates the archive, or its retention)"
                )
            if rebuilt is not None:
                rebuilt += present_sum
        if present.value is None and in_era:
            problems.append("archived commits, but no checkpoint in the ledger")
        _check_copy(present, rebuilt, problems, notes)
    return Recount(
        counter,
        opening,
        from_start,
        len(in_era),
        sum(s.rows for s in in_era),
        sum(s.counted_sum for s in in_era),
        present_rows,
        present_sum,
        rebuilt,
        expected,
        problems,
        in_era[0].commit_id if in_era else None,
        in_era[-1].commit_id if in_era else None,
        notes,
        cannot_rebuild,
    )


def _check_copy(
    present: Present, rebuilt: int | None, problems: list[str], notes: list[str]
) -> None:
    """The compact copy against the rebuilt value: the copy of the ledger's commit must hold
    it; a copy of an earlier commit (a crash between a commit and its copy) is behind, and
    readers still read right (they add the rows after its epoch, which are all there)."""
    if present.value is None:
        if present.copy_value is not None:
            problems.append(
                f"the compact table holds {present.copy_value} for a counter the ledger has no "
                "checkpoint of"
            )
        return
    if present.copy_commit is None and present.copy_value is None:
        problems.append("the compact table has no row for the counter (readers read 0)")
    elif present.copy_commit == present.commit_id:
        if rebuilt is not None and present.copy_value != rebuilt:
            problems.append(
                f"the compact table holds {present.copy_value}, the archive and the rows still "
                f"present add up to {rebuilt}"
            )
        elif rebuilt is None and present.copy_value != present.value:  # not rebuilt: the ledger
            problems.append(
                f"the compact table holds {present.copy_value}, the ledger's commit {present.value}"
            )
    elif present.copy_behind or (present.copy_epoch_ms or 0) < (present.epoch_ms or 0):
        notes.append(
            f"the compact copy is of an earlier commit ({present.copy_commit}, value "
            f"{present.copy_value}): readers add the rows after its epoch; the next run "
            "copies the ledger's commit"
        )
    else:
        problems.append(
            f"the compact table names commit {present.copy_commit} (value {present.copy_value}), "
            f"the ledger {present.commit_id}"
        )
