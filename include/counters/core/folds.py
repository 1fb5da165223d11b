"""Fold planning: a counter's checkpoint, its packed ledger state, and the fold of its rows."""

from __future__ import annotations

import struct
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .shards import BIGINT_MAX, BIGINT_MIN

Key = tuple[Hashable, ...]
"""A counter: the values of the raw table's partition key columns."""
Packed = tuple[Hashable, ...]
"""A raw row's clustering key in packed form: times as epoch milliseconds, uuids as text."""
Row = tuple[int, Packed, Any]
"""One raw row as the engine reads it: (time in epoch ms, packed clustering key, increment)."""


def format_key(key: Sequence[object]) -> str:
    return "/".join(str(part) for part in key)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A counter's state as the ledger holds it: what readers' ``value``/``epoch`` are, and the
    raw rows at or below the epoch already counted but not yet deleted (``pending``)."""

    value: int = 0
    epoch_ms: int | None = None
    commit_id: Any = None
    pending: frozenset[Packed] = frozenset()
    pending_sum: int = 0
    """The sum of the increments of the ``pending`` rows as they are in the table (a unique
    family's duplicates included): what a recount of them must find."""
    version: int | None = None
    run_id: str | None = None
    pending_rows: int = 0
    """How many rows ``pending`` lists (known without the list itself)."""
    low_ms: int | None = None
    """The time (ms) of the earliest row ``pending`` lists (None: unknown, e.g. a commit from
    before it was recorded): a fold that reads the counter's rows after ``low_ms - 1`` sees every
    counted row still present."""
    pending_loaded: bool = True
    """Whether ``pending`` holds the keys. The ledger keeps only their count and sum; the keys
    live in the commit's record of the run log and are read only for a counter that still has
    rows at or below its epoch (``needs_pending``), which is rare once cleanups succeed."""
    origin_ms: int | None = None
    """The point the value counts from: the last reset's (None: the counter's first row). A
    recount of what the value counts starts after it."""
    pending_flags: dict[Packed, int] | None = field(default=None, compare=False)
    """For a family with an archive, the ``ROW_*`` flags of each ``pending`` key as its commit's
    record holds them (loaded with the keys): whether the row counts in the value, and whether
    an archive already holds it. None: not loaded (every key counted, none archived)."""
    unarchived_from_zero: bool = field(default=False, compare=False)
    """For a family with an archive, loaded with ``pending_flags``: no archive holds this
    commit's rows and its record says it was built on zero (so is a commit that carries them:
    the archive rebuilds its value from zero)."""
    high_ms: int | None = None
    """The highest epoch (ms) a commit of this counter had, while it is above ``epoch_ms``
    (None otherwise): a commit that folded part of a late backlog lowered the epoch, and rows
    up to this one may be in the value already. A reset point must not be below it."""


EMPTY_CHECKPOINT = Checkpoint()


def high_water(base: Checkpoint, epoch_ms: int | None) -> int | None:
    """The ``high_ms`` a commit at ``epoch_ms`` on ``base`` keeps: the highest epoch of the
    counter's commits so far, when the new epoch is below it (a lowered epoch, or a later
    part of the same backlog), else None."""
    highest = max((e for e in (base.high_ms, base.epoch_ms) if e is not None), default=None)
    if highest is None or epoch_ms is None or epoch_ms >= highest:
        return None
    return highest


ROW_COUNTED = 1
"""Flag of a counted row whose increment is in the value (not a reset's consumed row, not a
unique family's duplicate)."""
ROW_ARCHIVED = 2
"""Flag of a counted row an archive file already holds (its commit's cleanup wrote it, then
crashed before deleting it): a later cleanup deletes it without archiving it again."""
FOLD_NEW = 0
"""``Fold.kinds``: a row this fold counts for the first time (its increment is in the value)."""
FOLD_CARRIED = 1
"""``Fold.kinds``: a row the base had counted, still present (``counted_present``)."""
FOLD_DUPLICATE = 2
"""``Fold.kinds``: a unique family's row of a member already counted (deleted, not summed)."""

LEDGER_STATE = struct.Struct(">BB16sqqqiqqqqq")
"""A ledger row's checkpoint as one cell (``state``), its run id after it in UTF-8: format (1),
flags (1: ``low_ms`` is set), the commit id's 16 bytes, value, epoch_ms, pending_sum,
pending_rows, low_ms, base_value, folded_sum, version, updated_ms. One cell instead of twelve:
a commit writes each counter's row into the Paxos proposal, the commit and the table, and the
node's cost follows the cells (a probe on a warm node: 100,000 new rows in 256 conditional
batches took 5.1-5.4 node CPU-s as twelve cells, 2.3-3.2 as this one and ``commit_id``)."""
STATE_FIELDS = (
    "format",
    "flags",
    "commit",
    "value",
    "epoch_ms",
    "pending_sum",
    "pending_rows",
    "low_ms",
    "base_value",
    "folded_sum",
    "version",
    "updated_ms",
)
"""The names of ``LEDGER_STATE``'s fields, in order."""
STATE_FORMAT = 1
STATE_FORMAT_HIGH = 2
"""The format of a ``state`` cell whose counter has a ``high_ms``: ``LEDGER_STATE``, then
``high_ms`` (8 bytes, big-endian), then the run id. Written only while a late backlog drains
below an earlier epoch; every other cell stays format 1."""
HIGH_MS = struct.Struct(">q")


def pack_state(
    commit_id_bytes: bytes,
    value: int,
    epoch_ms: int,
    pending_sum: int,
    pending_rows: int,
    low_ms: int | None,
    base_value: int,
    folded_sum: int,
    version: int,
    updated_ms: int,
    run_id: str,
    high_ms: int | None = None,
) -> bytes:
    """A committed checkpoint as a ledger row's ``state`` cell."""
    return (
        LEDGER_STATE.pack(
            STATE_FORMAT if high_ms is None else STATE_FORMAT_HIGH,
            low_ms is not None,
            commit_id_bytes,
            value,
            epoch_ms,
            pending_sum,
            pending_rows,
            low_ms or 0,
            base_value,
            folded_sum,
            version,
            updated_ms,
        )
        + (b"" if high_ms is None else HIGH_MS.pack(high_ms))
        + run_id.encode()
    )


def state_commit(state: bytes | None) -> bytes | None:
    """The commit id bytes a ``state`` cell was written with (None: no cell, or an unknown
    format). A row whose ``commit_id`` differs was last committed by a version that wrote the
    checkpoint as separate columns: those columns are the current ones."""
    if state is None or len(state) < LEDGER_STATE.size:
        return None
    if state[0] == STATE_FORMAT_HIGH and len(state) >= LEDGER_STATE.size + HIGH_MS.size:
        return state[2:18]
    return state[2:18] if state[0] == STATE_FORMAT else None


def unpack_state(state: bytes, commit_id: Any) -> Checkpoint:
    """The checkpoint a ``state`` cell holds; its pending keys stay in the run log."""
    (form, flags, _, value, epoch_ms, pending_sum, pending_rows, low_ms, _, _, version, _) = (
        LEDGER_STATE.unpack_from(state)
    )
    start, high_ms = LEDGER_STATE.size, None
    if form == STATE_FORMAT_HIGH:
        (high_ms,) = HIGH_MS.unpack_from(state, start)
        start += HIGH_MS.size
    return Checkpoint(
        value=value,
        epoch_ms=epoch_ms,
        commit_id=commit_id,
        pending_sum=pending_sum,
        version=version,
        run_id=state[start:].decode(),
        pending_rows=pending_rows,
        low_ms=low_ms if flags & 1 else None,
        pending_loaded=not pending_rows,
        high_ms=high_ms,
    )


def needs_pending(base: Checkpoint, rows: Iterable[Row]) -> bool:
    """Whether folding ``rows`` onto ``base`` needs the keys of its pending rows: only rows at
    or below the checkpoint's epoch can be counted already (a later row never is)."""
    if base.pending_loaded or not base.pending_rows or base.epoch_ms is None:
        return False
    epoch = base.epoch_ms
    return any(r[0] <= epoch for r in rows)


@dataclass(frozen=True, slots=True)
class Fold:
    """What one run does to one counter. Committed when it changes anything."""

    counter: Key
    base: Checkpoint
    epoch_ms: int
    value: int
    pending: tuple[Packed, ...]
    pending_sum: int
    folded_rows: int
    folded_sum: int
    late_rows: int = 0
    late_sum: int = 0
    max_lateness_ms: int = 0
    counted_present: int = 0
    counted_sum: int = 0
    """the sum of the rows counted before (in ``base.pending``) that were still present"""
    newer_rows: int = 0
    bad_rows: tuple[Packed, ...] = ()
    duplicates: int = 0
    capped: bool = False
    """More rows than one commit carries: the oldest that fit are folded (``cap_rows``)."""
    lowered: bool = False
    """Capped below the epoch it started from (a backlog of late rows): readers count the late
    rows after its epoch from this commit on, and later runs fold them."""
    too_large: tuple[int, int] | None = None
    """Refused: the millisecond (its time, its rows) after the counter's epoch that alone holds
    more than one commit carries (``max_rows``, ``max_key_bytes``): nothing can be folded."""
    low_ms: int | None = None
    """The time (ms) of the earliest row in ``pending`` (None: not known): every row the
    commit counts lies in (low_ms - 1, epoch_ms], all a recount of it has to read."""
    origin_ms: int | None = None
    """Set by a reset: the point the counter's value counts from from now on (kept in the
    ledger beside the checkpoint; every later commit leaves it as it is)."""
    restore: bool = False
    """Committed even if it changes nothing: its counter's copy is missing (deleted, expired),
    and only a commit's newer version writes a copy that wins over the tombstone."""
    gone_rows: int = 0
    """A rows family's recount: rows it had counted that no longer exist (business rows
    deleted since); ``value`` no longer counts them."""
    values: tuple[Any, ...] = ()
    """With ``keep_values``: each ``pending`` row's increment, in order (what an archive of
    the rows keeps: the run log holds only their keys otherwise)."""
    readers_before: int | None = None
    """What the readers' copy held before this run's commit, read from the compact table by
    the counter's key (``readers_base``): the independent side of the conservation check.
    None when it equals ``base.value`` (the usual case: a fold is not copied to say so)."""
    kinds: bytes = b""
    """With ``keep_values``: each ``pending`` row's ``FOLD_*`` kind, in order."""

    @property
    def commit(self) -> bool:
        """Folds new rows, drops duplicates, re-commits counted rows still present (so they
        are verified again before a cleanup deletes them), or restores a missing copy."""
        return (
            self.folded_rows > 0
            or self.duplicates > 0
            or self.counted_present > 0
            or self.gone_rows > 0
            or self.restore
        ) and not self.refused

    @property
    def refused(self) -> bool:
        return bool(self.bad_rows) or self.overflow or self.too_large is not None

    @property
    def overflow(self) -> bool:
        """A value, or a sum the checkpoint keeps (of its pending rows, of what it folded), past
        a bigint: the ledger could not hold it (the counter is quarantined, not the family
        stopped)."""
        return not (
            BIGINT_MIN <= self.value <= BIGINT_MAX
            and BIGINT_MIN <= self.pending_sum <= BIGINT_MAX
            and BIGINT_MIN <= self.folded_sum <= BIGINT_MAX
        )


def key_bytes(key: Packed) -> int:
    """About the bytes a packed row key takes in a commit's record of counted keys: each value
    with a 4-byte length, text as UTF-8, any other value as at most 16 bytes."""
    size = 0
    for value in key:
        if isinstance(value, str):
            size += 4 + len(value.encode())
        elif isinstance(value, bytes):
            size += 4 + len(value)
        else:
            size += 20
    return size


KEY_VALUE_MOST = 4 + 2**16
"""The most ``key_bytes`` counts for one value of a row key: the node refuses a clustering value
over 64 KiB. A fold of rows too few to be over a byte budget at that length is not measured."""


def rows_that_fit(rows: Sequence[Row], most_rows: int, most_bytes: int | None) -> int:
    """How many of ``rows``, in their order, one commit may carry: at most ``most_rows``, whose
    keys take at most ``most_bytes`` (``key_bytes``; None: any). Measured only where the rows
    could be over it."""
    n = min(len(rows), most_rows)
    if most_bytes is None or not n or n * len(rows[0][1]) * KEY_VALUE_MOST <= most_bytes:
        return n
    total = 0
    for i in range(n):
        total += key_bytes(rows[i][1])
        if total > most_bytes:
            return i
    return n


def _whole_millis(ordered: Sequence[Row], fit: int) -> int | None:
    """The latest time (ms) up to which every row of ``ordered`` (in time order) is among the
    first ``fit``: a fold ends between two milliseconds, never inside one. None when the first
    millisecond alone is over."""
    if fit >= len(ordered):
        return ordered[-1][0] if ordered else None
    first_left = ordered[fit][0]
    i = fit - 1
    while i >= 0 and ordered[i][0] == first_left:
        i -= 1
    return ordered[i][0] if i >= 0 else None


@dataclass(frozen=True, slots=True)
class Cap:
    """Where a capped fold of a counter stops (``cap_rows``): the rows it counts and its epoch;
    ``lowered`` when that epoch is below the one it started from (a late backlog over the
    limits); ``too_large`` (the millisecond's time, its rows) when it can count nothing: one
    millisecond after its epoch holds more than one commit carries."""

    rows: list[Row]
    epoch_ms: int
    lowered: bool = False
    too_large: tuple[int, int] | None = None


def _over(rows: Sequence[Row], most_rows: int, most_bytes: int | None) -> bool:
    """Whether ``rows`` are more than one commit carries (keys measured only if they could be)."""
    if len(rows) > most_rows:
        return True
    return rows_that_fit(rows, most_rows, most_bytes) < len(rows)


WHOLE_MILLIS_SHARE = 3 / 2
"""A fold never ends inside a millisecond: a first millisecond over a fold's rows or bytes is
folded whole if its keys take at most this share of the bytes (its record and a unique copy
then still stay well under the node's 16 MiB limits); past that the counter is refused."""


def _cut(ordered: Sequence[Row], most_rows: int, most_bytes: int | None) -> int | None:
    """The latest millisecond a fold of ``ordered`` (in time order) may end at: the last whole
    one among the rows that fit; the first one alone when it is over the rows or the bytes but
    within ``WHOLE_MILLIS_SHARE`` of the bytes; None when it is over that too."""
    cut = _whole_millis(ordered, rows_that_fit(ordered, most_rows, most_bytes))
    if cut is not None or not ordered:
        return cut
    first = ordered[0][0]
    at_first = [r for r in ordered if r[0] == first]
    if most_bytes is None:
        return first
    most = int(most_bytes * WHOLE_MILLIS_SHARE)
    return first if rows_that_fit(at_first, len(at_first), most) == len(at_first) else None


def _first_millis(ordered: Sequence[Row], after: int | None) -> tuple[int, int]:
    """The first millisecond of ``ordered`` after ``after``, and its rows."""
    first = next(r[0] for r in ordered if after is None or r[0] > after)
    return first, sum(1 for r in ordered if r[0] == first)


def cap_rows(
    base: Checkpoint,
    below: list[Row],
    most_rows: int,
    most_bytes: int | None,
    lower_epoch: bool = True,
) -> Cap | None:
    """The rows of ``below`` (a counter's rows at or below the fold's epoch) one commit
    counts, when they are more than it may carry (None: all of them). Oldest first, always:

    * up to the last whole millisecond that fits, which becomes the counter's epoch, if that is
      at or after the epoch it starts from (an ordinary backlog: readers add every row after it);
    * or, a backlog of late rows (at or below the epoch it starts from): the same, the epoch
      *lowered* to that millisecond (``lower_epoch``; not for a hot counter read by parts),
      when no counted row still present lies after it. Every row after the lowered epoch is
      then uncounted, so readers, who add the rows after the copy's epoch, count the late rows
      not folded yet at once, and the next runs fold them as an ordinary backlog;
    * else (a counted row still present after it: its cleanup did not finish; or a hot
      counter) the counted rows still present and the oldest late rows that fit, the epoch
      unchanged: the late rows left are, as before, in readers' values once folded;
    * nothing (``too_large``), when the first millisecond after the epoch alone is over
      (``WHOLE_MILLIS_SHARE``)."""
    if not _over(below, most_rows, most_bytes):
        return None
    ordered = sorted(below, key=lambda r: r[0])
    cut = _cut(ordered, most_rows, most_bytes)
    start = base.epoch_ms
    if cut is not None and (start is None or cut >= start):
        return Cap([r for r in ordered if r[0] <= cut], cut)
    if start is None:
        return Cap([], 0, too_large=_first_millis(ordered, None))
    pending = base.pending
    carried = [r for r in ordered if r[1] in pending]
    if lower_epoch and cut is not None and all(r[0] <= cut for r in carried):
        return Cap([r for r in ordered if r[0] <= cut], cut, lowered=True)
    late = [r for r in ordered if r[0] <= start and r[1] not in pending]
    room = most_rows - len(carried)
    left = None if most_bytes is None else most_bytes - sum(key_bytes(r[1]) for r in carried)
    taken = rows_that_fit(late, max(room, 0), None if left is None else max(left, 0))
    if not late or not (taken or carried):
        return Cap([], start, too_large=_first_millis(ordered, None if late else start))
    return Cap(sorted(carried + late[:taken], key=lambda r: r[0]), start)


def fold_counter(
    counter: Key,
    base: Checkpoint,
    rows: Iterable[Row],
    epoch_ms: int,
    *,
    member_index: int | None = None,
    counted_members: frozenset[Hashable] = frozenset(),
    max_rows: int | None = None,
    max_key_bytes: int | None = None,
    lower_epoch: bool = True,
    keep_values: bool = False,
) -> Fold:
    """Fold a counter's present raw rows into its checkpoint at ``epoch_ms``.

    ``rows`` must be every row of the counter present when read, read after ``base`` (or every
    one after a floor below its counted rows and its epoch: ``read_floor``). A row at
    or below the epoch is counted if its key is in ``base.pending``, else it is folded now (a
    row at or below ``base.epoch_ms`` is a late write).

    For a unique family (``member_index`` = the member's position in the clustering key) a
    member counts once: one already counted (in ``pending``, in ``counted_members``, or seen
    earlier in this fold) is a duplicate, deleted but not summed.

    ``max_rows`` and ``max_key_bytes`` bound the rows one commit carries and the bytes of their
    keys: past them the fold counts the oldest rows that fit (``cap_rows``), and its epoch stops
    at the last of them, lowered below the one it started from for a backlog of late rows
    (``lower_epoch``): readers stay exact, they add every row after it. The epoch moves
    backwards only then; a fold that can count nothing is ``too_large`` (refused).

    ``keep_values`` keeps each pending row's increment and kind (``Fold.values``, ``kinds``)
    for a family that archives the rows it deletes.
    """
    rows = list(rows)
    if needs_pending(base, rows):
        raise ValueError(
            f"{format_key(counter)}: rows at or below its epoch are present and the keys of "
            "the rows its checkpoint counted were not loaded"
        )
    target = epoch_ms if base.epoch_ms is None else max(epoch_ms, base.epoch_ms)
    below = [r for r in rows if r[0] <= target]
    capped = lowered = False
    too_large: tuple[int, int] | None = None
    cap = None if max_rows is None else cap_rows(base, below, max_rows, max_key_bytes, lower_epoch)
    if cap is not None and cap.too_large is not None:
        below, too_large = [], cap.too_large
    elif cap is not None:
        below, target, capped, lowered = cap.rows, cap.epoch_ms, True, cap.lowered
    newer = len(rows) - len(below)
    pending: list[Packed] = []
    bad: list[Packed] = []
    folded_rows = folded_sum = late_rows = late_sum = lateness = counted = counted_sum = dups = 0
    pending_sum = 0
    seen: set[Hashable] = set(counted_members)
    if member_index is not None:
        seen.update(key[member_index] for key in base.pending)
    base_pending = base.pending
    base_epoch = base.epoch_ms
    values: list[Any] = []
    kinds = bytearray()
    for time_ms, key, increment in below:
        if key in base_pending:
            pending.append(key)
            pending_sum += increment or 0
            counted += 1
            counted_sum += increment or 0
            if keep_values:
                values.append(increment)
                kinds.append(FOLD_CARRIED)
            continue
        if member_index is not None:
            member = key[member_index]
            if member in seen:
                pending.append(key)
                pending_sum += increment or 0  # deleted with the rest, not counted again
                dups += 1
                if keep_values:
                    values.append(increment)
                    kinds.append(FOLD_DUPLICATE)
                continue
            seen.add(member)
        if increment is None or type(increment) is not int:
            bad.append(key)
            continue
        pending.append(key)
        pending_sum += increment
        if keep_values:
            values.append(increment)
            kinds.append(FOLD_NEW)
        folded_rows += 1
        folded_sum += increment
        if base_epoch is not None and time_ms <= base_epoch:
            late_rows += 1
            late_sum += increment
            lateness = max(lateness, base_epoch - time_ms)
    if lowered and base_epoch is not None:  # late rows readers count from this commit on
        for time_ms, key, increment in rows:
            if not target < time_ms <= base_epoch or key in base_pending:
                continue
            if member_index is not None:
                if key[member_index] in seen:
                    continue
                seen.add(key[member_index])
            late_rows += 1
            late_sum += increment if type(increment) is int else 0
            lateness = max(lateness, base_epoch - time_ms)
    return Fold(
        counter=counter,
        base=base,
        epoch_ms=target,
        value=base.value + folded_sum,
        pending=tuple(pending),
        pending_sum=pending_sum,
        folded_rows=folded_rows,
        folded_sum=folded_sum,
        late_rows=late_rows,
        late_sum=late_sum,
        max_lateness_ms=lateness,
        counted_present=counted,
        counted_sum=counted_sum,
        newer_rows=newer,
        bad_rows=tuple(bad),
        duplicates=dups,
        capped=capped,
        lowered=lowered,
        too_large=too_large,
        low_ms=min(r[0] for r in below) if below else None,
        values=tuple(values),
        kinds=bytes(kinds),
    )


def fold_slice(counter: Key, base: Checkpoint, rows: int, total: int, epoch_ms: int) -> Fold:
    """Fold a counter whose rows are kept: add the slice (checkpoint, epoch] aggregated by the
    server (``rows`` rows adding up to ``total``: their count for a rows family)."""
    target = epoch_ms if base.epoch_ms is None else max(epoch_ms, base.epoch_ms)
    return Fold(
        counter=counter,
        base=base,
        epoch_ms=target,
        value=base.value + total,
        pending=(),
        pending_sum=0,
        folded_rows=rows,
        folded_sum=total,
    )


def fold_recount(counter: Key, base: Checkpoint, rows: int, all_rows: int, epoch_ms: int) -> Fold:
    """Fold a rows counter (its value is the number of rows that exist) from a recount of what
    it counts: ``all_rows`` rows after its reset point and at or below ``epoch_ms``, of which
    ``rows`` are after its checkpoint. The value becomes the recount outright, so rows written
    behind the checkpoint (a writer's clock behind by more than the lag) are counted and rows
    deleted since they were counted are not, whichever came. The checkpoint keeps a count, not
    the rows, so only their net is known: more rows than the value are reported as late rows,
    fewer as ``gone_rows``; a late row and a deletion in the same sweep interval offset each
    other in that report, never in the value. A checkpoint past ``epoch_ms`` (a reset point)
    is not recounted: the recount would not reach it."""
    if base.epoch_ms is not None and base.epoch_ms > epoch_ms:
        return fold_slice(counter, base, rows, rows, epoch_ms)
    net = all_rows - rows - base.value
    late, gone = max(net, 0), max(-net, 0)
    fold = fold_slice(counter, base, rows + late, all_rows - base.value, epoch_ms)
    return replace(fold, late_rows=late, late_sum=late, gone_rows=gone)


def next_version(now_micros: int, previous: int | None) -> int:
    """The write timestamp of a counter's compact copy: strictly larger than the previous
    commit's, so the newest commit's copy wins whatever order copies land in."""
    return max(now_micros, (previous or 0) + 1)


def restored_version(
    ledger_version: int | None, copy_writetime: int | None, now_micros: int
) -> int:
    """The write timestamp of a copy restored from the ledger (``quarantine --release``):
    strictly after the ledger's version and the changed copy's, never the operator's clock (a
    clock ahead would make the next commit's copy lose, and quarantine the counter again)."""
    known = [v for v in (ledger_version, copy_writetime) if v is not None]
    return max(known) + 1 if known else now_micros


def versioned_by_copy(checkpoint: Checkpoint, copy_writetime: int | None) -> Checkpoint:
    """The checkpoint whose copy (equal to it) was written after its version, a restored one,
    with that write time as its version: the next commit's copy (``next_version``) is newer."""
    if copy_writetime is not None and copy_writetime > (checkpoint.version or 0):
        return replace(checkpoint, version=copy_writetime)
    return checkpoint
