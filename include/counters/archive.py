"""The archive of deleted rows, pure: what a commit records of the rows it counts, the Parquet
table a cleanup writes of them, its manifest, and the recount of a counter from them.

A family with an ``archive`` keeps, beside each commit's record of counted keys in the run log,
an *archive record*: per counter its value after the commit (and the value and commit it was
built on, its reset point, whether it is a reset), and per counted row its increment and flags
(``core.ROW_*``: counted in the value or not, held by an archive already, carried from the base).
The fold has the rows' values in hand, so the cleanup reads none again; the server's recount
checked their sum before anything is deleted.

Before deleting a run's rows, the cleanup writes exactly those rows to one Parquet file per run
and shard (``archive_files``), records its manifest (rows, sum, sha256) in the run's audit row
and marks the commits archived in the run log; only then it deletes. A row archived but not
deleted (a crash between the two) is carried by the next fold with the flag ``ROW_ARCHIVED``,
so no cleanup archives it again.

**Recount.** A counter's value is its reset point's zero (or the value before the first archived
commit: the *opening*) plus the increments of the counted rows of every commit since, archived
or still present. Each archived commit says its value after: within the counter's current era
(its reset point, ``origin_ms``), consecutive archived commits must differ by the counted rows
the later one archived, and the last by the counted rows still present (``recount_counter``).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .core import FOLD_CARRIED, FOLD_DUPLICATE, ROW_COUNTED, Checkpoint, Fold
from .errors import ArchiveError

ROW_CARRIED = 4
"""Flag of a row the commit carried from its base (counted before, still present): if no
archive holds it yet, the cleanup archives it only if it is still there (``read_rows_at``)."""

RECORD_FORMAT = b"A2"
"""First bytes of an archive record (the run log's ``archive_rows`` cell)."""
FILE_FORMAT = 1
META_KEY = b"counters.archive"
"""The Parquet key-value metadata entry that describes an archive file (JSON)."""

META_COLUMNS = (
    "_run_id",
    "_shard",
    "_bucket",
    "_commit_id",
    "_commit_time",
    "_epoch",
    "_value_after",
    "_base_value",
    "_base_commit",
    "_origin",
    "_reset",
    "_from_zero",
    "_counted",
)
"""The columns an archive file has beside the family's key, clustering and increment columns."""


# --- values: CQL types as Arrow types ------------------------------------------------------

_INTS = {"int": pa.int32(), "bigint": pa.int64(), "smallint": pa.int16(), "tinyint": pa.int8()}
_TEXT = ("text", "varchar", "ascii", "uuid", "timeuuid", "inet")
TIMESTAMP = pa.timestamp("ms", tz="UTC")


def arrow_type(cql_type: str) -> pa.DataType:
    """How a key or clustering column is kept in an archive file: readable types; a varint, a
    decimal or any other type as its text."""
    if cql_type in _INTS:
        return _INTS[cql_type]
    if cql_type == "timestamp":
        return TIMESTAMP
    if cql_type == "date":
        return pa.date32()
    if cql_type == "boolean":
        return pa.bool_()
    if cql_type in ("float", "double"):
        return pa.float64()
    return pa.string()


_NUMPY_INTS = {pa.int64(): np.int64, pa.int32(): np.int32, pa.int16(): np.int16, pa.int8(): np.int8}


INT64 = pa.int64()


def ints(values: Sequence[Any], kind: pa.DataType = INT64) -> pa.Array:
    """Python ints as an Arrow integer array, through numpy: ``pa.array`` of a Python list
    costs ~0.4 ms a call whatever its length, numpy ~15 us (a commit packs ~10 such columns
    per 1,000 counters). Nulls, or ints past the type, take ``pa.array``'s way."""
    try:
        return pa.array(np.array(values, dtype=_NUMPY_INTS[kind]))
    except (TypeError, OverflowError, ValueError):
        return pa.array(values, kind)


def arrow_values(cql_type: str, values: Sequence[Any] | pa.Array | pa.ChunkedArray) -> Any:
    """Packed or JSON-encoded values (times as epoch ms, uuids and dates as text) as an Arrow
    array of ``arrow_type``."""
    kind = arrow_type(cql_type)
    if isinstance(values, pa.Array | pa.ChunkedArray):
        if kind == TIMESTAMP:
            return values.cast(pa.int64()).cast(TIMESTAMP)
        if kind == pa.date32():
            return values.cast(pa.string()).cast(pa.date32())
        return values.cast(kind)
    if kind == TIMESTAMP:
        return ints(values).cast(TIMESTAMP)
    if kind == pa.date32():
        return pa.array([None if v is None else str(v) for v in values], pa.string()).cast(
            pa.date32()
        )
    if kind == pa.string() and cql_type not in _TEXT:
        return pa.array([None if v is None else str(v) for v in values], pa.string())
    if kind in _NUMPY_INTS:
        return ints(values, kind)
    return pa.array(values, kind)


def encoded_values(cql_type: str, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """An archive column back as the JSON-encoded values the run log keeps of a key (times as
    epoch ms, dates as ISO text), to compare counters however they are typed."""
    if arrow_type(cql_type) == TIMESTAMP:
        return column.cast(pa.int64()).to_pylist()
    if arrow_type(cql_type) == pa.date32():
        return [None if v is None else v.isoformat() for v in column.to_pylist()]
    values = column.to_pylist()
    if cql_type == "varint":
        return [None if v is None else int(v) for v in values]
    return values


# --- a commit's archive record -------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One counter's part of a commit, as the archive keeps it."""

    counter: tuple[Any, ...]
    """The counter's key, JSON-encoded as the run log keeps it."""
    value: int
    """The counter's value after the commit."""
    base_value: int
    base_commit: str | None
    origin_ms: int | None
    reset: bool
    epoch_ms: int
    rows: int
    from_zero: bool = False
    """The commit was built on zero: the counter's first checkpoint, or a reset's."""
    base_run: str | None = None
    """The run id of ``base_commit`` (where the run log keeps its record)."""


def row_flags(fold: Fold) -> bytes:
    """Each pending row's ``ROW_*`` flags: a row this fold counts is ``ROW_COUNTED`` (not in a
    reset, which consumes the rows it deletes, nor a unique family's duplicate); a carried row
    keeps its flags from the base's record (counted, archived) and is ``ROW_CARRIED``."""
    reset = fold.origin_ms is not None
    if not fold.counted_present and not fold.duplicates:  # all new: the usual fold
        return bytes([0 if reset else ROW_COUNTED]) * len(fold.pending)
    base_flags = fold.base.pending_flags or {}
    out = bytearray(len(fold.pending))
    for i, (key, kind) in enumerate(zip(fold.pending, fold.kinds, strict=True)):
        if kind == FOLD_CARRIED:
            flags = base_flags.get(key, ROW_COUNTED) | ROW_CARRIED
        elif kind == FOLD_DUPLICATE:
            flags = 0
        else:
            flags = ROW_COUNTED
        out[i] = flags & ~ROW_COUNTED if reset else flags
    return bytes(out)


def built_on_zero(base: Checkpoint) -> bool:
    """Whether a checkpoint is zero with nothing counted behind it: a counter's first (no
    commit) or a reset's (its value 0 at its own reset point); or one no archive holds that
    was built on zero (a commit carrying its rows rests on zero too)."""
    if base.unarchived_from_zero:
        return True
    if base.value != 0:
        return False
    return base.commit_id is None or (
        base.origin_ms is not None and base.epoch_ms == base.origin_ms
    )


SEGMENT_FIELDS = (
    ("value", pa.int64()),
    ("base_value", pa.int64()),
    ("base_commit", pa.string()),
    ("origin_ms", pa.int64()),
    ("reset", pa.bool_()),
    ("epoch_ms", pa.int64()),
    ("rows", pa.int64()),
    ("from_zero", pa.bool_()),
    ("base_run", pa.string()),
)
"""The columns of an archive record's segment table, after the counter's key parts (``c0``...)."""


def pack_record(
    folds: Sequence[Fold],
    encode_counter: Callable[[tuple[Any, ...]], list[Any]],
    clustering_types: Sequence[str],
) -> bytes:
    """The archive record of the rows ``folds`` count: an Arrow stream of their segments (one
    per fold: the counter, its value after and before, ...) and one of their rows (clustering
    columns, increment, flags), in the order of the folds and of each fold's ``pending`` (the
    order of the run log's keys). Columnar from the start: a million rows cost ~0.5 CPU-s."""
    for fold in folds:
        if len(fold.values) != len(fold.pending) or len(fold.kinds) != len(fold.pending):
            raise ArchiveError(
                f"counter {fold.counter}: the fold kept no values of its rows (keep_values): "
                "an archive cannot be recorded"
            )
    counters = (
        [f.counter for f in folds]
        if encode_counter is list
        else [encode_counter(f.counter) for f in folds]
    )
    width = len(counters[0]) if counters else 0
    segment_columns: dict[str, Any] = {
        f"c{i}": pa.array([c[i] for c in counters]) for i in range(width)
    }
    bases = [f.base for f in folds]
    segment_columns.update(
        value=[f.value for f in folds],
        base_value=[b.value for b in bases],
        base_commit=[None if b.commit_id is None else str(b.commit_id) for b in bases],
        origin_ms=[
            f.origin_ms if f.origin_ms is not None else b.origin_ms
            for f, b in zip(folds, bases, strict=True)
        ],
        reset=[f.origin_ms is not None for f in folds],
        epoch_ms=[f.epoch_ms for f in folds],
        rows=[len(f.pending) for f in folds],
        from_zero=[built_on_zero(b) for b in bases],
        base_run=[b.run_id if b.commit_id is not None else None for b in bases],
    )
    for name, kind in SEGMENT_FIELDS:
        values = segment_columns[name]
        if kind in _NUMPY_INTS and None not in values:
            segment_columns[name] = ints(values, kind)
        elif all(v is None for v in values):
            segment_columns[name] = pa.nulls(len(values), kind)
        else:
            segment_columns[name] = pa.array(values, kind)
    keys = list(itertools.chain.from_iterable(f.pending for f in folds))
    values = list(itertools.chain.from_iterable(f.values for f in folds))
    flags = b"".join(row_flags(f) for f in folds)
    try:
        arrays = [arrow_values(t, [k[i] for k in keys]) for i, t in enumerate(clustering_types)]
        arrays.append(ints(values))
    except (OverflowError, pa.ArrowInvalid) as exc:
        raise ArchiveError(f"an increment does not fit an archive's int64: {exc}") from exc
    arrays.append(pa.array(flags, pa.uint8()) if flags else pa.array([], pa.uint8()))
    names = [f"k{i}" for i in range(len(clustering_types))] + ["increment", "flags"]
    head = _ipc(pa.table(segment_columns))
    return RECORD_FORMAT + struct.pack(">I", len(head)) + head + _ipc(pa.table(arrays, names))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class ArchiveRecord:
    """A commit's archive record, read back: its segments and their rows, in order (columnar;
    the ``Segment`` objects only where one counter is looked at)."""

    def __init__(self, segment_table: pa.Table, rows: pa.Table) -> None:
        self.segment_table = segment_table
        self.rows = rows
        self._segments: list[Segment] | None = None
        self._counters: list[tuple[Any, ...]] | None = None

    @property
    def counters(self) -> list[tuple[Any, ...]]:
        """Each segment's counter, JSON-encoded."""
        if self._counters is None:
            parts = [
                self.segment_table.column(n).to_pylist()
                for n in self.segment_table.column_names
                if n.startswith("c") and n[1:].isdigit()
            ]
            self._counters = list(zip(*parts, strict=True)) if parts else []
        return self._counters

    @property
    def segments(self) -> list[Segment]:
        if self._segments is None:
            fields = {n: self.segment_table.column(n).to_pylist() for n, _k in SEGMENT_FIELDS}
            self._segments = [
                Segment(
                    counter,
                    fields["value"][i],
                    fields["base_value"][i],
                    fields["base_commit"][i],
                    fields["origin_ms"][i],
                    bool(fields["reset"][i]),
                    fields["epoch_ms"][i],
                    fields["rows"][i],
                    bool(fields["from_zero"][i]),
                    fields["base_run"][i],
                )
                for i, counter in enumerate(self.counters)
            ]
        return self._segments

    def offsets(self) -> list[int]:
        """Where each segment's rows start in ``rows`` (and, last, where they end)."""
        return [0, *itertools.accumulate(self.segment_table.column("rows").to_pylist())]

    def flags_of(self, counter: Sequence[Any]) -> list[int] | None:
        """The ``ROW_*`` flags of one counter's rows (JSON-encoded key), None if absent."""
        wanted = tuple(counter)
        if wanted not in self.counters:
            return None
        i = self.counters.index(wanted)
        starts = self.offsets()
        return self.rows.column("flags").slice(starts[i], starts[i + 1] - starts[i]).to_pylist()


def record_part(record: ArchiveRecord, keep: Callable[[tuple[Any, ...]], bool]) -> ArchiveRecord:
    """The segments (and their rows) of the counters ``keep`` says, in order."""
    starts = record.offsets()
    chosen = [i for i, c in enumerate(record.counters) if keep(c)]
    rows = [j for i in chosen for j in range(starts[i], starts[i + 1])]
    return ArchiveRecord(
        record.segment_table.take(pa.array(chosen, pa.int64())),
        record.rows.take(pa.array(rows, pa.int64())),
    )


def join_records(records: Sequence[ArchiveRecord]) -> bytes:
    """One archive record of several (their segments in order): a reshard moves a counter's
    entry into the record of its commit at the counter's new place."""
    parts = [r for r in records if r.segment_table.num_rows]
    if not parts:
        raise ArchiveError("no archive record to join")
    segments = pa.concat_tables([r.segment_table for r in parts], promote_options="permissive")
    rows = pa.concat_tables([r.rows for r in parts])
    head = _ipc(segments)
    return RECORD_FORMAT + struct.pack(">I", len(head)) + head + _ipc(rows)


def unpack_record(blob: bytes) -> ArchiveRecord:
    if blob[:2] != RECORD_FORMAT:
        raise ArchiveError(f"not an archive record (starts {blob[:2]!r})")
    (size,) = struct.unpack_from(">I", blob, 2)
    buffer = pa.py_buffer(blob)
    segments = pa.ipc.open_stream(buffer.slice(6, size)).read_all()
    rows = pa.ipc.open_stream(buffer.slice(6 + size)).read_all()
    return ArchiveRecord(segments, rows)


def archived_mark(url: str | None, skipped: Sequence[Sequence[Any]]) -> str:
    """The run log's ``archived`` cell of a commit: the file that holds its rows (None: none
    needed one) and the counters whose rows it left out (quarantined, not deleted)."""
    return json.dumps({"url": url, "skipped": [list(c) for c in skipped]}, separators=(",", ":"))


def archived_skipped(mark: str | None) -> set[tuple[Any, ...]] | None:
    """The counters an ``archived`` cell left out; None when the commit is not archived."""
    if not mark:
        return None
    try:
        data = json.loads(mark)
    except ValueError:
        return set()
    return {tuple(c) for c in data.get("skipped") or ()}


# --- a cleanup's file -----------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """The family's columns as an archive file names and types them."""

    key: tuple[tuple[str, str], ...]
    """(name, CQL type) of each partition key column."""
    clustering: tuple[tuple[str, str], ...]
    increment: str

    @property
    def clustering_types(self) -> list[str]:
        return [t for _n, t in self.clustering]

    def check(self) -> None:
        """Refuse a family whose own column names clash with an archive file's columns."""
        names = [n for n, _t in self.key + self.clustering] + [self.increment]
        clash = sorted(set(names) & set(META_COLUMNS))
        if clash or len(set(names)) != len(names):
            raise ArchiveError(
                f"the family's columns {clash or names} clash with the archive file's own "
                f"columns ({', '.join(META_COLUMNS)}): rename them to archive this family"
            )


@dataclass(frozen=True)
class Commit:
    """One commit of the run log whose rows a cleanup archives, with the rows it keeps (a mask
    over its record's rows: not of a quarantined counter, not archived already, still present
    when carried)."""

    run_id: str
    shard: int
    bucket: int
    commit_id: str
    commit_time_ms: int
    record: ArchiveRecord
    keep: Sequence[bool]


def table_of(commits: Sequence[Commit], layout: Layout) -> pa.Table:
    """The rows of an archive file: every kept row of ``commits``, in their order, each with
    its commit, its counter's segment and whether it counts in the value (columnar: the
    segments' columns taken per row, no Python loop over rows)."""
    layout.check()
    parts: list[pa.Table] = []
    for commit in commits:
        record = commit.record
        segments = record.segment_table
        if not segments.num_rows:
            continue
        counts = segments.column("rows").to_numpy()
        index = np.repeat(np.arange(segments.num_rows, dtype=np.int32), counts)  # row -> segment
        keep = np.asarray(commit.keep, dtype=bool)
        if keep.all():  # the usual commit: every row kept, nothing to filter
            rows, which = record.rows, pa.array(index)
        else:
            rows, which = record.rows.filter(pa.array(keep)), pa.array(index[keep])
        if not len(rows):
            continue
        n = len(rows)
        columns: dict[str, Any] = {
            "_run_id": pa.array([commit.run_id] * n, pa.string()),
            "_shard": pa.array(np.full(n, commit.shard, dtype=np.int32)),
            "_bucket": pa.array(np.full(n, commit.bucket, dtype=np.int32)),
            "_commit_id": pa.array([commit.commit_id] * n, pa.string()),
            "_commit_time": pa.array(np.full(n, commit.commit_time_ms, dtype=np.int64)).cast(
                TIMESTAMP
            ),
        }
        for position, (name, cql_type) in enumerate(layout.key):
            columns[name] = arrow_values(cql_type, segments.column(f"c{position}")).take(which)
        per_segment = {
            "_epoch": segments.column("epoch_ms").cast(TIMESTAMP),
            "_value_after": segments.column("value"),
            "_base_value": segments.column("base_value"),
            "_base_commit": segments.column("base_commit"),
            "_origin": segments.column("origin_ms").cast(TIMESTAMP),
            "_reset": segments.column("reset"),
            "_from_zero": segments.column("from_zero"),
        }
        for name, values in per_segment.items():
            columns[name] = values.take(which)
        for position, (name, _t) in enumerate(layout.clustering):
            columns[name] = rows.column(f"k{position}")
        columns[layout.increment] = rows.column("increment")
        columns["_counted"] = pc.not_equal(
            pc.bit_wise_and(rows.column("flags"), pa.scalar(ROW_COUNTED, pa.uint8())),
            pa.scalar(0, pa.uint8()),
        )
        parts.append(pa.table(columns))
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts)


@dataclass(frozen=True)
class Manifest:
    """What a run's audit row records of one archive file: enough to find it and to prove it
    is the file the run wrote (rows, sum of their increments, sha256 of its bytes)."""

    url: str
    shard: int
    rows: int
    sum: int
    counted_sum: int
    sha256: str
    size: int
    commits: int

    @property
    def name(self) -> str:
        """The key of the audit row's ``archive`` map: the file's name."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def as_text(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def parquet_bytes(table: pa.Table, meta: dict[str, Any]) -> bytes:
    """The file's bytes: the same table and metadata give the same bytes (a retry that finds
    the file of a crashed attempt can tell it is its own)."""
    described = table.replace_schema_metadata(
        {META_KEY: json.dumps(meta, sort_keys=True, default=str).encode()}
    )
    sink = io.BytesIO()
    pq.write_table(described, sink, compression="zstd", write_statistics=True)
    return sink.getvalue()


def manifest_of(
    url: str, shard: int, table: pa.Table, data: bytes, commits: int, layout: Layout
) -> Manifest:
    """The manifest of a file's bytes and rows."""
    increments = table.column(layout.increment)
    total = pc.sum(increments).as_py() or 0
    counted = pc.sum(increments.filter(table.column("_counted"))).as_py() or 0
    return Manifest(
        url,
        shard,
        table.num_rows,
        int(total),
        int(counted),
        hashlib.sha256(data).hexdigest(),
        len(data),
        commits,
    )


@dataclass(frozen=True)
class FileCheck:
    """An archive file read back against its manifest."""

    manifest: Manifest
    table: pa.Table | None
    problem: str | None = None


def check_file(manifest: Manifest, data: bytes | None, increment: str) -> FileCheck:
    """Read a file's bytes against its manifest: its sha256, then its rows and their sum (a
    file changed and given a new checksum elsewhere still has to add up)."""
    if data is None:
        return FileCheck(manifest, None, f"{manifest.url}: missing")
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.sha256:
        return FileCheck(
            manifest,
            None,
            f"{manifest.url}: sha256 {digest} differs from the manifest's {manifest.sha256} "
            f"({len(data)} bytes, the run wrote {manifest.size}): the file was changed after "
            "the run wrote it",
        )
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as exc:
        return FileCheck(manifest, None, f"{manifest.url}: not a readable Parquet file: {exc}")
    total = pc.sum(table.column(increment)).as_py() or 0 if table.num_rows else 0
    if (table.num_rows, total) != (manifest.rows, manifest.sum):
        return FileCheck(
            manifest,
            None,
            f"{manifest.url}: {table.num_rows} row(s) summing to {total}, the manifest says "
            f"{manifest.rows} summing to {manifest.sum}",
        )
    return FileCheck(manifest, table)


# --- recount --------------------------------------------------------------------------------


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
    copy_value: int | None = None
    copy_commit: str | None = None
    copy_epoch_ms: int | None = None


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

    @property
    def difference(self) -> int | None:
        if self.rebuilt is None or self.expected is None:
            return None
        return self.rebuilt - self.expected

    @property
    def equal(self) -> bool:
        return not self.problems and self.difference == 0

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
    the one rebuilt."""
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
    if present is None:
        expected = rebuilt
        if not in_era:
            problems.append("no archived commit of the counter in the window")
    else:
        expected = 0 if present.value is None else present.value
        if present.unknown:
            problems.append(present.unknown)
        archived_last = bool(in_era) and in_era[-1].commit_id == present.commit_id
        if not archived_last:  # the ledger's commit: its counted rows not archived yet
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
    elif (present.copy_epoch_ms or 0) < (present.epoch_ms or 0):
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
