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

import struct
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

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


def minute_ms(moment: datetime) -> int:
    """The start of ``moment``'s minute, in epoch ms (what an index mark records of a row)."""
    return to_millis(moment) // 60_000 * 60_000


def parse_epoch(text: str) -> datetime:
    """An epoch given by a person (``--epoch``, the DAG's ``epoch`` param): ISO 8601, UTC when
    it has no offset, millisecond precision. ``ValueError`` names the text."""
    try:
        moment = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text!r} (e.g. 2026-11-22T10:00:00)") from None
    return truncate_ms(utc_naive(moment if moment.tzinfo else moment.replace(tzinfo=UTC)))


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


def overlapping_shards(shard: int, shards_from: int, shards_to: int) -> range:
    """The shards under a count of ``shards_to`` whose token ranges overlap ``shard`` under
    ``shards_from``: where a reshard may have moved what that shard held."""
    low, high = shard_bounds(shards_from)[shard]
    return range(shard_of(low + 1, shards_to), shard_of(high, shards_to) + 1)


def quarantine_shards(shard: int, counts: Iterable[int]) -> list[int]:
    """Every shard partition that can hold the quarantine entry of a counter the run knew in
    ``shard``, whichever of ``counts`` (the shard counts the family was or is being numbered
    by) numbered the run and the entry: a reshard between a run's verify and its cleanup
    moves entries to the new count's shards."""
    known = sorted(set(counts))
    found = {shard}
    for before in known:
        if shard < before:
            for after in known:
                found.update(overlapping_shards(shard, before, after))
    return sorted(found)


BUCKETS = 16
"""Token sub-ranges per shard. A bucket is the unit of every bulk step: one ledger partition
(one Paxos round commits many counters), one touched-index partition, one raw-table scan."""

BIGINT_MAX = 2**63 - 1
BIGINT_MIN = -(2**63)


def bucket_of(token: int, shards: int) -> tuple[int, int]:
    """(shard, bucket) of a partition token: the shard split again into ``BUCKETS`` ranges."""
    fine = shard_of(token, shards * BUCKETS)
    return fine // BUCKETS, fine % BUCKETS


def bucket_bounds(shards: int, shard: int, bucket: int) -> tuple[int, int]:
    """The token range ``(start, end]`` of one bucket."""
    return shard_bounds(shards * BUCKETS)[shard * BUCKETS + bucket]


def split_refused_range(low: int, high: int, known_tokens: Iterable[int]) -> list[tuple[int, int]]:
    """The ranges to read instead of a token range ``(low, high]`` whose scan the server
    refused (a partition full of tombstones): around the tokens of the counters already known
    (their partitions left out: the caller reads those by parts), else its two halves. A range
    of one token cannot be split: ``ValueError``."""
    inside = sorted({t for t in known_tokens if low < t <= high})
    if inside:
        edges = [low, *inside]
        pieces = [(edges[i], edges[i + 1] - 1) for i in range(len(inside))] + [(inside[-1], high)]
        return [(a, b) for a, b in pieces if a < b]
    if high - low <= 1:
        raise ValueError(f"the partition at token {high} cannot be read")
    middle = low + (high - low) // 2
    return [(low, middle), (middle, high)]


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size`` (the one chunking helper)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [items[i : i + size] for i in range(0, len(items), size)]


def spread(
    items: Iterable[tuple[int, int, Any]], most_rows: int, most_bytes: int
) -> list[tuple[int, list[Any]]]:
    """``(rows, bytes, item)`` in order, in consecutive groups of at most ``most_rows`` rows and
    ``most_bytes`` bytes (an item over either alone is a group of its own): ``(bytes, items)``
    per group. How a batch of many partitions stays under the node's row and size limits."""
    groups: list[tuple[int, list[Any]]] = []
    current: list[Any] = []
    rows = size = 0
    for n, weight, item in items:
        if current and (rows + n > most_rows or size + weight > most_bytes):
            groups.append((size, current))
            current, rows, size = [], 0, 0
        current.append(item)
        rows, size = rows + n, size + weight
    if current:
        groups.append((size, current))
    return groups


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


# --- fold planning ------------------------------------------------------------------------

Key = tuple[Hashable, ...]
"""A counter: the values of the raw table's partition key columns."""
Packed = tuple[Hashable, ...]
"""A raw row's clustering key in packed form: times as epoch milliseconds, uuids as text."""
Row = tuple[int, Packed, Any]
"""One raw row as the engine reads it: (time in epoch ms, packed clustering key, increment)."""


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


EMPTY_CHECKPOINT = Checkpoint()

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
) -> bytes:
    """A committed checkpoint as a ledger row's ``state`` cell."""
    return (
        LEDGER_STATE.pack(
            STATE_FORMAT,
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
        + run_id.encode()
    )


def state_commit(state: bytes | None) -> bytes | None:
    """The commit id bytes a ``state`` cell was written with (None: no cell, or an unknown
    format). A row whose ``commit_id`` differs was last committed by a version that wrote the
    checkpoint as separate columns: those columns are the current ones."""
    if state is None or len(state) < LEDGER_STATE.size or state[0] != STATE_FORMAT:
        return None
    return state[2:18]


def unpack_state(state: bytes, commit_id: Any) -> Checkpoint:
    """The checkpoint a ``state`` cell holds; its pending keys stay in the run log."""
    (_, flags, _, value, epoch_ms, pending_sum, pending_rows, low_ms, _, _, version, _) = (
        LEDGER_STATE.unpack_from(state)
    )
    return Checkpoint(
        value=value,
        epoch_ms=epoch_ms,
        commit_id=commit_id,
        pending_sum=pending_sum,
        version=version,
        run_id=state[LEDGER_STATE.size :].decode(),
        pending_rows=pending_rows,
        low_ms=low_ms if flags & 1 else None,
        pending_loaded=not pending_rows,
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
    the counter's key (``readers_base``): the independent side of the conservation check."""
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
        return bool(self.bad_rows) or self.overflow

    @property
    def overflow(self) -> bool:
        """A value, or a sum the checkpoint keeps (of its pending rows, of what it folded), past
        a bigint: the ledger could not hold it (the counter is quarantined, not the family
        stopped)."""
        return not all(
            BIGINT_MIN <= n <= BIGINT_MAX for n in (self.value, self.pending_sum, self.folded_sum)
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


KEY_SAMPLE = 256
"""Row keys a fold measures to size itself (``fold_row_limit``)."""


def fold_row_limit(rows: Sequence[Row], most_rows: int, most_bytes: int) -> int:
    """The most rows one fold of ``rows`` may carry: ``most_rows``, or fewer when their keys
    are long, so that the keys it counts take at most ``most_bytes`` (sized by the longest key
    of an even sample). Rows too few to be over it even at 16 KiB a key are not measured."""
    if len(rows) * 16 * 1024 <= most_bytes:
        return most_rows
    step = max(1, len(rows) // KEY_SAMPLE)
    longest = max(key_bytes(rows[i][1]) for i in range(0, len(rows), step))
    return max(1, min(most_rows, most_bytes // longest))


def fold_counter(
    counter: Key,
    base: Checkpoint,
    rows: Iterable[Row],
    epoch_ms: int,
    *,
    member_index: int | None = None,
    counted_members: frozenset[Hashable] = frozenset(),
    max_rows: int | None = None,
    keep_values: bool = False,
) -> Fold:
    """Fold a counter's present raw rows into its checkpoint at ``epoch_ms``.

    ``rows`` must be every row of the counter present when read, read after ``base`` (or every
    one after a floor below its counted rows and its epoch: ``read_floor``). A row at
    or below the epoch is counted if its key is in ``base.pending``, else it is folded now (a
    row at or below ``base.epoch_ms`` is a late write). The epoch never moves backwards.

    For a unique family (``member_index`` = the member's position in the clustering key) a
    member counts once: one already counted (in ``pending``, in ``counted_members``, or seen
    earlier in this fold) is a duplicate, deleted but not summed.

    ``max_rows`` bounds the rows one commit carries: past it, the counter's own epoch stops at
    the time of the last row that fits (readers stay exact: they add every row after it).

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
    capped = False
    if max_rows is not None and len(below) > max_rows:
        below.sort(key=lambda r: r[0])
        cut = below[max_rows - 1][0]
        if base.epoch_ms is None or cut >= base.epoch_ms:
            below, target, capped = [r for r in below if r[0] <= cut], cut, True
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


# --- how a bucket is read ------------------------------------------------------------------

WHOLE_BUCKET_SHARE = 4
"""A bucket is read whole (one token-range read of its ledger partition, compact rows and raw
rows) instead of by name (``IN``) once its touched counters are at least 1/4 of its population:
the node reads a row of a range for about a fifteenth of what a partition read by name costs
(docs/benchmarks.md), and the range also reads every idle counter's rows."""


def whole_bucket(touched: int, population: int | None) -> bool:
    """Whether reading the whole bucket costs less than reading ``touched`` counters by name;
    never when the population is unknown (no run has counted the bucket since it got the
    column: a sweep does)."""
    return population is not None and touched * WHOLE_BUCKET_SHARE >= population


def grown_population(population: int | None, folds: Iterable[Fold]) -> int | None:
    """A bucket's population once ``folds`` commit: plus the counters new to it (a fold on the
    empty checkpoint; one on a compact row from before the ledger was counted with the compact
    rows); unknown stays unknown."""
    if population is None:
        return None
    return population + sum(1 for f in folds if f.base == EMPTY_CHECKPOINT)


RECOUNT_WINDOW_MS = 10 * 60_000
"""How far below the bucket's typical floor a counter's floor may lie and still be recounted by
the shared token-range read (it then reads that much more of the partition's past)."""


def shared_floor(
    floors: dict[Key, int | None], window_ms: int = RECOUNT_WINDOW_MS
) -> tuple[int | None, list[Key], list[Key]]:
    """Pure: how a bucket's commits are recounted without reading the tombstones of earlier
    folds. A counter's floor is the time before its earliest counted row (``Fold.low_ms - 1``,
    None if unknown): its recount need not read at or below it. Returns the floor of the shared
    token-range recount (the lowest floor within ``window_ms`` of the median: every counter of
    the bucket has the same one after a steady run), the counters it covers, and the others
    (recounted by name: new floors far below the rest, or unknown ones)."""
    known = sorted(f for f in floors.values() if f is not None)
    if not known:
        return None, [], list(floors)
    median = known[len(known) // 2]
    floor = next(f for f in known if f >= median - window_ms)
    inside = [c for c, f in floors.items() if f is not None and f >= floor]
    outside = [c for c, f in floors.items() if f is None or f < floor]
    return floor, inside, outside


def read_floor(checkpoint: Checkpoint | None, earliest_ms: int | None) -> int | None:
    """Pure: the time after which a fold must read a marked counter's rows, or None (all of
    them). It must see every row after the checkpoint's epoch, every counted row still present
    (none lies before the checkpoint's ``low_ms``: a fold that read them carried them in its
    ``pending``), and the rows its writers announced (the mark's earliest minute). Below that
    lie the tombstones of earlier folds, and rows of other writers later than every mark, which
    the next sweep reads. Unknown where the counter was never folded, the commit did not record
    ``low_ms``, or the mark did not say."""
    if checkpoint is None or checkpoint.epoch_ms is None or earliest_ms is None:
        return None
    floor = min(checkpoint.epoch_ms, earliest_ms - 1)
    if checkpoint.pending_rows or checkpoint.pending:
        if checkpoint.low_ms is None:
            return None
        floor = min(floor, checkpoint.low_ms - 1)
    return floor


def lowest_floor(floors: Iterable[int | None]) -> int | None:
    """The floor under all of ``floors`` (None if any is unknown, or there are none)."""
    values = list(floors)
    if not values or any(f is None for f in values):
        return None
    return min(f for f in values if f is not None)


# --- run summaries and checks --------------------------------------------------------------

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
    "rows_left",
    "counted_present",
    "rows_gone",
)
NAMED_MAX = 20


@dataclass
class Tally:
    """Totals of a run (or a shard of it); adds up across shards."""

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
    quarantined: list[str] = field(default_factory=list)
    """Counters kept out of the run (bad rows, failed checks, tampered copies); at most 20."""
    windowed_counters: list[str] = field(default_factory=list)
    """Hot counters whose whole partition could not be read (tombstone overload), folded from
    a recent window only; at most 20 named."""

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

    def merge(self, other: Tally) -> Tally:
        merged = Tally()
        for name in _TALLY_SUMS:
            setattr(merged, name, getattr(self, name) + getattr(other, name))
        merged.max_lateness_ms = max(self.max_lateness_ms, other.max_lateness_ms)
        merged.quarantined = (self.quarantined + other.quarantined)[:NAMED_MAX]
        merged.windowed_counters = (self.windowed_counters + other.windowed_counters)[:NAMED_MAX]
        return merged

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
