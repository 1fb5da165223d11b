"""The small records a family's store returns and stores (index entries, ledger partitions,
copies, run-log commits, control rows, a reader's base), with the run log's record codec they
decode through: plain data, no I/O, so every part of the store and its callers share them."""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from cassandra.util import datetime_from_uuid1

from ..core import Checkpoint, Key, Packed, to_millis
from ..rowkeys import CountedKeys, KeyCodec


@dataclass(frozen=True)
class Touched:
    """An entry of the touched-counter index and the server write time of its latest mark."""

    counter: Key
    writetime: int
    earliest_ms: int | None = None
    """The earliest minute (ms) of the rows its writers announced, None if a mark did not say
    (the counter's past must then be read whole)."""


NO_KEYS: frozenset[Packed] = frozenset()


class Copy(NamedTuple):
    """A counter's row in the compact table (the readers' copy of the ledger). A tuple: verify
    reads one per committed counter, and a tuple is built 5x faster than a frozen dataclass."""

    value: int
    epoch_ms: int | None
    commit_id: Any
    writetime: int | None
    legacy_pending: frozenset[Packed] = frozenset()


@dataclass(frozen=True)
class Ledger:
    """One ledger partition as read: its head (the compare-and-set token of the whole bucket),
    the checkpoints of the counters read, and the bucket's population: how many counters it holds
    (a checkpoint or a compact row), counted where a run read the bucket whole and carried on by
    each commit; None until a run has counted it. It only chooses how a bucket is read, never
    what a run counts."""

    head: Any
    checkpoints: dict[Key, Checkpoint]
    population: int | None = None
    shards: int | None = None
    """The shard count the partition was committed under (None: before it was recorded;
    ``MOVING``: a reshard is moving it). Every commit is conditioned on it."""
    scan_refused_ms: int | None = None
    """When the node last refused a whole scan of the bucket (too many tombstones), if within
    ``SCAN_REFUSED_TTL_S``: a sweep then reads the bucket counter by counter at once."""


MOVING = -1
"""A ledger partition's ``shards`` while a reshard moves its checkpoints: no commit applies."""


class TableOwner(NamedTuple):
    """The family recorded as a table's owner, with its identity (JSON) when it was recorded."""

    family: str
    identity: str
    recorded_at: datetime | None
    recorded_by: str | None


class FamilyState(NamedTuple):
    epoch: datetime | None
    last_sweep: datetime | None
    shards: int | None  # what the ledger was written with (None before it was recorded)
    last_sweep_size: int | None = None
    """Raw rows and counters the last sweep read (None: not recorded): a small one sweeps
    every run (``Family.sweep_every_run_below``)."""


class KnownFamily(NamedTuple):
    """A family the cluster knows in a keyspace: it has a state row (a run concluded, or a
    reshard, a retirement) or owns tables (its first commit recorded them)."""

    name: str
    keyspace: str
    epoch: datetime | None
    retired_at: datetime | None = None
    """When ``counterctl retire`` retired it (None: not retired)."""
    retired_by: str | None = None


class RunFigures(NamedTuple):
    """What the run log holds of a run's figures (``RunLogTable.run_figures``)."""

    commits: tuple[dict[str, int] | None, ...]
    """Each applied commit's ``core.commit_figures`` (None: recorded before they were kept)."""
    deleted: int | None
    """The rows its cleanups deleted (None: no cleanup recorded any)."""


@dataclass(frozen=True)
class CommitRecord:
    """One applied commit of a run, as the run log holds it: per counter, its new epoch (ms)
    and the keys of the rows it counted (packed, as JSON lists). Kept compressed until a bucket
    of the cleanup reads ``entries``: decoded for the whole shard at once, the keys made a
    cleanup's memory grow with the shard, not with the buckets in flight."""

    commit_id: Any
    blob: bytes
    decode: Callable[[list[Any]], Key]
    codec: KeyCodec
    archive_rows: bytes | None = None
    """A family with an archive: the commit's archive record (``archive.pack_record``), None
    for a commit recorded before the family had one."""
    archived: str | None = None
    """The archive file that holds the commit's rows, once a cleanup wrote it."""

    @property
    def entries(self) -> list[tuple[Key, int, CountedKeys]]:
        return [
            (self.decode(c), epoch, keys)
            for c, epoch, keys in unpack_commit_keys(self.blob, self.codec)
        ]


@dataclass(frozen=True)
class Quarantined:
    counter: Key
    reason: str
    run_id: str
    detail: str


class ReadBase(NamedTuple):
    """A reader's base: a counter's compact row as read (its epoch as stored)."""

    value: int
    epoch: Any
    counted: frozenset[Any] = frozenset()
    """A unique family's members the copy counts already (its ``pending``)."""
    commit: Any = None
    """The commit that wrote the copy (its ``commit_id``; None in a copy an early version
    wrote, or where there is none)."""

    def measure(self, newer: Any, marked: frozenset[Any] = frozenset()) -> int:
        """The rows after the epoch as the read rule adds them: a number as read, or for a
        unique family the members not counted yet (not in the copy's ``pending``, and not in
        ``marked``, the members an earlier cleanup marked counted: its first row is gone, a
        clock-behind duplicate not). ``marked`` must be read before the copy that settles the
        read, like the rows: a cleanup marks members only after its copy was written."""
        if not isinstance(newer, set):
            return newer
        return len(newer - self.counted - marked)

    def settles(self, epoch: Any, commit: Any) -> bool:
        """Whether this copy is the one a read of the rows was bounded by (``epoch``, and the
        copy's ``commit`` then): then that read saw every row after the epoch and no delete of a
        later commit. The epoch alone does not say so: a commit that folds part of a late
        backlog lowers its counter's epoch, back to one a reader may have bounded its rows by
        before a commit in between deleted rows after it."""
        return self.has_epoch(epoch) and self.commit == commit

    def has_epoch(self, bound: Any) -> bool:
        """Whether this copy still has the epoch a read of the rows was bounded by: then that
        read saw every row after it. A timeuuid (a rows family's ``counted_until``) is compared
        exactly: two of them can differ within a millisecond."""
        if isinstance(self.epoch, uuid.UUID) or isinstance(bound, uuid.UUID):
            return bool(self.epoch == bound)
        return epoch_ms_of(self.epoch) == epoch_ms_of(bound)


EMPTY_READ_BASE = ReadBase(0, None)


def epoch_ms_of(stored: Any) -> int | None:
    """An epoch as stored (a timestamp, epoch ms, or a rows family's timeuuid) in ms."""
    if stored is None:
        return None
    if isinstance(stored, datetime):
        return to_millis(stored)
    if isinstance(stored, int):
        return stored
    return to_millis(datetime_from_uuid1(stored))


COMMIT_KEYS_V2 = b"\x02"
"""First byte of a run-log record whose keys are CQL bytes (``rowkeys``); a record written
before them is a zlib stream of JSON (its first byte is 0x78) and is still read."""


def pack_commit_keys(
    entries: Sequence[tuple[list[Any], int, Sequence[Packed] | CountedKeys]], codec: KeyCodec
) -> bytes:
    """One commit's counted keys, ``(counter as JSON values, its new epoch in ms, keys)`` per
    counter, as one compressed cell (zlib level 1): a JSON header of the counters, then each
    counter's keys as the elements of the ``IN`` value the cleanup binds."""
    header: list[list[Any]] = []
    bodies: list[bytes] = []
    for counter, epoch_ms, keys in entries:
        body = keys.body if isinstance(keys, CountedKeys) else codec.encode(keys)
        header.append([counter, epoch_ms, len(keys), len(body)])
        bodies.append(body)
    head = json.dumps(header, separators=(",", ":")).encode()
    data = b"".join([struct.pack(">i", len(head)), head, *bodies])
    return COMMIT_KEYS_V2 + zlib.compress(data, 1)


def unpack_commit_keys(blob: bytes, codec: KeyCodec) -> list[tuple[list[Any], int, CountedKeys]]:
    """The entries of :func:`pack_commit_keys` (or of a record from before it), keys still as
    bytes: decoded only where they are compared (``CountedKeys.keys``)."""
    if blob[:1] != COMMIT_KEYS_V2:
        return [
            (counter, epoch, CountedKeys.of(codec, keys))
            for counter, epoch, keys in json.loads(zlib.decompress(blob))
        ]
    data = zlib.decompress(blob[1:])
    (size,) = struct.unpack_from(">i", data, 0)
    at = 4 + size
    out: list[tuple[list[Any], int, CountedKeys]] = []
    for counter, epoch, count, width in json.loads(data[4:at]):
        out.append((counter, epoch, CountedKeys(codec, count, data[at : at + width])))
        at += width
    return out


def pending_flags_of(
    archive: tuple[bytes | None, str | None] | None, counter: list[Any], keys: Sequence[Packed]
) -> tuple[dict[Packed, int], bool]:
    """The ``ROW_*`` flags of a counter's pending keys from its commit's archive record, each
    ``ROW_ARCHIVED`` when a cleanup archived the commit (and did not leave the counter out: a
    quarantined one), and whether no archive holds the commit and it was built on zero. A
    commit recorded before the family had an archive: every key counted, none archived."""
    from ..archive import archived_skipped, unpack_record
    from ..core import ROW_ARCHIVED, ROW_COUNTED

    blob, mark = archive or (None, None)
    flags: list[int] | None = None
    from_zero = False
    if blob is not None:
        record = unpack_record(blob)
        flags = record.flags_of(counter)
        segment = next((s for s in record.segments if s.counter == tuple(counter)), None)
        from_zero = bool(segment and segment.from_zero)
    if flags is None or len(flags) != len(keys):
        flags = [ROW_COUNTED] * len(keys)
    skipped = archived_skipped(mark)  # None: the commit is not archived
    archived = skipped is not None and tuple(counter) not in skipped
    extra = ROW_ARCHIVED if archived else 0
    kept = ROW_COUNTED | ROW_ARCHIVED
    flagged = {k: (f | extra) & kept for k, f in zip(keys, flags, strict=True)}
    return flagged, from_zero and not archived
